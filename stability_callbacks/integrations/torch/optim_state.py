"""Where an optimizer keeps its rank-local state: Adam's ``exp_avg_sq`` and ``exp_avg``, piece by
piece with the parameter tensor each piece belongs to, and the parameters it updates, under plain
torch / DDP (replicated), FSDP2 (DTensor shards) and DeepSpeed ZeRO 0-3 and BF16_Optimizer (flat
fp32 partitions, alignment padding excluded). No compute, no sync: the reductions over what is
found here live in :mod:`.reductions`.
"""
from __future__ import annotations

import operator
from dataclasses import dataclass

import torch

try:
    from torch.distributed.tensor import DTensor
except ImportError:  # pragma: no cover - older torch / no distributed
    DTensor = None

__all__ = ["AdamState", "AdamHyper", "NoSecondMoment", "find_adam_state", "adam_hyperparams",
           "basic_optimizer", "optimized_params", "unwrap_optimizer", "local_tensor", "is_sharded", "tensor_names",
           "state_key"]


@dataclass(frozen=True)
class AdamState:
    """Where an optimizer keeps its rank-local Adam moments.

    ``exp_avg_sq`` / ``exp_avg``: the local pieces, in the same layout (DTensor shards already
    ``to_local()``, views of the unpadded fragments of a flat ZeRO partition; empty pieces kept).
    ``exp_avg`` is None when the optimizer keeps no first moment.
    ``tensor_of``: per piece, the index of the parameter tensor it belongs to, in the optimizer's
    order (param groups in order, their parameters in order: the same on every rank). None when
    the layout does not say (then there are no per-tensor statistics).
    ``tensor_numel``: per parameter tensor, its full (unsharded) element count.
    ``tensor_group``: per parameter tensor, its index in ``groups``.
    ``groups``: the param groups that hold lr, betas, eps (the optimizer that keeps the state).
    ``numel``: the local element count without alignment padding (a host int, no sync).
    ``partitioned``: True when ranks hold disjoint pieces (ZeRO >= 1, FSDP2) so sums add up
    across ranks; False when every rank holds the same full copy (DDP, ZeRO-0).
    ``params``: the tensors the optimizer updates, local and unpadded (for the parameter norm).
    """

    exp_avg_sq: list
    exp_avg: list | None
    tensor_of: list | None
    tensor_numel: list
    tensor_group: list
    groups: list
    numel: int
    partitioned: bool
    params: list
    source: str

    @property
    def num_tensors(self) -> int:
        return len(self.tensor_numel)


@dataclass(frozen=True)
class AdamHyper:
    """Adam's hyperparameters as the probe reads them (:func:`adam_hyperparams`)."""

    beta1: float | None
    beta2: float | None
    step: object    # int / float, a CPU tensor, a device tensor, or None


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
        if _is_deepspeed_wrapper(obj):
            return obj  # DeepSpeed ZeRO / BF16 / FP16 optimizer wrapper
        inner = getattr(obj, "_optimizer", None)  # lightning LightningOptimizer
        if inner is None:
            inner = getattr(obj, "optimizer", None)  # accelerate AcceleratedOptimizer & co.
        if inner is None or inner is obj or not hasattr(inner, "param_groups"):
            return obj
        obj = inner
    return obj


_FLAT_PARTITIONS = ("single_partition_of_fp32_groups",   # ZeRO-1/2: padding at the end
                    "fp32_partitioned_groups_flat",      # ZeRO-3: padding after each param
                    "fp32_groups_flat_partition")        # BF16_Optimizer: padding at the end


def _is_deepspeed_wrapper(obj) -> bool:
    return any(hasattr(obj, a) for a in _FLAT_PARTITIONS) or hasattr(obj, "fp32_groups")


@dataclass
class _Piece:
    offset: int      # into the flat fp32 partition
    numel: int
    tensor: int      # parameter tensor index (optimizer order)


