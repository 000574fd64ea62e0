"""Device kernels, each one read of its input and no host sync: Adam's moments (``exp_avg_sq``
max and L1, ``exp_avg``'s sum of squares, per parameter tensor too) in one pass, the parameters'
sum of squares, and a batch's fingerprint.

On a GPU the moments go through one Triton kernel over a table of the state's addresses
(:mod:`.triton_kernel`), built once per layout and kept by :class:`MomentPass`: one launch and a
few kernels to combine its rows, whatever the tensor count, and one read of each moment
(:class:`_DevicePlan`). Where Triton is missing (another accelerator, a build without it) or the
state is of mixed dtypes, torch's multi-tensor (``torch._foreach_*``) kernels do it instead. On
CPU, a compiled kernel (:mod:`.native`, ``moments.c``) reads each moment once, in one parallel
region of torch's threads (:func:`_moments_native`). Where it cannot be built, torch kernels do
the same in one pass of row sums (rows of 256 elements) over ``exp_avg_sq`` and of row norms over
``exp_avg``: the row sums give the L1 and bound the max, so only the rows that can hold the max
are read again (:func:`_moments_cpu`); the tensors are spread over as many threads as torch has
intra-op threads, each at one (:func:`_spread`). Where the tensors come from (ZeRO fragments,
FSDP2 shards, replicated state) is :mod:`.optim_state`'s job; reducing the results across ranks
is :class:`~.probe.StepProbe`'s.
"""
from __future__ import annotations

import contextlib
import math
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Iterable

import torch

from . import native, triton_kernel
from .optim_state import AdamState, find_adam_state, local_tensor, state_key
from .triton_kernel import CHUNK

__all__ = ["MomentStats", "MomentPass", "adam_moment_stats", "moment_stats", "param_sq_sum",
           "batch_fingerprint", "FOREACH_FAST_DEVICES"]

# CPU layout of the moment pass (see _moments_cpu): rows of 256 elements (1 KiB of fp32); pieces
# under 16 Ki elements are reduced together in one buffer (a kernel per piece costs more than its data).
_ROW = 1 << 8
_SMALL = 1 << 14
# Devices with fused multi-tensor kernels (torch/utils/_foreach_utils.py): the parameter norm takes
# them there. Every device but the CPU takes the device moment pass; with "cpu" added here (the
# tests, gpu_check.py --device cpu) CPU tensors take both device paths too.
FOREACH_FAST_DEVICES = ("cuda", "xpu", "mtia")


@dataclass(frozen=True)
class MomentStats:
    """Rank-local statistics of Adam's moments from one pass; 0-d device tensors (float64 sums).

    ``v_max``/``v_l1``: max and sum of ``exp_avg_sq``; ``m_sq``: sum of squares of ``exp_avg``
    (None without a first moment); ``numel``: local elements, padding excluded;
    ``per_tensor``: ``[num_tensors, 2]`` float64, the local part of each parameter tensor's
    ``exp_avg_sq`` sum and ``exp_avg`` sum of squares (zeros for tensors with no piece here;
    None when the layout is unknown or there is no first moment).
    """

    v_max: torch.Tensor
    v_l1: torch.Tensor
    m_sq: torch.Tensor | None
    numel: int
    partitioned: bool
    per_tensor: torch.Tensor | None


def adam_moment_stats(optimizer) -> MomentStats | None:
    """:func:`moment_stats` of the optimizer's local state (:func:`~.optim_state.find_adam_state`);
    None before step one. Raises ``NoSecondMoment`` (a subclass of Exception) for optimizers
    without a second moment; :class:`StepProbe` turns that into one line."""
    state = find_adam_state(optimizer)
    return None if state is None else moment_stats(state)


def moment_stats(state: AdamState) -> MomentStats:
    """One read of every local ``exp_avg_sq`` and ``exp_avg``; no host sync on accelerators. Builds
    the device pass's table for this call only: :class:`MomentPass` keeps it from step to step."""
    return _moment_stats(state, None)


