"""Sync-free per-step sampling shared by the HF, Lightning and DeepSpeed integrations.

What a step costs (DESIGN 3.1-3.3):

* Per-step scalars (loss, grad norm, loss scale, skip flag, extras) stay **device tensors**. At
  the end of the step they are packed into one small float64 vector, reduced across ranks with
  **one** collective, and copied to pinned host memory with ``non_blocking=True``; a CUDA event
  marks it. :meth:`StepProbe.poll` hands out a step's record ``lag_steps`` steps later (default
  1 on accelerators, when that copy has long landed, so the wait on its event is free) — the
  same step on every rank. On CPU the copy is immediate and the default lag is 0.
* Adam ``exp_avg_sq`` max and L1 are read from the local state (rank-local ZeRO partitions,
  FSDP2 shards, or the replicated DDP/ZeRO-0 state) with one read of the state per sampled step:
  multi-tensor (``torch._foreach_*``) kernels on accelerators; on CPU, where foreach kernels are
  per-tensor loops anyway, one pass of sums over groups of 16 elements, whose sums bound the
  max so that only the few blocks that can hold it are read again. Alignment padding (ZeRO) is
  excluded from every statistic.
* Nothing calls ``.item()``; every deliberate host sync carries a ``# host-sync:`` comment.

Cross-rank reduction (one ``all_gather`` of the packed vector, then each rank reduces the
``world x slots`` matrix locally in the same order, so every rank gets bit-identical values and
takes the same decisions; this gives SUM, MAX, MIN and MEAN from a single collective):

==================  ==========================================================================
loss                mean over the ranks that reported one (per-rank losses differ)
grad_norm           max (the framework's norm is already global: identical on every rank)
loss_scale          min (identical on every rank; min is the conservative reading)
skipped             max, then 1.0 when > 0 (``found_inf`` or a skip count)
adam max            max
adam l1 / numel     SUM when the state is partitioned (ZeRO >= 1, BF16_Optimizer, FSDP2: disjoint
                    shards); MAX when it is replicated (DDP, ZeRO-0: identical on every rank,
                    so summing would multiply by the world size)
param_norm          sum of squares reduced like adam l1, sqrt on the host
extras              the ``op`` given to :meth:`StepProbe.set_extra` (sum, mean, max, min)
==================  ==========================================================================

Float values given to ``set_grad_norm``/``set_loss_scale``/``set_skipped``/``set_lr`` are host
values the framework already made global (DeepSpeed's ``cur_scale``, ``skipped_steps``,
ZeRO-0's float norm): they skip the collective and go straight into the record.
"""
from __future__ import annotations

import logging
import math
from collections import deque
from dataclasses import dataclass
from typing import Any, Iterable, Mapping

import torch

from stability_callbacks import keys
from stability_callbacks.live import LogOnce
from stability_callbacks.record import StepRecord

try:  # torch.distributed is optional in some builds
    import torch.distributed as dist
except ImportError:  # pragma: no cover - torch built without distributed
    dist = None

try:
    from torch.distributed.tensor import DTensor
except ImportError:  # pragma: no cover - older torch / no distributed
    DTensor = None

log = logging.getLogger("stability_callbacks")

__all__ = [
    "StepProbe", "SecondMoments", "SecondMomentStats", "find_second_moments",
    "second_moment_stats", "adam_second_moment_stats", "param_sq_sum", "batch_fingerprint",
    "grad_scaler_readings", "deepspeed_readings", "REDUCE_OPS",
]

REDUCE_OPS = ("sum", "mean", "max", "min")

# CPU layout of the second-moment reduction (see _max_and_sum_cpu): blocks of 16 Ki elements
# (64 KiB of fp32), each summed as 16 rows of 1 Ki so that one group is 16 elements.
_BLOCK = 1 << 14
_GROUP = 16
# Devices with fused multi-tensor kernels (torch/utils/_foreach_utils.py).
_FOREACH_FAST_DEVICES = ("cuda", "xpu", "mtia")

