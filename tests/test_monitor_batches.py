"""Monitor.update_many (a replay's batches, one detector at a time over a run of records) finds
exactly what Monitor.update finds one record at a time, on real logs: the same findings in the
same order, the same state and requests after them, whatever the batch size."""
from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import pytest

from stability_callbacks import Monitor
from stability_callbacks.detectors import Detector
from stability_callbacks.replay.readers import read_records

DATA = Path(__file__).parent / "data"

# each exercises a part of the batch path: spikes, rollback advice and a NaN; records with two
# sets of keys; rollbacks (steps going back) between runs; a run log's fp16 scale; an LR jump, a
# level shift and a grad-norm spike, resumed from the middle on (RESUMED: a second segment, as a
# resumed run's log has); a run log whose segment declares the warmup and the model's output size
# (DECLARED: as a replayed run log's first record carries them); fp16 overflow steps whose records
# feed other detectors than the rest (MIXED: a run of records with two plans)
LOGS = ["real_logs/bs_tr8_104B_exp12_spike8740_diverge9027.log", "real_logs/mn_gpt2_1p5B_scaleup_20k.log",
        "field_logs/llm_llamafactory_two_ranks_duplicate_lines_sft.jsonl",
        "live_runs/ds-z2-fp16-logwarmup.jsonl", "live_runs/pl-lr-x50.jsonl", "live_runs/hf-classifier.jsonl",
        "real_logs/dschat_opt1.3b_sft_fp16_periodic_overflow.csv"]
RESUMED, DECLARED, MIXED = "live_runs/pl-lr-x50.jsonl", "live_runs/hf-classifier.jsonl", LOGS[-1]


def _records(path: Path) -> list:
    records = list(read_records(path))
    if str(path).endswith(RESUMED):
        records[150:] = [dataclasses.replace(r, segment=1) for r in records[150:]]
    if str(path).endswith(DECLARED):
        records[0] = dataclasses.replace(records[0], warmup_steps=30, num_outputs=10)
    return records


def _one_at_a_time(path: Path) -> tuple[list[dict], Monitor]:
    m = Monitor()
    found = [f for r in _records(path) for f in m.update(r)] + m.end()
    return [f.to_json() for f in found], m


def _in_batches(path: Path, size: int) -> tuple[list[dict], Monitor]:
    m = Monitor()
    records, found = _records(path), []
    for i in range(0, len(records), size):
        found += m.update_many(records[i:i + size])
    return [f.to_json() for f in found + m.end()], m


def _requests(m: Monitor) -> tuple:
    """The Monitor's Control (its alerts as JSON: a NaN value is not equal to itself)."""
    return dataclasses.replace(m.control, alerts=[]), [f.to_json() for f in m.control.alerts]


@pytest.mark.parametrize("log", LOGS)
def test_batches_find_what_one_record_at_a_time_finds(log):
    path = DATA / log
    want, one = _one_at_a_time(path)
    assert want or log == MIXED   # every log here has findings to compare (MIXED: a healthy one, its state)
    for size in (1, 7, 300, 10**6):
        got, many = _in_batches(path, size)
        assert got == want, size
        assert many.state_dict() == one.state_dict(), size
        assert _requests(many) == _requests(one), size   # the last step's, as it left them


def test_the_logs_cover_two_sets_of_keys_rollbacks_and_declarations():
    shapes = {frozenset(r.metrics) for r in read_records(DATA / LOGS[1])}
    assert len(shapes) == 2   # a loss printed with fewer digits at some steps carries its resolution
    steps = [r.step for r in read_records(DATA / LOGS[2])]
    assert any(b <= a for a, b in zip(steps, steps[1:]))
    plans = {tuple(d.name for d in m.detectors if d.wants(frozenset(r.metrics)))
             for m in [Monitor()] for r in read_records(DATA / MIXED)}
    assert len(plans) == 2
    for log in (RESUMED, DECLARED):
        assert _records(DATA / log) != list(read_records(DATA / log))
    assert "resume" in [f["kind"] for f in _one_at_a_time(DATA / RESUMED)[0]]


@pytest.mark.parametrize("failing", ["loss_spike", "level_shift"])
def test_a_detector_that_fails_is_off_from_that_step_in_batches_too(failing, caplog):
    """The main loss spike failing mid-run (the detectors after it lose its view of the loss
    from the next step on) or a detector after it: the same findings as one record at a time."""
    path = DATA / LOGS[1]
    records = list(read_records(path))
    clean, _ = _one_at_a_time(path)
    # the step after the onset of a spike that lasts: the failing step's view has it open
    onsets = [f["step"] for f in clean if f["kind"] == "loss_spike"]
    ends = [f["step"] for f in clean if f["kind"] == "spike_recovered"]
    at = next(s for s, e in zip(onsets, ends) if e > s + 1) + 1
    assert at > records[len(records) // 2].step   # in the second half, in the middle of a batch of 64

    def breaking(m: Monitor) -> Monitor:
        d = next(d for d in m.detectors if d.name == failing)
        if type(d).update_run is not Detector.update_run:   # its rule is its run's loop (update: a run of one)
            run_rule = d.update_run

            def run_fails_from_the_middle(run, ctxs):
                k = next((i for i, r in enumerate(run) if r.step >= at), len(run))
                run_rule(run[:k], ctxs[:k])
                if k < len(run):
                    raise RuntimeError("a bug in a detector")
            d.update_run = run_fails_from_the_middle   # type: ignore[method-assign]
            return m
        update = d.update

        def fails_from_the_middle(record, ctx):
            if record.step >= at:
                raise RuntimeError("a bug in a detector")
            return update(record, ctx)
        d.update = fails_from_the_middle   # type: ignore[method-assign]
        return m

    with caplog.at_level(logging.ERROR, logger="stability_callbacks"):
        one = breaking(Monitor())
        want = [f.to_json() for r in read_records(path) for f in one.update(r)]
        many = breaking(Monitor())
        got = [f.to_json() for i in range(0, len(records), 64) for f in many.update_many(records[i:i + 64])]
    assert got == want and many._broken == one._broken == {failing}
    assert many.state_dict() == one.state_dict()
    assert len([r for r in caplog.records if "now off" in r.getMessage()]) == 2
