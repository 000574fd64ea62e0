"""The packed per-step vector of :class:`~.probe.StepProbe`: one small tensor per step, reduced
across ranks with one collective and copied to the host without blocking.

Per-step scalars stay **device tensors**. At the end of the step they are packed into one small
float64 vector (value and presence per slot), reduced across ranks with **one** collective, and
copied to pinned host memory with ``non_blocking=True``; a CUDA event marks it. On the steps
the Adam statistics are sampled, a :class:`Block` of per-parameter-tensor values rides in the same
collective: it is reduced and summarised on the device, and only its fixed-size summary joins
the host copy.
:meth:`PackedSteps.poll` hands out a step's record ``lag_steps`` steps later (default 1 on
accelerators, when that copy has long landed, so the wait on its event is free) — the same step
on every rank. On CPU the copy is immediate and the default lag is 0.

Cross-rank reduction: one ``all_gather`` of the packed vector, then each rank reduces the
``world x slots`` matrix locally in the same order, so every rank gets bit-identical values and
takes the same decisions; this gives SUM, MAX, MIN and MEAN from a single collective. The fixed
slots and their reductions are the table ``SLOTS`` below; extras carry their own op.
"""
from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

import torch

from stability_callbacks import keys
from stability_callbacks.record import StepRecord

try:  # torch.distributed is optional in some builds
    import torch.distributed as dist
except ImportError:  # pragma: no cover - torch built without distributed
    dist = None

__all__ = ["PackedSteps", "Block", "SLOTS", "REDUCE_OPS", "world_size"]

#: A float32's relative resolution: the last digit of a live loss (the device buffer's dtype).
_FLOAT32_ULP = 2.0 ** -23

REDUCE_OPS = ("sum", "mean", "max", "min")


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
    keys.OVERFLOW_SKIPPED: Slot("max", finish=lambda v: 1.0 if v > 0 else 0.0),   # found_inf or a count
    keys.ADAM_V_MAX: Slot("max", every_rank=True),
    keys.ADAM_V_L1: Slot("sum", every_rank=True),                        # MAX when replicated
    keys.ADAM_V_NUMEL: Slot("sum", every_rank=True, finish=lambda v: float(round(v))),
    keys.ADAM_M_NORM: Slot("sum", every_rank=True, finish=math.sqrt),    # sum of squares
    keys.PARAM_NORM: Slot("sum", every_rank=True, finish=math.sqrt),     # sum of squares
    keys.ADAM_STEP: Slot("max"),   # only a device `step` (capturable/fused Adam); else a host value
}
_SLOT_LIST = list(SLOTS.values())


@dataclass
class Block:
    """A section of the packed vector that is reduced and summarised on the device (per-tensor
    values: too many for the host, and a summary of them needs them reduced first).

    ``size``: its length, the same on every rank; ``local``: this rank's values (float64 device
    tensor of ``size``), or None when this rank has none this step (it then sends zeros and the
    summary is left out of the record); ``op``: the cross-rank reduction, ``sum`` (partitioned
    values) or ``max`` (replicated ones); ``summarize(reduced, every_rank)``: the reduced values
    -> a ``[len(names)]`` tensor, on the device (``every_rank``: a device bool, whether every
    rank sent its values); ``names``/``present``: the metric key of each summary entry and
    whether it goes into the record (decided on the host).
    """

    size: int
    local: torch.Tensor | None
    op: str
    summarize: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    names: list
    present: list


@dataclass
class _Pending:
    step: int
    ops: list           # op per slot
    names: list         # metric key per slot
    host: dict          # host values (already global)
    buf: torch.Tensor   # on the host (or still being copied): the (world, 2 * slots) rows, then
                        # with a Block, world presence flags and its summary
    event: Any          # torch.cuda.Event or None
    world: int = 1
    block: Block | None = None
    epoch: int | None = None   # the record's epoch, where the loop counts them