def _deepspeed_flat_partitions(obj):
    """``(flat partitions, pieces per partition, full numel per tensor, group per tensor,
    group per partition)`` of a DeepSpeed ZeRO/BF16 optimizer, or None.

    Each piece is one parameter's fragment of this rank's flat fp32 partition: alignment padding
    is never in a piece. Padding holds v = 0, but the padded tail of a ZeRO-3 fp32 *parameter*
    partition is uninitialised memory (it read as inf here), so every statistic reads pieces only.
    ZeRO-1/2 and BF16_Optimizer say where each parameter's fragment lies (``_hp_mapping``, what
    ``safe_get_full_optimizer_state`` reads); ZeRO-3 keeps one partition per parameter, in order.
    """
    if hasattr(obj, "fp32_partitioned_groups_flat"):  # ZeRO-3
        parts, pieces, numels, groups = [], [], [], []
        sub_to_group = getattr(obj, "sub_group_to_group_id", {}) or {}
        for i, flat in enumerate(obj.fp32_partitioned_groups_flat):
            full = obj.fp16_groups[i]
            sizes = [int(t.ds_numel) for t in obj.fp16_partitioned_groups[i]]
            pads = obj.groups_padding[i] if i < len(obj.groups_padding) else [0] * len(sizes)
            segs, off = [], 0
            for p, size, pad in zip(full, sizes, pads):
                segs.append(_Piece(off, size - int(pad), len(numels)))
                numels.append(int(getattr(p, "ds_numel", p.numel())))
                groups.append(int(sub_to_group.get(i, 0)))
                off += size
            parts.append(flat)
            pieces.append(segs)
        return parts, pieces, numels, groups
    for flat_attr, lp_attr in (("single_partition_of_fp32_groups", "bit16_groups"),
                               ("fp32_groups_flat_partition", "bf16_groups")):
        if not hasattr(obj, flat_attr):
            continue
        parts, pieces, numels, groups = list(getattr(obj, flat_attr)), [], [], []
        lp_groups = getattr(obj, lp_attr, None)
        for i in range(len(parts)):
            segs = []
            lps = lp_groups[i] if lp_groups is not None and i < len(lp_groups) else None
            if lps is None or any(not hasattr(lp, "_hp_mapping") for lp in lps):
                return None   # no per-parameter map in this DeepSpeed version
            for lp in lps:
                mapping = lp._hp_mapping
                if mapping is not None:   # None: no fragment of this parameter on this rank
                    addr = mapping.get_hp_fragment_address()
                    segs.append(_Piece(int(addr.start), int(addr.numel), len(numels)))
                numels.append(int(lp.numel()))
                groups.append(i)
            pieces.append(segs)
        return parts, pieces, numels, groups
    return None


def _layers(optimizer):
    """``(ZeRO stage or None, DeepSpeed wrapper or None, the optimizer that keeps the state)``."""
    obj = unwrap_optimizer(optimizer)
    if hasattr(obj, "basic_optimizer") and hasattr(obj, "zero_optimization_stage"):
        return int(obj.zero_optimization_stage()), obj.optimizer, obj.basic_optimizer
    if _is_deepspeed_wrapper(obj):
        return None, obj, obj.optimizer
    return None, None, obj


def basic_optimizer(optimizer):
    """The optimizer that keeps the state, under any wrapper (accelerate, Lightning, DeepSpeed)."""
    return _layers(optimizer)[2]


def adam_hyperparams(optimizer) -> AdamHyper:
    """Adam's beta1, beta2 and update count, read where every rank has them without a
    collective: the betas from the param groups' hyperparameters (the largest, if groups differ),
    and the update count Adam's bias correction uses, including the update just made — from the
    state's ``step`` (the first entry that has one; torch's Adam keeps one per parameter, all
    equal) or DeepSpeed FusedAdam's per-group ``step``. Each is None when absent.

    ``step`` is returned as it is kept: a Python number, a CPU tensor (torch's default: read it
    with ``float()``, no device involved) or a device tensor (``capturable=True`` or
    ``fused=True`` keep it on the GPU, updated by the kernels: ``.item()`` would wait for the
    device, so the probe keeps it on the device). Skipped fp16 steps never reach the optimizer, so
    they are not counted (DeepSpeed's ``global_steps`` counts them; Adam's ``t`` does not). No
    compute, no sync.
    """
    _, _, basic = _layers(optimizer)
    groups = getattr(basic, "param_groups", None) or []
    betas = [g["betas"] for g in groups if isinstance(g.get("betas"), (tuple, list)) and len(g["betas"]) > 1]
    beta1 = float(max(b[0] for b in betas)) if betas else None
    beta2 = float(max(b[1] for b in betas)) if betas else None
    steps = [g["step"] for g in groups if isinstance(g.get("step"), (int, float))]   # FusedAdam
    if steps:
        return AdamHyper(beta1, beta2, max(steps))
    # The first state entry that has one (O(1): torch's Adam keeps the same count for every
    # parameter; ZeRO keys its state by flat partitions, and ZeRO-3 empties the groups' "params"
    # between its sub-group steps, so the state is read directly, not through the groups).
    for st in (getattr(basic, "state", None) or {}).values():
        if "step" in st:
            step = st["step"]
            return AdamHyper(beta1, beta2, local_tensor(step) if isinstance(step, torch.Tensor) else step)
    return AdamHyper(beta1, beta2, None)


