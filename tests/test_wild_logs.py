"""The wild corpus (tests/data/wild_logs, labels.*.json): real logs from public issue threads and
repositories that nobody on this project wrote. Each parses with ``--format auto`` to exactly
its hand-written CSV (CONVENTIONS: what a log parses to), and its replay meets its labels."""
import json
from pathlib import Path

import pytest
from test_readers import assert_same
from test_real_logs import violations

from stability_callbacks import Monitor
from stability_callbacks.replay.readers import read_records

WILD = Path(__file__).parent / "data" / "wild_logs"
LABELS = [entry for f in sorted(WILD.glob("labels.*.json")) for entry in json.loads(f.read_text())]


@pytest.mark.parametrize("label", LABELS, ids=[lab["name"] for lab in LABELS])
def test_wild_log_parses_to_its_csv(label):
    # Extra keys beyond the CSV's five (eval metrics kept apart, consumed samples) are allowed.
    assert_same(list(read_records(WILD / label["log"])), WILD / label["csv"],
                allowed_extra=("consumed_samples", "param_norm"))


@pytest.mark.parametrize("label", LABELS, ids=[lab["name"] for lab in LABELS])
def test_wild_log_meets_its_labels(label):
    monitor = Monitor()
    findings = [f for rec in read_records(WILD / label["log"]) for f in monitor.update(rec)]
    assert violations(label, findings) == []


def test_every_wild_log_has_a_label():
    logs = {p.name for p in WILD.glob("*") if p.suffix in (".log", ".json", ".jsonl", ".txt")
            and not p.name.startswith("labels.")}
    assert logs == {lab["log"] for lab in LABELS}
