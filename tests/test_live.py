"""LiveRun (torch-free): listeners, action lines in the run log, the guard, requests with reasons."""
from __future__ import annotations

import json
import logging

import pytest

from stability_callbacks import Monitor
from stability_callbacks.control import Action, Control
from stability_callbacks.live import Guard, LiveRun, RunListener
from stability_callbacks.record import StepRecord
from stability_callbacks.replay.readers import read_records
from stability_callbacks.replay.timeline import stitch


def _loss(step: int) -> float:
    return 9.0 if step == 31 else 2 + step % 3 / 100   # a spike at step 31


class Ear(RunListener):
    def __init__(self):
        self.events = []

    def on_segment(self, segment, start_step, reason):
        self.events.append(("segment", segment, start_step, reason))

    def on_record(self, record):
        self.events.append(("record", record.step))

    def on_finding(self, finding):
        self.events.append(("finding", finding.step, finding.kind))

    def on_checkpoint(self, step, path):
        self.events.append(("checkpoint", step, path))

    def on_action(self, action):
        self.events.append(("action", action.step, action.action))


def test_listeners_hear_everything_in_order_and_the_run_log_keeps_the_actions(tmp_path):
    ear = Ear()
    run = LiveRun(config={"actions": {}}, run_dir=tmp_path, listeners=[ear])
    run.start(0)
    for s in range(1, 33):
        run.observe(StepRecord(s, {"loss": _loss(s)}))
        if s == 31:
            reason = run.control.save_request(s)
            run.act(Action(s, "save", reason, path="ckpt/31"))
            run.checkpoint_saved(s, "ckpt/31")
            run.control.step_done()
    run.close()
    assert ear.events == ([("segment", 0, 0, "start")] + [("record", s) for s in range(1, 32)]
                          + [("finding", 31, "loss_spike"), ("action", 31, "save"),
                             ("checkpoint", 31, "ckpt/31"), ("record", 32),
                             ("finding", 32, "spike_recovered")])
    lines = [json.loads(x) for x in (tmp_path / "runlog.jsonl").read_text().splitlines()]
    assert [x for x in lines if x["type"] == "action"] == [
        {"type": "action", "step": 31, "action": "save", "path": "ckpt/31",
         "reason": "save now: loss_spike (warning) at step 31"}]
    # replay and timeline read the run log as before: action lines are not steps
    assert [r.step for r in read_records(tmp_path / "runlog.jsonl", "jsonl")] == list(range(1, 33))
    tl = stitch(tmp_path / "runlog.jsonl")
    assert len(tl.live) == 32 and [c["step"] for c in tl.checkpoints] == [31]


def test_a_failing_listener_is_logged_once_and_the_run_goes_on(tmp_path, caplog):
    class Broken(RunListener):
        def on_record(self, record):
            raise RuntimeError("boom")

    ear = Ear()
    run = LiveRun(config={"actions": {}}, run_dir=None, listeners=[Broken(), ear])
    with caplog.at_level(logging.ERROR, logger="stability_callbacks"):
        for s in range(1, 4):
            run.observe(StepRecord(s, {"loss": 2.0}))
    assert ear.events == [("record", 1), ("record", 2), ("record", 3)]
    errors = [r for r in caplog.records if "listener Broken.on_record failed" in r.getMessage()]
    assert len(errors) == 1 and "monitoring continues without it" in errors[0].getMessage()


def test_guard_swallows_logs_once_turns_off_on_fatal_and_lets_config_errors_through(caplog):
    guard = Guard()
    with caplog.at_level(logging.ERROR, logger="stability_callbacks"):
        for _ in range(3):
            with guard("probe", "reading the probe"):
                raise RuntimeError("boom")
    assert [r.getMessage() for r in caplog.records] == [
        "stability: reading the probe failed; monitoring continues without it"]
    assert guard.call("other", lambda: 1 / 0, default=-1) == -1 and not guard.off
    with guard("start", "starting", fatal=True):
        raise OSError("disk full")
    assert guard.off
    with pytest.raises(ValueError, match="bad key"):
        with guard("setup", fatal=True, passthrough=(ValueError,)):
            raise ValueError("bad key")


def test_policy_requests_carry_their_reasons():
    """Warmup of 10 steps (risk window 11-40), a NaN at step 30, halt on critical."""
    m = Monitor({"phase": {"warmup_steps": 10},
                 "policy": {"halt_on": "critical", "bump_save_interval_to": 5}})
    c = m.control
    for s in range(1, 30):
        m.update(StepRecord(s, {"loss": 3.0 - s / 100, "lr": 1e-3 * min(s, 10) / 10}))
    assert (c.save_interval_steps, c.save_interval_reason) == (
        5, "inside the warmup-end risk window (steps 11-40)")
    assert c.save_request(25) == ("bumped save interval (5 steps): inside the warmup-end risk "
                                  "window (steps 11-40)")
    assert c.save_request(25, last_saved_step=25) is None and c.save_request(26) is None
    m.update(StepRecord(30, {"loss": float("nan"), "lr": 1e-3}))
    assert c.stop and not c.state_is_good
    assert c.stop_reason == "nonfinite (critical) at step 30; policy.halt_on = critical"
    assert c.damage == "the weights are damaged (nonfinite at step 30)"
    assert c.save_request(31) == ("before the halt: nonfinite (critical) at step 30; "
                                  "policy.halt_on = critical")
    assert not c.save_now and c.save_reason is None   # damaged weights: no save-now asked