class MomentPass:
    """The probe's pass over one optimizer's Adam state, step after step (issue 36).

    The state's layout (:func:`~.optim_state.find_adam_state`) and, on a device, the pass's pointer
    table (:class:`_DevicePlan`) are built once and rebuilt only when
    :func:`~.optim_state.state_key` changes (state created or replaced, tensors reallocated, groups
    changed). A sampled step then costs the key's few dictionary reads per tensor on the host and,
    on a device, a fixed number of kernels whatever the tensor count: the pass's one launch and
    a few to combine its rows. Holds the state's views until the next rebuild (one sample's worth
    of memory after ``load_state_dict``).

    ``__call__(optimizer)`` -> ``(AdamState, MomentStats)``, or None before the first step; raises
    ``NoSecondMoment`` as :func:`~.optim_state.find_adam_state` does.
    """

    def __init__(self):
        self._key: tuple | None = None
        self._state: AdamState | None = None
        self._plan: _DevicePlan | None = None

    def __call__(self, optimizer) -> tuple[AdamState, MomentStats] | None:
        key = state_key(optimizer)
        if key != self._key:
            self._state, self._plan = find_adam_state(optimizer), None
            self._key = key
        if self._state is None:
            return None
        if self._plan is None and _takes_device_pass(self._state):
            self._plan = _DevicePlan(self._state)
        return self._state, _moment_stats(self._state, self._plan)


def _takes_device_pass(state: AdamState) -> bool:
    dev = next((t.device for t in state.exp_avg_sq if t.numel() > 0), None)
    return dev is not None and (dev.type != "cpu" or "cpu" in FOREACH_FAST_DEVICES)


def _moment_stats(state: AdamState, plan: _DevicePlan | None) -> MomentStats:
    if plan is not None:
        return plan.run(state)
    keep = [i for i, t in enumerate(state.exp_avg_sq) if t.numel() > 0]
    if not keep:   # every local shard is empty: neutral values for MAX / SUM
        dev = state.exp_avg_sq[0].device if state.exp_avg_sq else torch.device("cpu")
        zero = torch.zeros((), dtype=torch.float64, device=dev)
        per_tensor = None if state.exp_avg is None or state.tensor_of is None else \
            torch.zeros((state.num_tensors, 2), dtype=torch.float64, device=dev)
        return MomentStats(zero, zero, None if state.exp_avg is None else zero, 0, state.partitioned, per_tensor)
    if _takes_device_pass(state):
        return _DevicePlan(state).run(state)
    vs = [state.exp_avg_sq[i] for i in keep]
    ms = None if state.exp_avg is None else [state.exp_avg[i] for i in keep]
    got = _moments_native(vs, ms)
    if got is None:
        with _one_thread() as threads:
            got = _moments_cpu(vs, ms, threads)
    v_max, piece_v, piece_m = got
    per_tensor = None
    if piece_m is not None and state.tensor_of is not None:
        idx = _index(tuple(state.tensor_of[i] for i in keep), vs[0].device)
        per_tensor = torch.zeros((state.num_tensors, 2), dtype=torch.float64, device=vs[0].device)
        per_tensor.index_add_(0, idx, torch.stack([piece_v, piece_m], 1))
    return MomentStats(v_max, piece_v.sum(), None if piece_m is None else piece_m.sum(),
                       state.numel, state.partitioned, per_tensor)