_ONCE = LogOnce()   # process-wide: one warning per problem, whichever probe meets it


# --------------------------------------------------------------------------------------------
# Adam second moment: locate the state, then reduce it locally
# --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SecondMoments:
    """Where an optimizer keeps its rank-local ``exp_avg_sq``.

    ``tensors``: the local tensors (DTensor shards already ``to_local()``; empty shards kept).
    ``numel``: their element count without alignment padding (a host int, no sync).
    ``partitioned``: True when ranks hold disjoint pieces (ZeRO >= 1, FSDP2) so sums add up
    across ranks; False when every rank holds the same full copy (DDP, ZeRO-0).
    ``params``: the tensors the optimizer updates, same layout (for the parameter norm).
    """

    tensors: list
    numel: int
    partitioned: bool
    params: list
    source: str


@dataclass(frozen=True)
class SecondMomentStats:
    """Local (per-rank) statistics; device tensors, float32/float64 0-d."""

    max: torch.Tensor
    l1: torch.Tensor
    numel: int
    partitioned: bool


class _NoSecondMoment(Exception):
    """The optimizer keeps no (unfactored) second moment: SGD, Lion, Adafactor."""


_FACTORED_KEYS = ("exp_avg_sq_row", "exp_avg_sq_col", "row_var", "col_var")


def _local(t: torch.Tensor) -> torch.Tensor:
    if DTensor is not None and isinstance(t, DTensor):
        return t.to_local()
    return t


def _is_sharded_dtensor(t) -> bool:
    if DTensor is None or not isinstance(t, DTensor):
        return False
    # FSDP2 on a 1-D mesh: Shard(0). A Replicate placement (HSDP) would double count when
    # summed over the whole group; that layout is not supported here (docstring of the probe).
    return all(p.is_shard() for p in t.placements)


def _unwrap(optimizer):
    """Peel framework wrappers until a DeepSpeed engine/ZeRO optimizer or torch optimizer."""
    seen = 0
    obj = optimizer
    while seen < 8:
        seen += 1
        if hasattr(obj, "basic_optimizer") and hasattr(obj, "zero_optimization_stage"):
            return obj  # DeepSpeedEngine
        if _deepspeed_flat_partitions(obj) is not None or hasattr(obj, "fp32_groups"):
            return obj  # DeepSpeed ZeRO / BF16 / FP16 optimizer wrapper
        inner = getattr(obj, "_optimizer", None)  # lightning LightningOptimizer
        if inner is None:
            inner = getattr(obj, "optimizer", None)  # accelerate AcceleratedOptimizer & co.
        if inner is None or inner is obj or not hasattr(inner, "param_groups"):
            return obj
        obj = inner
    return obj


def _deepspeed_flat_partitions(obj):
    """``[(flat fp32 partition, [(offset, length), ...])]`` of a DeepSpeed ZeRO/BF16 optimizer.

    The segments leave out the alignment padding. Padding holds v = 0, but the padded tail of
    a ZeRO-3 fp32 *parameter* partition is uninitialised memory (it read as inf here), so the
    views exclude it for every statistic.
    """
    if hasattr(obj, "single_partition_of_fp32_groups"):  # ZeRO-1/2: padding at the end
        parts = list(obj.single_partition_of_fp32_groups)
        pads = list(getattr(obj, "groups_padding", [0] * len(parts)))
        return [(p, [(0, p.numel() - int(pad))]) for p, pad in zip(parts, pads)]
    if hasattr(obj, "fp32_partitioned_groups_flat"):  # ZeRO-3: padding after each param
        out = []
        for i, flat in enumerate(obj.fp32_partitioned_groups_flat):
            sizes = [int(t.ds_numel) for t in obj.fp16_partitioned_groups[i]]
            pads = obj.groups_padding[i] if i < len(obj.groups_padding) else [0] * len(sizes)
            segs, off = [], 0
            for size, pad in zip(sizes, pads):
                segs.append((off, size - int(pad)))
                off += size
            out.append((flat, segs))
        return out
    if hasattr(obj, "fp32_groups_flat_partition"):  # BF16_Optimizer: padding at the end
        parts = list(obj.fp32_groups_flat_partition)
        pads = list(getattr(obj, "group_paddings", [0] * len(parts)))
        return [(p, [(0, p.numel() - int(pad))]) for p, pad in zip(parts, pads)]
    return None