def find_adam_state(optimizer) -> AdamState | None:
    """Locate the rank-local ``exp_avg_sq`` and ``exp_avg`` of ``optimizer`` (no compute, no sync).

    Accepts a torch optimizer (Adam/AdamW in any implementation: default, foreach, fused), a
    wrapper (accelerate ``AcceleratedOptimizer``, Lightning ``LightningOptimizer``), a
    DeepSpeed engine or its ZeRO/BF16/FP16 optimizer, and FSDP2 (DTensor state). Returns None
    while the state is still empty (before the first step). Raises ``NoSecondMoment`` for
    optimizers without an unfactored second moment.
    """
    stage, wrapper, basic = _layers(optimizer)
    flat = _deepspeed_flat_partitions(wrapper) if wrapper is not None and stage != 0 else None
    if flat is not None:
        # ZeRO >= 1 / BF16_Optimizer: state keyed by the flat fp32 partitions (disjoint across
        # the DP group); views of each parameter's fragment (no copies).
        parts, pieces, numels, groups = flat
        vs, ms, params, tensor_of = [], [], [], []
        for part, segs in zip(parts, pieces):
            st = basic.state.get(part)
            if not st:
                return None
            if "exp_avg_sq" not in st:
                raise NoSecondMoment(type(basic).__name__)
            v, m, p = st["exp_avg_sq"].reshape(-1), st.get("exp_avg"), part.detach().reshape(-1)
            for s in segs:
                if s.numel > 0:
                    vs.append(v.narrow(0, s.offset, s.numel))
                    params.append(p.narrow(0, s.offset, s.numel))
                    ms.append(None if m is None else m.reshape(-1).narrow(0, s.offset, s.numel))
                    tensor_of.append(s.tensor)
        return AdamState(vs, _all_or_none(ms), tensor_of, numels, groups, list(basic.param_groups),
                         sum(t.numel() for t in vs), True, params, f"deepspeed:{type(wrapper).__name__}")

    state = basic.state
    all_params = [(p, gi) for gi, g in enumerate(basic.param_groups) for p in g["params"]]
    vs, ms, tensor_of = [], [], []
    sharded = replicated = any_state = False
    for i, (p, _) in enumerate(all_params):
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
        vs.append(local_tensor(v))
        ms.append(local_tensor(st["exp_avg"]) if "exp_avg" in st else None)
        tensor_of.append(i)
    if not any_state:
        return None
    if not vs or any(k in st for st in state.values() for k in _FACTORED_KEYS):
        raise NoSecondMoment(type(basic).__name__)
    if sharded and replicated:
        # Mixed plain and sharded state (e.g. a module left out of fully_shard) cannot be
        # reduced with one op; the replicated part would be counted world-size times.
        raise NoSecondMoment(f"{type(basic).__name__} with mixed sharded and replicated state")
    src = "fsdp2" if sharded else ("deepspeed:zero0" if stage == 0 else "torch")
    return AdamState(vs, _all_or_none(ms), tensor_of, [p.numel() for p, _ in all_params],
                     [g for _, g in all_params], list(basic.param_groups),
                     sum(t.numel() for t in vs), sharded, [local_tensor(p) for p, _ in all_params], src)