class _DevicePlan:
    """The device pass over one :class:`AdamState`'s non-empty pieces, built once per layout.

    Where a table kernel runs (:data:`_TABLE_KERNELS`: Triton on CUDA; every piece one dtype,
    contiguous, ``exp_avg`` beside ``exp_avg_sq``): the pieces cut into items of at most
    ``triton_kernel.CHUNK`` elements, their addresses and lengths in one int64 table on the device
    (``[3, items]``: v addresses, m addresses, lengths), and the tensor each item belongs to. A
    step is then one launch that writes ``[items, 3]`` (sum v, sum m^2, max v; float64), one
    ``index_add_`` into the per-tensor sums, and a few reductions: the same kernels for 148
    tensors as for 1480. Elsewhere (no Triton, another accelerator, mixed dtypes): torch's
    multi-tensor kernels, one per statistic, with host work per tensor inside them.
    """

    def __init__(self, state: AdamState):
        self._build(state)

    def _build(self, state: AdamState) -> None:
        keep = [i for i, t in enumerate(state.exp_avg_sq) if t.numel() > 0]
        self.vs = [state.exp_avg_sq[i] for i in keep]
        self.ms = None if state.exp_avg is None else [state.exp_avg[i] for i in keep]
        self.device = self.vs[0].device
        self.dtype = self.vs[0].dtype
        self.kernel = _table_kernel(self.vs, self.ms)
        of = None if state.tensor_of is None else [state.tensor_of[i] for i in keep]
        if self.kernel is not None:
            of = self._build_table(of)
        self.index = None if of is None or self.ms is None else \
            host_to_device(torch.tensor(of, dtype=torch.long), self.device)

    def _build_table(self, of: list | None) -> list | None:
        """The items, their table on the device; returns the tensor of each item."""
        size = self.vs[0].element_size()
        self.items = [(i, start, min(CHUNK, v.numel() - start))
                      for i, v in enumerate(self.vs) for start in range(0, v.numel(), CHUNK)]
        v_at = [self.vs[i].data_ptr() + size * start for i, start, _ in self.items]
        m_at = [0] * len(v_at) if self.ms is None else \
            [self.ms[i].data_ptr() + size * start for i, start, _ in self.items]
        self.aligned = all(a % 16 == 0 for a in (*v_at, *m_at))
        table = torch.tensor([v_at, m_at, [n for _, _, n in self.items]], dtype=torch.int64)
        self.table = host_to_device(table, self.device)
        return None if of is None else [of[i] for i, _, _ in self.items]

    def run(self, state: AdamState) -> MomentStats:
        if self.kernel is not None:
            out = torch.empty((len(self.items), 3), dtype=torch.float64, device=self.device)
            try:
                self.kernel(self, out)
            except Exception as e:
                if not getattr(self.kernel, "triton", False):
                    raise
                triton_kernel.failed(e)   # e.g. Triton cannot compile for this GPU: said once
                self._build(state)        # on the multi-tensor kernels from now on
                if self.kernel is not None:
                    raise
                return self.run(state)
            v_max, parts = out[:, 2].amax(), out[:, :2]
        else:
            v_max, piece_v, piece_m = _moments_foreach(self.vs, self.ms)
            parts = piece_v[:, None] if piece_m is None else torch.stack([piece_v, piece_m], 1)
        per_tensor = None
        if self.index is not None:
            per_tensor = torch.zeros((state.num_tensors, 2), dtype=torch.float64, device=self.device)
            sums = per_tensor.index_add_(0, self.index, parts).sum(0)
        else:
            sums = parts.sum(0)
        return MomentStats(v_max, sums[0], None if self.ms is None else sums[1], state.numel,
                           state.partitioned, per_tensor)


def _table_kernel(vs: list, ms: list | None):
    """The table kernel for these pieces (:data:`_TABLE_KERNELS`), or None: multi-tensor kernels."""
    dtype = vs[0].dtype
    if any(t.dtype != dtype or not t.is_contiguous() for t in (*vs, *(ms or ()))) or \
            (ms is not None and any(m.numel() != v.numel() for v, m in zip(vs, ms))):
        return None
    kernel = _TABLE_KERNELS.get(vs[0].device.type)
    return None if kernel is None else kernel(dtype)


def _triton(dtype):
    launch = triton_kernel.moments_kernel()
    if launch is None or dtype not in launch.dtypes:   # float64 state: multi-tensor kernels
        return None

    def run(plan: _DevicePlan, out: torch.Tensor) -> None:
        launch(plan.table, out, len(plan.items), plan.ms is not None, plan.dtype, plan.aligned)

    run.triton = True   # type: ignore[attr-defined]  # a failure: the multi-tensor kernels take over
    return run


def _shapes_only(plan: _DevicePlan, out: torch.Tensor) -> None:
    """``meta``: tensors without data, so no kernel: the pass's host work and dispatched ops alone
    (the op-count guard, ``scripts/bench_overhead.py --probe-host``)."""


