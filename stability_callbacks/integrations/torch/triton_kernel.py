"""The device moment pass's kernel: one Triton launch over a pointer table, whatever the number
of tensors (issue 36; :class:`~.reductions.MomentPass` builds the table and combines the result).

Why a kernel of our own: torch's multi-tensor kernels (``torch._foreach_max``, ``_foreach_norm``)
read ``exp_avg_sq`` once for its max and once more for its L1 (no torch kernel gives both from one
read), and each returns one tensor per input, so the host work of a pass grows with the tensor
count (on the H200: 2.2 ms of host launch work for GPT-2's 148 tensors against 0.15 ms for one
read of the bytes; docs/measured.md). Here the tensors are rows of a table, built once per layout
and kept on the device: row ``i`` holds the address of an item (a run of at most ``CHUNK``
elements of one state tensor) in ``exp_avg_sq`` and in ``exp_avg`` and its length. Program ``i``
reads its item once and writes ``out[i] = (sum v, sum m^2, max v)``: lanes of ``BLOCK`` fp32
sums (at most ``CHUNK / BLOCK`` additions each), added across the lanes in float64. Whole blocks
are read without a mask and, where every address is 16-byte aligned (separate state tensors; not
ZeRO's fragments of a flat partition), with 128-bit loads (checked in the PTX for sm_90). A NaN anywhere
in the item makes its sum NaN, and its max is then NaN too (a hardware max skips NaN; torch's
``amax`` does not, and neither may the pass).

Triton ships with torch's CUDA wheels (``import triton``); where it is missing the pass runs on
torch's multi-tensor kernels instead, and one INFO line says why. ``STABILITY_CALLBACKS_TRITON=0``
turns it off. The first launch compiles the kernel (about a second, once per process and dtype;
Triton caches it on disk).
"""
from __future__ import annotations

import logging
import os
import threading

import torch

log = logging.getLogger("stability_callbacks")

__all__ = ["moments_kernel", "status", "failed", "CHUNK"]

#: Elements per item (a tensor longer than this is cut into several): 256 KiB of fp32, enough
#: work per program to stream at full bandwidth, and ~1900 programs for GPT-2 small's 124 M.
CHUNK = 1 << 16
_BLOCK = 1024
_LOCK = threading.Lock()
_STATE: dict = {}   # "kernel": the launcher or None once tried; "why": what happened


def moments_kernel():
    """``launch(table, out, num_items, has_m, dtype, aligned)`` on the table's device (CUDA)
    (``aligned``: every address in the table is a multiple of 16 bytes), or None where
    Triton cannot be imported here (said once, at INFO). Tried on the first call of the process."""
    if "kernel" not in _STATE:
        with _LOCK:
            if "kernel" not in _STATE:
                _STATE["kernel"] = _load()
    return _STATE["kernel"]


def status() -> str:
    """One line: which device moment pass runs here, and why (after :func:`moments_kernel`)."""
    moments_kernel()
    return _STATE["why"]


def _load():
    if os.environ.get("STABILITY_CALLBACKS_TRITON", "1").strip() == "0":
        return _without("STABILITY_CALLBACKS_TRITON=0")
    try:
        import triton
        import triton.language as tl
    except ImportError as e:
        return _without(f"Triton cannot be imported ({e})")
    kernel = _define(triton, tl)
    dtypes = {torch.float32: tl.float32, torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}

    def launch(table: torch.Tensor, out: torch.Tensor, num_items: int, has_m: bool, dtype, aligned: bool) -> None:
        args = (table, out, num_items, has_m, dtypes[dtype], _BLOCK, aligned)
        if out.device.type == "cuda":
            with torch.cuda.device(out.device):   # Triton launches on the current device
                kernel[(num_items,)](*args, num_warps=4)
        else:   # TRITON_INTERPRET=1: the same kernel on CPU tensors (the tests)
            kernel[(num_items,)](*args)

    launch.dtypes = tuple(dtypes)   # type: ignore[attr-defined]
    _STATE["why"] = f"Triton {triton.__version__}: one kernel over a pointer table"
    return launch


def failed(error: Exception) -> None:
    """The kernel raised (it could not be compiled or launched here): the multi-tensor kernels from
    now on, said once at WARNING."""
    with _LOCK:
        if _STATE.get("kernel") is None:
            return
        _STATE["kernel"] = None
        _STATE["why"] = f"multi-tensor kernels: the Triton kernel failed ({type(error).__name__}: {error})"
    log.warning("stability: the Triton moment kernel failed (%s: %s); the device moment pass uses "
                "torch's multi-tensor kernels from now on", type(error).__name__, error)


def _without(why: str) -> None:
    _STATE["why"] = f"multi-tensor kernels: {why}"
    log.info("stability: the device moment pass uses torch's multi-tensor kernels (host work per "
             "tensor, exp_avg_sq read twice) instead of one Triton kernel: %s", why)
    return None


def _define(triton, tl):
    @triton.jit(do_not_specialize=["num_items"])   # one compile per dtype, whatever the layout
    def moments(table, out, num_items, HAS_M: tl.constexpr, DTYPE: tl.constexpr, BLOCK: tl.constexpr,
                ALIGNED: tl.constexpr):
        item = tl.program_id(0)
        v_ptr = tl.load(table + item).to(tl.pointer_type(DTYPE))
        m_ptr = tl.load(table + num_items + item).to(tl.pointer_type(DTYPE))
        n = tl.load(table + 2 * num_items + item)
        if ALIGNED:   # every address of the table 16-byte aligned: 128-bit loads
            v_ptr = tl.multiple_of(v_ptr, 16)
            m_ptr = tl.multiple_of(m_ptr, 16)
        sum_v = tl.zeros([BLOCK], dtype=tl.float32)
        sum_m = tl.zeros([BLOCK], dtype=tl.float32)
        max_v = tl.zeros([BLOCK], dtype=tl.float32)   # v >= 0: 0 is the max's neutral element
        full = n - n % BLOCK
        for start in range(0, full, BLOCK):   # whole blocks without a mask (a mask stops vector loads)
            offs = start + tl.arange(0, BLOCK)
            v = tl.load(v_ptr + offs).to(tl.float32)
            sum_v += v
            max_v = tl.maximum(max_v, v)
            if HAS_M:
                m = tl.load(m_ptr + offs).to(tl.float32)
                sum_m += m * m
        offs = full + tl.arange(0, BLOCK)   # the tail, masked
        v = tl.load(v_ptr + offs, mask=offs < n, other=0.0).to(tl.float32)
        sum_v += v
        max_v = tl.maximum(max_v, v)
        if HAS_M:
            m = tl.load(m_ptr + offs, mask=offs < n, other=0.0).to(tl.float32)
            sum_m += m * m
        total = tl.sum(sum_v.to(tl.float64), axis=0)
        top = tl.max(max_v, axis=0).to(tl.float64)
        tl.store(out + 3 * item, total)
        tl.store(out + 3 * item + 1, tl.sum(sum_m.to(tl.float64), axis=0))
        tl.store(out + 3 * item + 2, tl.where(total != total, total, top))   # a NaN in the sum: in the max

    return moments
