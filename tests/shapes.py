"""Helpers of the tests of logs written in a described shape (test_read_shapes*.py): a log's
records and read account, and `replay --json` on it."""
from __future__ import annotations

import json
import math

import pytest

from stability_callbacks.cli import main
from stability_callbacks.replay.readers import ReadAccount, read_records

NAN = float("nan")


def loss(s: float) -> float:
    """A falling loss: 2 + 8 / sqrt(s + 1), to 4 decimals."""
    return round(2.0 + 8.0 / math.sqrt(s + 1), 4)


def records_of(tmp_path, text: str, name: str = "run.log"):
    """``([(step, metrics)], account)`` of ``text`` written to ``tmp_path / name``; the reader's facts
    about a printed loss and an evaluation's loss beside a record (``eval_loss``: test_read_sweeps.py
    asserts it) left out."""
    path = tmp_path / name
    path.write_text(text)
    account = ReadAccount(path)
    got = [(r.step, {k: v for k, v in r.metrics.items()
                     if k not in ("loss_resolution", "loss_window", "loss_terms_zero", "eval_loss")})
           for r in read_records(path, account=account)]
    return got, account


def same(got, want):
    assert [s for s, _ in got] == [s for s, _ in want]
    for (_, g), (_, w) in zip(got, want):
        assert g == pytest.approx(w, nan_ok=True)


def replay(capsys, *argv) -> tuple[int, str, str]:
    code = main(["replay", *map(str, argv)])
    out = capsys.readouterr()
    return code, out.out, out.err


def replay_json(capsys, path, *argv) -> tuple[int, str, list[dict]]:
    """``replay PATH ARGV --json``: the exit code, standard output and the findings (the read
    account, the first JSON line, left out)."""
    out_json = path.parent / "f.jsonl"
    code, out, _ = replay(capsys, path, *argv, "--json", out_json)
    return code, out, [json.loads(x) for x in out_json.read_text().splitlines()[1:]]