def _segments(flat: torch.Tensor, segs) -> list:
    return [flat.narrow(0, off, n) for off, n in segs if n > 0]


def find_second_moments(optimizer) -> SecondMoments | None:
    """Locate the rank-local ``exp_avg_sq`` of ``optimizer`` (no compute, no sync).

    Accepts a torch optimizer (Adam/AdamW in any implementation: default, foreach, fused), a
    wrapper (accelerate ``AcceleratedOptimizer``, Lightning ``LightningOptimizer``), a
    DeepSpeed engine or its ZeRO/BF16/FP16 optimizer, and FSDP2 (DTensor state). Returns None
    while the state is still empty (before the first step). Raises ``_NoSecondMoment`` for
    optimizers without an unfactored second moment.
    """
    obj = _unwrap(optimizer)
    stage = None
    if hasattr(obj, "basic_optimizer") and hasattr(obj, "zero_optimization_stage"):
        stage = int(obj.zero_optimization_stage())
        wrapper = obj.optimizer
        basic = obj.basic_optimizer
    elif _deepspeed_flat_partitions(obj) is not None or hasattr(obj, "fp32_groups"):
        wrapper, basic = obj, obj.optimizer
    else:
        wrapper, basic = None, obj

    flat = _deepspeed_flat_partitions(wrapper) if wrapper is not None else None
    if flat is not None and stage != 0:
        # ZeRO >= 1 / BF16_Optimizer: state keyed by the flat fp32 partitions (disjoint across
        # the DP group); views over the unpadded segments (no copies).
        tensors, params = [], []
        for part, segs in flat:
            st = basic.state.get(part)
            if not st:
                return None
            if "exp_avg_sq" not in st:
                raise _NoSecondMoment(type(basic).__name__)
            tensors += _segments(st["exp_avg_sq"].reshape(-1), segs)
            params += _segments(part.detach().reshape(-1), segs)
        numel = sum(t.numel() for t in tensors)
        return SecondMoments(tensors, numel, True, params, f"deepspeed:{type(wrapper).__name__}")

    state = basic.state
    params = [p for g in basic.param_groups for p in g["params"]]
    tensors, sharded, replicated = [], False, False
    any_state = False
    for p in params:
        st = state.get(p)
        if not st:
            continue
        any_state = True
        if "exp_avg_sq" not in st:
            continue
        v = st["exp_avg_sq"]
        if _is_sharded_dtensor(v):
            sharded = True
        else:
            replicated = True
        tensors.append(_local(v))
    if not any_state:
        return None
    if not tensors or any(k in st for st in state.values() for k in _FACTORED_KEYS):
        raise _NoSecondMoment(type(basic).__name__)
    if sharded and replicated:
        # Mixed plain and sharded state (e.g. a module left out of fully_shard) cannot be
        # reduced with one op; the replicated part would be counted world-size times.
        raise _NoSecondMoment(f"{type(basic).__name__} with mixed sharded and replicated state")
    local_params = [_local(p) for p in params]
    src = "fsdp2" if sharded else ("deepspeed:zero0" if stage == 0 else "torch")
    return SecondMoments(tensors, sum(t.numel() for t in tensors), sharded, local_params, src)


