"""HF ``transformers.Trainer`` integration: add the callback the usual way.

>>> trainer = Trainer(model, args, train_dataset=ds, callbacks=[StabilityCallback(config="default")])  # doctest: +SKIP

HF hands callbacks neither the trainer nor the loss and pre-clip grad norm it computed, so the
callback finds its Trainer (:func:`_find_trainer`) and wraps ``training_step``,
``_get_grad_norm`` and ``train`` on that instance (:meth:`StabilityCallback.bind`). Where each
signal comes from, how saves, halts and rollbacks go: docs/integrations.md, "HF Trainer".
"""
from __future__ import annotations

import copy
import math
import os
import sys
from typing import Any

from transformers import Trainer, TrainerCallback
from transformers.integrations import INTEGRATION_TO_CALLBACK

from stability_callbacks.live import InstancePatches

from ..deepspeed.readings import DeepSpeedStep
from ..deepspeed.skip_step import gate_engine
from ..torch.adapter import CONFIG_ERRORS, RUN_DIR_NAME, SessionAdapter
from ..torch.preflight import scheduler_warmup
from ..torch.readings import read_grad_scaler
from ..torch.auto_rollback import RollBack
from ..torch.session import STATE_FILE
from .reload import HFRollBack
from .sampler import wrap_train_sampler

__all__ = ["StabilityCallback", "STATE_FILE"]

#: Our sinks that write into the tracker run HF's reporter of the same name writes to.
_SAME_RUN_SINKS = ("wandb", "trackio")


