"""Long real logs of healthy runs (tests/data/long_healthy, sources in its README): no critical
finding on any of them, and the warnings each gets, exactly. The ``ty_*`` logs are held out (a
second code base, set aside before the detector changes); the ``mn_*`` logs are the rules part."""
import gzip
from pathlib import Path

import pytest

from stability_callbacks import Monitor
from stability_callbacks.replay.readers import read_records

pytestmark = pytest.mark.slow   # the long logs

LONG = Path(__file__).parent / "data" / "long_healthy"
LOGS = sorted(p.name[:-len(".csv.gz")] for p in LONG.glob("*.csv.gz"))
HELD_OUT = [n for n in LOGS if n.startswith("ty_")]
#: name -> the warnings it gets, (step, kind): a healthy run's honest warnings, none critical.
WARNINGS: dict[str, list] = {}


def replay(name, tmp_path):
    """The log's findings and its number of steps (the reader of today reads no .gz: unzipped
    here, the source line dropped)."""
    lines = gzip.decompress((LONG / f"{name}.csv.gz").read_bytes()).decode().splitlines()
    assert lines[0].startswith("# source: ") and lines[1].startswith("step,loss")
    csv = tmp_path / f"{name}.csv"
    csv.write_text("\n".join(lines[1:]) + "\n")
    m = Monitor()
    findings, steps = [], 0
    for rec in read_records(csv, "csv"):
        steps += 1
        findings += m.update(rec)
    return findings, steps


def test_the_corpus_is_long_and_held_out_apart():
    assert len(LOGS) == 16 and len(HELD_OUT) == 5
    assert sum(p.stat().st_size for p in LONG.glob("*.csv.gz")) < 1_000_000


@pytest.mark.parametrize("name", LOGS)
def test_a_long_healthy_log_gets_no_critical_finding(name, tmp_path):
    findings, steps = replay(name, tmp_path)
    assert steps >= 5000
    assert [(f.step, f.kind) for f in findings if f.severity == "critical"] == []
    assert [(f.step, f.kind) for f in findings if f.severity == "warning"] == WARNINGS.get(name, [])
