"""Stitching a run log across rollbacks and resumes."""
from __future__ import annotations

import json
import math

import pytest

from stability_callbacks.record import Finding, StepRecord
from stability_callbacks.replay.readers import LogFormatError
from stability_callbacks.replay.timeline import Timeline, stitch, write_timeline_png


def write_runlog(path, items):
    path.write_text("".join(json.dumps(x) + "\n" for x in items))
    return path


def seg(k, start, reason):
    return {"type": "segment", "segment": k, "start_step": start, "reason": reason}


def step(s, loss, k=0, **more):
    return StepRecord(s, {"loss": loss, **more}, segment=k).to_json()


def finding(s, kind="loss_spike", severity="warning"):
    return {"type": "finding", **Finding(s, kind, severity, "m").to_json()}


def rollback_log(tmp_path):
    items = [seg(0, 0, "start")]          # start_step = the step a segment resumes from
    items += [step(s, 3.0, 0, grad_norm=1.0) for s in range(1, 11)]
    items += [{"type": "checkpoint", "step": 5, "path": "ckpt/5"}, finding(9)]
    items += [{"type": "checkpoint", "step": 10, "path": "ckpt/10"}]
    items += [seg(1, 5, "rollback")]      # back to checkpoint 5
    items += [step(s, 2.0, 1) for s in range(6, 9)]          # re-ran 6..8, not yet 9, 10
    items += [seg(2, 8, "resume")]        # a crash after 8, resumed from 8
    items += [step(s, 1.0, 2) for s in range(9, 13)]
    return write_runlog(tmp_path / "run.jsonl", items)


def test_later_segments_replace_the_steps_they_rerun(tmp_path):
    t = stitch(rollback_log(tmp_path))
    assert isinstance(t, Timeline)
    assert [(r.step, r.segment) for r in t.live] == (
        [(s, 0) for s in range(1, 6)] + [(s, 1) for s in range(6, 9)]
        + [(s, 2) for s in range(9, 13)])
    assert [r.metrics["loss"] for r in t.live][4:9] == [3.0, 2.0, 2.0, 2.0, 1.0]
    # The abandoned branch 6..10 of segment 0, kept apart.
    assert [(r.step, r.segment) for r in t.superseded] == [(s, 0) for s in range(6, 11)]
    assert [(s["segment"], s["start_step"], s["reason"], s["end_step"], s["num_steps"],
             s["num_superseded"]) for s in t.segments] == [
        (0, 0, "start", 10, 10, 0), (1, 5, "rollback", 8, 3, 5), (2, 8, "resume", 12, 4, 0)]
    assert [(c["step"], c["superseded"]) for c in t.checkpoints] == [(5, False), (10, True)]
    assert [(f.step, f.details["superseded"]) for f in t.findings] == [(9, True)]


def test_step_going_back_without_a_segment_line_is_an_implicit_resume(tmp_path):
    items = [step(s, 3.0) for s in range(1, 6)] + [step(s, 2.5) for s in range(4, 8)]
    t = stitch(write_runlog(tmp_path / "run.jsonl", items))
    assert [r.step for r in t.live] == [1, 2, 3, 4, 5, 6, 7]
    assert [r.metrics["loss"] for r in t.live] == [3.0] * 3 + [2.5] * 4
    assert [r.step for r in t.superseded] == [4, 5]
    assert [(s["start_step"], s["reason"]) for s in t.segments] == [(0, "start"), (3, "resume")]


def test_nonfinite_points_and_unreadable_lines(tmp_path):
    path = tmp_path / "run.jsonl"
    path.write_text(json.dumps(seg(0, 0, "start")) + "\n" + json.dumps(step(1, float("nan")))
                    + "\n{broken\n" + json.dumps(step(2, 1.0)) + "\n")
    skipped = []
    t = stitch(path, on_skip=lambda n, text, why: skipped.append(n))
    assert math.isnan(t.live[0].metrics["loss"]) and [r.step for r in t.live] == [1, 2]
    assert skipped == [3]


def test_not_a_run_log(tmp_path):
    with pytest.raises(LogFormatError, match=r"run\.jsonl: no step lines"):
        stitch(write_runlog(tmp_path / "run.jsonl", [seg(0, 0, "start")]))
    with pytest.raises(LogFormatError, match="no such file|cannot open"):
        stitch(tmp_path / "missing.jsonl")


def test_timeline_png_draws_live_and_faded_superseded_series(tmp_path):
    pytest.importorskip("matplotlib")
    out = write_timeline_png(tmp_path / "t.png", rollback_log(tmp_path))
    data = out.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    t = stitch(rollback_log(tmp_path))
    out2 = write_timeline_png(tmp_path / "t2.png", t, title="rollback")
    assert out2.stat().st_size > 10_000


def test_timeline_draws_the_update_norm_and_the_top_tensor_under_the_loss(tmp_path):
    pytest.importorskip("matplotlib")
    from stability_callbacks.replay.timeline import timeline_figure
    items = [seg(0, 0, "start")] + [step(s, 3.0 - s / 100, grad_norm=1.0, update_norm=0.01 * (3 if s == 30 else 1),
                                         **{"layers/top1/update_ratio": 1.1}) for s in range(1, 41)]
    fig = timeline_figure(write_runlog(tmp_path / "run.jsonl", items))
    assert [ax.get_ylabel() for ax in fig.axes] == ["loss", "grad norm", "update norm",
                                                   "top tensor's update\n(x its history)"]
    no_probe = [seg(0, 0, "start")] + [step(s, 3.0 - s / 100) for s in range(1, 41)]
    assert [ax.get_ylabel() for ax in timeline_figure(write_runlog(tmp_path / "plain.jsonl", no_probe)).axes] == ["loss"]
