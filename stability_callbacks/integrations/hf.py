"""HF ``transformers.Trainer`` integration: one line in the user's script.

>>> StabilityCallback.attach(trainer, config="configs/default.yaml", run_dir="out/stability")  # doctest: +SKIP

Why ``attach(trainer)`` and not ``trainer.add_callback(StabilityCallback(...))``: HF callbacks
are never handed the trainer, and the two values a monitor must reuse rather than recompute live
only on it: the per-micro-batch loss (returned by ``Trainer.training_step``) and the pre-clip
grad norm (a local of the training loop, returned by ``Trainer._get_grad_norm``). ``attach``
adds the callback and wraps those two methods *on that instance* (plus ``train``, to learn
which checkpoint a resume actually loads). ``trainer.add_callback(StabilityCallback(...,
trainer=trainer))`` is the same thing spelled the HF way. A callback added without a trainer
still runs, degraded: the loss comes from a forward hook on the model, there is no grad norm,
and findings are not sent to the Trainer's reporters (one warning says so).

Where each signal comes from (FRAMEWORK_NOTES 1.2-1.8):

=================  ==========================================================================
loss               sum of ``training_step``'s detached return values over the GA window (on
                   device; HF already divided by GA or normalised by ``num_items_in_batch``),
                   mean over ranks in the probe's one packed collective
grad_norm          the value ``_get_grad_norm`` returns: pre-clip, unscaled, global (a device
                   tensor; DeepSpeed: a float)
lr                 ``param_groups[0]["lr"]`` at ``on_step_begin``: the LR the coming step uses,
                   also under DeepSpeed (whose optimizer and scheduler step inside backward,
                   before HF's optimizer hooks run)
loss_scale/skip    torch GradScaler ``_scale`` after the step; a skip is a scale decrease
                   (accelerate's ``optimizer_step_was_skipped`` is wrong for fused optimizers).
                   DeepSpeed: ``cur_scale`` and the ``skipped_steps`` delta (ZeRO's scaler has
                   hysteresis, so its scale need not fall on an overflow)
adam/*             the probe reads ``exp_avg_sq`` where the optimizer keeps it (ZeRO partitions
                   included)
loss/<stream>      a model output (or ``compute_loss`` output) carrying ``stream_losses``:
                   ``{"name": scalar tensor}``; mean over micro-batches and ranks
batch_fingerprint  hash of each micro-batch's ``input_ids`` (resume auditor: data repetition)
=================  ==========================================================================

Actions, carried out the Trainer's way (the callback never saves or stops by itself):
``control.should_save`` for a save now; the save interval through ``state.save_steps`` (the
Trainer reads that, not ``args.save_steps``) inside the risk window and back to the user's value
after it; ``control.should_training_stop`` for a halt, with a save first only while
``Control.state_is_good`` — and while it is not, the Trainer's own periodic saves are suppressed
too, so damaged weights never rotate out the last good checkpoint. Signals and findings reach the
Trainer's reporters (TensorBoard, W&B, ...) through ``trainer.log`` under ``stability/...``
(TensorBoard shows ``train/stability/...``) at the Trainer's logging steps and at every finding,
keeping ``control.should_log`` so the Trainer's own line for that step is not lost (pitfall H4).
Detector state is written to ``checkpoint-N/stability_state.json`` and read back from the
checkpoint ``train(resume_from_checkpoint=...)`` actually loads.

Cost on an ordinary step: a few device ops on scalars, the probe's one packed collective under
DDP/DeepSpeed, no host sync (records arrive one step late on accelerators). Host syncs: the
probe's flush at a checkpoint and at the end of training.
"""
from __future__ import annotations

import json
import logging
import math
import os
from typing import Any

import torch
from transformers import TrainerCallback

from stability_callbacks import keys
from stability_callbacks.integrations._preflight import run_preflight
from stability_callbacks.live import (STATE_FILE, InstancePatches, LiveRun, LogOnce,
                                      reporter_scalars)
