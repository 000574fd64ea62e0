"""DeepSpeed engine hook for hand-written training loops (Megatron-DeepSpeed style).

>>> hook = attach(engine, config="configs/pretrain-fp16.yaml", run_dir="out/stability")  # doctest: +SKIP
>>> engine.load_checkpoint(ckpt_dir)          # restores the detector state too      # doctest: +SKIP
>>> for batch in loader:                      # the loop itself does not change       # doctest: +SKIP
...     loss = engine(**batch).loss
...     engine.backward(loss)
...     engine.step()
...     if hook.should_stop:                  # opt-in halt (policy.halt_on: critical)
...         break
>>> hook.close()                                                                      # doctest: +SKIP

DeepSpeed has no callback API (FRAMEWORK_NOTES 3.1), so ``attach`` wraps six engine methods *on
that instance* and leaves the loop alone:

==========================  ===============================================================
``forward``                 hash of the micro-batch's ``input_ids`` (``batch_fingerprint``:
                            the resume auditor's repeated-data check); training mode only
``backward`` / ``scale``    the micro-batch loss as DeepSpeed returns it (loss / GAS), summed
                            on device: the step loss is the mean over its micro-batches, then
                            over the data-parallel ranks in the probe's one packed collective
``_take_model_step``        the optimizer-step boundary (private, see below): the LR is read
                            before it (the LR this step used), grad norm, loss scale, skipped
                            flag and Adam statistics after it; the record is closed there
``step``                    after the engine's step has fully finished: the requests of the
                            Monitor are carried out (save now, bumped save interval, halt)
``save_checkpoint``         every save carries the detector state in ``client_state
                            ["stability"]`` (the user's own saves too); damaged weights
                            (``Control.state_is_good`` false) are never saved
``load_checkpoint``         restores the detector state from the checkpoint actually loaded,
                            and opens a ``resume`` (or, in-process, ``rollback``) segment
==========================  ===============================================================

Why ``_take_model_step``: ``engine.step()`` runs on every micro-batch and calls
``_take_model_step`` exactly once per real optimizer step, in managed and unmanaged gradient
accumulation alike (deepspeed 0.19.8 runtime/engine.py:3505-3565, 3617-3623; FRAMEWORK_NOTES 3.1
option 1). Only around it is ``get_lr()`` the LR the step used (the scheduler steps inside it)
and the skipped-steps delta that of this step. There is no public hook: DeepSpeed's optimizer
post-hooks fire once per param group and never on overflow (notes 3.1 option 3). If a future
version renames it, ``attach`` logs one warning and monitoring is off (training is untouched).

Signals (FRAMEWORK_NOTES 3.2-3.3):

=================  ==========================================================================
grad_norm          ``engine.get_global_grad_norm()`` after the step: pre-clip, unscaled, already
                   global (ZeRO >= 1: a tensor, ``inf`` on an overflow; ZeRO-0 fp16/bf16: a
                   float). ZeRO-0 fp32 keeps none: the hook computes it before the step with one
                   foreach reduction (``StepProbe.compute_grad_norm``; the engine clips later
                   inside the step, so this is the pre-clip norm). Caveat: ZeRO-0 fp16 norms are
                   off by the loss scale (DeepSpeed PR #8393, notes pitfall 12)
lr                 ``engine.get_lr()[0]`` before ``_take_model_step``
loss_scale         ``cur_scale`` after the step (fp16 only; a host float, no sync). ZeRO's
                   scaler has hysteresis, so an overflow need not lower it
skipped            ``engine.skipped_steps`` delta over the step (fp16 only)
adam/*, param_norm the probe reads the rank-local ``exp_avg_sq`` partitions via
                   ``engine.basic_optimizer`` and reduces them exactly
consumed_samples   ``engine.global_samples`` after the step
warmup             ``WarmupLR`` / ``WarmupDecayLR`` / ``WarmupCosineLR``: ``warmup_num_steps`` + 1
                   optimizer steps (unless ``phase.warmup_steps`` is configured)
=================  ==========================================================================

Every rank decides the same, at the same step: the probe reduces every value across ranks
before the Monitor sees it and hands out the record of step ``N`` a fixed number of steps later
on every rank (``StepProbe.poll``: at the end of step ``N`` on CPU, ``N+1`` on accelerators,
when its copy has long landed). Checkpoint saves first flush the probe (a sync point anyway,
and collective, so every rank flushes at the same place).

Actions: ``save_now`` and the bumped ``save_interval_steps`` become
``engine.save_checkpoint(save_dir, tag=f"global_step{N}")`` on **all** ranks (it is collective)
right after ``engine.step()`` of step ``N``; ``stop`` becomes ``hook.should_stop`` (a good state
is saved first). One-shot requests stay readable on ``hook.control`` until the next optimizer
step, for loops that want to act themselves (``save_on_request=False`` leaves saving to them).
:meth:`StabilityHook.apply_rollback` (opt-in, or ``rollback_on_halt=True``) points ``latest`` at
the advised checkpoint and moves newer tags aside (never deletes), so a restart that calls
``engine.load_checkpoint(save_dir)`` resumes from before the instability.

Not covered: the pipeline engine (``train_batch`` steps without ``engine.step()``: records are
taken, requests are not carried out); torch-autocast ZeRO-0 (no grad norm).
"""
from __future__ import annotations

