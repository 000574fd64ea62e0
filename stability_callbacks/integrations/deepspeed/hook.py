"""DeepSpeed engine hook for hand-written training loops (Megatron-DeepSpeed style).

>>> with attach(engine, config="pretrain-fp16", run_dir="out/stability") as hook:  # doctest: +SKIP
...     engine.load_checkpoint(ckpt_dir)      # restores the detector state too
...     for batch in loader:                  # the loop itself does not change
...         engine.backward(engine(**batch).loss)
...         engine.step()
...         if hook.should_stop:              # opt-in halt (policy.halt_on: critical)
...             break

DeepSpeed has no callback API, so ``attach`` wraps engine methods *on that instance*
(:meth:`StabilityHook._wrap_engine`) and feeds the shared :class:`~..torch.session.LiveSession`;
the detector state rides in ``client_state["stability"]``. Where each signal comes from, how
saves, halts and rollbacks go, what is not covered: docs/integrations.md, "DeepSpeed engine".
"""
from __future__ import annotations

import os
from typing import Any

import torch

from stability_callbacks import keys
from stability_callbacks.live import InstancePatches
from stability_callbacks.params import flag

from ..torch.adapter import RUN_DIR_NAME, SessionAdapter
from ..torch.preflight import scheduler_warmup
from .monitor import engine_monitor_writer
from .readings import DeepSpeedStep
from .reload import DeepSpeedRollBack
from .skip_step import gate_engine

#: ``client_state`` key of the detector state in every DeepSpeed checkpoint.
CLIENT_STATE_KEY = "stability"

__all__ = ["attach", "StabilityHook", "CLIENT_STATE_KEY"]


def attach(engine, **kwargs) -> "StabilityHook":
    """Instrument ``engine`` (a ``deepspeed.DeepSpeedEngine``) and return the hook.

    Keyword arguments are those of :class:`StabilityHook`. Call it right after
    ``deepspeed.initialize`` and before ``engine.load_checkpoint`` (so the detector state of the
    loaded checkpoint is restored). Collective-free; call it on every rank.
    """
    return StabilityHook(engine, **kwargs)


