"""The CPU moment kernel's build (integrations/torch/native.py): built once and cached, loaded
without a compiler once cached, and, where it cannot be built, the torch kernels with one line
that says why."""
from __future__ import annotations

import logging
import stat

import pytest

torch = pytest.importorskip("torch")

from stability_callbacks.integrations.torch import native  # noqa: E402
from stability_callbacks.integrations.torch.reductions import adam_moment_stats  # noqa: E402


@pytest.fixture
def fresh(monkeypatch, tmp_path):
    """A process that has not tried the kernel yet, with its own cache folder."""
    monkeypatch.setattr(native, "_STATE", {})
    monkeypatch.setenv("STABILITY_CALLBACKS_CACHE", str(tmp_path / "cache"))
    return tmp_path


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


def test_a_cache_folder_that_cannot_be_made_builds_into_a_private_temporary_one(fresh, monkeypatch):
    blocker = fresh / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("STABILITY_CALLBACKS_CACHE", str(blocker / "cache"))
    assert native.moment_kernels() is not None, native.status()
    assert "/stability_callbacks-" in native.status() and str(blocker) not in native.status()


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