import logging
import os
import re
import shutil
from typing import Any

import torch

from stability_callbacks import keys
from stability_callbacks.integrations._preflight import run_preflight
from stability_callbacks.live import InstancePatches, LogOnce
from stability_callbacks.integrations._probe import StepProbe
from stability_callbacks.integrations._readings import DeepSpeedStep
from stability_callbacks.integrations._reductions import batch_fingerprint

log = logging.getLogger("stability_callbacks")

#: ``client_state`` key of the detector state in every DeepSpeed checkpoint.
CLIENT_STATE_KEY = "stability"
#: Where :func:`roll_back_latest` moves the tags newer than the rollback target.
ROLLED_BACK_DIR = "rolled_back"
_TAG_STEP = re.compile(r"(\d+)$")
_WRAPPED = ("forward", "backward", "scale", "_take_model_step", "step", "save_checkpoint",
            "load_checkpoint")

__all__ = ["attach", "StabilityHook", "roll_back_latest", "CLIENT_STATE_KEY", "ROLLED_BACK_DIR"]


def attach(engine, **kwargs) -> "StabilityHook":
    """Instrument ``engine`` (a ``deepspeed.DeepSpeedEngine``) and return the hook.

    Keyword arguments are those of :class:`StabilityHook`. Call it right after
    ``deepspeed.initialize`` and before ``engine.load_checkpoint`` (so the detector state of the
    loaded checkpoint is restored). Collective-free; call it on every rank.
    """
    return StabilityHook(engine, **kwargs)


