"""Host reads and host syncs the package makes while a real model trains, counted per call site.

Used by ``tests/test_host_sync.py`` (CPU) and ``scripts/gpu_check.py`` (CPU and CUDA). Every
count is attributed to the first frame outside torch: the package's own reads by
``(file, function)``, a framework's (even inside a method the package wraps) left out.

- :class:`ValueReads` (any device): every scalar read (``_local_scalar_dense``: what ``.item()``,
  ``float()``, ``int()`` and ``bool()`` of a tensor dispatch to) and every ``.tolist()`` /
  ``.numpy()`` / ``.cpu()`` (which read memory without dispatching a scalar op). On a GPU each
  would wait for the device; on CPU this is how the property is proved.
- :class:`SyncWarnings` (CUDA): what ``torch.cuda.set_sync_debug_mode`` reports, attributed the
  same way.
- :class:`DispatchedOps` (any device, ``meta`` included): every op that reaches the dispatcher,
  the op-count guard of the device moment pass (``tests/test_probe_device.py``,
  ``scripts/bench_overhead.py --probe-host``). "warn", not "error": a framework's own syncs (the HF Trainer's NaN filter, DeepSpeed's
  overflow check) must not stop the run that measures ours; they are counted apart.
"""
from __future__ import annotations

import collections
import os
import sys
import warnings

import torch
from torch.utils._python_dispatch import TorchDispatchMode

import stability_callbacks

PACKAGE = os.path.dirname(os.path.abspath(stability_callbacks.__file__))
TORCH = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_SKIP = (TORCH, os.path.dirname(os.path.abspath(warnings.__file__)) + os.sep + "warnings.py",
         os.path.abspath(__file__))


def call_site(frame) -> tuple[str, str] | None:
    """(file, function) of the code that asked, when it is the package's, else None: the first
    frame from ``frame`` up that is not torch's (or the warnings machinery, or this file)."""
    while frame is not None and frame.f_code.co_filename.startswith(_SKIP):
        frame = frame.f_back
    if frame is None or not frame.f_code.co_filename.startswith(PACKAGE + os.sep):
        return None
    return os.path.basename(frame.f_code.co_filename), frame.f_code.co_name


class _Counts:
    def __init__(self, step_of=lambda: None):
        self.counts: collections.Counter = collections.Counter()   # (file, function, what) -> n
        self.steps: collections.Counter = collections.Counter()    # (step, file, function, what) -> n
        self.others = 0                                            # not the package's
        self.step_of = step_of

    def _count(self, site, what: str) -> None:
        if site is None:
            self.others += 1
            return
        self.counts[(*site, what)] += 1
        self.steps[(self.step_of(), *site, what)] += 1

    def per_step(self, steps) -> collections.Counter:
        """The package's counts over ``steps``, summed per ``(file, function, what)``."""
        out: collections.Counter = collections.Counter()
        for (n, *site), count in self.steps.items():
            if n in steps:
                out[tuple(site)] += count
        return out


class ValueReads(_Counts, TorchDispatchMode):
    """Counts every value read, per call site in the package."""

    def __init__(self, step_of=lambda: None):
        _Counts.__init__(self, step_of)
        TorchDispatchMode.__init__(self)
        self._originals = {name: getattr(torch.Tensor, name) for name in ("tolist", "numpy", "cpu")}
        self._own = {name for name in self._originals if name in vars(torch.Tensor)}

    def __enter__(self):
        for name, orig in self._originals.items():
            def wrapper(t, *args, _orig=orig, _name=name, **kwargs):
                self._count(call_site(sys._getframe(1)), _name)
                return _orig(t, *args, **kwargs)

            setattr(torch.Tensor, name, wrapper)
        return super().__enter__()

    def __exit__(self, *exc):
        for name, orig in self._originals.items():
            if name in self._own:
                setattr(torch.Tensor, name, orig)
            else:
                delattr(torch.Tensor, name)   # inherited from TensorBase again
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self._count(call_site(sys._getframe(1)), "scalar")
        return func(*args, **(kwargs or {}))


class SyncWarnings(_Counts):
    """CUDA: every host sync ``torch.cuda.set_sync_debug_mode("warn")`` reports, per call site."""

    def __enter__(self):
        self._catch = warnings.catch_warnings()
        self._catch.__enter__()
        warnings.simplefilter("always")
        shown = warnings.showwarning

        def show(message, category, filename, lineno, file=None, line=None):
            if "synchroniz" in str(message):
                self._count(call_site(sys._getframe(1)), "sync")
            else:
                shown(message, category, filename, lineno, file, line)

        warnings.showwarning = show
        torch.cuda.set_sync_debug_mode("warn")
        return self

    def __exit__(self, *exc):
        torch.cuda.set_sync_debug_mode(0)
        self._catch.__exit__(*exc)
        return False


class DispatchedOps(TorchDispatchMode):
    """Every op that reaches the dispatcher inside the ``with``, by name (a multi-tensor op counts
    once; the ops inside an op's own kernel are not seen)."""

    def __init__(self):
        super().__init__()
        self.ops: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func)] += 1
        return func(*args, **(kwargs or {}))
