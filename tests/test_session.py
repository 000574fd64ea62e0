"""LiveSession (the torch side every integration shares), driven by hand on CPU."""
from __future__ import annotations

import json
import logging

import pytest

torch = pytest.importorskip("torch")

from stability_callbacks.integrations.torch.session import LiveSession  # noqa: E402
from stability_callbacks.live import LiveRun  # noqa: E402


def _session(run_dir=None, **config) -> LiveSession:
    return LiveSession(LiveRun(config={"actions": {}, **config}, run_dir=run_dir))


def _train(s: LiveSession, steps, *, nan_at=None, saves=True) -> None:
    """What an adapter that saves by itself does: micro-batches, step close, requests."""
    for step in steps:
        s.probe.set_lr(1e-3 * min(step, 5) / 5)
        for micro in range(2):
            loss = float("nan") if step == nan_at else 3.0 - step / 100 + micro / 1000
            s.add_micro_batch(loss=torch.tensor(loss / 2), input_ids=torch.arange(4) + 10 * step + micro)
        s.end_step(step)
        why, stop = s.requests(step)
        if why and saves:
            s.record_save(step, f"ckpt/{step}", why)
        s.control.step_done()
        if stop:
            break


def test_requests_become_actions_with_their_reasons(tmp_path):
    """Warmup 5 (risk window 6-20, interval 2 there), a NaN at step 10, halt on critical."""
    s = _session(tmp_path, phase={"warmup_steps": 5},
                 policy={"halt_on": "critical", "bump_save_interval_to": 2})
    s.start(0, "start")
    _train(s, range(1, 15), nan_at=10)
    s.close()
    lines = [json.loads(x) for x in (tmp_path / "runlog.jsonl").read_text().splitlines()]
    window = "inside the warmup-end risk window (steps 6-20)"
    halt = "nonfinite (critical) at step 10; policy.halt_on = critical"
    assert [x for x in lines if x["type"] == "action"] == [
        {"type": "action", "step": 6, "action": "save_interval", "reason": window, "interval": 2},
        {"type": "action", "step": 6, "action": "save", "path": "ckpt/6",
         "reason": f"bumped save interval (2 steps): {window}"},
        {"type": "action", "step": 8, "action": "save", "path": "ckpt/8",
         "reason": f"bumped save interval (2 steps): {window}"},
        {"type": "action", "step": 10, "action": "stop", "reason": halt},
        {"type": "action", "step": 10, "action": "save_blocked",
         "reason": f"before the halt: {halt}; refused: the weights are damaged (nonfinite at step 10)"}]
    assert [x["step"] for x in lines if x["type"] == "checkpoint"] == [6, 8]
    assert (s.saves, s.stopped_at) == ([(6, "ckpt/6"), (8, "ckpt/8")], 10)
    # the rollback advice names the last good checkpoint the session reported
    assert s.control.rollback.details["checkpoint_path"] == "ckpt/8"
    stamps = list(s.finished_at_s)
    assert len(stamps) == 10 and stamps == sorted(stamps)


def test_micro_batches_make_one_record_per_sampled_step():
    s = _session(sampling={"every_n_steps": 2})
    s.start(0, "start")
    seen = []
    for step in range(1, 5):
        for micro in range(2):
            s.add_micro_batch(loss=torch.tensor(0.5 * step + micro), input_ids=torch.tensor([[step, micro]]))
            s.read_model_output({"stream_losses": {"a": torch.tensor([1.0, 3.0]) * step,
                                                   "b": torch.tensor(float(micro))}})
        seen += [(r.step, r.metrics["loss"], r.metrics["loss/a"], r.metrics["loss/b"])
                 for r, _ in s.end_step(step)]
    # every 2nd step; loss: the sum over micro-batches; streams: the mean over them
    assert seen == [(2, 3.0, 4.0, 0.5), (4, 5.0, 8.0, 0.5)]
    assert len(s.finished_at_s) == 4