def _items_in_torch(plan: _DevicePlan, out: torch.Tensor) -> None:
    """The table kernel's contract in torch kernels, item by item: what the device pass runs on CPU
    tensors (``"cpu"`` in :data:`FOREACH_FAST_DEVICES`: the tests, ``gpu_check.py --device cpu``),
    so that all of the device pass but the Triton kernel itself runs without a GPU."""
    rows = []
    for i, start, n in plan.items:
        v = plan.vs[i].reshape(-1)[start:start + n]
        m_sq = v.new_zeros((), dtype=torch.float64) if plan.ms is None else \
            plan.ms[i].reshape(-1)[start:start + n].to(torch.float64).square().sum()
        rows.append(torch.stack([v.sum(dtype=torch.float64), m_sq, v.amax().to(torch.float64)]))
    out.copy_(torch.stack(rows))


#: device type -> ``f(dtype)``: the table kernel ``kernel(plan, out)`` for that state dtype, or None
#: (multi-tensor kernels). The tests swap the CPU entry for the Triton kernel under its interpreter.
_TABLE_KERNELS = {"cuda": _triton, "meta": lambda dtype: _shapes_only, "cpu": lambda dtype: _items_in_torch}


def _moments_foreach(vs: list, ms: list | None):
    """Multi-tensor kernels: per piece the max and L1 of v (v >= 0: the L1 norm is the sum) and
    the sum of squares of m, accumulated in fp32 per piece, combined in float64."""
    v_max = torch.stack(torch._foreach_max(vs)).amax()
    piece_v = torch.stack(torch._foreach_norm(vs, 1, dtype=torch.float32)).to(torch.float64)
    piece_m = None if ms is None else \
        torch.stack(torch._foreach_norm(ms, 2, dtype=torch.float32)).to(torch.float64).square()
    return v_max, piece_v, piece_m


def _moments_native(vs: list, ms: list | None):
    """The CPU path of :func:`moment_stats` in the compiled kernel (:mod:`.native`): one read of
    each moment, in one parallel region of torch's intra-op threads. Tensors over ``_CHUNK``
    elements are cut into chunks, small ones taken together, and the threads take the units
    largest first as they come. None when the kernel is not built here, or the state is not
    one contiguous float32 or bfloat16 tensor per piece (same dtype for both moments): then
    :func:`_moments_cpu` runs.
    """
    kernels = native.moment_kernels()
    dtype = vs[0].dtype
    fn = None if kernels is None else kernels.get(dtype)
    if fn is None or any(t.dtype != dtype or not t.is_contiguous() for t in (*vs, *(ms or ()))) or \
            (ms is not None and any(m.numel() != v.numel() for v, m in zip(vs, ms))):
        return None
    plan = _native_plan(vs, ms)
    n = plan.num_items
    sum_v = torch.empty(n, dtype=torch.float64)
    sq_m = torch.empty(n, dtype=torch.float64)
    max_v = torch.empty(n, dtype=torch.float32)
    fn(plan.num_units, plan.units.data_ptr(), plan.order.data_ptr(), torch.get_num_threads(),
       plan.v_ptrs.data_ptr(), None if ms is None else plan.m_ptrs.data_ptr(), plan.lens.data_ptr(),
       sum_v.data_ptr(), sq_m.data_ptr(), max_v.data_ptr())
    piece_v = torch.zeros(len(vs), dtype=torch.float64).index_add_(0, plan.piece_of, sum_v)
    piece_m = None if ms is None else \
        torch.zeros(len(vs), dtype=torch.float64).index_add_(0, plan.piece_of, sq_m)
    total = piece_v.sum()
    if math.isnan(total):   # a NaN anywhere: the max is NaN too (the kernel's max skips NaN)
        return total, piece_v, piece_m
    return max_v.amax().to(torch.float64), piece_v, piece_m


# Work units of the compiled pass: a tensor over _CHUNK elements is cut into chunks of _CHUNK
# (4 MiB of fp32, a multiple of the kernel's 256-element block: about 0.5 ms of one core), and
# pieces are taken together until a unit holds _CHUNK / 4 elements.
_CHUNK = 1 << 20


