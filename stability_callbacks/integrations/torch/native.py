"""The CPU moment pass's compiled kernel (``moments.c``): built with the machine's C compiler at
first use, cached, loaded with :mod:`ctypes`.

Why a compiled kernel: torch has no kernel that reads a tensor once for both its sum and its
max. On GPT-2 small, 2 threads (docs/measured.md), this kernel reads ``exp_avg_sq`` for its max
and L1 at 0.94-1.11x the cost of one ``sum`` over it, the torch kernels
(:func:`.reductions._moments_cpu`) at 1.3-1.6x; the probe's whole pass, both moments, is
1.7-2.0x against 2.6-3.3x.
On 16 threads the torch kernels fall further behind (4.5x against 0.82-0.83x). It runs in one
parallel region of torch's own OpenMP runtime, so it is built only where that runtime is GNU
libgomp (torch's Linux builds): the kernel links ``libgomp.so.1`` and the loader hands it the
copy torch has loaded, never a second runtime.

* Compiler: ``$CC`` (default ``cc``), ``-O3 -shared -fPIC -fopenmp``, plus ``-mavx2 -mfma``
  where ``/proc/cpuinfo`` shows both.
* Cache: ``$STABILITY_CALLBACKS_CACHE``, else ``$XDG_CACHE_HOME/stability_callbacks``, else
  ``~/.cache/stability_callbacks``; where that cannot be made or written, one folder per user,
  ``<tempdir>/stability_callbacks-<uid>`` (mode 0700; used only while it is the user's own
  folder, not a link). The file name carries a hash of the source, the flags and the platform
  (OS, machine, C library), then one of the compiler (its resolved path and the first line of
  its ``--version``): a new compiler builds anew, and a machine without the AVX2 flags never
  loads that build. It is written under a temporary name and renamed, so ranks that build it at
  the same time each load a whole file. Without a compiler, a cached build for this source,
  flags and platform is loaded all the same.
* A cached file that does not load (cut short, not a library, without the kernel's functions) is
  rebuilt once. A file cut short is refused before ``dlopen``, which would map it past its end
  and die of SIGBUS.
* ``STABILITY_CALLBACKS_NATIVE=0`` turns it off. Without a compiler, when the build fails, or when
  the rebuilt file does not load either, the torch kernels run instead (the same statistics)
  and one INFO line says why.
"""
from __future__ import annotations

import _ctypes
import ctypes
import hashlib
import logging
import os
import platform
import re
import shlex
import shutil
import stat
import struct
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


class _NoKernel(Exception):
    """Why the compiled kernel cannot be used here (the torch kernels run instead)."""


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
    cc = shlex.split(os.environ.get("CC", "cc")) or ["cc"]
    try:
        lib, path = _open_kernel(cc, flags)
    except _NoKernel as e:
        return _without(str(e))
    except OSError as e:   # the cache folder or the source, read while another process writes
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
    log.info("stability: the CPU moment pass uses torch kernels (slower than the compiled kernel, "
             "the more so the more threads): %s", why)
    return None


def _open_kernel(cc: list, flags: list) -> tuple[ctypes.CDLL, Path]:
    """The kernel's library and its file: this compiler's cached build, else built now. A
    cached file that does not load is rebuilt once. Raises :class:`_NoKernel` with the reason."""
    folder = _cache_dir()
    base = _digest(_SOURCE.read_bytes(), repr((flags, _platform())))
    compiler = _compiler(cc)
    if compiler is None:   # no compiler to rebuild with: any build of this source, flags, platform
        cached = sorted(folder.glob(f"moments-{base}-*.so"), key=lambda p: p.stat().st_mtime)
        if not cached:
            raise _NoKernel(f"no C compiler ({cc[0]!r} not found; set CC)")
        try:
            return _dlopen(cached[-1]), cached[-1]
        except _NoKernel as e:
            raise _NoKernel(f"the cached {cached[-1]} does not load ({e}), and there is no C compiler "
                            f"to rebuild it with ({cc[0]!r} not found; set CC)") from None
    path = folder / f"moments-{base}-{_digest(compiler.encode())[:8]}.so"
    if not path.exists():
        _build(cc, flags, path)
        return _dlopen(path), path
    try:
        return _dlopen(path), path
    except _NoKernel as e:
        first = e
    try:
        _build(cc, flags, path)
        lib = _dlopen(path)
    except _NoKernel as e:
        raise _NoKernel(f"the cached {path} does not load ({first}), nor does its rebuild ({e})") from None
    log.info("stability: the cached CPU moment kernel %s did not load (%s); rebuilt it", path, first)
    return lib, path


def _digest(*parts: bytes | str) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode() if isinstance(part, str) else part)
    return h.hexdigest()[:16]


