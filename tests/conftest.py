from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"


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