class StabilityHook(SessionAdapter):
    """Live stability monitoring of one DeepSpeed engine (docs/design.md, "Public API"); a
    context manager.

    Keyword arguments: those of :class:`~..torch.adapter.SessionAdapter` (``run_dir`` default:
    ``<save_dir>/stability``, else ``<folder of the loop's load_checkpoint>/stability`` when the
    loop loads one before its first step, else ``./stability``); ``save_dir`` (where the hook's
    own saves go, and the run's folder; default: the directory of the loop's last
    ``save_checkpoint``, else ``<run_dir>/checkpoints``); ``save_on_request`` (carry out save-now
    and bumped-interval saves; False leaves them to the loop via ``hook.control``);
    ``rollback_on_halt`` (on a halt with rollback advice, point ``latest`` at the advised
    checkpoint: :meth:`apply_rollback`).

    An engine whose ``ds_config`` has a ``monitor`` section (``tensorboard``, ``wandb``,
    ``csv_monitor``) also gets the ``stability/...`` scalars through ``engine.monitor``
    (:func:`~.monitor.engine_monitor_writer`).
    """

    framework = "deepspeed"

    def __init__(self, engine, *, config: Any = None, overrides: Any = None, monitor: Any = None,
                 run_dir: str | os.PathLike | None = None, run_name: str | None = None,
                 save_dir: str | os.PathLike | None = None, save_on_request: bool = True,
                 rollback_on_halt: bool = False, listeners=()):
        self.save_on_request = flag("save_on_request", save_on_request)
        self.rollback_on_halt = flag("rollback_on_halt", rollback_on_halt)
        if not all(hasattr(engine, m) for m in ("backward", "step", "save_checkpoint",
                                                  "load_checkpoint", "get_lr")):
            raise ValueError(f"engine must be a deepspeed engine, got {type(engine).__name__}")
        super().__init__(config=config, overrides=overrides, monitor=monitor, run_dir=run_dir, run_name=run_name,
                         listeners=listeners)
        self.engine = engine
        self.save_dir = None if save_dir is None else os.fspath(save_dir)
        # The run's folder: the checkpoint folder when known now; else placed at the loop's
        # load_checkpoint (_loading), else the working directory's.
        self._placed = self.run_dir is not None or self.save_dir is not None
        rank0 = int(getattr(engine, "global_rank", 0)) == 0
        writer = engine_monitor_writer(engine) if rank0 else None
        self._open(is_rank0=rank0, process_group=getattr(engine, "data_parallel_group", None),
                   run_dir=os.path.join(self.save_dir, RUN_DIR_NAME) if self.save_dir else RUN_DIR_NAME,
                   listeners=[writer] if writer is not None else [])
        self._ds = DeepSpeedStep(engine)
        self.session.read_engine(self._ds)
        self.session.run.forensics.unknown_because("the loop does not iterate hook.batches(loader)")
        self._loop_save_dir: str | None = None   # where the loop itself last saved
        self._request: str | None = None         # why the hook's own save_checkpoint call saves
        self._patches = InstancePatches(engine)  # the engine's wrapped methods
        self._rollback = DeepSpeedRollBack(lambda: self.session, engine)
        gate_engine(self, engine, next_step=lambda: int(engine.global_steps) + 1)
        sched = getattr(engine, "lr_scheduler", None)
        if sched is not None:   # DeepSpeed's own (WarmupLR: it starts at iteration -1) or a client one
            self.session.declare_warmup(scheduler_warmup(sched, None)[0])
        self._wrap_engine()

    # ------------------------------------------------------------------------- public surface
    @property
    def saved_steps(self) -> list[int]:
        """The steps the hook itself saved (the monitor's requests)."""
        return [step for step, _ in self.saved]

    def batches(self, loader):
        """Iterate ``loader`` (a torch ``DataLoader`` over a map-style dataset, this rank's
        micro-batches) from the data the engine is at: after ``engine.load_checkpoint`` the
        batches of the steps already trained are left out, after an automatic rollback the
        skipped ones too. ``for batch in hook.batches(loader):`` replaces ``for batch in loader:``
        (needed for ``policy.auto_rollback``, and for the data forensics to name the samples of
        a step: docs/design.md, Forensics); one pass over the loader."""
        return self._rollback.batches(loader, record=self._sample_ring)

    def apply_rollback(self, save_dir: str | os.PathLike | None = None) -> dict | None:
        """Carry out the rollback advice on disk: ``latest`` names the advised checkpoint's tag and
        newer tags move to ``<save_dir>/rolled_back/`` (nothing is deleted). Call on every rank
        (rank 0 moves, then a barrier). Returns ``{"tag", "moved"}``, or None without advice or
        without an advised checkpoint."""
        return self._rollback.apply_advice(save_dir, self._save_dir)

    def close(self) -> None:
        """Flush the last records, close the run log and restore the engine's methods."""
        try:
            self.session.close()   # host-sync: end of training; never raises
        finally:
            self._patches.restore()
            self._ungate()
            if self.session.skip is not None:
                self.session.skip.close()

    def __enter__(self) -> "StabilityHook":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc is not None:   # one critical alert, delivered; the exception goes on unchanged
            self._crashed(exc)
        self.close()

    # ---------------------------------------------------------------------- wiring to engine
    def _wrap_engine(self) -> None:
        e, s = self.engine, self.session
        if getattr(e, "_take_model_step", None) is None:
            # Without the step boundary there is no record to close: monitoring is off.
            self.guard.warn_once("no-model-step", "stability: this DeepSpeed engine has no "
                                 "_take_model_step; stability monitoring is off for this run")
            self.guard.off = True
            return

        def forward(out, *args, **kwargs):
            if not e.training:
                s.alive()   # an evaluation batch: progress, not a hang
                return
            ids = kwargs.get("input_ids")
            if ids is None and args:
                ids = args[0].get("input_ids") if isinstance(args[0], dict) else args[0]
            # The batch as the module was called (forensics.dump_batches): its keyword arguments.
            s.add_micro_batch(input_ids=ids, batch=kwargs or (args[0] if len(args) == 1 else None))
            s.read_model_output(out)

        def backward(out, loss, *args, **kwargs):
            # DeepSpeed returns loss / GAS (or the loss as given with scale_wrt_gas=False):
            # summed over the micro-batches it is the step loss.
            s.add_micro_batch(loss=out if isinstance(out, torch.Tensor) else loss)

        def scale(loss, *args, **kwargs):
            # torch-style backward (engine.scale(loss).backward()) never enters engine.backward.
            s.add_micro_batch(loss=loss, divide_by=float(e.gradient_accumulation_steps()))

        orig_step, orig_save = getattr(e, "step", None), getattr(e, "save_checkpoint", None)

        def step(*args, **kwargs):
            before = e.global_steps
            out = orig_step(*args, **kwargs)
            if e.global_steps != before and not self._off():
                self._act()
            return out

        def save_checkpoint(save_dir, tag=None, client_state=None, *args, **kwargs):
            return self._save(orig_save, save_dir, tag, client_state, args, kwargs)

        for name, before, after in (("forward", None, forward), ("backward", None, backward), ("scale", scale, None),
                                    ("_take_model_step", self._before_model_step, self._after_model_step),
                                    ("load_checkpoint", self._loading, lambda result, *_, **__: self._loaded(result))):
            if not self._wrap(self._patches, name, before=before, after=after):
                self.guard.warn_once(f"no-{name}", "stability: this DeepSpeed engine has no %s; the "
                                     "parts of monitoring that need it are off", name)
        self._patches.set("step", step)   # the engine's own checks make both exist
        self._patches.set("save_checkpoint", save_checkpoint)

    # ------------------------------------------------------------------------------ per step
    def _before_model_step(self, *_, **__) -> None:
        e, s = self.engine, self.session
        with self.guard("before-step", "reading the step's inputs"):
            self._start_once()
            s.control.step_done()   # the one-shot requests of the previous step were readable until now
            s.read_lr(e.optimizer)   # engine.get_lr()'s source: the LR this step uses
            self._ds.mark()
            self._ds.grad_norm_before_step(s)   # where DeepSpeed keeps none

    def _after_model_step(self, *_, **__) -> None:
        e, s = self.engine, self.session
        with self.guard("after-step", "reading DeepSpeed's step"):
            s.probe.set_value(keys.CONSUMED_SAMPLES, float(e.global_samples))
        # The probe hands out a step's record a fixed number of steps late (0 on CPU, 1 on
        # accelerators), the same step on every rank: decisions stay collective-safe.
        s.end_step(int(e.global_steps))

    def _act(self) -> None:
        s, step, rollback = self.session, int(self.engine.global_steps), None
        with self.guard("act", "carrying out the monitor's requests"):
            rollback, why, stop = self._requests(step, interval_saves=self.save_on_request)
            if why and self.save_on_request and s.can_save_into(self._save_dir(), step):   # a halt saves first
                self._request = why
                try:
                    self.engine.save_checkpoint(self._save_dir(), tag=f"global_step{step}")
                except OSError as e:
                    s.save_failed(step, e)
                finally:
                    self._request = None
            if stop and s.stopped_at == step and self.rollback_on_halt and s.control.rollback is not None:
                self.apply_rollback()
        if rollback is not None:   # outside the guard: a failed load is not a monitoring failure
            self._rollback.carry_out(rollback)

    # ------------------------------------------------------------------ checkpoints and resume
    def _save(self, save_fn, save_dir, tag, client_state, args, kwargs):
        client_state = dict(client_state or {})
        if self._off():
            return save_fn(save_dir, tag, client_state, *args, **kwargs)
        s, step, why = self.session, int(self.engine.global_steps), self._request
        # host-sync: a checkpoint is a sync point anyway, and the saved state must cover every
        # step up to this one. save_checkpoint is collective: every rank flushes here.
        s.flush()
        with self.guard("start", "starting the stability monitor"):
            self._start_once()
        # Damaged weights (NaN, divergence, collapse): saving would make `latest` point at them
        # and could rotate out the last good checkpoint. Every rank skips alike.
        if not s.allow_save(step, why or "the loop's save_checkpoint"):
            return False
        self._loop_save_dir = os.fspath(save_dir)
        path = os.path.join(self._loop_save_dir, f"global_step{step}" if tag is None else str(tag))
        with self.guard("save-state", "adding the stability state to the checkpoint"):
            client_state[CLIENT_STATE_KEY] = s.checkpoint(step, path, why)
        return save_fn(save_dir, tag, client_state, *args, **kwargs)

    def _loading(self, load_dir=None, *_, **__) -> None:
        """Before ``engine.load_checkpoint(load_dir, ...)``: a run not placed yet lives next to
        the checkpoints it loads, ``<load_dir>/stability``."""
        if not self._placed and load_dir is not None and not self.session.started:
            self._placed = True
            with self.guard("place", "placing the run next to its checkpoints"):
                self.run.place(os.path.join(os.fspath(load_dir), RUN_DIR_NAME))

    def _loaded(self, result) -> None:
        load_path, client_state = result if isinstance(result, tuple) and len(result) == 2 else (None, None)
        if self._off() or load_path is None:
            return
        with self.guard("load-state", "restoring the stability state"):
            reason = self.session.reload((client_state or {}).get(CLIENT_STATE_KEY), load_path)
            self._ds.mark()
            # load_path is the tag folder's model-states file: the checkpoint is the tag folder.
            folder = os.path.dirname(load_path) if os.path.isfile(load_path) else load_path
            self._start(reason, checkpoint=folder)

    def _start_once(self) -> None:
        if not self.session.started:
            self._start("resume" if self.engine.global_steps > 0 else "start")

    def _start(self, reason: str, checkpoint: str | None = None) -> None:
        e = self.engine
        self._placed = True
        precision = "fp16" if e.fp16_enabled() else "bf16" if e.bfloat16_enabled() else "fp32"
        self._begin(int(e.global_steps), reason, checkpoint=checkpoint, model=e.module,
                    optimizer=getattr(e, "basic_optimizer", None),
                    scheduler=getattr(e, "lr_scheduler", None), precision=precision)

    def _save_dir(self) -> str:
        return self.save_dir or self._loop_save_dir or os.path.join(self.run.run_dir, "checkpoints")