def _platform() -> tuple:
    """What a build is bound to besides its source, flags and compiler: the OS, the machine and
    the C library (a cache folder shared by machines of other kinds). No Python ABI: the kernel
    uses no Python API, ctypes calls it."""
    try:
        libc = os.confstr("CS_GNU_LIBC_VERSION")
    except (AttributeError, ValueError, OSError):   # not glibc
        libc = None
    return platform.system(), platform.machine(), libc


def _compiler(cc: list) -> str | None:
    """The compiler's identity (its resolved path and the first line of its ``--version``), or
    None where there is none."""
    exe = shutil.which(cc[0])
    if exe is None:
        return None
    try:
        done = subprocess.run([*cc, "--version"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as e:
        raise _NoKernel(f"{cc[0]} does not run ({e})") from None
    lines = (done.stdout or done.stderr).strip().splitlines()
    return " ".join([os.path.realpath(exe), *cc[1:], lines[0] if lines else f"exit {done.returncode}"])


def _build(cc: list, flags: list, path: Path) -> None:
    """Compile the kernel into ``path``; raises :class:`_NoKernel` with the reason it could not."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
    try:
        done = subprocess.run([*cc, *flags, "-o", str(tmp), str(_SOURCE)],
                              capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            err = (done.stderr or done.stdout).strip().splitlines()
            raise _NoKernel(f"{cc[0]} failed ({err[-1] if err else 'exit ' + str(done.returncode)})")
        with open(tmp, "rb") as fh:   # on disk before its name is: a crash never leaves half a file
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except (OSError, subprocess.SubprocessError) as e:
        raise _NoKernel(f"{cc[0]} failed ({e})") from None
    finally:
        tmp.unlink(missing_ok=True)


def _dlopen(path: Path) -> ctypes.CDLL:
    """``path`` loaded, with the kernel's functions; raises :class:`_NoKernel` with why not."""
    short = _cut_short(path)
    if short:
        raise _NoKernel(short)
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as e:
        raise _NoKernel(str(e)) from None
    missing = [name for name in _FUNCTIONS.values() if not hasattr(lib, name)]
    if missing:   # closed, or a dlopen of the same name after the rebuild would return this one
        _ctypes.dlclose(lib._handle)
        raise _NoKernel(f"{path.name} lacks {', '.join(missing)}")
    return lib


def _cut_short(path: Path) -> str | None:
    """Why ``path`` is not a whole ELF file, or None: its header and the tables it points to
    (the linker writes the section table last) lie inside the file. A library cut short would be
    mapped past its end by ``dlopen`` and kill the process with SIGBUS."""
    try:
        with open(path, "rb") as fh:
            head = fh.read(64)
        size = path.stat().st_size
    except OSError as e:
        return str(e)
    if len(head) < 52 or head[:4] != b"\x7fELF" or head[4] not in (1, 2) or head[5] not in (1, 2):
        return f"{path.name} is not an ELF file ({size} bytes)"
    order = "<" if head[5] == 1 else ">"
    if head[4] == 2:   # 64-bit: e_phoff, e_shoff at 32; e_phentsize, e_phnum, e_shentsize, e_shnum at 54
        if len(head) < 64:
            return f"{path.name} is cut short ({size} bytes)"
        ph, sh = struct.unpack_from(order + "QQ", head, 32)
        ph_size, ph_n, sh_size, sh_n = struct.unpack_from(order + "HHHH", head, 54)
    else:              # 32-bit: e_phoff, e_shoff at 28; the sizes and counts at 42
        ph, sh = struct.unpack_from(order + "II", head, 28)
        ph_size, ph_n, sh_size, sh_n = struct.unpack_from(order + "HHHH", head, 42)
    end = max(ph + ph_size * ph_n, sh + sh_size * sh_n)
    return f"{path.name} is cut short ({size} of at least {end} bytes)" if end > size else None


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
    """The cache folder (module docstring): the configured one where it can be made and written,
    else the user's own under the temporary directory. Raises :class:`_NoKernel` when neither."""
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
    return _user_temp_dir()


def _user_temp_dir() -> Path:
    """``<tempdir>/stability_callbacks-<uid>``, one per user and shared by the user's processes,
    made with mode 0700. A library is loaded from it only while it is a folder of this user's
    that no one else can write (not a link): anyone who can put a file there runs code here."""
    uid = os.getuid()
    path = Path(tempfile.gettempdir()) / f"stability_callbacks-{uid}"
    try:
        path.mkdir(mode=0o700)
    except FileExistsError:
        pass
    except OSError as e:
        raise _NoKernel(f"the cache folder cannot be written and {path} cannot be made ({e})") from None
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != uid or st.st_mode & 0o022:
        what = "a link" if stat.S_ISLNK(st.st_mode) else f"mode {stat.S_IMODE(st.st_mode):o}"
        raise _NoKernel(f"the cache folder cannot be written, and {path} is not a folder only this "
                        f"user can write ({what}, owner uid {st.st_uid}); move it away")
    return path
