"""The CPU moment kernel's build (integrations/torch/native.py): built once and cached, loaded
without a compiler once cached, rebuilt for another compiler, rebuilt once when the cached file
does not load, one cache folder per user where the configured one cannot be written, and, where
it cannot be built, the torch kernels with one line that says why."""
from __future__ import annotations

import logging
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from stability_callbacks.integrations.torch import native  # noqa: E402
from stability_callbacks.integrations.torch.reductions import adam_moment_stats  # noqa: E402


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """A process that has not tried the kernel yet, with its own cache folder."""
    monkeypatch.setattr(native, "_STATE", {})
    monkeypatch.setenv("STABILITY_CALLBACKS_CACHE", str(tmp_path / "cache"))
    (tmp_path / "tmp").mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))   # never the machine's /tmp
    return tmp_path


def _counting_cc(folder: Path) -> Path:
    """A ``CC`` around the machine's ``cc``: each build adds a line to ``folder/builds``; with
    ``folder/version`` present, ``--version`` prints ``fakecc <its text>``; with ``folder/broken``,
    a build writes a file that is no library."""
    real = shutil.which("cc")
    if real is None:
        pytest.skip("no C compiler")
    cc = folder / "cc"
    cc.write_text(f"""#!/bin/sh
if [ "$1" = --version ] && [ -f {folder}/version ]; then echo "fakecc $(cat {folder}/version)"; exit 0; fi
if [ "$1" = --version ]; then exec {real} "$@"; fi
echo build >> {folder}/builds
if [ -f {folder}/broken ]; then
  while [ $# -gt 1 ]; do [ "$1" = -o ] && out=$2; shift; done
  echo 'not a library' > "$out"; exit 0
fi
exec {real} "$@"
""")
    cc.chmod(cc.stat().st_mode | stat.S_IXUSR)
    return cc


def _builds(folder: Path) -> int:
    path = folder / "builds"
    return len(path.read_text().splitlines()) if path.exists() else 0


def _kernel_file() -> Path:
    """The file the last :func:`native.moment_kernels` loaded (its status names it)."""
    (path,) = [Path(w) for w in native.status().split() if w.endswith(".so")]
    return path


def _stats_are_right():
    g = torch.Generator().manual_seed(0)
    p = torch.nn.Parameter(torch.zeros(70_000))
    opt = torch.optim.Adam([p])
    p.grad = torch.zeros_like(p)
    opt.step()
    v = opt.state[p]["exp_avg_sq"]
    v.copy_(torch.rand(70_000, generator=g))
    v[123] = 3.0
    st = adam_moment_stats(opt)
    return float(st.v_max) == 3.0 and float(st.v_l1) == pytest.approx(float(v.double().sum()), rel=1e-7)


def _infos(caplog):
    return [r.getMessage() for r in caplog.records if r.levelno == logging.INFO and "moment pass" in r.getMessage()]


def test_built_once_then_loaded_from_the_cache_without_a_compiler(fresh, monkeypatch):
    assert native.moment_kernels() is not None, native.status()
    built = list((fresh / "cache").glob("moments-*.so"))
    assert len(built) == 1 and str(built[0]) in native.status()
    assert not [p for p in (fresh / "cache").iterdir() if p.name.startswith(".")]   # no temporary left
    monkeypatch.setattr(native, "_STATE", {})
    monkeypatch.setenv("CC", str(fresh / "no-such-cc"))
    assert native.moment_kernels() is not None and str(built[0]) in native.status()
    assert _stats_are_right()


def test_no_compiler_runs_the_torch_kernels_and_says_why_once(fresh, monkeypatch, caplog):
    monkeypatch.setenv("CC", str(fresh / "no-such-cc"))
    caplog.set_level(logging.INFO, logger="stability_callbacks")
    assert native.moment_kernels() is None and native.moment_kernels() is None
    assert "no C compiler" in native.status() and "no-such-cc" in native.status()
    assert _stats_are_right() and _stats_are_right()
    assert len(_infos(caplog)) == 1 and "set CC" in _infos(caplog)[0]


