"""HF ``transformers.Trainer`` integration: one line in the user's script.

>>> StabilityCallback.attach(trainer, config="default", run_dir="out/stability")  # doctest: +SKIP

HF callbacks are never handed the trainer, and two values a monitor must reuse rather than
recompute live only on it: the micro-batch loss (``Trainer.training_step``'s return) and the
pre-clip grad norm (``Trainer._get_grad_norm``'s). ``attach`` adds the callback and wraps those
methods *on that instance*, plus ``train`` to learn which checkpoint a resume loads. Added
without the trainer, the callback runs degraded: the loss from a forward hook, no grad norm, no
reporter logging (one warning says so). The loop around the readings is the shared
:class:`~._session.LiveSession` (FRAMEWORK_NOTES 1.2-1.8):

=================  ==========================================================================
loss               ``training_step``'s detached returns over the GA window (already / GA)
grad_norm          what ``_get_grad_norm`` returns: pre-clip, unscaled, global
lr                 ``param_groups[0]["lr"]`` at ``on_step_begin``: the LR the step uses (also
                   under DeepSpeed, which steps optimizer and scheduler inside backward)
loss_scale/skip    GradScaler ``_scale`` after the step, a skip = a scale decrease (accelerate's
                   flag is wrong for fused optimizers); DeepSpeed: ``cur_scale``, skipped delta
loss/<stream>      a model output's ``stream_losses = {"name": scalar tensor}``
=================  ==========================================================================

Actions, the Trainer's way: ``should_save`` (save now, before a halt); the bumped interval via
``state.save_steps`` (what the Trainer reads); ``should_training_stop``. While the weights are
damaged the Trainer's own saves are suppressed too, so they never rotate out the last good
checkpoint. ``stability/...`` scalars reach the reporters through ``trainer.log`` at logging
steps and findings, keeping ``should_log`` (pitfall H4). Detector state lives in
``checkpoint-N/stability_state.json``, read back from the checkpoint actually resumed from.
Skip step gates the optimizer's ``step`` (:mod:`._skip`); an automatic rollback stops the
Trainer and re-enters ``train(resume_from_checkpoint=...)`` from the ``train`` wrapper, with a
skip-aware sampler (:mod:`._rollback`).
"""
from __future__ import annotations

import json
import math
import os
from typing import Any

import torch
from transformers import TrainerCallback

from stability_callbacks.live import InstancePatches, reporter_scalars

from ._readings import DeepSpeedStep, grad_scaler_readings, step_lr
from ._rollback import HFRollBack, RollBack
from ._session import SessionAdapter
from ._skip import gate_optimizer

#: The detector state's file inside every ``checkpoint-N`` folder.
STATE_FILE = "stability_state.json"

__all__ = ["StabilityCallback", "STATE_FILE"]


