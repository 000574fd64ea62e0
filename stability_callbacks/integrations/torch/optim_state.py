"""Where an optimizer keeps its rank-local state: Adam's ``exp_avg_sq`` and the parameters it
updates, under plain torch / DDP (replicated), FSDP2 (DTensor shards) and DeepSpeed ZeRO 0-3 and
BF16_Optimizer (flat fp32 partitions, alignment padding excluded). No compute, no sync: the
reductions over what is found here live in :mod:`.reductions`.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

try:
    from torch.distributed.tensor import DTensor
except ImportError:  # pragma: no cover - older torch / no distributed
    DTensor = None

__all__ = ["SecondMoments", "NoSecondMoment", "find_second_moments", "adam_beta2_and_step",
           "optimized_params", "unwrap_optimizer", "local_tensor", "is_sharded"]


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


class NoSecondMoment(Exception):
    """The optimizer keeps no (unfactored) second moment: SGD, Lion, Adafactor."""


_FACTORED_KEYS = ("exp_avg_sq_row", "exp_avg_sq_col", "row_var", "col_var")


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """This rank's piece of a DTensor (FSDP2 shard); any other tensor as it is."""
    if DTensor is not None and isinstance(t, DTensor):
        return t.to_local()
    return t


def is_sharded(t) -> bool:
    """Whether ``t`` is a DTensor sharded across ranks (FSDP2)."""
    if DTensor is None or not isinstance(t, DTensor):
        return False
    # FSDP2 on a 1-D mesh: Shard(0). A Replicate placement (HSDP) would double count when
    # summed over the whole group; that layout is not supported here (docstring of the probe).
    return all(p.is_shard() for p in t.placements)


def unwrap_optimizer(optimizer):
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


def _layers(optimizer):
    """``(ZeRO stage or None, DeepSpeed wrapper or None, the optimizer that keeps the state)``."""
    obj = unwrap_optimizer(optimizer)
    if hasattr(obj, "basic_optimizer") and hasattr(obj, "zero_optimization_stage"):
        return int(obj.zero_optimization_stage()), obj.optimizer, obj.basic_optimizer
    if _deepspeed_flat_partitions(obj) is not None or hasattr(obj, "fp32_groups"):
        return None, obj, obj.optimizer
    return None, None, obj


def adam_beta2_and_step(optimizer):
    """``(beta2, step)`` of an Adam-like optimizer, read where every rank has them without a
    collective: beta2 from the param groups' hyperparameters (the largest, if groups differ), and
    the update count Adam's bias correction uses, including the update just made — from the
    state's ``step`` (the first entry that has one; torch's Adam keeps one per parameter, all
    equal) or DeepSpeed FusedAdam's per-group ``step``. Either is None when absent.

    ``step`` is returned as it is kept: a Python number, a CPU tensor (torch's default: read it
    with ``float()``, no device involved) or a device tensor (``capturable=True`` or
    ``fused=True`` keep it on the GPU, updated by the kernels: ``.item()`` would wait for the
    device, so the probe sends it through its packed device vector instead). Skipped fp16 steps
    never reach the optimizer, so they are not counted (DeepSpeed's ``global_steps`` counts them;
    Adam's ``t`` does not). No compute, no sync.
    """
    _, _, basic = _layers(optimizer)
    groups = getattr(basic, "param_groups", None) or []
    betas = [g["betas"][1] for g in groups if isinstance(g.get("betas"), (tuple, list)) and len(g["betas"]) > 1]
    beta2 = float(max(betas)) if betas else None
    steps = [g["step"] for g in groups if isinstance(g.get("step"), (int, float))]   # FusedAdam
    if steps:
        return beta2, max(steps)
    # The first state entry that has one (O(1): torch's Adam keeps the same count for every
    # parameter; ZeRO keys its state by flat partitions, and ZeRO-3 empties the groups' "params"
    # between its sub-group steps, so the state is read directly, not through the groups).
    for st in (getattr(basic, "state", None) or {}).values():
        if "step" in st:
            step = st["step"]
            return beta2, local_tensor(step) if isinstance(step, torch.Tensor) else step
    return beta2, None


def find_second_moments(optimizer) -> SecondMoments | None:
    """Locate the rank-local ``exp_avg_sq`` of ``optimizer`` (no compute, no sync).

    Accepts a torch optimizer (Adam/AdamW in any implementation: default, foreach, fused), a
    wrapper (accelerate ``AcceleratedOptimizer``, Lightning ``LightningOptimizer``), a
    DeepSpeed engine or its ZeRO/BF16/FP16 optimizer, and FSDP2 (DTensor state). Returns None
    while the state is still empty (before the first step). Raises ``NoSecondMoment`` for
    optimizers without an unfactored second moment.
    """
    stage, wrapper, basic = _layers(optimizer)
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
                raise NoSecondMoment(type(basic).__name__)
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
        if is_sharded(v):
            sharded = True
        else:
            replicated = True
        tensors.append(local_tensor(v))
    if not any_state:
        return None
    if not tensors or any(k in st for st in state.values() for k in _FACTORED_KEYS):
        raise NoSecondMoment(type(basic).__name__)
    if sharded and replicated:
        # Mixed plain and sharded state (e.g. a module left out of fully_shard) cannot be
        # reduced with one op; the replicated part would be counted world-size times.
        raise NoSecondMoment(f"{type(basic).__name__} with mixed sharded and replicated state")
    local_params = [local_tensor(p) for p in params]
    src = "fsdp2" if sharded else ("deepspeed:zero0" if stage == 0 else "torch")
    return SecondMoments(tensors, sum(t.numel() for t in tensors), sharded, local_params, src)



def optimized_params(optimizer=None, model=None) -> tuple[list, bool]:
    """The rank-local tensors ``optimizer`` updates (else ``model``'s parameters), for the
    parameter norm, and whether ranks hold disjoint pieces of them (ZeRO >= 1, FSDP2): then a
    sum over ranks is the whole; otherwise every rank holds the same full copy."""
    if optimizer is None:
        tensors = list(model.parameters())
        return tensors, any(is_sharded(p) for p in tensors)
    try:
        sm = find_second_moments(optimizer)
    except NoSecondMoment:
        sm = None
    if sm is not None:   # the ZeRO partitions, padding excluded, where the state lives
        return sm.params, sm.partitioned
    basic = unwrap_optimizer(optimizer)
    basic = getattr(basic, "basic_optimizer", basic)
    tensors = [p for g in basic.param_groups for p in g["params"]]
    return tensors, any(is_sharded(p) for p in tensors)