def _max_and_sum(tensors: list) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(max, sum in float64) over non-negative tensors, one read of the data; device tensors."""
    tensors = [t for t in tensors if t.numel() > 0]  # _foreach_max raises on empty shards
    if not tensors:
        return None
    if tensors[0].device.type in _FOREACH_FAST_DEVICES:
        # Fused multi-tensor kernels; v >= 0 so the L1 norm is the sum. Accumulate in fp32.
        maxes = torch._foreach_max(tensors)
        sums = torch._foreach_norm(tensors, 1, dtype=torch.float32)
        return torch.stack(maxes).amax(), torch.stack(sums).sum(dtype=torch.float64)
    return _max_and_sum_cpu(tensors)


def _max_and_sum_cpu(tensors: list) -> tuple[torch.Tensor, torch.Tensor]:
    """The CPU path of ``_max_and_sum``: one read from memory, then the max of a few blocks.

    CPU foreach kernels are per-tensor loops, ``_foreach_norm(ord=1)`` loses accuracy on huge
    tensors (FRAMEWORK_NOTES pitfall 9), and a max after the sum would read everything twice.
    Instead one pass sums every group of 16 elements (a ``[blocks, 16, 1 Ki]`` view reduced over
    its middle dim: ~1.3-1.5x a plain sum here, into a transient buffer 1/16 the state's size).
    The L1 is the sum of those group sums, and they bound the max: a non-negative element is
    never above its group's sum, also after fp32 rounding (rounding is monotone). So the max is
    read only from the blocks whose largest group sum reaches the best max found so far. Real optimizer state is heavy-tailed across and within
    tensors: GPT-2-small's AdamW state left 0-6% of its blocks to read in the first 40 steps.
    Flat state leaves every block a candidate, which costs a second full read.
    Host decisions here cost nothing: on CPU there is no device to wait for.
    """
    sums, maxes, blocked, loose = [], [], [], {}
    for t in tensors:
        flat = t.reshape(-1)
        k = flat.numel() // _BLOCK
        if k:
            blocks = flat[:k * _BLOCK].view(k, _BLOCK)
            group_sums = blocks.view(k, _GROUP, _BLOCK // _GROUP).sum(1, dtype=_acc(flat.dtype))
            sums.append(group_sums.sum())
            blocked.append((group_sums.amax(1), blocks))   # (per-block bound, blocks)
        if flat.numel() > k * _BLOCK:
            loose.setdefault(flat.dtype, []).append(flat[k * _BLOCK:])
    for parts in loose.values():   # small tensors and block tails, one copy per dtype
        rest = torch.cat(parts) if len(parts) > 1 else parts[0]
        sums.append(rest.sum(dtype=_acc(rest.dtype)))
        maxes.append(rest.amax())
    total = torch.stack([s.to(torch.float64) for s in sums]).sum()
    if math.isnan(total):   # a NaN anywhere: the max is NaN too (a negative-signed NaN included)
        return total, total
    best = max((float(m) for m in maxes), default=-math.inf)
    if blocked:
        tops = torch.stack([bound.amax() for bound, _ in blocked]).tolist()
        order = sorted(range(len(blocked)), key=tops.__getitem__, reverse=True)
        bound, blocks = blocked[order[0]]   # seed: the block with the largest group sum
        best = max(best, float(blocks[int(bound.argmax())].amax()))
        for i in order:
            if tops[i] < best:
                break   # sorted: no later tensor has a group sum as large as the max found
            bound, blocks = blocked[i]
            cand = (bound >= best).nonzero().squeeze(1)
            if 4 * cand.numel() > bound.numel():
                best = max(best, float(_amax_nonneg(blocks)))
            else:
                best = max(best, float(blocks.index_select(0, cand).amax()))
    return torch.tensor(best, dtype=torch.float64), total


def _acc(dtype: torch.dtype) -> torch.dtype | None:
    """Accumulation dtype of a sum: fp32 for 16-bit floats, the tensor's own otherwise."""
    return torch.float32 if dtype in (torch.bfloat16, torch.float16) else None


def _amax_nonneg(t: torch.Tensor) -> torch.Tensor:
    """Max of a contiguous tensor of non-NaN values >= 0 (as a 0-d tensor of ``t``'s dtype).

    Bit patterns of non-negative floats order like the integers, and the integer max skips the
    float max's NaN checks (~40% faster here); -0.0 reads as the smallest integer, hence the clamp.
    """
    as_int = _SAME_WIDTH_INT.get(t.dtype)
    if as_int is None:
        return t.amax()
    return t.view(as_int).amax().clamp_min(0).reshape(1).view(t.dtype).reshape(())


_SAME_WIDTH_INT = {torch.float32: torch.int32, torch.float64: torch.int64,
                   torch.bfloat16: torch.int16, torch.float16: torch.int16}


def second_moment_stats(optimizer) -> SecondMomentStats | None:
    """Rank-local ``exp_avg_sq`` max, L1 (float64) and element count; None before step one.

    One read of the local state; no host sync. Raises ``_NoSecondMoment`` (a subclass of
    Exception) for optimizers without a second moment; :class:`StepProbe` turns that into one
    warning.
    """
    sm = find_second_moments(optimizer)
    if sm is None:
        return None
    r = _max_and_sum(sm.tensors)
    if r is None:  # every local shard is empty: neutral values for MAX / SUM
        dev = sm.tensors[0].device if sm.tensors else torch.device("cpu")
        zero = torch.zeros((), dtype=torch.float64, device=dev)
        return SecondMomentStats(zero, zero, 0, sm.partitioned)
    return SecondMomentStats(r[0], r[1], sm.numel, sm.partitioned)


def adam_second_moment_stats(optimizer, process_group=None):
    """Global ``(max_t, l1_t, numel_t)`` as 0-d float64 device tensors, or None.

    Convenience for tests and one-off use: reduces across ``process_group`` itself with two
    ``all_reduce`` calls (MAX, then SUM for partitioned state). :class:`StepProbe` instead folds
    these values into its single packed collective.

    >>> import torch
    >>> p = torch.nn.Parameter(torch.ones(3))
    >>> opt = torch.optim.AdamW([p]); p.grad = torch.tensor([1., 2., 3.]); opt.step()
    >>> mx, l1, n = adam_second_moment_stats(opt)
    >>> round(float(mx), 6), round(float(l1), 6), int(n)
    (0.009, 0.014, 3)
    """
    st = second_moment_stats(optimizer)
    if st is None:
        return None
    dev = st.max.device
    mx = st.max.to(torch.float64)
    l1 = st.l1.to(torch.float64)
    numel = torch.full((), float(st.numel), dtype=torch.float64, device=dev)
    if _world_size(process_group) > 1:
        dist.all_reduce(mx, op=dist.ReduceOp.MAX, group=process_group)
        if st.partitioned:
            both = torch.stack([l1, numel])
            dist.all_reduce(both, op=dist.ReduceOp.SUM, group=process_group)
            l1, numel = both[0], both[1]
    return mx, l1, numel


def param_sq_sum(tensors: Iterable[torch.Tensor]) -> torch.Tensor | None:
    """Sum of squares (float64 0-d device tensor) of the local tensors; one read of each."""
    ts = [_local(t).detach() for t in tensors]
    ts = [t for t in ts if t.numel() > 0]
    if not ts:
        return None
    if ts[0].device.type in _FOREACH_FAST_DEVICES:
        norms = torch._foreach_norm(ts, 2, dtype=torch.float32)
        return torch.stack(norms).to(torch.float64).square().sum()
    parts = []   # per block of _BLOCK elements and per tail: fp32 norms, combined in float64
    for t in ts:
        flat = t.reshape(-1)
        k = flat.numel() // _BLOCK
        if k:
            parts.append(torch.linalg.vector_norm(flat[:k * _BLOCK].view(k, _BLOCK), dim=1,
                                                  dtype=torch.float32))
        if flat.numel() > k * _BLOCK:
            parts.append(torch.linalg.vector_norm(flat[k * _BLOCK:], dtype=torch.float32)[None])
    return torch.cat(parts).to(torch.float64).square().sum()


# --------------------------------------------------------------------------------------------
# Small readers
# --------------------------------------------------------------------------------------------
_FP_MOD = 2_147_483_647           # 2**31 - 1 (prime): products of two residues fit in int64
_FP_OUT_MOD = 1_099_511_627_689   # largest prime < 2**40: a SUM over <= 8192 ranks stays exact


def batch_fingerprint(input_ids: torch.Tensor) -> torch.Tensor:
    """Order-sensitive integer hash of a batch of token ids, as a 0-d float64 device tensor.

    Position-keyed, squared mix of each id mod 2**31-1, summed in int64 and reduced below
    2**40, so it is exact in float64 and a SUM over up to 8192 ranks stays exact. Equal batches
    give equal fingerprints on any device; not cryptographic. A few elementwise kernels over the
    token ids, no sync.

    >>> import torch
    >>> a = batch_fingerprint(torch.tensor([[1, 2, 3], [4, 5, 6]]))
    >>> bool(a == batch_fingerprint(torch.tensor([[1, 2, 3], [4, 5, 6]])))
    True
    >>> bool(a == batch_fingerprint(torch.tensor([[4, 5, 6], [1, 2, 3]])))
    False
    >>> 0 <= float(a) < 2 ** 40
    True
    """
    ids = input_ids.detach().reshape(-1).to(torch.int64).remainder(_FP_MOD)
    pos = torch.arange(1, ids.numel() + 1, device=ids.device, dtype=torch.int64)
    x = (ids * 1_103_515_245 + pos * 40_503 + 12_345).remainder(_FP_MOD)   # < 2**31
    x = (x * x + pos).remainder(_FP_MOD)                                   # nonlinear mix
    # sum of < 2**31 values: exact in int64 for < 2**32 tokens
    return x.sum().remainder(_FP_OUT_MOD).to(torch.float64)


def grad_scaler_readings(scaler, optimizer):
    """``(scale, found_inf)`` of a torch ``GradScaler`` as device tensors, no sync.

    Call after ``scaler.unscale_(optimizer)`` (or ``scaler.step``) and **before**
    ``scaler.update()``, which forgets ``found_inf``; ``scale`` is then the scale this step
    used. ``found_inf`` is None when the scaler has not unscaled this optimizer yet (then a skip
    can still be seen afterwards as a scale decrease, see ``StepProbe.set_loss_scale``).
    Reads ``GradScaler._scale`` / ``_per_optimizer_states`` (private; torch has no public
    tensor accessor: ``get_scale()`` is an ``.item()``).
    """
    if scaler is None or not scaler.is_enabled():
        return None, None
    scale = getattr(scaler, "_scale", None)
    states = getattr(scaler, "_per_optimizer_states", {})
    found = states.get(id(_unwrap(optimizer)), {}).get("found_inf_per_device") if states else None
    if not found and optimizer is not None:
        found = states.get(id(optimizer), {}).get("found_inf_per_device")
    found_t = None
    if found:
        vals = list(found.values())
        found_t = vals[0] if len(vals) == 1 else torch.stack(
            [v.to(vals[0].device) for v in vals]).sum()
    return scale, found_t


def deepspeed_readings(engine) -> dict:
    """Host values DeepSpeed already has after ``engine.step()``: no sync (ints and floats).

    ``loss_scale`` (None without fp16), ``skipped_steps`` (a running count: the integration
    diffs it), ``grad_norm`` (tensor, float or None: None at ZeRO-0 fp32, then compute it).
    """
    opt = getattr(engine, "optimizer", None)
    scale = None
    if getattr(engine, "fp16_enabled", lambda: False)():
        scale = getattr(opt, "cur_scale", None)
        if scale is None:
            scale = getattr(getattr(opt, "loss_scaler", None), "cur_scale", None)
        if scale is None and hasattr(engine, "_get_optimizer_loss_scale"):
            # ZeRO-0 fp16 (FP16_UnfusedOptimizer / FP16_Optimizer) keeps it in
            # loss_scale_config.cur_scale; the engine's own reader (engine.py:3771, what its
            # monitor logs) knows every optimizer. Private, hence the fallback only.
            scale = engine._get_optimizer_loss_scale()
    return {"loss_scale": None if scale is None else float(scale),
            "skipped_steps": int(getattr(engine, "skipped_steps", 0)),
            "grad_norm": engine.get_global_grad_norm()}


def record_deepspeed_step(probe: "StepProbe", engine, skipped_before: int | None) -> tuple[dict, int]:
    """Put what DeepSpeed knows after ``engine.step()`` into ``probe``: the fp16 loss scale and
    the optimizer steps skipped since ``skipped_before`` (its scaler has hysteresis, so a skip
    need not move the scale). Returns the readings and the new running skip count. No sync."""
    r = deepspeed_readings(engine)
    if r["loss_scale"] is not None:   # only fp16 skips steps
        probe.set_loss_scale(r["loss_scale"])
        if skipped_before is not None:
            probe.set_skipped(float(r["skipped_steps"] - skipped_before))
    return r, r["skipped_steps"]


def _all_gather_flat(out: torch.Tensor, inp: torch.Tensor, group) -> None:
    # torch 2.13 deprecates all_gather_into_tensor in favour of all_gather_single
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    gather(out, inp, group=group)


def _world_size(group) -> int:
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return 1
    return dist.get_world_size(group)


def step_lr(optimizer) -> float:
    """The LR in the optimizer's first param group, as a float (read it where the framework has
    not yet stepped its scheduler: that is the LR this step uses)."""
    lr = optimizer.param_groups[0]["lr"]
    if isinstance(lr, torch.Tensor):
        lr = lr.item()   # host-sync: a tensor LR (capturable optimizers) only
    return float(lr)


# --------------------------------------------------------------------------------------------
# The probe
# --------------------------------------------------------------------------------------------
# Fixed slots (name, op, metric key). The layout is the same on every rank and every step so
# the packed collective always matches; absent values travel with presence 0.
_LOSS, _GRAD, _SCALE, _SKIP, _VMAX, _VL1, _VNUMEL, _PSQ = range(8)
_BASE_SLOTS = ("loss", "grad_norm", "loss_scale", "skipped",
               "adam_max", "adam_l1", "adam_numel", "param_sq")
_NEEDS_EVERY_RANK = frozenset((keys.ADAM_V_MAX, keys.ADAM_V_L1, keys.ADAM_V_NUMEL,
                               keys.PARAM_NORM))


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
    >>> [r.step for r in records], sorted(records[-1].metrics)[:3]
    ([1, 2], ['adam/exp_avg_sq_l1', 'adam/exp_avg_sq_max', 'adam/exp_avg_sq_numel'])
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
        self._dev: list = [None] * len(_BASE_SLOTS)   # device tensors per base slot
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
        l = loss.detach()
        if l.numel() != 1:
            l = l.float().mean()
        l = l.reshape(()).float()
        if divide_by != 1.0:
            l = l / divide_by
        self._loss = l if self._loss is None else self._loss + l

    def set_grad_norm(self, value) -> None:
        """The framework's pre-clip, unscaled, global grad norm (tensor, float or None)."""
        if value is None:
            return
        if isinstance(value, torch.Tensor):
            if DTensor is not None and isinstance(value, DTensor):
                value = value.full_tensor()  # a collective, not a host sync (FSDP2 norms)
            self._dev[_GRAD] = value.detach()
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
        self._dev[_GRAD] = norm.detach()
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
            self._dev[_SCALE] = v
        else:
            self._host[keys.LOSS_SCALE] = float(value)

    def set_skipped(self, value) -> None:
        """Whether the optimizer step was skipped: a device tensor (e.g. ``found_inf``: > 0 means
        skipped) or a host bool/float (DeepSpeed ``skipped_steps`` delta)."""
        if value is None:
            return
        if isinstance(value, torch.Tensor):
            self._dev[_SKIP] = value.detach().reshape(-1).sum()
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
        ops = ["mean", "max", "min", "max", "max", "sum", "sum", "sum"]
        if want_adam:
            self._sample_adam(optimizer, ops)
        if want_pnorm:
            self._sample_param_norm(optimizer, model, ops)
        if self._loss is not None:
            self._dev[_LOSS] = self._loss   # NaN/Inf travel as values: the NonFinite detector reads them
        if self._skip_from_scale and self._dev[_SKIP] is None and keys.SKIPPED not in self._host:
            cur, prev = self._skip_from_scale
            self._dev[_SKIP] = cur < prev

        values = list(self._dev)
        names: list = [keys.LOSS, keys.GRAD_NORM, keys.LOSS_SCALE, keys.SKIPPED, keys.ADAM_V_MAX, keys.ADAM_V_L1, keys.ADAM_V_NUMEL, keys.PARAM_NORM]
        host = dict(self._host)
        if world > 1:
            # The packed layout must be identical on every rank, so across ranks only the
            # extras declared at construction travel (absent ones with presence 0). An extra
            # set on one rank only would otherwise change the size of its vector and hang the
            # collective.
            extra_names = sorted(self.extra_reductions)
            undeclared = sorted(set(self._extras) - set(self.extra_reductions))
            if undeclared:
                _ONCE._warn("undeclared-extra:" + ",".join(undeclared),
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

    def _sample_adam(self, optimizer, ops) -> None:
        try:
            st = second_moment_stats(optimizer)
        except _NoSecondMoment as e:
            self._adam_disabled = True
            _ONCE._warn("no-second-moment", "stability: %s keeps no Adam second moment "
                       "(exp_avg_sq); second-moment statistics are off for this run", e)
            return
        except Exception:  # monitoring never takes training down
            self._adam_disabled = True
            log.exception("stability: Adam second-moment statistics failed; turned off")
            return
        if st is None:
            return
        self._dev[_VMAX] = st.max
        self._dev[_VL1] = st.l1
        self._dev[_VNUMEL] = self._const(float(st.numel), st.max.device)
        if not st.partitioned:
            # Replicated state (DDP, ZeRO-0): every rank holds the same values. MAX keeps them
            # (and makes ranks agree bit-for-bit even if float noise differed); SUM would
            # multiply the L1 and the count by the world size.
            ops[_VL1] = ops[_VNUMEL] = "max"

    def _sample_param_norm(self, optimizer, model, ops) -> None:
        try:
            partitioned = False
            if optimizer is not None:
                sm = find_second_moments(optimizer)
                if sm is not None:
                    tensors, partitioned = sm.params, sm.partitioned
                else:
                    basic = _unwrap(optimizer)
                    basic = getattr(basic, "basic_optimizer", basic)
                    tensors = [p for g in basic.param_groups for p in g["params"]]
                    partitioned = any(_is_sharded_dtensor(p) for p in tensors)
            else:
                tensors = list(model.parameters())
                partitioned = any(_is_sharded_dtensor(p) for p in tensors)
            sq = param_sq_sum(tensors)
        except _NoSecondMoment:
            basic = _unwrap(optimizer)
            basic = getattr(basic, "basic_optimizer", basic)
            tensors = [p for g in basic.param_groups for p in g["params"]]
            partitioned = any(_is_sharded_dtensor(p) for p in tensors)
            sq = param_sq_sum(tensors)
        except Exception:
            self._param_norm_disabled = True
            log.exception("stability: parameter norm failed; turned off")
            return
        if sq is None:
            return
        self._dev[_PSQ] = sq
        if not partitioned:
            ops[_PSQ] = "max"

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
            if name in _NEEDS_EVERY_RANK and len(vals) != len(rows):
                continue  # a rank's state statistic failed: a partial sum would mislead
            metrics[name] = _reduce(vals, op)
        if keys.SKIPPED in metrics:
            metrics[keys.SKIPPED] = 1.0 if metrics[keys.SKIPPED] > 0 else 0.0
        if keys.PARAM_NORM in metrics:
            metrics[keys.PARAM_NORM] = math.sqrt(metrics[keys.PARAM_NORM])
        if keys.ADAM_V_NUMEL in metrics:
            metrics[keys.ADAM_V_NUMEL] = float(round(metrics[keys.ADAM_V_NUMEL]))
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