class StabilityCallback(TrainerCallback, SessionAdapter):
    """Live stability monitoring for ``transformers.Trainer`` (docs/design.md, "Public API").

    Keyword arguments: those of :class:`~..torch.adapter.SessionAdapter` (``run_dir`` default:
    ``<output_dir>/stability``; ``run_name`` default: the Trainer's ``args.run_name``);
    ``trainer`` (bind now; else the Trainer holding the callback is found); ``log_to_reporters``
    (``stability/...`` scalars to the Trainer's reporters, :meth:`_report`).
    """

    framework = "hf"

    def __init__(self, *, config: Any = None, overrides: Any = None, monitor: Any = None,
                 run_dir: str | os.PathLike | None = None, run_name: str | None = None,
                 trainer: Any = None, log_to_reporters: bool = True, listeners=()):
        SessionAdapter.__init__(self, config=config, overrides=overrides, monitor=monitor, run_dir=run_dir,
                                run_name=run_name, listeners=listeners)
        self.log_to_reporters = bool(log_to_reporters)
        self.trainer = self._patches = self._hook = None
        self._ga, self._user_save_steps = 1, None
        self._data_problem: str | None = "the callback could not find its Trainer (use StabilityCallback.attach)"
        self._save_reason: tuple[int, str | None] | None = None   # the step's save, and why
        if trainer is not None:
            self.bind(trainer)

    @classmethod
    def attach(cls, trainer, **kwargs) -> "StabilityCallback":
        """Create the callback, bind it to ``trainer`` and add it."""
        cb = cls(trainer=trainer, **kwargs)
        trainer.add_callback(cb)
        return cb

    def bind(self, trainer, *, running: bool = False) -> "StabilityCallback":
        """Wrap ``training_step``, ``_get_grad_norm`` and ``train`` on ``trainer``'s instance
        (the loop looks them up at every call). ``Trainer._get_grad_norm`` is private
        (transformers 5.23), but the loop hands its pre-clip norm to no callback; if a later
        version drops it, the grad norm is missing (one warning). ``running``: bound at train
        begin, past this ``train`` call's wrapper: ``Trainer._run_epoch`` (private) carries the
        crash alert instead (not under ``auto_find_batch_size``, which retries), and
        an automatic rollback cannot reach the train loader (it is built already): a halt."""
        if self.trainer is trainer:
            return self
        if self.trainer is not None:
            raise ValueError(f"trainer: this StabilityCallback is already bound to {self.trainer!r}")
        self.trainer, self._patches = trainer, InstancePatches(trainer)
        if self._auto_rollback():   # re-enters train() from the checkpoint it goes back to
            self._rollback = HFRollBack(lambda: self.session, trainer, late=running)
        if self._rollback is not None or self._records_samples():
            # One wrapper: the rollback skips data through it, the forensics records indices.
            self._data_problem = ("the callback met its Trainer after the train loader was built "
                                  "(add it with Trainer(callbacks=[...]) or StabilityCallback.attach)"
                                  if running else None)
            rollback = self._rollback

            def built(sampler, problem):
                self._data_problem = problem
                if rollback is not None:
                    rollback.built(sampler, problem)
            wrap_train_sampler(trainer, self._patches, record=self._sample_ring, built=built,
                               skips=rollback.skips if rollback is not None else lambda: None)
        train = trainer.train if self._rollback is None else self._rollback.reentering(trainer.train)

        def training_step(loss, model=None, inputs=None, *_, **__):   # inputs: a dict or BatchEncoding
            batch = inputs if hasattr(inputs, "get") else None
            self.session.add_micro_batch(loss=loss, input_ids=batch.get("input_ids") if batch is not None else None,
                                         batch=batch)

        self._wrap(self._patches, "training_step", after=training_step)
        self._patches.set("train", self._reporting_crashes(train))
        if not self._wrap(self._patches, "_get_grad_norm",
                          after=lambda norm, *_, **__: self.session.before_optimizer_step(grad_norm=norm)):
            self.guard.warn_once("no-grad-norm", "stability: Trainer._get_grad_norm is gone in this "
                                 "transformers version; the grad norm is not monitored")
        if running and hasattr(trainer, "_run_epoch") and not trainer.args.auto_find_batch_size:
            self._patches.set("_run_epoch", self._reporting_crashes(trainer._run_epoch))
        return self

    # ----------------------------------------------------------------------- training events
    def on_init_end(self, args, state, control, **kwargs):
        if self.trainer is None:   # Trainer(callbacks=[this]): found inside Trainer.__init__
            with self.guard("find-trainer", "finding the Trainer"):
                trainer, _ = _find_trainer(self)
                if trainer is not None:
                    self.bind(trainer)

    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        # A bad config (a sink's unset variable) raises through the Trainer, before step one.
        with self.guard("start", "starting the stability monitor", fatal=True, passthrough=CONFIG_ERRORS):
            trainer, loop = _find_trainer(self)   # the loop's frame: the checkpoint it resumes from
            if self.trainer is None and trainer is not None:   # trainer.add_callback(this)
                self.bind(trainer, running=True)
            elif self.trainer is None:
                self.guard.warn_once("unbound", "stability: StabilityCallback could not find its "
                                     "Trainer: no grad norm, reporter logging, crash alert or resumed "
                                     "detector state, the loss from the model's forward. Use "
                                     "StabilityCallback.attach(trainer, ...)")
            resume = loop.f_locals.get("resume_from_checkpoint") if loop is not None else None
            resume = os.fspath(resume) if isinstance(resume, (str, os.PathLike)) else None
            # The W&B sink finds the run HF's WandbCallback started (wandb.run) by itself.
            s = self.session if self._rolling else self._open(
                is_rank0=state.is_world_process_zero, run_dir=os.path.join(args.output_dir, RUN_DIR_NAME),
                run_name=self.run_name or getattr(args, "run_name", None))
            s.report = self.log_to_reporters and self.trainer is not None
            if self._data_problem is not None:
                s.run.forensics.unknown_because(self._data_problem)
            self._ga = max(1, int(args.gradient_accumulation_steps))
            # The interval the Trainer saves on (TrainerState.compute_steps; a resume's own).
            self._user_save_steps = state.save_steps if args.save_strategy == "steps" else None
            warmup = self._warmup(args, state, kwargs.get("lr_scheduler"))
            s.declare_warmup(warmup)
            if resume is not None:
                s.restore_file(resume)
            precision = "fp16" if args.fp16 else "bf16" if args.bf16 else "fp32"
            self._begin(state.global_step, "resume" if resume or state.global_step else "start",
                        checkpoint=resume, model=model, optimizer=optimizer, scheduler=kwargs.get("lr_scheduler"),
                        precision=precision, warmup_steps=warmup, total_steps=state.max_steps or None)
            if self._rollback is None and self.trainer is None and self._auto_rollback():
                self._rollback = RollBack(lambda: self.session, "the callback could not find its Trainer (use attach)")
            if model is not None:   # the unwrapped model: its hook fires inside DDP/DeepSpeed too
                self._hook = model.register_forward_hook(self._forward_hook, with_kwargs=True)
            engine = self.trainer.model_wrapped if getattr(self.trainer, "is_deepspeed_enabled", False) else None
            # The grad norm under DeepSpeed: _get_grad_norm's, as without it.
            s.read_engine(None if engine is None else DeepSpeedStep(engine, grad_norm=False))
            if self.trainer is not None and optimizer is not None:
                def next_step() -> int:
                    return state.global_step + 1
                if engine is not None:
                    gate_engine(self, engine, next_step=next_step)
                else:
                    self._gate_step(optimizer, next_step=next_step)

    def _warmup(self, args, state, scheduler) -> int | None:
        """The LR warmup to declare: the Trainer's arguments describe the scheduler the Trainer
        made (``create_scheduler``); one passed in by hand (``optimizers=(opt, sched)``, or
        DeepSpeed's from its config) says its own, read from a copy of it — unknown (None: found
        from the LR as it goes) where it cannot be read."""
        if self.trainer is None or getattr(self.trainer, "_created_lr_scheduler", True) or scheduler is None:
            return args.get_warmup_steps(state.max_steps) if state.max_steps > 0 else 0
        return scheduler_warmup(scheduler, state.max_steps or None)[0]

    def on_step_begin(self, args, state, control, optimizer=None, **kwargs):
        # HF steps the scheduler after the optimizer, and DeepSpeed both inside backward: only
        # now is param_groups the LR this step uses.
        if not self._off():
            self.session.read_lr(optimizer)

    def _forward_hook(self, module, args, kwargs, output) -> None:
        if self._off() or not module.training:
            return
        if self.trainer is None:   # no training_step to read: the forward's loss and batch
            loss = output.get("loss") if hasattr(output, "get") else getattr(output, "loss", None)
            # A loss normalised by num_items_in_batch is already the window's share.
            self.session.add_micro_batch(loss=loss, input_ids=kwargs.get("input_ids"), batch=kwargs, divide_by=(
                1.0 if kwargs.get("num_items_in_batch") is not None else self._ga))
        self.session.read_model_output(output)

    def on_prediction_step(self, args, state, control, **kwargs):
        self._alive()

    def on_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
        # After scaler.update() (accelerate's skip flag is wrong for fused optimizers).
        if not self._off() and self.trainer is not None and self.session.engine is None:
            with self.guard("loss-scale", "reading the loss scale"):
                read_grad_scaler(self.session.probe, self.trainer.accelerator.scaler, optimizer)

    def on_step_end(self, args, state, control, optimizer=None, **kwargs):
        if self._off():
            return
        self.session.end_step(state.global_step, optimizer=optimizer, epoch=_epoch(state.epoch))
        self._act(args, state, control)
        s = self.session   # to the reporters at logging steps, and at once for a finding
        if s.report and (control.should_log or s.finding_pending or control.should_training_stop):
            with self.guard("report", "logging to the Trainer's reporters"):
                self._report(args, state, control)

    def _report(self, args, state, control) -> None:
        """The ``stability/...`` scalars to the Trainer's reporters (``report_to``: its
        TensorBoard, W&B, Trackio, ... callbacks), each through its own ``on_log`` as
        ``Trainer.log`` calls it, but not to the console printers (``PrinterCallback``,
        ``ProgressCallback``) nor into ``log_history``: the Trainer's own line stays the one line
        per logging step. The reporters log at ``state.global_step``: each call gets a copy of
        ``state`` at the step of what it carries (the newest record's signals; each finding at
        its own step). A reporter whose tracker one of our sinks already writes to
        (``actions.wandb`` / ``actions.trackio``: the same run, every ``metrics_every_n_steps``)
        is left out."""
        step, signals, found = self.session.take_report()
        rows: dict[int, dict[str, float]] = {} if step is None else {step: signals}
        for at, tag, code in found:
            rows.setdefault(at, {})[tag] = code
        handler = self.trainer.callback_handler
        ours = self.session.run.sinks_on & set(_SAME_RUN_SINKS)
        reporters = tuple(cls for name, cls in INTEGRATION_TO_CALLBACK.items() if name not in ours)
        for at in sorted(rows):
            at_step = copy.copy(state)
            at_step.global_step = at
            for cb in handler.callbacks:
                if isinstance(cb, reporters):
                    cb.on_log(args, at_step, control, logs=dict(rows[at]), model=handler.model,
                              processing_class=handler.processing_class, optimizer=handler.optimizer,
                              lr_scheduler=handler.lr_scheduler, train_dataloader=handler.train_dataloader,
                              eval_dataloader=handler.eval_dataloader)

    def _act(self, args, state, control) -> None:
        s, step = self.session, state.global_step
        with self.guard("act", "carrying out the monitor's requests"):
            own = control.should_save   # the Trainer's own interval (DefaultFlowCallback ran first)
            rollback, why, stop = self._requests(step, user_interval=self._user_save_steps)
            if stop or rollback is not None:   # should_training_stop does not save by itself
                control.should_training_stop = True
            # Damaged weights: no save (the Trainer's rotation could delete the last good checkpoint).
            own = own and rollback is None and s.allow_save(step, "the Trainer's own save")
            control.should_save = bool(why) or own
            self._save_reason = (step, why)   # why None: the Trainer's own save
            s.control.step_done()

    # ------------------------------------------------------------------ checkpoints and resume
    def on_save(self, args, state, control, **kwargs):
        if self._off():
            return
        with self.guard("save-state", "saving the stability state into the checkpoint"):
            step, path = state.global_step, os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
            why = self._save_reason[1] if self._save_reason and self._save_reason[0] == step else None
            blob = self.session.checkpoint(step, path, why)   # host-sync: flushes every step up to here
            if state.is_world_process_zero and os.path.isdir(path):
                self.session.write_state_file(path, blob)

    def on_train_end(self, args, state, control, **kwargs):
        if self.session is not None and not self._rolling:   # a rollback goes on in the same session
            self.session.close()   # host-sync: the last records; never raises
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        self._ungate()

    def close(self) -> None:
        """Undo :meth:`bind` (the trainer's methods are restored)."""
        if self._patches is not None:
            self._patches.restore()