class StabilityCallback(TrainerCallback, SessionAdapter):
    """Live stability monitoring for ``transformers.Trainer`` (DESIGN 2.6).

    Keyword arguments: ``config`` (path, dict or None = defaults) or ``monitor`` (a ready
    ``Monitor``); ``run_dir`` (run log JSONL and reports); ``run_name`` (default: the Trainer's
    ``args.run_name``); ``trainer`` (the Trainer to bind to; or use :meth:`attach` /
    :meth:`bind`); ``log_to_reporters`` (``stability/...`` scalars through ``trainer.log``);
    ``listeners`` (:class:`~stability_callbacks.live.RunListener` s: records, findings, actions).
    """

    def __init__(self, *, config: Any = None, monitor: Any = None,
                 run_dir: str | os.PathLike = "out/stability", run_name: str | None = None,
                 trainer: Any = None, log_to_reporters: bool = True, listeners=()):
        SessionAdapter.__init__(self, config=config, monitor=monitor, run_dir=run_dir,
                                run_name=run_name, listeners=listeners)
        self.log_to_reporters = bool(log_to_reporters)
        self.trainer = self._patches = self._resume_path = self._hook = self._ds = None
        self._rollback = self._gate = None
        self._fallback_loss = False
        self._ga = 1
        self._user_save_steps: int | None = None
        self._bumped: int | None = None       # the save interval decided at the last step
        self._save_reason: tuple[int, str | None] | None = None
        self._to_report: dict[str, float] = {}
        self._finding_pending = False
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
        self.trainer, self._patches = trainer, InstancePatches(trainer)
        orig_step, orig_train = trainer.training_step, trainer.train
        orig_norm = getattr(trainer, "_get_grad_norm", None)

        def training_step(*args, **kwargs):
            loss = orig_step(*args, **kwargs)
            inputs = args[1] if len(args) > 1 else kwargs.get("inputs")
            if not self._off():   # inputs: a dict or BatchEncoding (a UserDict, not a dict)
                ids = inputs.get("input_ids") if hasattr(inputs, "get") else None
                self.session.add_micro_batch(loss=None if self._fallback_loss else loss, input_ids=ids)
            return loss

        def _get_grad_norm(*args, **kwargs):
            norm = orig_norm(*args, **kwargs)
            if not self._off():
                self.session.before_optimizer_step(grad_norm=norm)
            return norm

        def train(*args, **kwargs):
            ckpt = kwargs.get("resume_from_checkpoint", args[0] if args else None)
            if ckpt is True:
                from transformers.trainer_utils import get_last_checkpoint
                ckpt = get_last_checkpoint(trainer.args.output_dir)
            self._resume_path = None if ckpt in (None, False) else os.fspath(ckpt)
            out = orig_train(*args, **kwargs)
            # An automatic rollback stopped the Trainer: re-enter from the checkpoint it names.
            while self._rollback is not None and (path := self._rollback.reenter()) is not None:
                self._resume_path = path
                kwargs = {**dict(zip(("resume_from_checkpoint", "trial", "ignore_keys_for_eval"), args)),
                          **kwargs, "resume_from_checkpoint": path}
                args = ()
                out = orig_train(**kwargs)
            return out

        self._patches.set("training_step", training_step)
        if orig_norm is not None:
            self._patches.set("_get_grad_norm", _get_grad_norm)
        else:
            self.guard.warn_once("no-grad-norm", "stability: Trainer._get_grad_norm is gone in this "
                                 "transformers version; the grad norm is not monitored")
        self._patches.set("train", train)
        if self._auto_rollback():
            self._rollback = HFRollBack(lambda: self.session, trainer, self._patches)
        return self

    # ----------------------------------------------------------------------- training events
    def on_train_begin(self, args, state, control, model=None, optimizer=None, **kwargs):
        with self.guard("start", "starting the stability monitor", fatal=True):
            self._begin(args, state, model, optimizer, kwargs.get("lr_scheduler"))

    def _begin(self, args, state, model, optimizer, lr_scheduler) -> None:
        if self.trainer is None:
            self._fallback_loss = True
            self.guard.warn_once("unbound", "stability: StabilityCallback was added without the "
                                 "trainer; use StabilityCallback.attach(trainer, ...) for the grad "
                                 "norm, the Trainer's exact loss and reporter logging. Taking the "
                                 "loss from the model's forward instead.")
        # The W&B sink finds the run HF's WandbCallback started (wandb.run) by itself.
        rolling = self._rollback is not None and self._rollback.pending is not None
        s = self.session if rolling else self._open(
            is_rank0=state.is_world_process_zero, run_name=self.run_name or getattr(args, "run_name", None))
        self._ga = max(1, int(args.gradient_accumulation_steps))
        self._user_save_steps = _save_steps_from_args(args, state.max_steps)
        warmup = args.get_warmup_steps(state.max_steps) if state.max_steps > 0 else 0
        s.declare_warmup(warmup)
        if self._resume_path is not None:
            path = os.path.join(self._resume_path, STATE_FILE)
            blob = self.guard.call("load-state", lambda: _read_json(path)) if os.path.isfile(path) else None
            s.restore(blob, self._resume_path)
        precision = "fp16" if args.fp16 else "bf16" if args.bf16 else "fp32"
        reason = "rollback" if rolling else "start" if self._resume_path is None else "resume"
        s.start(state.global_step, reason, model=model,
                optimizer=optimizer, scheduler=lr_scheduler, precision=precision,
                warmup_steps=warmup, total_steps=state.max_steps or None)
        if rolling:
            self._rollback.restored()
        elif self._rollback is None and self._auto_rollback():
            self._rollback = RollBack(lambda: self.session)   # unbound: every request is a halt
            self._rollback.sampler_problem = "the callback was added without the trainer (use attach)"
        if model is not None:   # the unwrapped model: its hook fires inside DDP/DeepSpeed too
            self._hook = model.register_forward_hook(self._forward_hook)
        engine = None
        if getattr(self.trainer, "is_deepspeed_enabled", False):
            engine = self.trainer.model_wrapped
            self._ds = DeepSpeedStep(engine)
        if self.trainer is not None and optimizer is not None:
            lr_factor = self._rollback.lr_factor(lambda: state.global_step + 1) if self._rollback else None
            self._gate = gate_optimizer(s.skip, engine.optimizer if engine is not None else optimizer,
                                        engine=engine, lr_factor=lr_factor)

    def on_step_begin(self, args, state, control, optimizer=None, **kwargs):
        if not self._off():
            # The LR this step will use: HF steps the scheduler after the optimizer, and
            # DeepSpeed steps both inside backward, so only now is param_groups this step's.
            with self.guard("lr", "reading the learning rate"):
                self.session.probe.set_lr(step_lr(optimizer))

    def _forward_hook(self, module, args, output) -> None:
        if self._off() or not module.training:
            return
        if self._fallback_loss:
            loss = output.get("loss") if hasattr(output, "get") else getattr(output, "loss", None)
            if isinstance(loss, torch.Tensor):
                self.session.add_micro_batch(loss=loss, divide_by=self._ga)
        self.session.read_model_output(output)

    def on_optimizer_step(self, args, state, control, optimizer=None, **kwargs):
        if self._off() or self.trainer is None or self._ds is not None:
            return
        scaler = getattr(self.trainer.accelerator, "scaler", None)
        if scaler is not None:
            with self.guard("loss-scale", "reading the loss scale"):
                # After scaler.update(): a decrease means this step overflowed and was skipped
                # (torch's GradScaler has no hysteresis). found_inf is already forgotten here.
                self.session.probe.set_loss_scale(grad_scaler_readings(scaler, optimizer)[0],
                                                  detect_decrease=True)

    def on_step_end(self, args, state, control, optimizer=None, **kwargs):
        if self._off():
            return
        if self._ds is not None:
            with self.guard("deepspeed", "reading DeepSpeed's step"):
                self._ds.read_into(self.session.probe, grad_norm=False)   # norm: _get_grad_norm
        # Under DeepSpeed the ZeRO partitions live on the engine; elsewhere the optimizer.
        opt = self.trainer.model_wrapped if self._ds is not None else optimizer
        self._collect(self.session.end_step(state.global_step, optimizer=opt))
        self._act(args, state, control)
        self._report(control)

    def _collect(self, pairs) -> None:
        for record, findings in pairs:
            self._to_report.update(reporter_scalars(record, findings))
            self._finding_pending = self._finding_pending or bool(findings)

    def _act(self, args, state, control) -> None:
        s, c, step = self.session, self.session.control, state.global_step
        with self.guard("act", "carrying out the monitor's requests"):
            # The interval decided at the previous step governs this one: DefaultFlowCallback ran
            # before this hook and already tested `global_step % state.save_steps`.
            prev = self._bumped
            if prev and c.state_is_good and args.save_strategy != "steps" and step % prev == 0:
                control.should_save = True   # the Trainer reads save_steps only for "steps"
            rollback = self._rollback.accept(step) if self._rollback is not None else None
            why, stop = s.requests(step, interval_saves=False,   # save now, or before a halt
                                   user_interval=self._user_save_steps)
            if stop or rollback is not None:   # stopping does not save by itself (FRAMEWORK_NOTES 1.4)
                control.should_training_stop = True
            if rollback is not None:   # this branch is abandoned: train() re-enters from the checkpoint
                control.should_save, why = False, None
            if not c.state_is_good:   # or the Trainer's rotation could delete the last good one
                if control.should_save:
                    s.save_blocked(step, "the Trainer's own save")
                control.should_save = False
            elif why:
                control.should_save = True
            if control.should_save:
                if why is None and prev and step % prev == 0 and prev != self._user_save_steps:
                    why = c.save_request(step, interval=prev)
                self._save_reason = (step, why)   # None: the Trainer's own save
            bumped = c.save_interval_steps
            if bumped and self._user_save_steps:
                bumped = min(bumped, self._user_save_steps)   # a bump never makes saves rarer
            self._bumped = bumped
            wanted = bumped or self._user_save_steps
            if wanted and state.save_steps != wanted:
                state.save_steps = wanted
            c.step_done()

    def _report(self, control) -> None:
        # At the Trainer's logging steps, and at once for a finding (its step is the news).
        if not (self.log_to_reporters and self.trainer is not None and self._to_report and (
                control.should_log or self._finding_pending or control.should_training_stop)):
            return
        logs, self._to_report, self._finding_pending = self._to_report, {}, False
        with self.guard("report", "logging to the Trainer's reporters"):
            keep = control.should_log
            self.trainer.log(logs)
            # trainer.log runs on_log, which clears should_log: the Trainer's own line for this
            # step would vanish (FRAMEWORK_NOTES pitfall H4).
            control.should_log = keep

    # ------------------------------------------------------------------ checkpoints and resume
    def on_save(self, args, state, control, **kwargs):
        if self._off():
            return
        s, step = self.session, state.global_step
        # host-sync: a checkpoint is a sync point anyway; the saved state must include every
        # step up to this one.
        self._collect(s.flush())
        with self.guard("save-state", "saving the stability state into the checkpoint"):
            path = os.path.join(args.output_dir, f"checkpoint-{step}")
            why = self._save_reason[1] if self._save_reason and self._save_reason[0] == step else None
            blob = s.checkpoint(step, path, why)
            if state.is_world_process_zero and os.path.isdir(path):
                with open(os.path.join(path, STATE_FILE + ".tmp"), "w") as fh:
                    json.dump(blob, fh, allow_nan=True)
                os.replace(fh.name, os.path.join(path, STATE_FILE))

    def on_train_end(self, args, state, control, **kwargs):
        rolling = self._rollback is not None and self._rollback.pending is not None
        if self.session is not None and not rolling:   # a rollback goes on in the same session
            self.session.close()   # host-sync: the last records; never raises
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if self._gate is not None:
            self._gate.close()
            self._gate = None

    def close(self) -> None:
        """Undo :meth:`bind` (the trainer's methods are restored)."""
        if self._patches is not None:
            self._patches.restore()


def _read_json(path: str) -> dict:
    with open(path) as fh:
        return json.load(fh)


def _save_steps_from_args(args, max_steps: int) -> int | None:
    """The user's save interval as the Trainer computes it (TrainerState.compute_steps)."""
    n = getattr(args, "save_steps", None)
    if n is None:
        return None
    if n < 1:
        n = math.ceil(max_steps * n)
    return int(n) or None
