"""Device kernels, each one read of its input and no host sync: Adam ``exp_avg_sq`` max and L1,
the parameters' sum of squares, and a batch's fingerprint.

``exp_avg_sq`` on accelerators goes through multi-tensor (``torch._foreach_*``) kernels; on CPU,
where foreach kernels are per-tensor loops anyway, one pass of sums over groups of 16 elements,
whose sums bound the max so that only the few blocks that can hold it are read again. Where the
tensors come from (ZeRO partitions, FSDP2 shards, replicated state) is :mod:`.optim_state`'s job;
reducing the results across ranks is :class:`~.probe.StepProbe`'s.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

import torch

from .optim_state import find_second_moments, local_tensor

__all__ = ["SecondMomentStats", "second_moment_stats", "param_sq_sum", "batch_fingerprint",
           "FOREACH_FAST_DEVICES"]

# CPU layout of the second-moment reduction (see _max_and_sum_cpu): blocks of 16 Ki elements
# (64 KiB of fp32), each summed as 16 rows of 1 Ki so that one group is 16 elements.
_BLOCK = 1 << 14
_GROUP = 16
# Devices with fused multi-tensor kernels (torch/utils/_foreach_utils.py).
FOREACH_FAST_DEVICES = ("cuda", "xpu", "mtia")


@dataclass(frozen=True)
class SecondMomentStats:
    """Local (per-rank) statistics; device tensors, float32/float64 0-d."""

    max: torch.Tensor
    l1: torch.Tensor
    numel: int
    partitioned: bool



def _max_and_sum(tensors: list) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(max, sum in float64) over non-negative tensors, one read of the data; device tensors."""
    tensors = [t for t in tensors if t.numel() > 0]  # _foreach_max raises on empty shards
    if not tensors:
        return None
    if tensors[0].device.type in FOREACH_FAST_DEVICES:
        # Fused multi-tensor kernels; v >= 0 so the L1 norm is the sum. Accumulate in fp32.
        maxes = torch._foreach_max(tensors)
        sums = torch._foreach_norm(tensors, 1, dtype=torch.float32)
        return torch.stack(maxes).amax(), torch.stack(sums).sum(dtype=torch.float64)
    return _max_and_sum_cpu(tensors)


def _max_and_sum_cpu(tensors: list) -> tuple[torch.Tensor, torch.Tensor]:
    """The CPU path of ``_max_and_sum``: one read from memory, then the max of a few blocks.

    CPU foreach kernels are per-tensor loops, ``_foreach_norm(ord=1)`` loses accuracy on huge
    tensors (it accumulates in the tensor's own dtype), and a max after the sum would read everything twice.
    Instead one pass sums every group of 16 elements (a ``[blocks, 16, 1 Ki]`` view reduced over
    its middle dim: ~1.3-1.5x a plain sum here, into a transient buffer 1/16 the state's size).
    The L1 is the sum of those group sums, and they bound the max: a non-negative element is
    never above its group's sum, also after fp32 rounding (rounding is monotone). So the max is
    read only from the blocks whose largest group sum reaches the best max found so far. Real
    optimizer state is heavy-tailed across and within tensors: GPT-2-small's AdamW state left
    0-6% of its blocks to read in the first 40 steps. Flat state leaves every block a
    candidate, which costs a second full read.
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

    One read of the local state; no host sync. Raises ``NoSecondMoment`` (a subclass of
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



def param_sq_sum(tensors: Iterable[torch.Tensor]) -> torch.Tensor | None:
    """Sum of squares (float64 0-d device tensor) of the local tensors; one read of each."""
    ts = [local_tensor(t).detach() for t in tensors]
    ts = [t for t in ts if t.numel() > 0]
    if not ts:
        return None
    if ts[0].device.type in FOREACH_FAST_DEVICES:
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