def state_key(optimizer) -> tuple:
    """What :func:`find_adam_state`'s answer depends on, cheap to compute every sampled step: the
    optimizer objects, their param groups, and the address and element count of every state
    tensor it would read (the flat partitions and their state under DeepSpeed; each parameter's
    ``exp_avg_sq`` and ``exp_avg`` otherwise, the local shard of a DTensor). An equal key means
    the :class:`AdamState` found before still describes the state, views and addresses included;
    a state created, replaced, reallocated or moved (``load_state_dict``, a new param group,
    DeepSpeed's ``offload_states``, which swaps ``.data``) changes it. No compute, no sync: a few
    dictionary reads, an address and a count per state tensor, in C-level loops (~0.2 us per
    parameter)."""
    stage, wrapper, basic = _layers(optimizer)
    state = basic.state
    flat = None
    if wrapper is not None and stage != 0:
        flat = next((getattr(wrapper, a) for a in _FLAT_PARTITIONS if hasattr(wrapper, a)), None)
    groups = basic.param_groups
    if flat is not None:
        holders, sizes = list(flat), ()
        entries = [e for e in map(state.get, holders) if e]
    else:
        sizes = tuple(len(g["params"]) for g in groups)
        entries = [e for g in groups for e in map(state.get, g["params"]) if e]
    try:
        vs, ms = list(map(_V, entries)), list(map(_M, entries))
    except KeyError:   # no exp_avg_sq (find_adam_state says so) or no exp_avg
        vs, ms = [e.get("exp_avg_sq") for e in entries], [e.get("exp_avg") for e in entries]
    tensors = (holders if flat is not None else []) + vs + ms
    return (id(wrapper), id(basic), id(state), tuple(map(id, groups)), sizes, len(entries),
            _addresses(tensors))


_V, _M = operator.itemgetter("exp_avg_sq"), operator.itemgetter("exp_avg")


def _addresses(tensors: list) -> tuple:
    """The data address and element count of each tensor (a DTensor's: its shard's); None for a
    missing one."""
    try:
        return tuple(map(torch.Tensor.data_ptr, tensors)), tuple(map(torch.Tensor.numel, tensors))
    except (TypeError, RuntimeError):   # a None (no exp_avg), a DTensor (no storage of its own)
        return tuple(_address(t) for t in tensors)


def _address(t):
    if t is None:
        return None
    if DTensor is not None and isinstance(t, DTensor):
        # the shard itself (DTensor._local_tensor, what to_local() views, without its autograd
        # function); the wrapper has no storage
        t = getattr(t, "_local_tensor", None)
        if t is None:
            return None
    return t.data_ptr(), t.numel()


def _all_or_none(tensors: list) -> list | None:
    return None if any(t is None for t in tensors) else tensors


def tensor_names(optimizer, model) -> list[str | None]:
    """The name in ``model`` of each parameter tensor, in the order :func:`find_adam_state` numbers
    them (``layers/top1/tensor`` is an index into this list); None where ``model`` does not hold
    the parameter. No compute, no sync."""
    names: dict[int, str] = {}
    for n, p in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(p), n)   # a tied parameter: the name of the module that holds it first
    stage, wrapper, basic = _layers(optimizer)
    lp_groups = None
    if wrapper is not None and stage != 0:
        lp_groups = next((getattr(wrapper, a) for a in ("fp16_groups", "bit16_groups", "bf16_groups")
                          if hasattr(wrapper, a)), None)
    groups = lp_groups if lp_groups is not None else [g["params"] for g in basic.param_groups]
    return [names.get(id(p)) for g in groups for p in g]


def optimized_params(optimizer=None, model=None) -> tuple[list, bool]:
    """The rank-local tensors ``optimizer`` updates (else ``model``'s parameters), for the
    parameter norm, and whether ranks hold disjoint pieces of them (ZeRO >= 1, FSDP2): then a
    sum over ranks is the whole; otherwise every rank holds the same full copy."""
    if optimizer is None:
        tensors = list(model.parameters())
        return tensors, any(is_sharded(p) for p in tensors)
    try:
        st = find_adam_state(optimizer)
    except NoSecondMoment:
        st = None
    if st is not None:   # the ZeRO partitions, padding excluded, where the state lives
        return st.params, st.partitioned
    basic = unwrap_optimizer(optimizer)
    basic = getattr(basic, "basic_optimizer", basic)
    tensors = [p for g in basic.param_groups for p in g["params"]]
    return tensors, any(is_sharded(p) for p in tensors)