@dataclass(frozen=True)
class _NativePlan:
    num_items: int
    v_ptrs: torch.Tensor     # int64 addresses of each item's first element
    m_ptrs: torch.Tensor | None
    lens: torch.Tensor       # int64 elements per item
    piece_of: torch.Tensor   # long: the piece each item belongs to
    num_units: int
    units: torch.Tensor      # int64: unit u holds items units[u] .. units[u + 1]
    order: torch.Tensor      # int64: the units, largest first


def _native_plan(vs: list, ms: list | None) -> _NativePlan:
    """The items and work units of the compiled pass over these tensors: a pure function of
    their addresses, sizes and dtype, cached on them (only integers are kept: no tensor stays
    alive through the cache)."""
    key = (vs[0].dtype, tuple((t.data_ptr(), t.numel()) for t in vs),
           None if ms is None else tuple(t.data_ptr() for t in ms))
    plan = _PLAN_CACHE.get(key)
    if plan is not None:
        return plan
    size = vs[0].element_size()
    items = [(i, start, min(_CHUNK, v.numel() - start))
             for i, v in enumerate(vs) for start in range(0, v.numel(), _CHUNK)]
    bounds, held, unit_size = [0], 0, []
    for k, (_, _, count) in enumerate(items):
        held += count
        if held >= _CHUNK // 4 or k == len(items) - 1:
            bounds.append(k + 1)
            unit_size.append(held)
            held = 0
    plan = _NativePlan(
        num_items=len(items),
        v_ptrs=torch.tensor([vs[i].data_ptr() + size * s for i, s, _ in items], dtype=torch.int64),
        m_ptrs=None if ms is None else
        torch.tensor([ms[i].data_ptr() + size * s for i, s, _ in items], dtype=torch.int64),
        lens=torch.tensor([c for _, _, c in items], dtype=torch.int64),
        piece_of=torch.tensor([i for i, _, _ in items], dtype=torch.long),
        num_units=len(unit_size),
        units=torch.tensor(bounds, dtype=torch.int64),
        order=torch.tensor(sorted(range(len(unit_size)), key=lambda u: -unit_size[u]), dtype=torch.int64))
    if len(_PLAN_CACHE) > 8:
        _PLAN_CACHE.clear()
    _PLAN_CACHE[key] = plan
    return plan


_PLAN_CACHE: dict = {}