def test_state_round_trips_and_restores_from_the_checkpoint_loaded(tmp_path, caplog):
    a = _session()
    a.start(0, "start")
    _train(a, range(1, 8), saves=False)
    blob = a.state(7)
    assert blob["step"] == 7 and json.loads(json.dumps(blob)) == blob
    for state in (blob, blob["live"]):   # Lightning checkpoints kept the bare LiveRun state
        b = _session()
        b.restore(state, "checkpoint-7")
        assert b.run.monitor.state_dict() == a.run.monitor.state_dict()
    fresh = _session()
    with caplog.at_level(logging.WARNING, logger="stability_callbacks"):
        fresh.restore(None, "checkpoint-3")
        fresh.restore({"live": {"monitor": {"version": 99}}}, "checkpoint-5")
    assert fresh.run.monitor.last_step is None
    assert "checkpoint-3 has no stability state; detectors start fresh" in caplog.text
    assert "restoring the stability state from checkpoint-5 (detectors start fresh) failed" in caplog.text


@pytest.mark.parametrize("exc", [ValueError("bad batch"), KeyboardInterrupt()], ids=["error", "ctrl-c"])
def test_a_crash_is_one_critical_finding_then_the_session_is_closed(tmp_path, exc):
    s = _session(tmp_path)
    s.start(0, "start")
    _train(s, range(1, 4))
    s.crashed(exc)
    s.crashed(exc)                       # an adapter may see it twice (train and its epoch loop)
    lines = [json.loads(x) for x in (tmp_path / "runlog.jsonl").read_text().splitlines()]
    crashes = [(x["step"], x["severity"], x["details"]["exception"], x["details"]["in_step"])
               for x in lines if x.get("kind") == "crash"]
    assert crashes == ([(3, "critical", "ValueError", 4)] if isinstance(exc, Exception) else [])
    assert s.closed and not s._watchdog._thread.is_alive()
    assert s.run.dispatcher._closed and s.run.runlog._f.closed
    # The outcome: crashed and why (the crash's first sentence); Ctrl-C is someone stopping it.
    o = s.outcome
    assert (o.crashed, o.halted, o.steps_watched, o.last_step) == (isinstance(exc, Exception), False, 3, 3)
    assert (o.reason, o.exit_code) == (("Training crashed in step 4 with ValueError: bad batch.", 1)
                                       if isinstance(exc, Exception) else (None, 0))
    assert o.summary_lines()[0] == ("stability: the run crashed: Training crashed in step 4 with ValueError: "
                                    "bad batch." if isinstance(exc, Exception) else "stability: the run ended at "
                                    "step 3, not halted")


def test_the_hang_watchdog_runs_on_rank0_only():
    s = LiveSession(LiveRun(config={"actions": {}}, run_dir=None, is_rank0=False))
    s.start(0, "start")
    assert s._watchdog is None
    s.close()
    off = _session(watchdog={"enabled": False})
    off.start(0, "start")
    assert off._watchdog._thread is None
    off.close()


def test_the_probes_tensors_are_named_after_the_models_parameters_once_it_has_seen_them():
    """Findings about one tensor name it (``parameter tensor #3`` becomes ``block1.weight``):
    the session names the probe's tensors, in the optimizer's order, at the first sampled step."""
    model = torch.nn.Sequential()
    model.add_module("embed", torch.nn.Embedding(16, 8))
    model.add_module("block", torch.nn.Linear(8, 8))
    model.add_module("head", torch.nn.Linear(8, 16, bias=False))
    opt = torch.optim.AdamW([{"params": [model.head.weight, model.block.bias]},
                             {"params": [model.embed.weight, model.block.weight], "weight_decay": 0.0}])
    s = _session()
    s.start(0, "start", model=model, optimizer=opt)
    for step in (1, 2):
        ids = torch.arange(6) + step
        loss = torch.nn.functional.cross_entropy(model(ids), ids)
        loss.backward()
        s.add_micro_batch(loss=loss.detach(), input_ids=ids)
        opt.step()
        opt.zero_grad()
        s.end_step(step, optimizer=opt)
        assert s.run.monitor.tensor_names == ["head.weight", "block.bias", "embed.weight", "block.weight"]
    s.close()