class StabilityHook(LogOnce):
    """Live stability monitoring of one DeepSpeed engine (DESIGN 2.6).

    Keyword arguments (the config): ``config`` (path, dict or None = defaults) or ``monitor``
    (a ready ``Monitor``); ``run_dir`` (run log JSONL); ``run_name``; ``save_dir`` (where the
    hook's own saves go; default: the directory of the loop's last ``save_checkpoint``, else
    ``<run_dir>/checkpoints``); ``save_on_request`` (carry out save-now and bumped-interval
    saves; False leaves them to the loop via ``hook.control``); ``rollback_on_halt`` (on a halt
    with rollback advice, point ``latest`` at the advised checkpoint: :meth:`apply_rollback`).
    """

    def __init__(self, engine, *, config: Any = None, monitor: Any = None,
                 run_dir: str | os.PathLike = "out/stability", run_name: str | None = None,
                 save_dir: str | os.PathLike | None = None, save_on_request: bool = True,
                 rollback_on_halt: bool = False):
        for key, val in (("save_on_request", save_on_request), ("rollback_on_halt", rollback_on_halt)):
            if not isinstance(val, bool):
                raise ValueError(f"{key} must be True or False, got {val!r}")
        if not all(hasattr(engine, m) for m in ("backward", "step", "save_checkpoint",
                                                  "load_checkpoint", "get_lr")):
            raise ValueError(f"engine must be a deepspeed engine, got {type(engine).__name__}")
        from stability_callbacks.live import LiveRun

        self.engine = engine
        self.run_dir = os.fspath(run_dir)
        self.save_dir = None if save_dir is None else os.fspath(save_dir)
        self._loop_save_dir: str | None = None   # where the loop itself last saved
        self.save_on_request = save_on_request
        self.rollback_on_halt = rollback_on_halt
        self.run = LiveRun(config=config, monitor=monitor, run_dir=self.run_dir,
                           is_rank0=int(getattr(engine, "global_rank", 0)) == 0, run_name=run_name)
        sampling = self.run.monitor.config["sampling"]
        self._every_n = int(sampling.get("every_n_steps", 1) or 1)
        self.probe = StepProbe(
            process_group=getattr(engine, "data_parallel_group", None),
            adam_every_n_steps=int(sampling.get("adam_every_n_steps", 1) or 0),
            param_norm_every_n_steps=int(sampling.get("param_norm_every_n_steps", 0) or 0),
            extra_reductions={keys.BATCH_FINGERPRINT: "sum"})
        self.saved_steps: list[int] = []      # steps the hook itself saved
        self.stopped_at: int | None = None    # the step after which should_stop turned true
        self._fp: torch.Tensor | None = None
        self._ds = DeepSpeedStep(engine)
        self._started = False
        self._failed = False
        self._warned: set[str] = set()
        self._patches = InstancePatches(engine)   # the engine's wrapped methods
        self._declare_warmup()
        self._wrap_engine()

    # ------------------------------------------------------------------------- public surface
    @property
    def control(self):
        """The Monitor's :class:`~stability_callbacks.control.Control` (requests of this step)."""
        return self.run.control

    @property
    def should_stop(self) -> bool:
        """True once the policy asked for a halt; the same step on every rank."""
        return bool(self.run.control.stop)

    @property
    def findings(self) -> list:
        """Every finding of this run so far."""
        return list(getattr(self.run, "findings", []) or [])

    def apply_rollback(self, save_dir: str | os.PathLike | None = None) -> dict | None:
        """Carry out the rollback advice on disk: ``latest`` names the advised checkpoint's tag and
        newer tags move to ``<save_dir>/rolled_back/`` (nothing is deleted). Call on every rank
        (rank 0 moves, then a barrier). Returns ``{"tag", "moved"}``, or None without advice or
        without an advised checkpoint."""
        advice = self.run.control.rollback
        details = getattr(advice, "details", None) or {}
        step = details.get("checkpoint_step")
        if step is None:
            self._warn("no-rollback-target", "stability: no good checkpoint before the instability "
                       "is known; latest is left as it is")
            return None
        # The advice names the checkpoint as "<save_dir>/<tag>" (how the hook reports saves).
        path = (details.get("checkpoint_path") or "").rstrip("/\\")
        tag = os.path.basename(path) or f"global_step{step}"
        if save_dir is not None:
            target_dir = os.fspath(save_dir)
        else:
            target_dir = os.path.dirname(path) or self._save_dir()
        moved: list[str] = []
        try:
            if self._is_rank0():
                moved = roll_back_latest(target_dir, tag)
        finally:
            _barrier()   # reached on every rank even if rank 0's file moves failed
        return {"tag": tag, "moved": moved}

    def close(self) -> None:
        """Flush the last records, close the run log and restore the engine's methods."""
        try:
            if not self._failed:
                self._observe(self.probe.flush())   # host-sync: end of training
        except Exception:
            self._degrade("flush", "flushing the last records failed")
        finally:
            self.run.close()   # never raises
            self._patches.restore()

    def __enter__(self) -> "StabilityHook":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # ---------------------------------------------------------------------- wiring to engine
    def _wrap_engine(self) -> None:
        e = self.engine
        orig = {name: getattr(e, name, None) for name in _WRAPPED}

        def forward(*args, **kwargs):
            if not self._off() and e.training:
                self._fingerprint(args, kwargs)
            return orig["forward"](*args, **kwargs)

        def backward(loss, *args, **kwargs):
            out = orig["backward"](loss, *args, **kwargs)
            if not self._off():
                try:
                    # DeepSpeed returns loss / GAS (or the loss as given with
                    # scale_wrt_gas=False): summed over the micro-batches it is the step loss.
                    self.probe.add_loss(out if isinstance(out, torch.Tensor) else loss)
                except Exception:
                    self._degrade("loss", "reading the micro-batch loss failed")
            return out

        def scale(loss, *args, **kwargs):
            # torch-style backward (engine.scale(loss).backward()) never enters engine.backward.
            if not self._off():
                try:
                    self.probe.add_loss(loss, divide_by=float(e.gradient_accumulation_steps()))
                except Exception:
                    self._degrade("loss", "reading the micro-batch loss failed")
            return orig["scale"](loss, *args, **kwargs)

        def take_model_step(*args, **kwargs):
            self._before_model_step()
            out = orig["_take_model_step"](*args, **kwargs)
            self._after_model_step()
            return out

        def step(*args, **kwargs):
            before = e.global_steps
            out = orig["step"](*args, **kwargs)
            if e.global_steps != before and not self._off():
                self._act()
            return out

        def save_checkpoint(save_dir, tag=None, client_state=None, *args, **kwargs):
            return self._save(orig["save_checkpoint"], save_dir, tag, client_state, args, kwargs)

        def load_checkpoint(load_dir, *args, **kwargs):
            result = orig["load_checkpoint"](load_dir, *args, **kwargs)
            self._loaded(result)
            return result

        wrappers = {"forward": forward, "backward": backward, "scale": scale,
                    "_take_model_step": take_model_step, "step": step,
                    "save_checkpoint": save_checkpoint, "load_checkpoint": load_checkpoint}
        if orig["_take_model_step"] is None:
            # Without the step boundary there is no record to close: monitoring is off.
            self._warn("no-model-step", "stability: this DeepSpeed engine has no "
                       "_take_model_step; stability monitoring is off for this run")
            self._failed = True
            return
        for name, fn in wrappers.items():
            if orig[name] is None:
                self._warn(f"no-{name}", "stability: this DeepSpeed engine has no %s; the parts of "
                           "monitoring that need it are off", name)
                continue
            self._patches.set(name, fn)

    # ------------------------------------------------------------------------------ per step
    def _fingerprint(self, args, kwargs) -> None:
        try:
            ids = kwargs.get("input_ids")
            if ids is None and args and isinstance(args[0], dict):
                ids = args[0].get("input_ids")
            if ids is None and args:
                ids = args[0]
            if isinstance(ids, torch.Tensor) and not ids.is_floating_point():
                fp = batch_fingerprint(ids)
                self._fp = fp if self._fp is None else self._fp + fp
        except Exception:
            self._degrade("fingerprint", "hashing the micro-batch failed")

    def _before_model_step(self) -> None:
        if self._off():
            return
        e = self.engine
        try:
            if not self._started:
                self._start("resume" if e.global_steps > 0 else "start")
            # The one-shot requests of the previous step were readable until now.
            self.run.control.step_done()
            lr = e.get_lr()
            if lr:
                self.probe.set_lr(float(lr[0]))
            self._ds.mark()
            if self._needs_own_grad_norm():
                # ZeRO-0 fp32 keeps no norm; the engine clips inside _take_model_step, so the
                # grads here are still pre-clip.
                self.probe.compute_grad_norm(e.module.parameters())
        except Exception:
            self._degrade("before-step", "reading the step's inputs failed")

    def _needs_own_grad_norm(self) -> bool:
        e = self.engine
        if getattr(e, "torch_autocast_z0_gradscaler", None) is not None:
            self._warn("autocast-norm", "stability: torch-autocast ZeRO-0 keeps scaled grads "
                       "until inside the step; the grad norm is not monitored")
            return False
        return not (e.fp16_enabled() or e.bfloat16_enabled() or e.zero_optimization())

    def _after_model_step(self) -> None:
        if self._off():
            return
        e = self.engine
        probe = self.probe
        step = int(e.global_steps)
        try:
            self._ds.read_into(probe, grad_norm=True)
            probe.set_value(keys.CONSUMED_SAMPLES, float(e.global_samples))
            if self._fp is not None:
                probe.set_extra(keys.BATCH_FINGERPRINT, self._fp, op="sum")
            self._fp = None
            if step % self._every_n:
                probe.discard_step()
            else:
                probe.finish_step(step, optimizer=e)
            # The probe hands out a step's record a fixed number of steps late (0 on CPU, 1 on
            # accelerators), the same step on every rank: decisions stay collective-safe.
            self._observe(self.probe.poll())
        except Exception:
            self._degrade("after-step", "closing the step's sample failed")

    def _observe(self, records) -> None:
        for record in records:
            self.run.observe(record)

    def _act(self) -> None:
        c = self.run.control
        step = int(self.engine.global_steps)
        try:
            if c.stop and self.stopped_at is None:
                self.stopped_at = step
            last = self.saved_steps[-1] if self.saved_steps else None
            if self.save_on_request and c.save_due(step, last):   # a halt saves a good state first
                self.engine.save_checkpoint(self._save_dir(), tag=f"global_step{step}")
                self.saved_steps.append(step)
            if self.stopped_at == step and self.rollback_on_halt and c.rollback is not None:
                self.apply_rollback()
        except Exception:
            self._degrade("act", "carrying out the monitor's requests failed")

    # ------------------------------------------------------------------ checkpoints and resume
    def _save(self, save_fn, save_dir, tag, client_state, args, kwargs):
        if self._off():
            return save_fn(save_dir, tag, client_state if client_state is not None else {},
                           *args, **kwargs)
        e = self.engine
        step = int(e.global_steps)
        client_state = dict(client_state or {})
        try:
            # host-sync: a checkpoint is a sync point anyway, and the saved state must cover every
            # step up to this one. save_checkpoint is collective: every rank flushes here.
            self._observe(self.probe.flush())
            if not self._started:
                self._start("resume" if step > 0 else "start")
        except Exception:
            self._degrade("save-flush", "flushing before the checkpoint failed")
        if not self.run.control.state_is_good:
            # Damaged weights (NaN, divergence, collapse): saving would make `latest` point at
            # them and could rotate out the last good checkpoint. Every rank skips alike.
            self._warn(f"no-bad-save-{step}", "stability: not saving the checkpoint of step %d: "
                       "the monitor says the weights are damaged", step)
            return False
        self._loop_save_dir = os.fspath(save_dir)
        name = str(tag) if tag is not None else f"global_step{step}"
        try:
            # Noted before the state is taken, so a resume from this checkpoint knows it.
            self.run.checkpoint_saved(step, os.path.join(os.fspath(save_dir), name))
            client_state[CLIENT_STATE_KEY] = {"step": step, "live": self.run.state_dict()}
        except Exception:
            self._degrade("save-state", "adding the stability state to the checkpoint failed")
        return save_fn(save_dir, tag, client_state, *args, **kwargs)

    def _loaded(self, result) -> None:
        if self._off():
            return
        try:
            load_path, client_state = (result if isinstance(result, tuple) and len(result) == 2
                                       else (None, None))
            if load_path is None:
                return
            reason = "resume"
            if self._started:
                # Rolled back in-process: what was recorded since belongs to the abandoned future.
                self._observe(self.probe.flush())   # host-sync: checkpoint load
                reason = "rollback"
            blob = (client_state or {}).get(CLIENT_STATE_KEY)
            if blob is None:
                self._warn("no-state", "stability: %s has no stability state; detectors start "
                           "fresh", load_path)
            else:   # the Monitor inside checks its state version
                self.run.load_state_dict(blob["live"])
            self._fp = None
            self._ds.mark()
            self._start(reason)
        except Exception:
            self._degrade("load-state", "restoring the stability state failed")

    def _start(self, reason: str) -> None:
        e = self.engine
        self.run.start(int(e.global_steps), reason=reason)
        if reason == "start":
            precision = "fp16" if e.fp16_enabled() else "bf16" if e.bfloat16_enabled() else "fp32"
            run_preflight(self.run, e.module, getattr(e, "basic_optimizer", None),
                          getattr(e, "lr_scheduler", None), precision=precision)
        self._started = True

    def _save_dir(self) -> str:
        return self.save_dir or self._loop_save_dir or os.path.join(self.run_dir, "checkpoints")

    def _declare_warmup(self) -> None:
        if self.run.monitor.config["phase"].get("warmup_steps") is not None:
            return
        sched = getattr(self.engine, "lr_scheduler", None)
        warmup = getattr(sched, "warmup_num_steps", None)
        if isinstance(warmup, int) and warmup > 0:
            # DeepSpeed's warmup schedulers count iterations 0..W-1 as warmup, and optimizer
            # step s runs at iteration s-2 (the scheduler starts at -1 and the first step()
            # only moves it to 0; runtime/lr_schedules.py:755-790): steps 1..W+1 are warmup.
            self.run.monitor.set_warmup_steps(warmup + 1)

    # ------------------------------------------------------------------------- failure policy
    def _off(self) -> bool:
        return self._failed

    def _is_rank0(self) -> bool:
        return int(getattr(self.engine, "global_rank", 0)) == 0


