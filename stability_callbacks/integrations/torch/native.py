"""The CPU moment pass's compiled kernel (``moments.c``): built with the machine's C compiler at
first use, cached, loaded with :mod:`ctypes`.

Why a compiled kernel: torch has no kernel that reads a tensor once for both its sum and its
max, and the pass in torch kernels (:func:`.reductions._moments_cpu`) costs 1.3-1.6x one memory
pass on GPT-2 small, two threads; this one costs about one pass (docs/measured.md). It runs in
one parallel region of torch's own OpenMP runtime, so it is built only where that runtime is
GNU libgomp (torch's Linux builds): the kernel links ``libgomp.so.1`` and the loader hands it
the copy torch has loaded, never a second runtime.

* Compiler: ``$CC`` (default ``cc``), ``-O3 -shared -fPIC -fopenmp``, plus ``-mavx2 -mfma``
  where ``/proc/cpuinfo`` shows both (the flags are part of the cached file's name, so a
  machine without them never loads that build).
* Cache: ``$STABILITY_CALLBACKS_CACHE``, else ``$XDG_CACHE_HOME/stability_callbacks``, else
  ``~/.cache/stability_callbacks`` (a private temporary folder when that cannot be written). The
  file name carries a hash of the source and the flags; it is written under a temporary name and
  renamed, so ranks that build it at the same time each load a whole file.
* ``STABILITY_CALLBACKS_NATIVE=0`` turns it off. Without a compiler, or when the build fails,
  the torch kernels run instead (the same statistics) and one INFO line says why.
"""
from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import platform
import re
import shlex
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

log = logging.getLogger("stability_callbacks")

__all__ = ["moment_kernels", "status"]

_SOURCE = Path(__file__).with_name("moments.c")
_FUNCTIONS = {torch.float32: "moments_f32_all", torch.bfloat16: "moments_bf16_all"}
_LOCK = threading.Lock()
_STATE: dict = {}   # "kernels": {dtype: function} or None once tried; "why": what happened


def moment_kernels() -> dict | None:
    """``{dtype: function}`` of the built kernel (float32, bfloat16), or None when it cannot be
    built or loaded here (said once, at INFO). Built on the first call of the process."""
    if "kernels" not in _STATE:
        with _LOCK:
            if "kernels" not in _STATE:
                _STATE["kernels"] = _load()
    return _STATE["kernels"]


def status() -> str:
    """One line: which CPU moment pass runs here, and why (after :func:`moment_kernels`)."""
    moment_kernels()
    return _STATE["why"]


def _load() -> dict | None:
    if os.environ.get("STABILITY_CALLBACKS_NATIVE", "1").strip() == "0":
        return _without("STABILITY_CALLBACKS_NATIVE=0")
    runtimes = _openmp_runtimes()
    if not any(r.endswith("/libgomp.so.1") for r in runtimes):
        return _without("torch's OpenMP runtime here is not GNU libgomp")
    flags = ["-O3", "-shared", "-fPIC", "-std=gnu11", "-fopenmp", *_simd_flags()]
    key = hashlib.sha256(_SOURCE.read_bytes() + repr((flags, platform.machine())).encode()).hexdigest()[:16]
    try:
        path = _cache_dir() / f"moments-{key}.so"
        if not path.exists():
            why = _build(flags, path)
            if why:
                return _without(why)
        lib = ctypes.CDLL(str(path))
    except OSError as e:
        return _without(f"cannot load the compiled kernel ({e})")
    extra = _openmp_runtimes() - runtimes
    if extra:   # e.g. CC=clang links LLVM's libomp: its threads would compete with torch's
        return _without(f"{path.name} brought a second OpenMP runtime ({', '.join(sorted(extra))}); "
                        "set CC to gcc")
    kernels = {}
    for dtype, name in _FUNCTIONS.items():
        fn = getattr(lib, name)
        fn.argtypes = [ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int] + [ctypes.c_void_p] * 6
        fn.restype = None
        kernels[dtype] = fn
    _STATE["why"] = f"compiled kernel {path} (one read of Adam's moments)"
    return kernels


def _without(why: str) -> None:
    _STATE["why"] = f"torch kernels: {why}"
    log.info("stability: the CPU moment pass uses torch kernels (1.3-1.6x one memory pass "
             "instead of one): %s", why)
    return None


def _build(flags: list, path: Path) -> str | None:
    """Compile the kernel into ``path``; the reason it could not, or None."""
    cc = shlex.split(os.environ.get("CC", "cc")) or ["cc"]
    if shutil.which(cc[0]) is None:
        return f"no C compiler ({cc[0]!r} not found; set CC)"
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
    try:
        done = subprocess.run([*cc, *flags, "-o", str(tmp), str(_SOURCE)],
                              capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            err = (done.stderr or done.stdout).strip().splitlines()
            return f"{cc[0]} failed ({err[-1] if err else 'exit ' + str(done.returncode)})"
        os.replace(tmp, path)
    except (OSError, subprocess.SubprocessError) as e:
        return f"{cc[0]} failed ({e})"
    finally:
        tmp.unlink(missing_ok=True)
    return None


def _openmp_runtimes() -> set:
    """The OpenMP runtimes mapped in this process (torch's Linux wheels map GNU ``libgomp.so.1``
    with their CPU library); empty where ``/proc`` is not there."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split(maxsplit=5)[-1].strip() for line in maps if "omp" in line}
    except OSError:
        return set()
    return {p for p in paths if re.search(r"/lib(g|i|i5)?omp[^/]*\.so", p)}


def _simd_flags() -> list:
    try:
        cpu = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    line = next((ln for ln in cpu.splitlines() if ln.startswith("flags")), "")
    have = set(line.partition(":")[2].split())
    return ["-mavx2", "-mfma"] if {"avx2", "fma"} <= have else []


def _cache_dir() -> Path:
    env = os.environ.get("STABILITY_CALLBACKS_CACHE")
    if env:
        base = Path(env)
    else:
        base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "stability_callbacks"
    try:
        base.mkdir(parents=True, exist_ok=True, mode=0o700)
        if os.access(base, os.W_OK):
            return base
    except OSError:
        pass
    return Path(tempfile.mkdtemp(prefix="stability_callbacks-"))
