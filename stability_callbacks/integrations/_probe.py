"""Sync-free per-step sampling shared by the HF, Lightning and DeepSpeed integrations.

What a step costs (DESIGN 3.1-3.3):

* Per-step scalars (loss, grad norm, loss scale, skip flag, extras) stay **device tensors**. At
  the end of the step they are packed into one small float64 vector, reduced across ranks with
  **one** collective, and copied to pinned host memory with ``non_blocking=True``; a CUDA event
  marks it. :meth:`StepProbe.poll` hands out a step's record ``lag_steps`` steps later (default
  1 on accelerators, when that copy has long landed, so the wait on its event is free) — the
  same step on every rank. On CPU the copy is immediate and the default lag is 0.
* Adam ``exp_avg_sq`` max and L1 (:mod:`._reductions`) are read from the local state
  (:mod:`._optim_state`: rank-local ZeRO partitions, FSDP2 shards, or the replicated DDP/ZeRO-0
  state) with one read of the state per sampled step. Alignment padding (ZeRO) is excluded
  from every statistic.
* ``adam/beta2`` and ``adam/step`` come with the Adam statistics, for their bias correction:
  host values every rank has (the param groups' betas; the state's ``step``, a CPU tensor unless
  the optimizer is capturable/fused), so no reduction; a device ``step`` rides in the packed vector.
* Nothing calls ``.item()``; every deliberate host sync carries a ``# host-sync:`` comment.

Cross-rank reduction: one ``all_gather`` of the packed vector, then each rank reduces the
``world x slots`` matrix locally in the same order, so every rank gets bit-identical values and
takes the same decisions; this gives SUM, MAX, MIN and MEAN from a single collective. The fixed
slots and their reductions are the table ``SLOTS`` below; extras use the ``op`` given to
:meth:`StepProbe.set_extra` (sum, mean, max, min).

Float values given to ``set_grad_norm``/``set_loss_scale``/``set_skipped``/``set_lr`` are host
values the framework already made global (DeepSpeed's ``cur_scale``, ``skipped_steps``,
ZeRO-0's float norm): they skip the collective and go straight into the record.
"""
from __future__ import annotations

import logging
import math
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, Mapping, NamedTuple

import torch

from stability_callbacks import keys
from stability_callbacks.live import Guard
from stability_callbacks.record import StepRecord

from ._optim_state import NoSecondMoment, adam_beta2_and_step, optimized_params
from ._reductions import param_sq_sum, second_moment_stats

try:  # torch.distributed is optional in some builds
    import torch.distributed as dist
except ImportError:  # pragma: no cover - torch built without distributed
    dist = None

try:
    from torch.distributed.tensor import DTensor
except ImportError:  # pragma: no cover - older torch / no distributed
    DTensor = None

log = logging.getLogger("stability_callbacks")

__all__ = ["StepProbe", "SLOTS", "REDUCE_OPS"]

REDUCE_OPS = ("sum", "mean", "max", "min")

_ONCE = Guard()   # process-wide: one warning per problem, whichever probe meets it


class Slot(NamedTuple):
    op: str                       # cross-rank reduction
    every_rank: bool = False      # a state statistic: left out unless every rank reported it
    finish: Callable[[float], float] | None = None   # on the host, after the reduction


#: The fixed slots of the packed vector, in this order on every rank and every step, so the one
#: collective always matches; an absent value travels with presence 0. A partitioned statistic
#: (ZeRO >= 1, BF16_Optimizer, FSDP2: disjoint shards) is summed; a replicated one (DDP, ZeRO-0:
#: identical on every rank, so summing would multiply it by the world size) uses MAX instead.
SLOTS: dict[str, Slot] = {
    keys.LOSS: Slot("mean"),                 # per-rank losses differ: mean of those reported
    keys.GRAD_NORM: Slot("max"),             # the framework's norm is already global
    keys.LOSS_SCALE: Slot("min"),            # identical on every rank; min is conservative
    keys.SKIPPED: Slot("max", finish=lambda v: 1.0 if v > 0 else 0.0),   # found_inf or a count
    keys.ADAM_V_MAX: Slot("max", every_rank=True),
    keys.ADAM_V_L1: Slot("sum", every_rank=True),                        # MAX when replicated
    keys.ADAM_V_NUMEL: Slot("sum", every_rank=True, finish=lambda v: float(round(v))),
    keys.PARAM_NORM: Slot("sum", every_rank=True, finish=math.sqrt),     # sum of squares
    keys.ADAM_STEP: Slot("max"),   # only a device `step` (capturable/fused Adam); else a host value
}
_SLOT_LIST = list(SLOTS.values())