def roll_back_latest(save_dir: str | os.PathLike, tag: str) -> list[str]:
    """Point ``<save_dir>/latest`` at ``tag`` and move every tag with a higher step number into
    ``<save_dir>/rolled_back/`` (kept, never deleted; a name already there gets a ``.1``, ``.2``
    suffix). Returns the moved tags, oldest first. Filesystem only: call it on one rank.

    Raises ``ValueError`` when ``tag`` is not a checkpoint folder in ``save_dir`` or carries no
    step number (``global_step<N>``, ``iter_<N>``, ...).
    """
    save_dir = os.fspath(save_dir)
    if not os.path.isdir(os.path.join(save_dir, tag)):
        raise ValueError(f"tag: {tag!r} is not a checkpoint folder in {save_dir}")
    target = _tag_step(tag)
    if target is None:
        raise ValueError(f"tag: {tag!r} carries no step number")
    newer = sorted((s, name) for name in os.listdir(save_dir)
                   if name != ROLLED_BACK_DIR and os.path.isdir(os.path.join(save_dir, name))
                   and (s := _tag_step(name)) is not None and s > target)
    aside = os.path.join(save_dir, ROLLED_BACK_DIR)
    moved = []
    for _, name in newer:
        os.makedirs(aside, exist_ok=True)
        dest, k = os.path.join(aside, name), 0
        while os.path.exists(dest):
            k += 1
            dest = os.path.join(aside, f"{name}.{k}")
        shutil.move(os.path.join(save_dir, name), dest)
        moved.append(name)
    tmp = os.path.join(save_dir, "latest.tmp")
    with open(tmp, "w") as fh:
        fh.write(tag)
    os.replace(tmp, os.path.join(save_dir, "latest"))
    return moved


def _tag_step(tag: str) -> int | None:
    m = _TAG_STEP.search(tag)
    return int(m.group(1)) if m else None


def _barrier() -> None:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()