def _moments_cpu(vs: list, ms: list | None, threads: int = 1):
    """The CPU path of :func:`moment_stats`: one read of each moment from memory, plus the few
    rows of v that can hold its max, spread over ``threads`` threads (:func:`_spread`).

    CPU foreach kernels are per-tensor loops, a whole-tensor norm or L1 in fp32 drifts (1e-2 on
    GPT-2's 38 M-element embedding state), and a max beside the sum would read v twice. Instead
    every full row of ``_ROW`` elements is reduced on its own (v: its sum; m: its L2 norm, both
    in fp32) and combined per piece in float64; pieces under ``_SMALL`` elements, and the large
    ones' tails, are summed in one float64 buffer. The row sums of v bound its max: a
    non-negative element is never above its row's sum, also after fp32 rounding (rounding is
    monotone). So once a piece's rows are summed, its max is read from its row with the largest
    sum, then from the rows whose sum reaches the largest element found so far in any piece
    (skipping the others is safe: that element is a lower bound of the max). Real optimizer state
    is heavy-tailed across and within tensors and the pieces go largest first: after one AdamW
    step of GPT-2 small, 0.06 % of v is read again. Flat state leaves every row a candidate,
    which costs a second read of v. Host decisions here cost nothing: on CPU there is no device
    to wait for. Every piece's sums are formed in one order whichever thread reduces it, and the
    max is the max: the result does not depend on timing.
    """
    n = len(vs)
    big = sorted((i for i in range(n) if vs[i].numel() >= _SMALL), key=lambda i: -vs[i].numel())
    per_piece: dict[int, tuple] = {}   # float64 sums of v and of m's squares
    rest: list = [None, None]          # the same for the rest, per piece
    found = [-math.inf]                # the largest element of v found so far
    lock = threading.Lock()

    def raise_found(value: float) -> float:
        with lock:
            found[0] = max(found[0], value)
            return found[0]

    def reduce_piece(i: int) -> None:   # a few kernels per piece: few Python steps (they hold the GIL)
        rows = _rows(vs[i])
        sums = rows.sum(1, dtype=_acc(vs[i].dtype))
        sq = None if ms is None else _rows_sq_sum(ms[i])
        per_piece[i] = (sums.sum(dtype=torch.float64), sq)
        if float(sums.amax()) < found[0]:
            return   # no row sums to the largest element found: none holds a larger one
        best = raise_found(float(rows[int(sums.argmax())].amax()))
        cand = (sums >= best).nonzero().squeeze(1)
        if cand.numel():
            # a copy of a third costs as much as reading all
            got = _amax_nonneg(rows if 3 * cand.numel() > sums.numel() else rows.index_select(0, cand))
            raise_found(float(got))

    def reduce_rest() -> None:   # one float64 buffer: every small piece whole, every large one's tail
        large = set(big)
        pieces, rest_v, rest_m = [], [], []
        for i, v in enumerate(vs):
            start = v.numel() // _ROW * _ROW if i in large else 0
            if v.numel() > start:
                pieces.append((i, v.numel() - start))
                rest_v.append(v.reshape(-1)[start:])
                if ms is not None:
                    rest_m.append(ms[i].reshape(-1)[start:])
        if pieces:
            idx = _index(("rows", *pieces), torch.device("cpu"))
            flat = torch.cat(rest_v).to(torch.float64)
            rest[0] = torch.zeros(n, dtype=torch.float64).index_add_(0, idx, flat)
            raise_found(float(flat.max()))
            if ms is not None:
                rest[1] = torch.zeros(n, dtype=torch.float64).index_add_(
                    0, idx, torch.cat(rest_m).to(torch.float64).square())

    # the rest first: it overlaps the largest piece
    _spread(lambda i: reduce_rest() if i < 0 else reduce_piece(i), [-1, *big], threads)
    piece_v = torch.zeros(n, dtype=torch.float64) if rest[0] is None else rest[0]
    piece_m = None if ms is None else torch.zeros(n, dtype=torch.float64) if rest[1] is None else rest[1]
    if big:
        idx = _index(tuple(big), torch.device("cpu"))
        piece_v.index_add_(0, idx, torch.stack([per_piece[i][0] for i in big]))
        if piece_m is not None:
            piece_m.index_add_(0, idx, torch.stack([per_piece[i][1] for i in big]))
    total = piece_v.sum()
    if math.isnan(total):   # a NaN anywhere: the max is NaN too (a negative-signed NaN included)
        return total, piece_v, piece_m
    return torch.tensor(found[0], dtype=torch.float64), piece_v, piece_m


def _rows(t: torch.Tensor) -> torch.Tensor:
    """The full rows of ``_ROW`` elements of ``t``, as a ``[k, _ROW]`` view."""
    k = t.numel() // _ROW
    return t.reshape(-1)[:k * _ROW].view(k, _ROW)


def _rows_sq_sum(t: torch.Tensor) -> torch.Tensor:
    """The sum of squares of ``t``'s full rows: fp32 row norms, combined in float64 (0-d)."""
    return torch.linalg.vector_norm(_rows(t), dim=1, dtype=torch.float32).to(torch.float64).square().sum()