from stability_callbacks.integrations._probe import StepProbe
from stability_callbacks.integrations._readings import (grad_scaler_readings,
                                                        DeepSpeedStep, step_lr)
from stability_callbacks.integrations._reductions import batch_fingerprint

log = logging.getLogger("stability_callbacks")


__all__ = ["StabilityCallback", "STATE_FILE"]


class StabilityCallback(TrainerCallback, LogOnce):
    """Live stability monitoring for ``transformers.Trainer`` (DESIGN 2.6).

    Keyword arguments: ``config`` (path, dict or None = defaults) or ``monitor`` (a ready
    ``Monitor``); ``run_dir`` (run log JSONL and reports); ``run_name`` (default: the Trainer's
    ``args.run_name``); ``trainer`` (the Trainer to bind to; or use :meth:`attach` /
    :meth:`bind`); ``log_to_reporters`` (send ``stability/...`` scalars through
    ``trainer.log``).
    """

    def __init__(self, *, config: Any = None, monitor: Any = None,
                 run_dir: str | os.PathLike = "out/stability", run_name: str | None = None,
                 trainer: Any = None, log_to_reporters: bool = True):
        self.config = config
        self.monitor = monitor
        self.run_dir = os.fspath(run_dir)
        self.run_name = run_name
        self.log_to_reporters = bool(log_to_reporters)
        self.run = None               # LiveRun, created at on_train_begin
        self.probe: StepProbe | None = None
        self.trainer = None
        self._resume_path: str | None = None
        self._patches: InstancePatches | None = None   # the trainer's wrapped methods
        self._hook = None
        self._fallback_loss = False
        self._ga = 1
        self._fp: torch.Tensor | None = None
        self._streams: dict[str, list] = {}
        self._user_save_steps: int | None = None
        self._bumped_interval: int | None = None
        self._every_n = 1
        self._ds: DeepSpeedStep | None = None
        self._to_report: dict[str, float] = {}
        self._finding_pending = False
        self._warned: set[str] = set()
        self._failed = False
        if trainer is not None:
            self.bind(trainer)

    # ------------------------------------------------------------------ wiring to the trainer
    @classmethod
    def attach(cls, trainer, **kwargs) -> "StabilityCallback":
        """Create the callback, bind it to ``trainer`` and add it: the one line a user writes."""
        cb = cls(trainer=trainer, **kwargs)
        trainer.add_callback(cb)
        return cb

    def bind(self, trainer) -> "StabilityCallback":
        """Wrap ``trainer.training_step``, ``trainer._get_grad_norm`` and ``trainer.train`` on
        this instance only. ``_get_grad_norm`` is private (transformers 5.23, trainer.py:2781):
        the loop keeps the pre-clip norm in a local and hands it to no callback; without this
        wrap the norm would be computed twice. If a future version drops the method the grad
        norm is simply missing (one warning)."""
        if self.trainer is trainer:
            return self
        if self.trainer is not None:
            raise ValueError(f"trainer: this StabilityCallback is already bound to {self.trainer!r}")
        self.trainer = trainer
        self._patches = InstancePatches(trainer)

        orig_step = trainer.training_step

        def training_step(*args, **kwargs):
            loss = orig_step(*args, **kwargs)
            inputs = args[1] if len(args) > 1 else kwargs.get("inputs")
            self._micro_batch(loss, inputs)
            return loss

        self._patches.set("training_step", training_step)

        orig_norm = getattr(trainer, "_get_grad_norm", None)
        if orig_norm is not None:
            def _get_grad_norm(*args, **kwargs):
                norm = orig_norm(*args, **kwargs)
                if self.probe is not None:
                    try:
                        self.probe.set_grad_norm(norm)
                    except Exception:
                        self._degrade("grad-norm", "reading the grad norm failed")
                return norm
            self._patches.set("_get_grad_norm", _get_grad_norm)
        else:
            self._warn("no-grad-norm", "stability: Trainer._get_grad_norm is gone in this "
                       "transformers version; the grad norm is not monitored")

        orig_train = trainer.train

        def train(*args, **kwargs):
            ckpt = kwargs.get("resume_from_checkpoint", args[0] if args else None)
            if ckpt is True:
                from transformers.trainer_utils import get_last_checkpoint
                ckpt = get_last_checkpoint(trainer.args.output_dir)
            self._resume_path = None if ckpt in (None, False) else os.fspath(ckpt)
            return orig_train(*args, **kwargs)

        self._patches.set("train", train)
        return self

    # ----------------------------------------------------------------------- training events
    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        try:
            self._begin(args, state, model, optimizer, kwargs.get("lr_scheduler"))
        except Exception:
            self._failed = True
            self._degrade("begin", "starting the stability monitor failed; it is off for this run")

    def _begin(self, args, state, model, optimizer=None, lr_scheduler=None) -> None:
        if self.trainer is None:
            self._fallback_loss = True
            self._warn("unbound", "stability: StabilityCallback was added without the trainer; "
                       "use StabilityCallback.attach(trainer, ...) for the grad norm, the "
                       "Trainer's exact loss and reporter logging. Taking the loss from the "
                       "model's forward instead.")
        wandb_run = None
        if self.trainer is not None and any(type(c).__name__ == "WandbCallback"
                                            for c in self.trainer.callback_handler.callbacks):
            try:
                import wandb
                wandb_run = wandb.run
            except ImportError:
                pass
        self.run = LiveRun(config=self.config, monitor=self.monitor, run_dir=self.run_dir,
                           is_rank0=state.is_world_process_zero,
                           run_name=self.run_name or getattr(args, "run_name", None),
                           wandb_run=wandb_run)
        sampling = self.run.monitor.config["sampling"]
        self._every_n = int(sampling.get("every_n_steps", 1) or 1)
        self.probe = StepProbe(
            adam_every_n_steps=int(sampling.get("adam_every_n_steps", 1) or 0),
            param_norm_every_n_steps=int(sampling.get("param_norm_every_n_steps", 0) or 0),
            extra_reductions={keys.BATCH_FINGERPRINT: "sum",
                              **{keys.LOSS_STREAM_PREFIX + n: "mean" for n in sampling["loss_streams"]}})
        self._ga = max(1, int(args.gradient_accumulation_steps))
        self._user_save_steps = _save_steps_from_args(args, state.max_steps)

        warmup = args.get_warmup_steps(state.max_steps) if state.max_steps > 0 else 0
        if warmup > 0 and self.run.monitor.config["phase"].get("warmup_steps") is None:
            self.run.monitor.set_warmup_steps(warmup)

        reason = "start"
        if self._resume_path is not None:
            reason = "resume"
            try:
                self._load_state(self._resume_path)
            except Exception:   # e.g. a checkpoint from another detector configuration
                self._degrade("load-state", f"restoring the stability state from "
                              f"{self._resume_path} failed; detectors start fresh")
        self.run.start(state.global_step, reason=reason)
        if reason == "start":
            precision = "fp16" if args.fp16 else "bf16" if args.bf16 else "fp32"
            run_preflight(self.run, model, optimizer, lr_scheduler, precision=precision,
                          warmup_steps=warmup, total_steps=state.max_steps or None)

        if model is not None:   # the unwrapped model: its hook fires inside DDP/DeepSpeed too
            self._hook = model.register_forward_hook(self._forward_hook)
        if self._is_deepspeed():
            self._ds = DeepSpeedStep(self.trainer.model_wrapped)

    def on_step_begin(self, args, state, control, optimizer=None, **kwargs):
        if self._off():
            return
        try:
            # The LR this step will use: HF steps the scheduler after the optimizer, and
            # DeepSpeed steps both inside backward, so only now is param_groups this step's.
            self.probe.set_lr(step_lr(optimizer))
        except Exception:
            self._degrade("lr", "reading the learning rate failed")

    def _micro_batch(self, loss, inputs) -> None:
        if self._off():
            return
        try:
            if loss is not None and not self._fallback_loss:
                self.probe.add_loss(loss)
            # dict or BatchEncoding (a UserDict, not a dict)
            ids = inputs.get("input_ids") if hasattr(inputs, "get") else None
            if isinstance(ids, torch.Tensor):
                fp = batch_fingerprint(ids)
                self._fp = fp if self._fp is None else self._fp + fp
        except Exception:
            self._degrade("micro-batch", "reading the micro-batch loss failed")

    def _forward_hook(self, module, args, output) -> None:
        if self._off() or not module.training:
            return
        try:
            get = output.get if hasattr(output, "get") else (lambda k, d=None: getattr(output, k, d))
            if self._fallback_loss:
                loss = get("loss", None)
                if isinstance(loss, torch.Tensor):
                    self.probe.add_loss(loss, divide_by=self._ga)
            streams = get("stream_losses", None)
            if streams:
                for name, value in streams.items():
                    if isinstance(value, torch.Tensor):
                        self._streams.setdefault(name, []).append(value.detach().float().mean())
        except Exception:
            self._degrade("forward-hook", "reading the model output failed")

    def on_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
        if self._off() or self.trainer is None or self._is_deepspeed():
            return
        try:
            scaler = getattr(self.trainer.accelerator, "scaler", None)
            if scaler is not None:
                # After scaler.update(): a decrease means this step overflowed and was skipped
                # (torch's GradScaler has no hysteresis). found_inf is already forgotten here.
                scale, _ = grad_scaler_readings(scaler, optimizer)
                self.probe.set_loss_scale(scale, detect_decrease=True)
        except Exception:
            self._degrade("loss-scale", "reading the loss scale failed")

    def on_step_end(self, args, state, control, optimizer=None, **kwargs):
        if self._off():
            return
        step = state.global_step
        try:
            self._close_step(step, optimizer)
            records = self.probe.poll()
        except Exception:
            self._degrade("step", "closing the step's sample failed")
            records = []
        self._observe(records, state)
        self._act(args, state, control)
        self._report(control)

    def _close_step(self, step: int, optimizer) -> None:
        probe = self.probe
        if self._is_deepspeed():
            self._ds.read_into(probe, grad_norm=False)   # the norm came from _get_grad_norm
        if self._fp is not None:
            probe.set_extra(keys.BATCH_FINGERPRINT, self._fp, op="sum")
        for name, parts in self._streams.items():
            probe.set_extra(keys.LOSS_STREAM_PREFIX + name, torch.stack(parts).mean(), op="mean")
        self._fp = None
        self._streams = {}
        if step % self._every_n:
            probe.discard_step()
            return
        # Under DeepSpeed the engine is where the ZeRO partitions live; elsewhere the optimizer.
        opt = self.trainer.model_wrapped if self._is_deepspeed() else optimizer
        probe.finish_step(step, optimizer=opt)

    def _observe(self, records, state) -> None:
        for record in records:
            findings = self.run.observe(record)
            self._to_report.update(reporter_scalars(record, findings))
            self._finding_pending = self._finding_pending or bool(findings)

    def _act(self, args, state, control) -> None:
        c = self.run.control
        try:
            if not c.state_is_good:
                # Damaged weights (NaN, unrecovered divergence): no save of any kind, or the
                # Trainer's rotation could delete the last good checkpoint.
                if control.should_save:
                    self._warn("no-bad-save", "stability: not saving checkpoints from step %d on: "
                               "the monitor says the weights are damaged", state.global_step)
                control.should_save = False
            elif c.save_now:
                control.should_save = True

            # The interval decided at the previous step governs this one: DefaultFlowCallback ran
            # before this hook and already tested `global_step % state.save_steps`.
            prev = self._bumped_interval
            if (prev and c.state_is_good and args.save_strategy != "steps"
                    and state.global_step % prev == 0):
                control.should_save = True   # the Trainer reads save_steps only for "steps"
            bumped = c.save_interval_steps
            if bumped and self._user_save_steps:
                bumped = min(bumped, self._user_save_steps)   # a bump never makes saves rarer
            self._bumped_interval = bumped
            wanted = bumped or self._user_save_steps
            if wanted and state.save_steps != wanted:
                state.save_steps = wanted

            if c.stop:
                control.should_training_stop = True
                # Stopping does not save by itself (FRAMEWORK_NOTES 1.4); save only good weights.
                control.should_save = bool(c.state_is_good)
            c.step_done()
        except Exception:
            self._degrade("act", "carrying out the monitor's requests failed")

    def _report(self, control) -> None:
        if not self.log_to_reporters or self.trainer is None or not self._to_report:
            return
        # At the Trainer's logging steps, and at once for a finding (its step is the news).
        if not (control.should_log or self._finding_pending or control.should_training_stop):
            return
        logs, self._to_report, self._finding_pending = self._to_report, {}, False
        try:
            keep = control.should_log
            self.trainer.log(logs)
            # trainer.log runs on_log, which clears should_log: the Trainer's own line for this
            # step would vanish (FRAMEWORK_NOTES pitfall H4).
            control.should_log = keep
        except Exception:
            self._degrade("report", "logging to the Trainer's reporters failed")

    # ------------------------------------------------------------------ checkpoints and resume
    def on_save(self, args, state, control, **kwargs):
        if self._off():
            return
        try:
            # host-sync: a checkpoint is a sync point anyway; the saved state must include every
            # step up to this one.
            self._observe(self.probe.flush(), state)
            path = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
            self.run.checkpoint_saved(state.global_step, path)
            if state.is_world_process_zero and os.path.isdir(path):
                blob = {"step": state.global_step, "live": self.run.state_dict()}
                tmp = os.path.join(path, STATE_FILE + ".tmp")
                with open(tmp, "w") as fh:
                    json.dump(blob, fh, allow_nan=True)
                os.replace(tmp, os.path.join(path, STATE_FILE))
        except Exception:
            self._degrade("save-state", "saving the stability state into the checkpoint failed")

    def _load_state(self, ckpt: str) -> None:
        path = os.path.join(ckpt, STATE_FILE)
        if not os.path.isfile(path):
            self._warn("no-state", "stability: %s has no %s; detectors start fresh", ckpt, STATE_FILE)
            return
        with open(path) as fh:
            blob = json.load(fh)
        self.run.load_state_dict(blob["live"])

    def on_train_end(self, args, state, control, **kwargs):
        if self.run is None:
            return
        try:
            if self.probe is not None and not self._failed:
                self._observe(self.probe.flush(), state)   # host-sync: end of training
        except Exception:
            self._degrade("flush", "flushing the last records failed")
        finally:
            self.run.close()   # never raises
            if self._hook is not None:
                self._hook.remove()
                self._hook = None

    def close(self) -> None:
        """Undo :meth:`bind` (the trainer's methods are restored)."""
        if self._patches is not None:
            self._patches.restore()

    # --------------------------------------------------------------------------------- misc
    def _off(self) -> bool:
        return self._failed or self.run is None or self.probe is None

    def _is_deepspeed(self) -> bool:
        return self.trainer is not None and bool(getattr(self.trainer, "is_deepspeed_enabled", False))

    @property
    def findings(self) -> list:
        """Every finding of this run so far (from the LiveRun)."""
        return list(getattr(self.run, "findings", []) or [])


def _save_steps_from_args(args, max_steps: int) -> int | None:
    """The user's save interval as the Trainer computes it (TrainerState.compute_steps)."""
    n = getattr(args, "save_steps", None)
    if n is None:
        return None
    if n < 1:
        n = math.ceil(max_steps * n)
    return int(n) or None