def _find_trainer(callback, max_frames: int = 32):
    """``(trainer, frame)``: the Trainer whose callback handler holds ``callback``, and the frame
    of the Trainer method that fired the event; ``(None, None)`` when there is none.

    ``CallbackHandler.call_event`` passes callbacks no trainer (transformers 5.23), but runs
    synchronously inside the Trainer's own methods: ``on_init_end`` from ``Trainer.__init__``,
    ``on_train_begin`` from ``Trainer._inner_training_loop``, whose arguments include
    ``resume_from_checkpoint``. The
    trainer is that frame's ``self``, checked to hold this very callback. Twice per run at most.
    """
    frame = sys._getframe(1)
    for _ in range(max_frames):
        if frame is None:
            break
        obj = frame.f_locals.get("self")
        handler = getattr(obj, "callback_handler", None) if isinstance(obj, Trainer) else None
        if handler is not None and any(cb is callback for cb in handler.callbacks):
            return obj, frame
        frame = frame.f_back
    return None, None


def _epoch(progress: float | None) -> int | None:
    """The epoch (from 1) of the step just ended, from ``TrainerState.epoch``: the epoch's index
    plus the part of it done, in (e, e + 1] at its steps (rounded first: e + n/n may print as
    e + 1 + 1e-16)."""
    return max(1, math.ceil(round(progress, 6))) if progress is not None else None