def _spread(fn, items: list, threads: int) -> None:
    """``fn(item)`` for every item, on this thread and ``threads - 1`` pool threads, each at one
    intra-op thread and taking the next item when done with its last.

    Why not torch's own threads: a multi-threaded kernel is a parallel region that ends when its
    slowest thread does, and on a shared CPU one thread is often descheduled (measured on 2 shared
    cores: 4-30x slower than one thread, a region per tensor). Python threads (torch releases the
    GIL inside a kernel) wait for each other once, at the end, and a descheduled one holds back
    only the item it is on: with the largest items first, a small one.
    """
    if threads <= 1 or len(items) < 2:
        for item in items:
            fn(item)
        return
    it, lock, stop = iter(items), threading.Lock(), threading.Event()

    def work(pooled: bool) -> None:
        if pooled:   # a pool thread at one intra-op thread (the caller has set its own: _one_thread)
            torch.set_num_threads(1)
        while not stop.is_set():
            with lock:
                item = next(it, _DONE)
            if item is _DONE:
                return
            try:
                fn(item)
            except BaseException:
                stop.set()
                raise

    futures = [_pool(threads - 1).submit(work, True) for _ in range(threads - 1)]
    try:
        work(False)
    finally:
        for f in futures:
            f.result()


_DONE = object()
_POOL: list = [None, 0, 0]   # executor, its workers, the pid it was made in


def _pool(workers: int) -> ThreadPoolExecutor:
    """The pool :func:`_spread` runs on: made on first use, again after a fork (a child has none
    of its parent's threads) or when more workers are asked for."""
    pool, size, pid = _POOL
    if pool is None or pid != os.getpid() or size < workers:
        if pool is not None and pid == os.getpid():
            pool.shutdown(wait=False)
        pool = ThreadPoolExecutor(workers, thread_name_prefix="stability-reduce")
        _POOL[:] = [pool, workers, os.getpid()]
    return pool


@contextlib.contextmanager
def _one_thread():
    """This thread at one intra-op thread, the count it had given to the ``with``: the CPU pass
    spreads its pieces over that many threads of its own (:func:`_spread`)."""
    n = torch.get_num_threads()
    if n == 1:
        yield n
        return
    torch.set_num_threads(1)
    try:
        yield n
    finally:
        torch.set_num_threads(n)


_INDEX_CACHE: dict = {}


def _index(layout: tuple, device) -> torch.Tensor:
    """A cached long index on ``device``: for ``("rows", (piece, count)...)`` each piece number
    repeated count times; otherwise the layout itself (the tensor number of each piece)."""
    key = (layout, str(device))
    idx = _INDEX_CACHE.get(key)
    if idx is None:
        if len(_INDEX_CACHE) > 32:
            _INDEX_CACHE.clear()
        if layout and layout[0] == "rows":
            pieces, counts = zip(*layout[1:])
            host = torch.repeat_interleave(torch.tensor(pieces), torch.tensor(counts))
        else:
            host = torch.tensor(layout, dtype=torch.long)
        idx = _INDEX_CACHE[key] = host_to_device(host, device)
    return idx


def host_to_device(t: torch.Tensor, device) -> torch.Tensor:
    """``t`` (a host tensor) on ``device`` without a host sync: a pinned, non-blocking copy on
    CUDA (torch's pinned allocator keeps the source alive until the copy is done)."""
    device = torch.device(device)
    if device.type == "cpu":
        return t
    if device.type == "cuda":
        t = t.pin_memory()
    return t.to(device, non_blocking=True)


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


def param_sq_sum(tensors: Iterable[torch.Tensor]) -> torch.Tensor | None:
    """Sum of squares (float64 0-d device tensor) of the local tensors; one read of each."""
    ts = [local_tensor(t).detach() for t in tensors]
    ts = [t for t in ts if t.numel() > 0]
    if not ts:
        return None
    if ts[0].device.type in FOREACH_FAST_DEVICES:
        norms = torch._foreach_norm(ts, 2, dtype=torch.float32)
        return torch.stack(norms).to(torch.float64).square().sum()
    parts = [0.0] * len(ts)   # per tensor: its rows (fp32 norms) and its tail, in float64

    def reduce_tensor(i: int) -> None:
        flat = ts[i].reshape(-1)
        tail = flat[flat.numel() // _ROW * _ROW:]
        parts[i] = float(_rows_sq_sum(flat) + tail.to(torch.float64).square().sum())

    with _one_thread() as threads:
        _spread(reduce_tensor, sorted(range(len(ts)), key=lambda i: -ts[i].numel()), threads)
    return torch.tensor(parts, dtype=torch.float64).sum()


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