class PackedSteps:
    """The steps finished and not yet handed out: packed, reduced, on their way to the host.

    ``device``: where the values are packed (default: the first value's device);
    ``process_group``: the group of the one collective (None: the default group);
    ``lag_steps``: records come out this many steps late (None: 0 on CPU, 1 on accelerators).
    """

    def __init__(self, *, device=None, process_group=None, lag_steps: int | None = None):
        self.device = None if device is None else torch.device(device)
        self.process_group = process_group
        self.lag_steps = lag_steps
        self._pending: deque[_Pending] = deque()
        self._consts: dict[Any, torch.Tensor] = {}

    def push(self, step: int, values: list, ops: list, names: list, host: dict, world: int,
             block: Block | None = None, *, epoch: int | None = None) -> None:
        """Pack ``values`` (device tensors, host floats still to reduce, or None: absent) and the
        ``block``, reduce them across the ``world`` ranks with ``ops``, and start the copy to the
        host."""
        try:
            buf, event = self._pack_reduce_copy(values, world, block)
        except Exception:
            self._pending.clear()
            raise
        self._pending.append(_Pending(step, ops, names, host, buf, event, world, block, epoch))

    def const(self, value: float, device) -> torch.Tensor:
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

    def _pack_reduce_copy(self, values: list, world: int, block: Block | None):
        dev = self.device or next((v.device for v in values if isinstance(v, torch.Tensor)),
                                  torch.device("cpu"))
        self.device = dev
        dtype = self._pack_dtype(dev)
        one, zero = self.const(1.0, dev), self.const(0.0, dev)
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
        fixed = packed.numel()
        if block is not None:
            local = block.local
            if local is None or local.numel() != block.size:
                local = torch.zeros(block.size, dtype=dtype, device=dev)
                flag = zero
            else:
                local, flag = local.to(dev, dtype, non_blocking=True), one
            packed = torch.cat([packed, flag.reshape(1), local])
        if world > 1:
            gathered = torch.empty(world * packed.numel(), dtype=dtype, device=dev)
            # The one collective of the step (all_gather: each rank then applies SUM/MAX/MIN/
            # MEAN itself in the same order, so all ranks get identical values).
            _all_gather_flat(gathered, packed, self.process_group)
            gathered = gathered.reshape(world, -1)
        else:
            gathered = packed.reshape(1, -1)
        if block is not None:
            values_b = gathered[:, fixed + 1:]
            reduced = values_b.sum(0) if block.op == "sum" else values_b.amax(0)
            every_rank = gathered[:, fixed].amin() > 0   # on the device: no sync
            summary = block.summarize(reduced, every_rank).to(dtype).reshape(-1)
            gathered = torch.cat([gathered[:, :fixed].reshape(-1), gathered[:, fixed], summary])
        if dev.type in ("cpu", "meta"):   # meta: shapes only (the op-count guard), nothing to copy
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
        flat = p.buf.to(torch.float64).reshape(-1).tolist()   # already on the host: no device sync
        n = len(p.ops)
        rows = [flat[r * 2 * n:(r + 1) * 2 * n] for r in range(p.world)]
        metrics: dict[str, float] = {}
        if p.block is not None:
            flags, summary = flat[p.world * 2 * n:p.world * (2 * n + 1)], flat[p.world * (2 * n + 1):]
            if all(f > 0 for f in flags):   # a rank without its values: no summary
                metrics.update((name, value) for name, value, present
                               in zip(p.block.names, summary, p.block.present) if present)
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
        loss = metrics.get(keys.LOSS)
        if loss is not None and loss != 0.0 and math.isfinite(loss) and keys.LOSS_RESOLUTION not in metrics:
            # a live loss is no print: it carries a float32's digits (a loss computed in bf16 lies
            # on a coarser grid, which stall reads from its values): a round value repeated is
            # frozen, not a coarse print (a triplet loss pinned at its margin, 1.0 three times)
            metrics[keys.LOSS_RESOLUTION] = abs(loss) * _FLOAT32_ULP
        return StepRecord(p.step, metrics, epoch=p.epoch)



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


def world_size(group) -> int:
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return 1
    return dist.get_world_size(group)

