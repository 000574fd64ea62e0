"""Lightning integration: ``Trainer(callbacks=[StabilityCallback(config=..., run_dir=...)])``.

>>> trainer = Trainer(callbacks=[StabilityCallback(config="default", run_dir="out/stability")])  # doctest: +SKIP

The hooks Lightning 2.6 offers feed the shared
:class:`~..torch.session.LiveSession`; the detector state is the callback's ``state_dict``. Where each
signal comes from, how saves, halts and rollbacks go: docs/integrations.md, "Lightning".
"""
from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
from typing import Any

import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.plugins.precision import FSDPPrecision
from lightning.pytorch.strategies import DeepSpeedStrategy, FSDPStrategy   # no deepspeed import

from stability_callbacks.live import InstancePatches
from stability_callbacks.params import flag

from ..deepspeed.readings import DeepSpeedStep
from ..deepspeed.skip_step import gate_engine
from ..torch.adapter import CONFIG_ERRORS, RUN_DIR_NAME, SessionAdapter
from ..torch.preflight import scheduler_warmup
from ..torch.readings import read_grad_scaler, sharded_grad_norm
from .reload import LightningRollBack
from .sampler import install_train_sampler

__all__ = ["StabilityCallback"]

log = logging.getLogger("stability_callbacks")


class StabilityCallback(Callback, SessionAdapter):
    """Live stability monitoring for ``lightning.pytorch.Trainer`` (docs/design.md, "Public API").

    Keyword arguments: those of :class:`~..torch.adapter.SessionAdapter` (``run_dir`` default:
    ``<default_root_dir>/stability``); ``checkpoint_dir`` (where the callback's own saves go;
    default: the ``ModelCheckpoint`` dirpath, else ``<default_root_dir>/checkpoints``);
    ``take_over_clipping`` (reuse the monitored grad norm for norm clipping instead of computing
    it twice; default True); ``log_to_loggers`` (the signals and findings to the trainer's
    loggers, :meth:`_log`; default True).

    Two of these callbacks with different configs keep two states in a checkpoint
    (:attr:`state_key`).
    """

    framework = "lightning"

    def __init__(self, *, config: Any = None, overrides: Any = None, monitor: Any = None,
                 run_dir: str | os.PathLike | None = None, run_name: str | None = None,
                 checkpoint_dir: str | os.PathLike | None = None,
                 take_over_clipping: bool = True, log_to_loggers: bool = True, listeners=()):
        self.take_over_clipping = flag("take_over_clipping", take_over_clipping)
        self.log_to_loggers = flag("log_to_loggers", log_to_loggers)
        SessionAdapter.__init__(self, config=config, overrides=overrides, monitor=monitor, run_dir=run_dir,
                                run_name=run_name, listeners=listeners)
        self.checkpoint_dir = None if checkpoint_dir is None else os.fspath(checkpoint_dir)
        self._resumed, self._last_step = False, 0
        self._norm: torch.Tensor | None = None    # this step's grad norm, for the clipping
        self._clip_patches: InstancePatches | None = None
        self._save_patches: InstancePatches | None = None
        self._own_save = False                     # the callback's own save is under way
        self._noted_step: int | None = None        # the step of the trainer's last save noted
        # backward passes in the first training batch, and whether a game was decided on: several
        # optimizers each stepped on its own loss (a GAN's players) call backward more than once
        self._backwards, self._game_decided = 0, False
        # Lightning reads the key at every hook call (its profiler's names): made once.
        self._state_key = self._generate_state_key(config=_config_id(self.config, monitor))

    @property
    def state_key(self) -> str:
        """The key of this callback's state in a checkpoint (``checkpoint["callbacks"]``), made as
        ``ModelCheckpoint`` and ``EarlyStopping`` make theirs: the class's name and what tells two
        of these callbacks apart, the config as given (:func:`_config_id`), e.g.
        ``StabilityCallback{'config': 'pretrain-fp16'}``."""
        return self._state_key

    # ------------------------------------------------------------------------------ set-up
    def setup(self, trainer, pl_module, stage: str) -> None:
        if stage != "fit" or (self.session is not None and not self.session.closed):
            return
        # A bad config (a sink's unset variable) is the user's error: it fails before step one.
        with self.guard("setup", "starting the stability monitor", fatal=True, passthrough=CONFIG_ERRORS):
            wandb_run = None
            if trainer.is_global_zero:
                for lg in trainer.loggers:
                    if type(lg).__name__ == "WandbLogger":
                        wandb_run = self.guard.call("wandb", lambda lg=lg: lg.experiment)
            # A second fit() with the same callback continues the same Monitor (and run log).
            s = self._open(is_rank0=trainer.is_global_zero, wandb_run=wandb_run,
                           run_dir=os.path.join(trainer.default_root_dir, RUN_DIR_NAME),
                           monitor=self.run.monitor if self.session is not None else None)
            s.report = self.log_to_loggers
            if self.take_over_clipping and not isinstance(trainer.strategy, DeepSpeedStrategy):
                self._take_over_clipping(trainer)
            if self._save_patches is None:
                self._note_saves(trainer)
            if self._auto_rollback() and self._rollback is None:
                self._rollback = LightningRollBack(lambda: self.session, trainer)

    def _wrap_sampler(self, trainer) -> None:
        """The one sampler wrapper into the train loader (the rollback's skips, the forensics'
        index ring), when either is on; what cannot be wrapped is said where it matters."""
        rb = self._rollback
        if rb is None and not self._records_samples():
            return
        # An unexpected failure leaves the loader's own sampler (monitoring never takes training
        # down) and is said where it matters: the findings' samples, the rollback's halt.
        sampler, problem = None, "wrapping the train loader's sampler failed (the log has why)"
        with self.guard("sampler", "wrapping the train loader's sampler"):
            try:
                sampler = install_train_sampler(trainer, skips=rb.skips if rb is not None else lambda: None,
                                                record=self._sample_ring,
                                                start_step=(lambda: trainer.global_step) if rb is not None else None)
                problem = None
            except ValueError as e:
                problem = str(e)
        if problem is not None:
            self.session.run.forensics.unknown_because(problem)
        if rb is not None:
            rb.sampler, rb.sampler_problem = sampler, problem

    def _take_over_clipping(self, trainer) -> None:
        """Clip with the norm this callback already computed (``clip_grads_with_norm_``: the same
        arithmetic as ``clip_grad_norm_``, minus the second norm pass). Wraps the precision
        plugin's ``clip_grad_by_norm`` on this trainer's instance only; FSDP's plugin refuses
        norm clipping and is left alone."""
        precision = trainer.precision_plugin
        if isinstance(precision, FSDPPrecision) or "clip_grad_by_norm" in vars(precision):
            return
        orig, self._clip_patches = precision.clip_grad_by_norm, InstancePatches(precision)

        def clip_grad_by_norm(optimizer, clip_val):
            norm, self._norm = self._norm, None
            if norm is None:
                return orig(optimizer, clip_val)
            params = [p for p in precision.main_params(optimizer) if p.grad is not None]
            torch.nn.utils.clip_grads_with_norm_(params, clip_val, norm)

        self._clip_patches.set("clip_grad_by_norm", clip_grad_by_norm)

    def _note_saves(self, trainer) -> None:
        """Note every checkpoint the trainer writes, with its step and its path:
        ``trainer.save_checkpoint`` wrapped on this trainer's instance, noted once the file is
        written. No hook is given the path (``on_save_checkpoint`` has none), and
        ``ModelCheckpoint`` keeps only its latest save, privately. It saves through this method
        (its step-named file; with ``save_last=True``, then a copy as ``last.ckpt``, the same
        path at every save; ``save_last='link'`` only links), and so does a user's own call.
        Only the first file the trainer saves at a step is noted (the step-named one, not
        ``last.ckpt`` after it; the callback's own save at that step is noted apart: a resume
        from either continues the run log);
        a path saved again holds the newer step from then on (``Policy.note_checkpoint``), so an
        overwritten ``last.ckpt`` is never advised as an older step's checkpoint."""
        orig, self._save_patches = trainer.save_checkpoint, InstancePatches(trainer)

        def save_checkpoint(filepath, *args, **kwargs):
            orig(filepath, *args, **kwargs)
            step = trainer.global_step
            if self._own_save or self._off() or self.session.closed or step == self._noted_step:
                return
            with self.guard("checkpoint", "noting a checkpoint the trainer saved"):
                self._noted_step = step
                self.session.record_save(step, os.fspath(filepath))

        self._save_patches.set("save_checkpoint", save_checkpoint)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Lightning calls this after ``setup`` (``Trainer._run``) with the state saved in the
        checkpoint it resumes from; ``{}``: saved while monitoring was off (fresh detectors)."""
        self._resumed = True
        if state_dict and not self._off():
            self.session.restore(state_dict, "the checkpoint")

    def on_load_checkpoint(self, trainer, pl_module, checkpoint: dict[str, Any]) -> None:
        """Lightning restores each callback's state by its :attr:`state_key`, right after this
        hook. A checkpoint that holds one StabilityCallback state under another key (saved
        before the callback had a key of its own, when it was the class's name; or with the
        config spelled otherwise) restores it into this callback when the trainer has no other
        StabilityCallback: it can be no one else's. Otherwise only the callback whose key
        matches restores a state, and one that finds none says so."""
        states = checkpoint.get("callbacks") or {}
        if self.state_key in states or self._off():
            return
        name = type(self).__qualname__
        theirs = [k for k in states if isinstance(k, str) and (k == name or k.startswith(name + "{"))]
        if not theirs:
            return   # saved without monitoring, or while it was off: fresh detectors (load_state_dict)
        ours = sum(isinstance(cb, StabilityCallback) for cb in trainer.callbacks)
        if len(theirs) == 1 and ours == 1:
            log.info("stability: restoring the state saved as %r into this callback (key %r)",
                     theirs[0], self.state_key)
            self.load_state_dict(copy.deepcopy(states[theirs[0]]))
        elif theirs == [name]:
            log.warning("stability: the checkpoint keeps one %s state under the key of checkpoints "
                        "saved before each callback had its own (%r), and this trainer has %d: "
                        "whose it was is unknown, and the detectors of %r start fresh (resume with "
                        "that callback alone to restore it)", name, name, ours, self.state_key)
        else:
            log.warning("stability: the checkpoint holds no state under this callback's key %r (it "
                        "holds %s); its detectors start fresh. The key follows the config given: "
                        "pass the one the checkpoint was saved with", self.state_key,
                        ", ".join(repr(k) for k in theirs))

    def state_dict(self) -> dict[str, Any]:
        # Requests the records flushed here raise are carried out at the next step boundary
        # (Control's flags persist until step_done()).
        return {} if self._off() else self.guard.call(
            "state", lambda: self.session.checkpoint(self._last_step), {})

    def on_train_start(self, trainer, pl_module) -> None:
        if self._off():
            return
        with self.guard("start", "starting the stability monitor", fatal=True):
            s = self.session
            self._last_step = trainer.global_step
            # A checkpoint without this callback's state is a resume too (fresh detectors).
            reason = "resume" if self._resumed or trainer.ckpt_path else "start"
            scheds = trainer.lr_scheduler_configs
            total = trainer.max_steps if trainer.max_steps > 0 else None
            if scheds and scheds[0].interval == "step" and scheds[0].frequency == 1:
                # stepped after every optimizer step, as HF's: its warmup is read (else: from the LR)
                s.declare_warmup(scheduler_warmup(scheds[0].scheduler, total)[0])
            self._backwards, self._game_decided = 0, len(trainer.optimizers) < 2
            ckpt = None if trainer.ckpt_path is None else os.fspath(trainer.ckpt_path)
            self._begin(trainer.global_step, reason, checkpoint=ckpt, model=pl_module,
                        optimizer=trainer.optimizers[0] if trainer.optimizers else None,
                        scheduler=scheds[0].scheduler if scheds else None, precision=str(trainer.precision),
                        total_steps=total)
            self._wrap_sampler(trainer)
            # CPU copies land at once (poll is deterministic); on accelerators the copy may land
            # at different times on different ranks, so multi-rank runs drain in lockstep.
            s.lockstep = trainer.world_size > 1 and trainer.strategy.root_device.type != "cpu"
            engine = trainer.strategy.deepspeed_engine if isinstance(trainer.strategy, DeepSpeedStrategy) else None
            s.read_engine(None if engine is None else DeepSpeedStep(engine))
            if self._gate is None and trainer.optimizers:
                def next_step() -> int:
                    return trainer.global_step + 1
                if engine is not None:
                    gate_engine(self, engine, next_step=next_step)
                else:
                    self._gate_step(trainer.optimizers[0], next_step=next_step)

    # ------------------------------------------------------------------------------ per step
    def on_before_optimizer_step(self, trainer, pl_module, optimizer) -> None:
        if self._off():
            return
        s = self.session
        s.read_lr(optimizer)   # the LR this step uses; per micro-batch under DeepSpeed
        with self.guard("before-step", "reading the grad norm / loss scale"):
            if s.engine is not None:   # DeepSpeed: grads still sit in p.grad before engine.step()
                if s.engine.engine.is_gradient_accumulation_boundary():
                    s.engine.grad_norm_before_step(s)
                return
            # After unscale_, before update(): the scale this step used and found_inf. A fused
            # optimizer unscales inside its step (MixedPrecision.optimizer_step): no found_inf,
            # grads still scaled.
            scaler = getattr(trainer.precision_plugin, "scaler", None)
            scale, found_inf = read_grad_scaler(s.probe, scaler, optimizer)
            params = list(trainer.precision_plugin.main_params(optimizer))
            if isinstance(trainer.strategy, FSDPStrategy):
                s.before_optimizer_step(grad_norm=sharded_grad_norm(params))
            else:
                self._norm = s.before_optimizer_step(params=params, scaled_by=(
                    scale if scale is not None and found_inf is None else None))
            if scaler is not None and s.skip is not None:   # the scaler's own skip carries it out
                s.skip.merge_into_scaler(scaler, optimizer)

    def on_before_backward(self, trainer, pl_module, loss) -> None:
        if not self._game_decided:
            self._backwards += 1

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self._off():
            return
        s = self.session
        if not self._game_decided:
            # several optimizers, each stepped on its own loss in one batch (a GAN's discriminator,
            # then its generator): a game; one loss for all (Muon beside AdamW) is none
            self._game_decided = True
            if self._backwards > 1:
                s.declare_game(len(trainer.optimizers))
        s.add_micro_batch(loss=outputs.get("loss") if isinstance(outputs, dict) else outputs,
                          input_ids=batch.get("input_ids") if isinstance(batch, dict) else None, batch=batch)
        if isinstance(outputs, dict):
            s.read_model_output(outputs)
        step = trainer.global_step
        if step == self._last_step:
            return            # an accumulation micro-batch (or a skipped training_step)
        self._last_step, self._norm = step, None
        s.end_step(step, optimizer=trainer.optimizers[0] if trainer.optimizers else None,
                   epoch=trainer.current_epoch + 1)
        if s.report:
            with self.guard("log", "logging to the trainer's loggers"):
                self._log(trainer, pl_module)
        self._act(trainer, step)

    def _log(self, trainer, pl_module) -> None:
        """The signals and findings to the trainer's loggers, through each logger's own
        ``log_metrics`` (rank 0 only, as Lightning's loggers are): the signals at Lightning's
        ``log_every_n_steps``, each finding once, at its own step (through ``pl_module.log`` a
        finding's value stays in the step results and is logged again at later logging steps).
        A ``WandbLogger`` is left out when ``actions.wandb`` writes to that same run. Every value
        also goes to ``trainer.callback_metrics`` (``pl_module.log(..., logger=False)``), where
        ``ModelCheckpoint`` or ``EarlyStopping`` can monitor it."""
        step, signals, found = self.session.take_report()
        for name, v in {**signals, **{tag: code for _, tag, code in found}}.items():
            pl_module.log(name, v, on_step=True, on_epoch=False, logger=False)
        rows: dict[int, dict[str, float]] = {}
        if step is not None and step % max(1, trainer.log_every_n_steps) == 0:
            rows[step] = signals
        for at, tag, code in found:
            rows.setdefault(at, {})[tag] = code
        if not rows:
            return
        skip = "WandbLogger" if "wandb" in self.session.run.sinks_on else None
        for lg in trainer.loggers:
            if type(lg).__name__ != skip:
                for at in sorted(rows):
                    lg.log_metrics(rows[at], step=at)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0):
        self._alive()

    def _act(self, trainer, step: int) -> None:
        s = self.session
        with self.guard("act", "carrying out the monitor's requests"):
            if not s.control.state_is_good:
                # Damaged weights (NaN, unrecovered divergence): no save of any kind, or a
                # rotation could delete the last good checkpoint. ModelCheckpoint skips a step
                # it believes saved (ModelCheckpoint._should_skip_saving_checkpoint).
                for cb in trainer.checkpoint_callbacks:
                    if isinstance(cb, ModelCheckpoint):
                        cb._last_global_step_saved = step
            rollback, why, stop = self._requests(step)
            if stop or rollback is not None:   # a rollback: the fit loop wrapper takes it from here
                trainer.should_stop = True
            if why:
                # Collective under DeepSpeed/FSDP: every rank reaches this at the same step.
                mc = trainer.checkpoint_callback
                folder = self.checkpoint_dir or (mc.dirpath if isinstance(mc, ModelCheckpoint) and mc.dirpath
                                                 else os.path.join(trainer.default_root_dir, "checkpoints"))
                path = os.path.join(folder, f"stability-step={step}.ckpt")
                if s.can_save_into(folder, step):
                    try:
                        self._own_save = True   # recorded here, with why (not by _note_saves)
                        trainer.save_checkpoint(path)
                        s.record_save(step, path, why)   # (the trainer's own file at this step is noted too)
                    except OSError as e:
                        s.save_failed(step, e)
                    finally:
                        self._own_save = False
            s.control.step_done()

    # ---------------------------------------------------------------------------------- end
    def on_train_end(self, trainer, pl_module) -> None:
        if self.session is None:
            return
        if not self._off():
            self.session.flush()   # host-sync: end of training
        if not self._rolling:   # a rollback goes on from the checkpoint, in the same session
            self.session.close()   # never raises

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        self._crashed(exception)   # Lightning re-raises it after its callbacks and teardown (_call_and_handle_interrupt)

    def teardown(self, trainer, pl_module, stage: str) -> None:
        self._ungate()
        if self._rollback is not None:
            self._rollback.close()
        for patches in (self._clip_patches, self._save_patches):
            if patches is not None:
                patches.restore()
        self._rollback = self._clip_patches = self._save_patches = None


def _config_id(config: Any, monitor: Any) -> str | None:
    """What tells one StabilityCallback's state from another's: its config as given (a preset
    name or a YAML path as written, a dict by a hash of its settings, a ``Monitor`` by a hash of
    its config's), with its overrides (``+`` a hash of them); None for the defaults. Not
    ``run_dir`` or ``run_name``: they often carry a launch's date, and a resume under a new one
    would lose the state; two callbacks with one config hold the same state (the same
    detectors, fed the same steps). ``config``: the callback's
    :class:`~stability_callbacks.config.Config`."""
    if monitor is not None:
        return "monitor:" + _digest(monitor.config.to_dict())
    given = config.source
    if config.overrides:
        return (given or "default") + "+" + _digest(dict(config.overrides))
    return given


def _digest(settings: Any) -> str:
    text = json.dumps(settings, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]
