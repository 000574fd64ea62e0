"""Lightning integration: ``Trainer(callbacks=[StabilityCallback(config=..., run_dir=...)])``.

>>> trainer = Trainer(callbacks=[StabilityCallback(config="configs/default.yaml",
...                                                run_dir="out/stability")])  # doctest: +SKIP

Where each signal comes from (FRAMEWORK_NOTES 2.1-2.5; Lightning 2.6):

=================  ==========================================================================
loss               ``outputs["loss"]`` of ``on_train_batch_end`` (already divided by
                   ``accumulate_grad_batches``), summed on the device over the micro-batches
                   of the step; mean over ranks in the probe's one packed collective
step boundary      ``trainer.global_step`` advanced since the last ``on_train_batch_end``
                   (it counts optimizer steps; also under DeepSpeed, whose hooks fire on every
                   micro-batch)
grad_norm          computed once in ``on_before_optimizer_step`` (grads unscaled, *unclipped*
                   there) and, when ``gradient_clip_val`` clips by norm, reused for the
                   clipping: Lightning's own clipping throws its norm away, so without the
                   take-over the norm would be computed twice. DeepSpeed: the engine's
                   ``get_global_grad_norm()`` (ZeRO owns the grads; ZeRO-0 fp32 has none, so
                   it is computed at the accumulation boundary). FSDP: local shards, one
                   all_reduce
lr                 ``param_groups[0]["lr"]`` in ``on_before_optimizer_step``: the LR this step
                   uses (Lightning steps schedulers after the optimizer)
loss_scale/skip    16-mixed: ``GradScaler._scale`` and ``found_inf`` in
                   ``on_before_optimizer_step`` (after unscale, before update). Lightning
                   counts a skipped step in ``global_step`` anyway; the record says
                   ``skipped=1``. DeepSpeed: ``cur_scale`` and the ``skipped_steps`` delta
adam/*             the probe reads ``exp_avg_sq`` where the optimizer keeps it (the DeepSpeed
                   engine's ZeRO partitions included)
batch_fingerprint  hash of each micro-batch's ``input_ids`` (dict batches), summed
=================  ==========================================================================

Actions, carried out the Lightning way, on every rank at the same step (every rank feeds the
Monitor the same reduced record, so every rank takes the same decision; no extra collective):

* save now / the bumped save interval: ``trainer.save_checkpoint`` on all ranks (it is
  collective under DeepSpeed/FSDP) into ``checkpoint_dir`` as ``stability-step=N.ckpt``. The
  user's ``ModelCheckpoint`` keeps its own interval: changing its ``_every_n_train_steps`` at run
  time would also change its ``state_key`` (built from that value), so a resume would no longer
  find its state (Lightning warns "callbacks used to create the checkpoint need to be
  provided").
* halt: ``trainer.should_stop = True`` (with a save first while the weights are good).
* never a diverged state over the last good one: while ``Control.state_is_good`` is False no
  save is made, and ``ModelCheckpoint`` is told this step is already saved (its private
  ``_last_global_step_saved``), so its periodic, epoch-end and ``save_last`` saves skip too.
* logging: ``pl_module.log("stability/<key>", value, on_step=True)`` per sampled step and
  ``stability/finding/<kind>`` = severity (1 info, 2 warning, 3 critical) per finding; alerts
  go through the LiveRun's sinks (the ``WandbLogger`` run is handed to them on rank 0).

Detector state is the callback's ``state_dict`` (saved in every checkpoint by Lightning) and is
restored by Lightning from the checkpoint ``fit(ckpt_path=...)`` actually loads; the run log gets
a ``resume`` segment then.

Cost on an ordinary step: a few device ops on scalars, one grad-norm pass that replaces
Lightning's, the probe's one packed collective under DDP/DeepSpeed/FSDP, no host sync on CPU
or single device. On accelerators with several ranks the records are drained one step late with
a wait on the previous step's copy (``# host-sync:`` below) so that every rank acts at the same
step.
"""
from __future__ import annotations