def test_a_failing_compiler_is_named_with_its_last_line(fresh, monkeypatch, caplog):
    cc = fresh / "cc"
    cc.write_text("#!/bin/sh\necho 'moments.c:1: error: this compiler is broken' >&2\nexit 1\n")
    cc.chmod(cc.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("CC", str(cc))
    caplog.set_level(logging.INFO, logger="stability_callbacks")
    assert native.moment_kernels() is None
    assert native.status().endswith("failed (moments.c:1: error: this compiler is broken)")
    assert len(_infos(caplog)) == 1 and _stats_are_right()
    assert not list((fresh / "cache").iterdir())   # nothing half-written is left to load


def test_turned_off_by_the_environment(fresh, monkeypatch):
    monkeypatch.setenv("STABILITY_CALLBACKS_NATIVE", "0")
    assert native.moment_kernels() is None and "STABILITY_CALLBACKS_NATIVE=0" in native.status()
    assert _stats_are_right()


def _corrupt_copy(good: Path, bad: Path, how: str, tmp: Path) -> None:
    """``bad``: ``good`` cut to half its bytes, or another library under its name (a new file:
    the process keeps ``good`` mapped)."""
    bad.parent.mkdir(parents=True, exist_ok=True)
    if how == "cut short":
        bad.write_bytes(good.read_bytes()[:good.stat().st_size // 2])
    else:
        src = tmp / "other.c"
        src.write_text("int not_the_kernel(void) { return 0; }\n")
        subprocess.run(["cc", "-shared", "-fPIC", "-o", str(bad), str(src)], check=True)


@pytest.mark.parametrize("how, said", [("cut short", "is cut short"), ("another library", "lacks moments_f32_all")])
def test_a_cached_kernel_that_does_not_load_is_rebuilt_once(fresh, monkeypatch, caplog, how, said):
    # Loaded as it is, a library cut short is mapped past its end: SIGBUS kills the process.
    monkeypatch.setenv("CC", str(_counting_cc(fresh)))
    assert native.moment_kernels() is not None, native.status()
    good = _kernel_file()
    # Another cache folder, so that this process has not loaded that file's name yet.
    monkeypatch.setenv("STABILITY_CALLBACKS_CACHE", str(fresh / "cache2"))
    bad = fresh / "cache2" / good.name
    _corrupt_copy(good, bad, how, fresh)
    monkeypatch.setattr(native, "_STATE", {})
    caplog.set_level(logging.INFO, logger="stability_callbacks")
    assert native.moment_kernels() is not None, native.status()
    assert _kernel_file() == bad and bad.read_bytes() == good.read_bytes() and _builds(fresh) == 2
    (line,) = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert line.startswith(f"stability: the cached CPU moment kernel {bad} did not load (") and said in line
    assert line.endswith("; rebuilt it") and _stats_are_right()
    monkeypatch.setattr(native, "_STATE", {})   # the next process loads the rebuilt file
    assert native.moment_kernels() is not None and _kernel_file() == bad and _builds(fresh) == 2


def test_a_rebuild_that_does_not_load_either_runs_the_torch_kernels_and_says_so_once(fresh, monkeypatch, caplog):
    monkeypatch.setenv("CC", str(_counting_cc(fresh)))
    assert native.moment_kernels() is not None, native.status()
    good = _kernel_file()
    monkeypatch.setenv("STABILITY_CALLBACKS_CACHE", str(fresh / "cache2"))
    bad = fresh / "cache2" / good.name
    _corrupt_copy(good, bad, "cut short", fresh)
    (fresh / "broken").write_text("")
    monkeypatch.setattr(native, "_STATE", {})
    caplog.set_level(logging.INFO, logger="stability_callbacks")
    assert native.moment_kernels() is None and native.moment_kernels() is None
    assert _builds(fresh) == 2   # rebuilt once, not again
    size = good.stat().st_size   # the linker writes the section table last: it ends the file
    why = (f"the cached {bad} does not load ({bad.name} is cut short ({size // 2} of at least {size} "
           f"bytes)), nor does its rebuild ({bad.name} is not an ELF file (14 bytes))")
    assert native.status() == f"torch kernels: {why}"
    assert _infos(caplog) == [f"stability: the CPU moment pass uses torch kernels (slower than the "
                              f"compiled kernel, the more so the more threads): {why}"]
    assert _stats_are_right() and _stats_are_right()


def test_the_cached_file_is_the_compilers_and_the_platforms(fresh, monkeypatch):
    monkeypatch.setenv("CC", str(_counting_cc(fresh)))
    (fresh / "version").write_text("1.0")
    assert native.moment_kernels() is not None, native.status()
    first = _kernel_file()
    (fresh / "version").write_text("2.0")   # an upgraded compiler builds anew
    monkeypatch.setattr(native, "_STATE", {})
    assert native.moment_kernels() is not None and _kernel_file() != first and _builds(fresh) == 2
    second = _kernel_file()
    assert first.name.split("-")[1] == second.name.split("-")[1]   # the same source, flags, platform
    (fresh / "version").write_text("1.0")   # and the first one's file is its own again
    monkeypatch.setattr(native, "_STATE", {})
    assert native.moment_kernels() is not None and _kernel_file() == first and _builds(fresh) == 2
    # Without a compiler, a build for this platform is loaded; for another one, none.
    monkeypatch.setenv("CC", str(fresh / "no-such-cc"))
    monkeypatch.setattr(native, "_STATE", {})
    assert native.moment_kernels() is not None and _kernel_file() in (first, second)
    monkeypatch.setattr(native, "_platform", lambda: ("Linux", "aarch64", "glibc 2.36"))
    monkeypatch.setattr(native, "_STATE", {})
    assert native.moment_kernels() is None and "no C compiler" in native.status()


def _user_folder(tmp: Path) -> Path:
    return tmp / f"stability_callbacks-{os.getuid()}"


def test_a_cache_folder_that_cannot_be_made_builds_into_the_users_temporary_one(fresh, monkeypatch):
    blocker = fresh / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("STABILITY_CALLBACKS_CACHE", str(blocker / "cache"))
    assert native.moment_kernels() is not None, native.status()
    assert _kernel_file().parent == _user_folder(fresh / "tmp")
    assert stat.S_IMODE(_user_folder(fresh / "tmp").stat().st_mode) == 0o700


@pytest.mark.slow
def test_processes_without_a_writable_cache_share_one_folder(fresh):
    """Two processes, one after the other: the second loads what the first built, from the same
    folder (a fresh temporary folder per process would build in each, and leave each behind)."""
    blocker = fresh / "a-file"
    blocker.write_text("")
    env = {**os.environ, "STABILITY_CALLBACKS_CACHE": str(blocker / "cache"), "TMPDIR": str(fresh / "tmp"),
           "CC": str(_counting_cc(fresh)), "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    code = "from stability_callbacks.integrations.torch import native; print(native.status())"
    said = [subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                           check=True, timeout=120).stdout.strip() for _ in range(2)]
    so = list(_user_folder(fresh / "tmp").glob("moments-*.so"))
    assert len(so) == 1 and said == [f"compiled kernel {so[0]} (one read of Adam's moments)"] * 2
    assert _builds(fresh) == 1 and os.listdir(fresh / "tmp") == [_user_folder(fresh / "tmp").name]


@pytest.mark.parametrize("planted, said", [("a link", "(a link, owner uid"), ("writable by others", "(mode 777, owner uid")])
def test_a_temporary_folder_that_is_not_the_users_own_is_not_used(fresh, monkeypatch, planted, said):
    """Whoever can put a file in the folder a library is loaded from runs code in this process."""
    blocker = fresh / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("STABILITY_CALLBACKS_CACHE", str(blocker / "cache"))
    folder, elsewhere = _user_folder(fresh / "tmp"), fresh / "elsewhere"
    elsewhere.mkdir()
    if planted == "a link":
        folder.symlink_to(elsewhere)
    else:
        folder.mkdir()
        folder.chmod(0o777)
    assert native.moment_kernels() is None and _stats_are_right()
    assert native.status().startswith(f"torch kernels: the cache folder cannot be written, and {folder} "
                                      f"is not a folder only this user can write {said}")
    assert native.status().endswith("; move it away")
    assert not list(elsewhere.iterdir()) and not list(folder.iterdir())


def test_only_where_torch_runs_gnu_libgomp(fresh, monkeypatch):
    monkeypatch.setattr(native, "_openmp_runtimes", lambda: {"/opt/conda/lib/libiomp5.so"})
    assert native.moment_kernels() is None and "not GNU libgomp" in native.status()
    assert _stats_are_right()


def test_a_build_that_brings_a_second_openmp_runtime_is_not_used(fresh, monkeypatch):
    # CC=clang links LLVM's libomp: a second pool of threads next to torch's
    real, seen = native._openmp_runtimes, []

    def after_load_one_more():
        seen.append(1)
        return real() | ({"/usr/lib/llvm-18/lib/libomp.so.5"} if len(seen) > 1 else set())

    monkeypatch.setattr(native, "_openmp_runtimes", after_load_one_more)
    assert native.moment_kernels() is None
    assert "second OpenMP runtime (/usr/lib/llvm-18/lib/libomp.so.5); set CC to gcc" in native.status()
    assert _stats_are_right()
