from pathlib import Path

import pytest

DATA = Path(__file__).parent / "data"


@pytest.fixture
def real_logs() -> Path:
    return DATA / "real_logs"
