import os
import tempfile
from pathlib import Path

import pytest

# The CPU moment kernel is built once for the whole run (and its subprocesses), not into ~/.cache.
if "STABILITY_CALLBACKS_CACHE" not in os.environ:
    os.environ["STABILITY_CALLBACKS_CACHE"] = tempfile.mkdtemp(prefix="stability-callbacks-cache-")

DATA = Path(__file__).parent / "data"


@pytest.fixture(autouse=True)
def no_end_report(request, monkeypatch):
    """The HTML report a live run writes at its end (``report.enabled``) costs ~0.5 s of
    matplotlib per run: off by default for the suite's many tiny in-process runs. A test marked
    ``end_report`` keeps the real default; runs in subprocesses (the launchers, the 2-rank
    workers) keep it too."""
    if request.node.get_closest_marker("end_report") is None:
        from stability_callbacks.outcome import RunReport
        monkeypatch.setitem(RunReport.__init__.__kwdefaults__, "enabled", False)


@pytest.fixture
def real_logs() -> Path:
    return DATA / "real_logs"


@pytest.fixture(scope="module")
def one_thread():
    """Torch on one intra-op thread for a module of tiny training runs (2 shared cores: more
    threads only add contention at this model size); ``pytestmark = usefixtures("one_thread")``."""
    torch = pytest.importorskip("torch")
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(prev)


@pytest.fixture(params=["compiled", "torch"])
def cpu_pass(request, monkeypatch):
    """Both CPU moment passes: the compiled kernel (:mod:`...torch.native`; a machine that
    cannot build it fails here, saying why) and the torch kernels. Fails a test in which the
    pass it asks for did not run."""
    from stability_callbacks.integrations.torch import native, reductions
    if request.param == "torch":
        monkeypatch.setitem(native._STATE, "kernels", None)
    else:
        assert native.moment_kernels() is not None, native.status()
    ran = []
    compiled = reductions._moments_native

    def spy(vs, ms):
        got = compiled(vs, ms)
        ran.append("compiled" if got is not None else "torch")
        return got

    monkeypatch.setattr(reductions, "_moments_native", spy)
    yield request.param
    assert ran and set(ran) == {request.param}, ran