def test_one_shot_requests_are_reset_in_one_place():
    c = Control(save_now=True, save_reason="save now: x", save_interval_steps=5, stop=True)
    c.step_done()
    assert (c.save_now, c.save_reason, c.save_interval_steps, c.stop) == (False, None, 5, True)
    with pytest.raises(ValueError, match="action must be one of save, save_blocked"):
        Action(1, "reboot", "not an action")


# ------------------------------------------------------------------ one run log per run
def _run_once(run_dir, steps, *, reason="start", start=0, checkpoint=None, saves=()):
    run = LiveRun(config={"actions": {}}, run_dir=run_dir)
    run.start(start, reason, checkpoint=checkpoint)
    for s in steps:
        run.observe(StepRecord(s, {"loss": 2.0 + s % 3 / 100}))
        if s in saves:
            run.checkpoint_saved(s, f"{run_dir}/../ckpt/checkpoint-{s}")
    run.close()
    return run


def _segments(path):
    return [(x["segment"], x["start_step"], x["reason"]) for x in map(json.loads, path.read_text().splitlines())
            if x["type"] == "segment"]


def test_a_resume_from_a_checkpoint_the_run_log_knows_continues_it_any_other_run_starts_its_own(tmp_path):
    """The rule (docs/design.md, Run log): a resume from a checkpoint noted in the run log of
    ``run_dir`` appends to it; a fresh start, or a resume from a checkpoint it does not know
    (another run's), moves it aside as ``runlog.<n>.jsonl`` and starts a new one."""
    log = tmp_path / "runlog.jsonl"
    _run_once(tmp_path, range(1, 21), saves=(10, 20))
    # The same checkpoint under another path (moved, or another mount): the same folder name.
    _run_once(tmp_path, range(11, 16), reason="resume", start=10, checkpoint="/mnt/elsewhere/checkpoint-10")
    assert _segments(log) == [(0, 0, "start"), (1, 10, "resume")]
    _run_once(tmp_path, range(1, 6))                                        # a new run here
    assert _segments(log) == [(0, 0, "start")]
    assert _segments(tmp_path / "runlog.1.jsonl") == [(0, 0, "start"), (1, 10, "resume")]
    _run_once(tmp_path, range(31, 33), reason="resume", start=30, checkpoint="other/checkpoint-30")
    assert _segments(log) == [(1, 30, "resume")]                            # unknown: its own log
    assert sorted(p.name for p in tmp_path.glob("runlog*")) == ["runlog.1.jsonl", "runlog.2.jsonl", "runlog.jsonl"]
    # A Monitor that ran before (a second fit with the same callback) carries on in its log.
    first = _run_once(tmp_path / "b", range(1, 4))
    again = LiveRun(monitor=first.monitor, run_dir=tmp_path / "b")
    again.start(3, "start")
    again.close()
    assert _segments(tmp_path / "b" / "runlog.jsonl") == [(0, 0, "start"), (0, 3, "start")]


def test_an_unwritable_run_dir_is_one_warning_and_detection_and_alerts_go_on(tmp_path, caplog):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    ear = Ear()
    run = LiveRun(config={"actions": {"log": {}}}, run_dir=blocker / "stability", listeners=[ear])
    with caplog.at_level(logging.INFO):
        run.start(0)
        found = [f.kind for s in range(1, 33) for f in run.observe(StepRecord(s, {"loss": _loss(s)}))]
        run.close()
    assert found == ["loss_spike", "spike_recovered"] and run.runlog is None
    warnings = [r.getMessage() for r in caplog.records if "cannot write the run log" in r.getMessage()]
    assert len(warnings) == 1 and "detection and alerts go on" in warnings[0]
    assert "loss_spike at step 31" in caplog.text                            # the log sink still alerts
    assert ("finding", 31, "loss_spike") in ear.events


def test_the_first_failing_rank_claims_the_crash_and_the_later_one_names_it(tmp_path):
    """Two ranks' runs in one folder (no collective): rank 1 fails first and claims the crash;
    rank 0's finding names rank 1 first, then its own exception; a claim older than the run is
    an earlier run's and is replaced."""
    rank0 = LiveRun(config={"actions": {}}, run_dir=tmp_path, is_rank0=True)
    rank1 = LiveRun(config={"actions": {}}, run_dir=tmp_path, is_rank0=False)
    rank0.start(0)
    rank1.start(0)
    first = rank1.crash(5, RuntimeError("boom"), rank=1, world_size=2)
    then = rank0.crash(5, RuntimeError("Connection closed by peer"), rank=0, world_size=2)
    assert first.details["rank"] == 1 and first.message.startswith("Training crashed on rank 1 in step 6 with "
                                                                    "RuntimeError: boom.")
    assert (then.details["rank"], then.details["then"]) == (1, {"rank": 0, "exception": "RuntimeError",
                                                                "message": "Connection closed by peer"})
    assert "Rank 0 failed after it, with RuntimeError: Connection closed by peer." in then.message
    later = LiveRun(config={"actions": {}}, run_dir=tmp_path, is_rank0=True)   # the next run
    assert later.crash(2, ValueError("x"), rank=0, world_size=2).details["rank"] == 0
    for run in (rank0, rank1, later):
        run.close()