@dataclass
class _Pending:
    step: int
    ops: list           # op per slot
    names: list         # metric key per slot
    host: dict          # host values (already global)
    buf: torch.Tensor   # (world, 2 * slots) on the host, or still being copied
    event: Any          # torch.cuda.Event or None


class StepProbe:
    """Per-step sampling on the device, one packed collective, records one step late.

    Keyword arguments (the config): ``device`` (where the model computes; default: the device
    of the first loss given), ``process_group`` (the data-parallel group; None = default group
    when torch.distributed is initialised), ``adam_every_n_steps`` (0 = never),
    ``param_norm_every_n_steps`` (0 = never), ``extra_reductions`` (name -> default op for
    :meth:`set_extra`), ``lag_steps`` (records come out this many steps late; None = 0 on CPU,
    1 on accelerators; see :meth:`poll`).

    Every rank must call :meth:`finish_step` for the same steps (it runs the collective). Under
    torch.distributed only extras declared in ``extra_reductions`` are reduced and recorded
    (the same names on every rank keep the packed layout identical; a declared extra a rank
    did not set this step is left out of that step's reduction); others are dropped with one
    warning. In a single process every extra is recorded.

    >>> import torch
    >>> model = torch.nn.Linear(4, 1)
    >>> opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    >>> probe = StepProbe(adam_every_n_steps=1)
    >>> for step in range(1, 3):
    ...     for _ in range(2):                          # 2 micro-batches (GA = 2)
    ...         loss = model(torch.ones(8, 4)).pow(2).mean() / 2
    ...         loss.backward()
    ...         probe.add_loss(loss)
    ...     norm = probe.compute_grad_norm(model.parameters())   # device tensor (clip with it)
    ...     probe.set_lr(opt.param_groups[0]["lr"])
    ...     opt.step(); opt.zero_grad()
    ...     probe.finish_step(step, optimizer=opt)
    >>> records = probe.poll() + probe.flush()          # CPU: ready at once
    >>> [r.step for r in records], sorted(records[-1].metrics)[:5]   # doctest: +NORMALIZE_WHITESPACE
    ([1, 2], ['adam/beta2', 'adam/exp_avg_sq_l1', 'adam/exp_avg_sq_max', 'adam/exp_avg_sq_numel',
              'adam/step'])
    >>> records[-1].metrics["adam/beta2"], records[-1].metrics["adam/step"]
    (0.999, 2.0)
    """

    def __init__(self, *, device=None, process_group=None, adam_every_n_steps: int = 1,
                 param_norm_every_n_steps: int = 0,
                 extra_reductions: Mapping[str, str] | None = None,
                 lag_steps: int | None = None):
        for key, val in (("adam_every_n_steps", adam_every_n_steps),
                         ("param_norm_every_n_steps", param_norm_every_n_steps)):
            if isinstance(val, bool) or not isinstance(val, int) or val < 0:
                raise ValueError(f"{key} must be an integer >= 0, got {val!r}")
        if lag_steps is not None and (isinstance(lag_steps, bool) or not isinstance(lag_steps, int)
                                      or lag_steps < 0):
            raise ValueError(f"lag_steps must be None or an integer >= 0, got {lag_steps!r}")
        extra_reductions = dict(extra_reductions or {})
        for name, op in extra_reductions.items():
            if op not in REDUCE_OPS:
                raise ValueError(f"extra_reductions.{name} must be one of {REDUCE_OPS}, got {op!r}")
        self.device = None if device is None else torch.device(device)
        self.process_group = process_group
        self.adam_every_n_steps = adam_every_n_steps
        self.param_norm_every_n_steps = param_norm_every_n_steps
        self.extra_reductions = extra_reductions
        self.lag_steps = lag_steps
        self._pending: deque[_Pending] = deque()
        self._consts: dict[float, torch.Tensor] = {}
        self._adam_disabled = False
        self._param_norm_disabled = False
        self._prev_scale: torch.Tensor | None = None
        self._reset_step()

    # ---- per-step inputs (all cheap, none syncs) ---------------------------------------------
    def _reset_step(self) -> None:
        self._loss: torch.Tensor | None = None
        self._dev: dict[str, torch.Tensor] = {}       # slot key -> device tensor
        self._host: dict[str, float] = {}
        self._extras: dict[str, tuple] = {}           # name -> (value, op)
        self._skip_from_scale = False

    def _adopt_device(self, t: torch.Tensor) -> None:
        if self.device is None:
            self.device = t.device

    def add_loss(self, loss, *, divide_by: float = 1.0) -> None:
        """Add one micro-batch's loss (a tensor, as the framework returns it, usually already
        divided by the accumulation steps; pass ``divide_by`` when it is not). Accumulated on
        the device out of place (the caller's tensor is never modified)."""
        if not isinstance(loss, torch.Tensor):
            loss = torch.tensor(float(loss))
        self._adopt_device(loss)
        v = loss.detach()
        if v.numel() != 1:
            v = v.float().mean()
        v = v.reshape(()).float()
        if divide_by != 1.0:
            v = v / divide_by
        self._loss = v if self._loss is None else self._loss + v

    def set_grad_norm(self, value) -> None:
        """The framework's pre-clip, unscaled, global grad norm (tensor, float or None)."""
        if value is None:
            return
        if isinstance(value, torch.Tensor):
            if DTensor is not None and isinstance(value, DTensor):
                value = value.full_tensor()  # a collective, not a host sync (FSDP2 norms)
            self._dev[keys.GRAD_NORM] = value.detach()
            self._host.pop(keys.GRAD_NORM, None)   # the latest reading wins
        else:
            self._host[keys.GRAD_NORM] = float(value)

    def compute_grad_norm(self, parameters, norm_type: float = 2.0) -> torch.Tensor | None:
        """Global grad norm with one foreach reduction, for frameworks that expose none.

        Returns the device tensor so the caller can clip with it
        (``torch.nn.utils.clip_grads_with_norm_``). Call it before clipping (pre-clip norm).
        DTensor grads (FSDP2) are completed with one all_reduce by ``full_tensor()``; plain DDP
        grads are already all-reduced, so the local norm is global.
        """
        grads = [p.grad for p in parameters if getattr(p, "grad", None) is not None]
        if not grads:
            return None
        norm = torch.nn.utils.get_total_norm(grads, norm_type, error_if_nonfinite=False,
                                             foreach=None)
        if DTensor is not None and isinstance(norm, DTensor):
            norm = norm.full_tensor()
        self._adopt_device(norm)
        self._dev[keys.GRAD_NORM] = norm.detach()
        return norm

    def set_lr(self, lr: float) -> None:
        """The LR used by this step (a host float; identical on every rank)."""
        self._host[keys.LR] = float(lr)

    def set_loss_scale(self, value, *, detect_decrease: bool = False) -> None:
        """Loss scale (device tensor such as ``GradScaler._scale``, or a host float such as
        DeepSpeed's ``cur_scale``). Prefer the scale used by this step with ``found_inf``
        (:func:`grad_scaler_readings`). Where only the scale is at hand, pass the scale read
        **after** ``scaler.update()`` with ``detect_decrease=True``: when :meth:`set_skipped`
        was not called, ``skipped`` is then derived on the device as "lower than at the previous
        call" (a torch GradScaler lowers its scale exactly on an overflow; DeepSpeed ZeRO's
        hysteresis does not, so use its ``skipped_steps`` there)."""
        if value is None:
            return
        if isinstance(value, torch.Tensor):
            v = value.detach().reshape(()).to(torch.float64)
            if detect_decrease:
                if self._prev_scale is not None:
                    self._skip_from_scale = (v, self._prev_scale)
                self._prev_scale = v.clone()
            self._dev[keys.LOSS_SCALE] = v
        else:
            self._host[keys.LOSS_SCALE] = float(value)

    def set_skipped(self, value) -> None:
        """Whether the optimizer step was skipped: a device tensor (e.g. ``found_inf``: > 0 means
        skipped) or a host bool/float (DeepSpeed ``skipped_steps`` delta)."""
        if value is None:
            return
        if isinstance(value, torch.Tensor):
            self._dev[keys.SKIPPED] = value.detach().reshape(-1).sum()
        else:
            self._host[keys.SKIPPED] = 1.0 if float(value) > 0 else 0.0

    def set_extra(self, name: str, value, op: str | None = None) -> None:
        """A further per-step value reduced across ranks with ``op`` (sum, mean, max, min),
        e.g. ``batch_fingerprint`` (sum) or ``loss/<stream>`` (mean)."""
        op = op or self.extra_reductions.get(name, "sum")
        if op not in REDUCE_OPS:
            raise ValueError(f"op for extra {name!r} must be one of {REDUCE_OPS}, got {op!r}")
        if isinstance(value, torch.Tensor):
            value = value.detach().reshape(-1).sum() if value.numel() != 1 else \
                value.detach().reshape(())
        else:
            value = float(value)
        self._extras[name] = (value, op)

    def set_value(self, key: str, value: float) -> None:
        """A host float that is already identical on every rank (e.g. ``consumed_samples``)."""
        self._host[key] = float(value)

    def discard_step(self) -> None:
        """Forget what this step accumulated (for steps the sampling cadence skips)."""
        self._reset_step()

    # ---- end of step ----------------------------------------------------------------------------
    def finish_step(self, step: int, *, optimizer=None, model=None) -> None:
        """Close the step: Adam / param-norm stats on their cadence, pack, one collective when
        distributed, non-blocking copy to the host. Never raises for a monitoring failure
        (logs once and degrades); a collective that fails is a distributed failure and does."""
        step = int(step)
        world = _world_size(self.process_group)
        want_adam = (self.adam_every_n_steps > 0 and not self._adam_disabled
                     and step % self.adam_every_n_steps == 0 and optimizer is not None)
        want_pnorm = (self.param_norm_every_n_steps > 0 and not self._param_norm_disabled
                      and step % self.param_norm_every_n_steps == 0
                      and (optimizer is not None or model is not None))
        replicated: dict[str, str] = {}   # slot key -> "max" for replicated state
        if want_adam:
            self._sample_adam(optimizer, replicated)
        if want_pnorm:
            self._sample_param_norm(optimizer, model, replicated)
        if self._loss is not None:
            self._dev[keys.LOSS] = self._loss   # NaN/Inf travel as values: the NonFinite detector reads them
        if self._skip_from_scale and keys.SKIPPED not in self._dev and keys.SKIPPED not in self._host:
            cur, prev = self._skip_from_scale
            self._dev[keys.SKIPPED] = cur < prev

        values: list = [self._dev.get(k) for k in SLOTS]
        ops = [replicated.get(k, slot.op) for k, slot in SLOTS.items()]
        names: list = list(SLOTS)
        host = dict(self._host)
        if world > 1:
            # The packed layout must be identical on every rank, so across ranks only the
            # extras declared at construction travel (absent ones with presence 0). An extra
            # set on one rank only would otherwise change the size of its vector and hang the
            # collective.
            extra_names = sorted(self.extra_reductions)
            undeclared = sorted(set(self._extras) - set(self.extra_reductions))
            if undeclared:
                _ONCE.warn_once("undeclared-extra:" + ",".join(undeclared),
                                "stability: extras %s are not in extra_reductions and are dropped "
                                "under torch.distributed (declare them on every rank)", undeclared)
        else:
            extra_names = sorted(self._extras)
        for name in extra_names:
            value, op = self._extras.get(name, (None, self.extra_reductions.get(name, "sum")))
            if isinstance(value, float) and world == 1:
                host[name] = value          # nothing to reduce
                continue
            values.append(value)
            ops.append(op)
            names.append(name)
        self._reset_step()
        try:
            buf, event = self._pack_reduce_copy(values, world)
        except Exception:
            self._pending.clear()
            raise
        self._pending.append(_Pending(step, ops, names, host, buf, event))

    def _sample_adam(self, optimizer, replicated: dict) -> None:
        try:
            st = second_moment_stats(optimizer)
        except NoSecondMoment as e:
            self._adam_disabled = True
            _ONCE.warn_once("no-second-moment", "stability: %s keeps no Adam second moment "
                            "(exp_avg_sq); second-moment statistics are off for this run", e, level=logging.INFO)
            return
        except Exception:  # monitoring never takes training down
            self._adam_disabled = True
            log.exception("stability: Adam second-moment statistics failed; turned off")
            return
        if st is None:
            return
        self._sample_adam_hyperparams(optimizer)
        self._dev[keys.ADAM_V_MAX] = st.max
        self._dev[keys.ADAM_V_L1] = st.l1
        self._dev[keys.ADAM_V_NUMEL] = self._const(float(st.numel), st.max.device)
        if not st.partitioned:
            # Replicated state (DDP, ZeRO-0): every rank holds the same values. MAX keeps them
            # (and makes ranks agree bit-for-bit even if float noise differed); SUM would
            # multiply the L1 and the count by the world size.
            replicated[keys.ADAM_V_L1] = replicated[keys.ADAM_V_NUMEL] = "max"

    def _sample_adam_hyperparams(self, optimizer) -> None:
        """``adam/beta2`` and ``adam/step`` beside the second-moment statistics (the bias
        correction needs them). Both are identical on every rank, so no reduction: beta2 is a host
        float from the param groups; ``step`` a host number or CPU tensor (read on the host: no
        device involved), or — capturable/fused Adam — a device tensor the kernels update, which
        travels in the packed vector like the other device scalars (``.item()`` would sync)."""
        try:
            beta2, step = adam_beta2_and_step(optimizer)
        except Exception:  # monitoring never takes training down; the detectors assume defaults
            _ONCE.warn_once("adam-hyperparams", "stability: could not read Adam's beta2/step; "
                            "the bias correction assumes beta2=0.999 and t=the step")
            return
        if beta2 is not None:
            self._host[keys.ADAM_BETA2] = beta2
        if isinstance(step, torch.Tensor):
            if step.device.type == "cpu":
                self._host[keys.ADAM_STEP] = float(step)   # a CPU tensor: no device sync
            else:
                self._dev[keys.ADAM_STEP] = step.detach().reshape(())
        elif step is not None:
            self._host[keys.ADAM_STEP] = float(step)

    def _sample_param_norm(self, optimizer, model, replicated: dict) -> None:
        try:
            tensors, partitioned = optimized_params(optimizer, model)
            sq = param_sq_sum(tensors)
        except Exception:
            self._param_norm_disabled = True
            log.exception("stability: parameter norm failed; turned off")
            return
        if sq is None:
            return
        self._dev[keys.PARAM_NORM] = sq
        if not partitioned:
            replicated[keys.PARAM_NORM] = "max"

    def _const(self, value: float, device) -> torch.Tensor:
        # Cached device constants. torch.full is a fill kernel, not an H2D copy (which would be
        # a blocking copy, i.e. a stream sync, with torch.tensor(..., device="cuda")).
        key = (value, str(device))
        t = self._consts.get(key)
        if t is None:
            if len(self._consts) > 64:
                self._consts.clear()
            t = torch.full((), value, dtype=self._pack_dtype(device), device=device)
            self._consts[key] = t
        return t

    @staticmethod
    def _pack_dtype(device) -> torch.dtype:
        return torch.float32 if torch.device(device).type == "mps" else torch.float64

    def _pack_reduce_copy(self, values: list, world: int):
        dev = self.device or next((v.device for v in values if isinstance(v, torch.Tensor)),
                                  torch.device("cpu"))
        self.device = dev
        dtype = self._pack_dtype(dev)
        one, zero = self._const(1.0, dev), self._const(0.0, dev)
        host_floats = [i for i, v in enumerate(values) if isinstance(v, float)]
        parts, presence = [], []
        for v in values:
            if isinstance(v, torch.Tensor):
                if v.device != dev:
                    v = v.to(dev, non_blocking=True)
                parts.append(v.reshape(()).to(dtype))
                presence.append(one)
            else:
                parts.append(zero)
                presence.append(zero)
        packed = torch.stack(parts + presence)
        if host_floats:
            # Float extras that still need a cross-rank reduction: one small H2D copy.
            idx = torch.tensor(host_floats, dtype=torch.long)
            src = torch.tensor([values[i] for i in host_floats], dtype=dtype)
            n = len(values)
            if dev.type == "cuda":
                src, idx = src.pin_memory(), idx.pin_memory()
            packed = packed.index_put((idx.to(dev, non_blocking=True),),
                                      src.to(dev, non_blocking=True))
            packed = packed.index_put(((idx + n).to(dev, non_blocking=True),),
                                      torch.ones_like(src).to(dev, non_blocking=True))
        if world > 1:
            gathered = torch.empty(world * packed.numel(), dtype=dtype, device=dev)
            # The one collective of the step (all_gather: each rank then applies SUM/MAX/MIN/
            # MEAN itself in the same order, so all ranks get identical values).
            _all_gather_flat(gathered, packed, self.process_group)
            gathered = gathered.reshape(world, -1)
        else:
            gathered = packed.reshape(1, -1)
        if dev.type == "cpu":
            return gathered, None
        host = torch.empty(gathered.shape, dtype=dtype, device="cpu",
                           pin_memory=dev.type == "cuda")
        # Other accelerators (xpu, mps) have no event here: copy synchronously there.
        host.copy_(gathered, non_blocking=dev.type == "cuda")  # host-sync: only on non-CUDA
        event = None
        if dev.type == "cuda":
            event = torch.cuda.Event()
            event.record()
        return host, event

    # ---- getting records out ------------------------------------------------------------------
    @staticmethod
    def _wait(p: _Pending) -> None:
        if p.event is not None:
            p.event.synchronize()  # host-sync: normally a no-op (see poll); flush waits here
            p.event = None

    @property
    def effective_lag_steps(self) -> int:
        if self.lag_steps is not None:
            return self.lag_steps
        return 0 if self.device is None or self.device.type == "cpu" else 1

    def poll(self) -> list[StepRecord]:
        """Records of every step finished at least ``lag_steps`` calls of :meth:`finish_step`
        ago, oldest first (default lag: 0 on CPU, 1 on accelerators).

        The lag is counted in steps, not in "whichever copy happens to have landed", so every
        rank gets the record of step N at the same point of its loop and the Monitor decides
        the same on all ranks (a save or stop must be collective). By then a whole step of
        device work has been queued behind the copy, so the event is normally complete and the
        wait below returns at once; when the host runs further ahead than that it is held back
        to ``lag_steps`` steps of run-ahead.
        """
        out = []
        lag = self.effective_lag_steps
        while len(self._pending) > lag:
            p = self._pending.popleft()
            self._wait(p)  # host-sync: only if the device is > lag_steps behind the host
            out.append(self._decode(p))
        return out

    def flush(self) -> list[StepRecord]:
        """Every pending record (end of training, or before a checkpoint)."""
        out = []
        while self._pending:
            p = self._pending.popleft()
            self._wait(p)  # host-sync: end of training / explicit flush waits for the copies
            out.append(self._decode(p))
        return out

    @property
    def num_pending(self) -> int:
        return len(self._pending)

    @staticmethod
    def _decode(p: _Pending) -> StepRecord:
        rows = p.buf.to(torch.float64).tolist()   # already on the host: no device sync
        n = len(p.ops)
        metrics: dict[str, float] = {}
        for i, (name, op) in enumerate(zip(p.names, p.ops)):
            vals = [r[i] for r in rows if r[n + i] > 0]
            if not vals or name is None:
                continue
            slot = _SLOT_LIST[i] if i < len(_SLOT_LIST) else None   # the rest are extras
            if slot is not None and slot.every_rank and len(vals) != len(rows):
                continue  # a rank's state statistic failed: a partial sum would mislead
            value = _reduce(vals, op)
            metrics[name] = slot.finish(value) if slot is not None and slot.finish else value
        metrics.update(p.host)   # host values are global already (and win over device copies)
        return StepRecord(p.step, metrics)


def _reduce(vals: list[float], op: str) -> float:
    # NaN must win in max/min (Python's max() with NaN depends on order).
    if op in ("max", "min") and any(v != v for v in vals):
        return math.nan
    if op == "max":
        return max(vals)
    if op == "min":
        return min(vals)
    s = math.fsum(vals) if all(math.isfinite(v) for v in vals) else sum(vals)
    return s / len(vals) if op == "mean" else s


def _all_gather_flat(out: torch.Tensor, inp: torch.Tensor, group) -> None:
    # torch 2.13 deprecates all_gather_into_tensor in favour of all_gather_single
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(out, inp, group=group)


def _world_size(group) -> int:
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return 1
    return dist.get_world_size(group)