import logging
import os
from typing import Any

import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.plugins.precision import FSDPPrecision
from lightning.pytorch.strategies import DeepSpeedStrategy, FSDPStrategy   # no deepspeed import

from stability_callbacks import keys
from stability_callbacks.integrations._preflight import run_preflight
from stability_callbacks.live import LogOnce, reporter_scalars
from stability_callbacks.integrations._probe import StepProbe
from stability_callbacks.integrations._readings import (grad_scaler_readings,
                                                        DeepSpeedStep, sharded_grad_norm,
                                                        step_lr)
from stability_callbacks.integrations._reductions import batch_fingerprint

log = logging.getLogger("stability_callbacks")

__all__ = ["StabilityCallback"]


class StabilityCallback(Callback, LogOnce):
    """Live stability monitoring for ``lightning.pytorch.Trainer`` (DESIGN 2.6).

    Keyword arguments: ``config`` (path, preset name, dict or None = defaults) or ``monitor`` (a
    ready ``Monitor``); ``run_dir`` (run log JSONL and reports; one per run); ``run_name``;
    ``checkpoint_dir`` (where the callback's own saves go; default: the ``ModelCheckpoint``
    dirpath, else ``<default_root_dir>/checkpoints``); ``take_over_clipping`` (reuse the
    monitored grad norm for norm clipping instead of computing it twice; default True);
    ``log_to_loggers`` (``pl_module.log`` the signals and findings; default True).
    """

    def __init__(self, *, config: Any = None, monitor: Any = None,
                 run_dir: str | os.PathLike = "out/stability", run_name: str | None = None,
                 checkpoint_dir: str | os.PathLike | None = None,
                 take_over_clipping: bool = True, log_to_loggers: bool = True):
        for key, val in (("take_over_clipping", take_over_clipping),
                         ("log_to_loggers", log_to_loggers)):
            if not isinstance(val, bool):
                raise ValueError(f"{key} must be True or False, got {val!r}")
        self.config = config
        self.monitor = monitor
        self.run_dir = os.fspath(run_dir)
        self.run_name = run_name
        self.checkpoint_dir = None if checkpoint_dir is None else os.fspath(checkpoint_dir)
        self.take_over_clipping = take_over_clipping
        self.log_to_loggers = log_to_loggers
        self.run = None                    # LiveRun, created in setup("fit")
        self.probe: StepProbe | None = None
        self.saved: list[tuple[int, str]] = []   # (step, path) of the callback's own saves
        self._pending_state: dict | None = None  # from load_state_dict before setup
        self._resumed = False
        self._last_step = 0
        self._every_n = 1
        self._lockstep = False
        self._norm: torch.Tensor | None = None   # this step's grad norm, for the clipping
        self._orig_clip = None
        self._fp: torch.Tensor | None = None
        self._ds: DeepSpeedStep | None = None
        self._last_saved_step: int | None = None
        self._mc_seen: str | None = None
        self._save_pending: int | None = None
        self._warned: set[str] = set()
        self._failed = False
        self._closed = False

    def _off(self) -> bool:
        return self._failed or self.run is None or self.probe is None

    # ------------------------------------------------------------------------------ set-up
    def setup(self, trainer, pl_module, stage: str) -> None:
        if stage != "fit" or (self.run is not None and not self._closed):
            return
        try:
            self._setup(trainer)
        except ValueError:
            raise                     # a bad config is the user's error: fail before step one
        except Exception:
            self._failed = True
            self._degrade("setup", "starting the stability monitor failed; it is off for this run")

    def _setup(self, trainer) -> None:
        from stability_callbacks.live import LiveRun

        wandb_run = None
        if trainer.is_global_zero:
            for lg in trainer.loggers:
                if type(lg).__name__ == "WandbLogger":
                    try:
                        wandb_run = lg.experiment
                    except Exception:
                        self._degrade("wandb", "reaching the WandbLogger's run failed")
        # A second fit() with the same callback continues the same Monitor (and run log).
        monitor = self.run.monitor if self.run is not None else self.monitor
        self._closed = False
        self.run = LiveRun(config=self.config, monitor=monitor, run_dir=self.run_dir,
                           is_rank0=trainer.is_global_zero, run_name=self.run_name,
                           wandb_run=wandb_run)
        sampling = dict(self.run.monitor.config.get("sampling") or {})
        self._every_n = int(sampling.get("every_n_steps", 1) or 1)
        self.probe = StepProbe(adam_every_n_steps=int(sampling.get("adam_every_n_steps", 1) or 0),
                               param_norm_every_n_steps=int(sampling.get("param_norm_every_n_steps", 0) or 0),
                               extra_reductions={keys.BATCH_FINGERPRINT: "sum"})
        if self._pending_state is not None:
            self.run.load_state_dict(self._pending_state)
            self._pending_state = None
        if self.take_over_clipping and not self._is_deepspeed(trainer):
            self._take_over_clipping(trainer)

    def _take_over_clipping(self, trainer) -> None:
        """Clip with the norm this callback already computed (``clip_grads_with_norm_``: the same
        arithmetic as ``clip_grad_norm_``, minus the second norm pass). Wraps the precision
        plugin's ``clip_grad_by_norm`` on this trainer's instance only; FSDP's plugin refuses
        norm clipping and is left alone."""
        precision = trainer.precision_plugin
        if isinstance(precision, FSDPPrecision) or "clip_grad_by_norm" in vars(precision):
            return
        orig = precision.clip_grad_by_norm

        def clip_grad_by_norm(optimizer, clip_val):
            norm, self._norm = self._norm, None
            if norm is None:
                return orig(optimizer, clip_val)
            params = [p for p in precision.main_params(optimizer) if p.grad is not None]
            torch.nn.utils.clip_grads_with_norm_(params, clip_val, norm)

        precision.clip_grad_by_norm = clip_grad_by_norm
        self._orig_clip = (precision, orig)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Lightning calls this with the state saved in the checkpoint it is resuming from."""
        self._resumed = True
        if not state_dict:
            return            # saved while monitoring was off: the detectors start fresh
        live = state_dict   # LiveRun state; the Monitor inside checks its version
        if self.run is None:
            self._pending_state = live
        else:
            self.run.load_state_dict(live)

    def state_dict(self) -> dict[str, Any]:
        if self._off():
            return {}
        try:
            # host-sync: a checkpoint is a sync point anyway; the saved detector state must
            # include every step up to this one. Requests the flushed records raise are carried
            # out at the next step boundary (Control's flags persist until step_done()).
            self._observe(self.probe.flush(), None)
            return self.run.state_dict()
        except Exception:
            self._degrade("state", "saving the stability state into the checkpoint failed")
            return {}

    def on_train_start(self, trainer, pl_module) -> None:
        if self._off():
            return
        try:
            self._last_step = trainer.global_step
            # A checkpoint without this callback's state is a resume too (fresh detectors).
            reason = "resume" if self._resumed or trainer.ckpt_path else "start"
            self.run.start(trainer.global_step, reason=reason)
            if reason == "start":
                scheds = trainer.lr_scheduler_configs
                run_preflight(self.run, pl_module, trainer.optimizers[0] if trainer.optimizers else None,
                              scheds[0].scheduler if scheds else None, precision=str(trainer.precision),
                              total_steps=trainer.max_steps if trainer.max_steps > 0 else None)
            world = trainer.world_size
            # CPU copies land at once (poll is deterministic); on accelerators the copy may land
            # at different times on different ranks, so multi-rank runs drain in lockstep.
            self._lockstep = world > 1 and trainer.strategy.root_device.type != "cpu"
            mc = trainer.checkpoint_callback
            if isinstance(mc, ModelCheckpoint):
                self._mc_seen = mc._last_checkpoint_saved or None
            if self._is_deepspeed(trainer):
                self._ds = DeepSpeedStep(trainer.strategy.deepspeed_engine)
        except Exception:
            self._failed = True
            self._degrade("start", "starting the stability monitor failed; it is off for this run")

    # ------------------------------------------------------------------------------ per step
    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        if self._off():
            return
        try:
            self.probe.set_lr(step_lr(optimizer))   # the LR this step uses; overwritten per DeepSpeed micro-batch
            if self._is_deepspeed(trainer):
                engine = trainer.strategy.deepspeed_engine
                # ZeRO-0 fp32 keeps no norm; grads still sit in p.grad before engine.step().
                if engine.zero_optimization_stage() == 0 and not (
                        engine.fp16_enabled() or engine.bfloat16_enabled()) \
                        and engine.is_gradient_accumulation_boundary():
                    self.probe.compute_grad_norm(engine.module.parameters())
                return
            scaler = getattr(trainer.precision_plugin, "scaler", None)
            if scaler is not None:
                # After unscale_, before update(): the scale this step used and found_inf.
                scale, found_inf = grad_scaler_readings(scaler, optimizer)
                self.probe.set_loss_scale(scale, detect_decrease=found_inf is None)
                self.probe.set_skipped(found_inf)
            params = list(trainer.precision_plugin.main_params(optimizer))
            if self._is_fsdp(trainer):
                self.probe.set_grad_norm(sharded_grad_norm(params))
            else:
                self._norm = self.probe.compute_grad_norm(params)
        except Exception:
            self._degrade("before-step", "reading the grad norm / LR / loss scale failed")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self._off():
            return
        try:
            loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
            if isinstance(loss, torch.Tensor):
                self.probe.add_loss(loss)
            ids = batch.get("input_ids") if isinstance(batch, dict) else None
            if isinstance(ids, torch.Tensor):
                fp = batch_fingerprint(ids)
                self._fp = fp if self._fp is None else self._fp + fp
        except Exception:
            self._degrade("micro-batch", "reading the micro-batch loss failed")
        step = trainer.global_step
        if step == self._last_step:
            return            # an accumulation micro-batch (or a skipped training_step)
        self._last_step = step
        self._norm = None
        records = []
        try:
            records = self._close_step(trainer, step)
        except Exception:
            self._degrade("step", "closing the step's sample failed")
        self._observe(records, pl_module)
        self._note_framework_saves(trainer)
        self._act(trainer, step)

    def _close_step(self, trainer, step: int) -> list:
        probe = self.probe
        # host-sync: lockstep (several ranks on an accelerator) waits for the previous steps'
        # copies, all issued a step ago, so every rank sees the same records at the same step.
        early = probe.flush() if self._lockstep else []
        engine = trainer.strategy.deepspeed_engine if self._is_deepspeed(trainer) else None
        if engine is not None:
            self._ds.read_into(probe, grad_norm=True)
        if self._fp is not None:
            probe.set_extra(keys.BATCH_FINGERPRINT, self._fp, op="sum")
        self._fp = None
        if step % self._every_n:
            probe.discard_step()
            return early
        # Under DeepSpeed the ZeRO partitions live on the engine; elsewhere the optimizer.
        opt = engine if engine is not None else (trainer.optimizers[0] if trainer.optimizers else None)
        probe.finish_step(step, optimizer=opt)
        return early + ([] if self._lockstep else probe.poll())

    def _observe(self, records, pl_module) -> None:
        for record in records:
            try:
                findings = self.run.observe(record)
            except Exception:
                self._degrade("observe", "feeding the monitor failed")
                continue
            if pl_module is None or not self.log_to_loggers:
                continue
            try:
                for name, v in reporter_scalars(record, findings or []).items():
                    pl_module.log(name, v, on_step=True, on_epoch=False)
            except Exception:
                self._degrade("log", "logging to the trainer's loggers failed")

    # --------------------------------------------------------------------------------- actions
    def _act(self, trainer, step: int) -> None:
        c = self.run.control
        try:
            if not c.state_is_good:
                # Damaged weights (NaN, unrecovered divergence): no save of any kind, or a
                # rotation could delete the last good checkpoint. ModelCheckpoint skips a step
                # it believes saved (model_checkpoint.py _should_skip_saving_checkpoint).
                for cb in trainer.checkpoint_callbacks:
                    if isinstance(cb, ModelCheckpoint):
                        cb._last_global_step_saved = step
                if c.save_now:
                    self._warn("no-bad-save", "stability: not saving checkpoints from step %d on: "
                               "the monitor says the weights are damaged", step)
            elif c.save_due(step, self._last_saved_step):   # halting does not save by itself
                self._save(trainer, step)
            if c.stop:
                trainer.should_stop = True
            c.step_done()
        except Exception:
            self._degrade("act", "carrying out the monitor's requests failed")

    def _save(self, trainer, step: int) -> None:
        # Collective under DeepSpeed/FSDP: every rank reaches this at the same step because every
        # rank took the same decision from the same reduced record.
        path = os.path.join(self._checkpoint_dir(trainer), f"stability-step={step}.ckpt")
        trainer.save_checkpoint(path)
        self._last_saved_step = step
        self.saved.append((step, path))
        self.run.checkpoint_saved(step, path)

    def _checkpoint_dir(self, trainer) -> str:
        if self.checkpoint_dir is not None:
            return self.checkpoint_dir
        mc = trainer.checkpoint_callback
        if isinstance(mc, ModelCheckpoint) and mc.dirpath:
            return mc.dirpath
        return os.path.join(trainer.default_root_dir, "checkpoints")

    def _note_framework_saves(self, trainer) -> None:
        """Tell the Monitor about ModelCheckpoint's saves (the rollback advice names them).

        ``on_save_checkpoint`` gives no path; ModelCheckpoint keeps the path of its latest save
        only in the private ``_last_checkpoint_saved`` (lightning 2.6 model_checkpoint.py)."""
        mc = trainer.checkpoint_callback
        if not isinstance(mc, ModelCheckpoint):
            return
        path = mc._last_checkpoint_saved or None
        if path and path != self._mc_seen and self._save_pending is not None:
            self._mc_seen = path
            self.run.checkpoint_saved(self._save_pending, path)
        self._save_pending = None

    def on_save_checkpoint(self, trainer, pl_module, checkpoint) -> None:
        self._save_pending = trainer.global_step

    # ---------------------------------------------------------------------------------- end
    def on_train_end(self, trainer, pl_module) -> None:
        if self.run is None:
            return
        try:
            if self.probe is not None and not self._failed:
                self._observe(self.probe.flush(), None)   # host-sync: end of training
            self._note_framework_saves(trainer)
        except Exception:
            self._degrade("flush", "flushing the last records failed")
        finally:
            self.run.close()   # never raises
            self._closed = True

    def teardown(self, trainer, pl_module, stage: str) -> None:
        if self._orig_clip is not None:
            precision, _ = self._orig_clip
            vars(precision).pop("clip_grad_by_norm", None)
            self._orig_clip = None

    # --------------------------------------------------------------------------------- misc
    @staticmethod
    def _is_deepspeed(trainer) -> bool:
        return isinstance(trainer.strategy, DeepSpeedStrategy)

    @staticmethod
    def _is_fsdp(trainer) -> bool:
        return isinstance(trainer.strategy, FSDPStrategy)

    @property
    def findings(self) -> list:
        """Every finding of this run so far (from the LiveRun)."""
        return list(getattr(self.run, "findings", []) or [])

