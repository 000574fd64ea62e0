"""HF Trainer integration: real ``Trainer.train()`` runs of the planted-fault scenarios (CPU).

Each run is a tiny GPT-2 (stability_callbacks.demo.scenarios) for 22-45 steps, ~1-3 s with one
thread. The data-pocket run is shared (module fixture) by the signal, run-log, TensorBoard and
resume tests; it adds the callback the plain way, ``Trainer(..., callbacks=[cb])``.
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from transformers import Trainer, TrainingArguments  # noqa: E402

from alert_inbox import AlertInbox  # noqa: E402
from stability_callbacks.advice import native_forms  # noqa: E402
from stability_callbacks.demo.scenarios import build_scenario  # noqa: E402
from streams import two_stream_losses  # noqa: E402
from stability_callbacks.integrations.hf import callback as hf_callback  # noqa: E402
from stability_callbacks.integrations.hf import STATE_FILE, StabilityCallback  # noqa: E402
from stability_callbacks.integrations.torch.optim_state import tensor_names  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


pytestmark = pytest.mark.usefixtures("one_thread")


def _args(out, sc, **overrides) -> TrainingArguments:
    kw = dict(output_dir=str(out), max_steps=sc.max_steps,
              per_device_train_batch_size=sc.batch_size,
              gradient_accumulation_steps=sc.grad_accum, learning_rate=sc.lr,
              warmup_steps=sc.warmup_steps, weight_decay=0.0, logging_steps=5,
              save_strategy="steps", save_steps=1000, report_to="none",
              train_sampling_strategy="sequential", use_cpu=True, disable_tqdm=True,
              logging_nan_inf_filter=False)
    kw.update(overrides)
    return TrainingArguments(**kw)


def _checkpoints(out) -> list[int]:
    return sorted(int(d.split("-")[1]) for d in os.listdir(out) if d.startswith("checkpoint-"))


def _kinds(findings, min_severity=("info", "warning", "critical")):
    return [(f.step, f.kind) for f in findings if f.severity in min_severity]


def _first(findings, kind):
    return next((f for f in findings if f.kind == kind), None)


def _runlog(run_dir) -> list[dict]:
    with open(Path(run_dir) / "runlog.jsonl") as fh:
        return [json.loads(line) for line in fh]


def _actions(run_dir) -> list[tuple]:
    return [(x["step"], x["action"], x["reason"]) for x in _runlog(run_dir) if x["type"] == "action"]


# ------------------------------------------------------------------------------ data pocket
@pytest.fixture(scope="module")
def pocket(tmp_path_factory):
    """data-pocket, GA=2, TensorBoard on, a regular save at step 22 (the resume point); the
    callback added the plain way, in the Trainer's constructor."""
    out = tmp_path_factory.mktemp("pocket")
    sc = build_scenario("data-pocket", batch_size=4, grad_accum=2)
    args = _args(out / "ckpt", sc, save_steps=22, report_to=["tensorboard"])
    cb = StabilityCallback(run_dir=out / "stability")
    trainer = Trainer(model=sc.make_model(), args=args, train_dataset=sc.train_dataset(), callbacks=[cb])
    assert cb.trainer is trainer        # found inside Trainer.__init__ (on_init_end)
    trainer.train()
    return {"sc": sc, "out": out, "trainer": trainer, "cb": cb}


def test_data_pocket_spike_at_the_pocket_and_recovery(pocket):
    sc, cb = pocket["sc"], pocket["cb"]
    first, last = sc.fault_steps[0], sc.fault_steps[-1]
    spike = _first(cb.findings, "loss_spike")
    assert (spike.step, spike.severity, spike.onset_step) == (first, "warning", first)
    # The grad norm (the Trainer's own, pre-clip) leads with it: the bad batch's gradient.
    lead = _first(cb.findings, "grad_norm_spike")
    assert (lead.step, lead.severity) == (first, "info")
    assert _first(cb.findings, "spike_recovered").step == last + 1
    # The spike names its step's samples, the pocket's first (and the clean ones before it); the
    # recovery names the whole pocket (the sequential sampler, wrapped, recorded them).
    g = sc.samples_per_step()
    assert spike.details["samples"] == {"step": first, "indices": sc.pocket_indices(steps=(first,)), "ranks": 1,
                                        "neighbours": {str(s): list(range((s - 1) * g, s * g)) for s in (first - 2, first - 1)}}
    episode = _first(cb.findings, "spike_recovered").details["samples"]
    assert episode["indices"] + sum(episode["neighbours"].values(), []) == sc.pocket_indices()
    # Nothing serious before the pocket: the healthy stretch is quiet.
    assert _kinds([f for f in cb.findings if f.step < first], ("warning", "critical")) == []
    assert not any(f.kind in ("nonfinite", "spike_unrecovered", "divergence") for f in cb.findings)
    # The policy asked for a save at the spike; the Trainer made it, with our state inside.
    ckpt = pocket["out"] / "ckpt"
    assert _checkpoints(ckpt) == [22, first, 44, 45]
    for step in (22, first):
        state = json.loads((ckpt / f"checkpoint-{step}" / STATE_FILE).read_text())
        assert state["step"] == step and "monitor" in state["live"]
    assert pocket["trainer"].state.save_steps == 22          # the user's interval, untouched


def test_signals_are_the_trainers_own_values(pocket):
    """Loss (GA=2, summed on device), pre-clip grad norm and LR equal what the Trainer logs."""
    records = {r["step"]: r["metrics"] for r in _runlog(pocket["out"] / "stability")
               if r["type"] == "step"}
    assert sorted(records) == list(range(1, pocket["sc"].max_steps + 1))
    hf = [h for h in pocket["trainer"].state.log_history if "loss" in h and "step" in h]
    assert [h["step"] for h in hf] == list(range(5, 46, 5))     # HF's own line at every logging step
    for h in hf:
        s = h["step"]
        window = [records[i]["loss"] for i in range(s - 4, s + 1)]
        assert sum(window) / 5 == pytest.approx(h["loss"], rel=1e-5)
        assert records[s]["grad_norm"] == pytest.approx(h["grad_norm"], rel=1e-6)
        assert records[s]["lr"] == pytest.approx(h["learning_rate"], rel=1e-9)
    m = records[30]
    assert m["adam/exp_avg_sq_numel"] == sum(p.numel() for p in pocket["trainer"].model.parameters())
    # the probe's tensors carry the model's names, in the optimizer's order (HF's decay groups)
    names = pocket["cb"].session.run.monitor.tensor_names
    assert names == tensor_names(pocket["trainer"].optimizer, pocket["trainer"].model)
    assert sorted(names) == sorted(n for n, _ in pocket["trainer"].model.named_parameters())
    assert m["adam/exp_avg_sq_max"] > 0 and math.isfinite(m["adam/exp_avg_sq_l1"])
    assert records[1]["batch_fingerprint"] != records[2]["batch_fingerprint"]


def test_runlog_has_segment_findings_and_checkpoints(pocket):
    lines = _runlog(pocket["out"] / "stability")
    assert lines[0] == {"type": "segment", "segment": 0, "start_step": 0, "reason": "start"}
    found = [(x["step"], x["kind"]) for x in lines if x["type"] == "finding"]
    assert (25, "loss_spike") in found and (28, "spike_recovered") in found
    assert [x["step"] for x in lines if x["type"] == "checkpoint"] == [22, 25, 44, 45]


def test_tensorboard_gets_stability_scalars_and_keeps_the_trainers_line(pocket):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    (events,) = (pocket["out"] / "ckpt" / "runs").glob("*/events.out.tfevents.*")
    ea = EventAccumulator(str(events.parent), size_guidance={"scalars": 0})
    ea.Reload()
    tags = ea.Tags()["scalars"]
    # HF's own loss and grad_norm are at every logging step: our reporter calls (each
    # reporter's on_log, not trainer.log) leave control.should_log alone.
    assert [e.step for e in ea.Scalars("train/loss")] == list(range(5, 46, 5))
    assert [e.step for e in ea.Scalars("train/grad_norm")] == list(range(5, 46, 5))
    assert {"train/stability/loss", "train/stability/grad_norm", "train/stability/lr"} <= set(tags)
    spike = [(e.step, e.value) for e in ea.Scalars("train/stability/finding/loss_spike")]
    assert spike == [(25, 2.0)]                                  # warning at the pocket
    stab_loss = {e.step: e.value for e in ea.Scalars("train/stability/loss")}
    assert stab_loss[25] > 5.0


# -------------------------------------------------------------------------------- resume
def _resume(pocket, tmp_path, **overrides):
    sc = pocket["sc"]
    args = _args(pocket["out"] / "ckpt", sc, save_steps=22, **overrides)
    cb = StabilityCallback(run_dir=tmp_path / "stability")
    trainer = Trainer(model=sc.make_model(), args=args, train_dataset=sc.train_dataset(), callbacks=[cb])
    # Saves of the resumed run go elsewhere: the fixture's checkpoints stay as they were.
    trainer.args.output_dir = str(tmp_path / "ckpt")
    trainer.train(resume_from_checkpoint=str(pocket["out"] / "ckpt" / "checkpoint-22"))
    return trainer, cb


def test_resume_continues_detector_state(pocket, tmp_path):
    trainer, cb = _resume(pocket, tmp_path)
    whole = [(f.step, f.kind, f.severity) for f in pocket["cb"].findings if f.step > 22]
    resumed = [(f.step, f.kind, f.severity) for f in cb.findings]
    assert resumed[0] == (22, "resume", "info")
    # The pocket 3 steps after the resume also reads as a resume spike: that one is extra.
    assert (25, "resume_spike", "warning") in resumed
    # A fresh monitor would re-detect the warmup end (step 23) and re-learn its baselines; the
    # restored one carries on exactly as the uninterrupted run did.
    assert [r for r in resumed[1:] if r[1] != "resume_spike"] == whole
    spike_a = next(d for d in pocket["cb"].run.monitor.detectors if d.name == "loss_spike")
    spike_b = next(d for d in cb.run.monitor.detectors if d.name == "loss_spike")
    assert spike_b.base.n == spike_a.base.n                      # 45 points, not 23
    lines = _runlog(tmp_path / "stability")
    assert lines[0] == {"type": "segment", "segment": 1, "start_step": 22, "reason": "resume"}
    assert trainer.state.global_step == 45
    assert _first(cb.findings, "data_repetition") is None


def test_resume_without_data_skip_reports_data_repetition(pocket, tmp_path):
    # ignore_data_skip: the dataloader starts from the first batch again, so step 23 sees the
    # batch of step 1 (issue 9: batch fingerprints in the step records).
    trainer, cb = _resume(pocket, tmp_path, ignore_data_skip=True, max_steps=pocket["sc"].max_steps)
    rep = _first(cb.findings, "data_repetition")
    assert rep is not None and rep.step == 23
    assert rep.severity == "critical"
    assert rep.details.get("repeats_step") == rep.step - 22


# ----------------------------------------------------------------------------------- NaN
@pytest.mark.parametrize("bf16", [pytest.param(False, marks=pytest.mark.end_report), True], ids=["fp32", "bf16"])
def test_nan_halts_cleanly_without_saving_damaged_weights(tmp_path, bf16, caplog):
    sc = build_scenario("nan")
    # bf16 autocast on CPU, and the Trainer's own NaN filter on: it masks the NaN in *its* logged
    # loss, not in the value training_step returns, which is what the monitor reads.
    args = _args(tmp_path / "ckpt", sc, save_steps=10, bf16=bf16, logging_nan_inf_filter=bf16)
    trainer = Trainer(model=sc.make_model(), args=args, train_dataset=sc.train_dataset())
    cb = StabilityCallback.attach(trainer, config={"policy": {"halt_on": "critical"}},
                                  run_dir=tmp_path / "stability")
    with caplog.at_level("INFO", logger="stability_callbacks"):
        trainer.train()
    (bad,) = sc.fault_steps
    # The log sink: one line per finding (the full text is in the run log and the report).
    assert [r.getMessage().split(":")[:2] for r in caplog.records if r.name == "stability_callbacks.findings"] == [
        ["INFO", " warmup_end at step 6"], ["CRITICAL", f" nonfinite at step {bad}"],
        ["CRITICAL", f" warmup_instability at step {bad}"], ["CRITICAL", f" rollback_advice at step {bad}"]]
    _assert_the_end_of_a_halted_run(cb, caplog, tmp_path, bad, report=not bf16)
    nonfinite = _first(cb.findings, "nonfinite")
    assert (nonfinite.step, nonfinite.severity) == (bad, "critical")
    assert trainer.state.global_step == bad                      # stopped at the NaN step
    assert _checkpoints(tmp_path / "ckpt") == [10, 20]           # no save of the NaN weights
    advice = cb.run.control.rollback   # names the last good checkpoint before the onset
    good = max(c for c in (10, 20) if c < advice.details["onset_step"])
    assert advice.details["checkpoint_step"] == good
    assert advice.details["checkpoint_path"].endswith(f"checkpoint-{good}")
    assert not any(f.kind == "loss_spike" and f.severity != "info" for f in cb.findings)
    # What the callback did and why (the bump to 300 never beat the user's interval of 10).
    halt = f"nonfinite (critical) at step {bad}; policy.halt_on = critical"
    assert _actions(tmp_path / "stability") == [
        (bad, "stop", halt),
        (bad, "save_blocked", f"before the halt: {halt}; refused: the weights are damaged "
                              f"(nonfinite at step {bad})")]


def test_a_nan_at_the_first_step_says_train_again_from_the_initial_weights(tmp_path):
    """A NaN at step 1: nothing was trained before it, so the nonfinite finding and the rollback
    advice both say to train again from the initial weights; neither names a checkpoint before it."""
    sc = build_scenario("nan", fault_step=1, max_steps=3)
    trainer = Trainer(model=sc.make_model(), args=_args(tmp_path / "ckpt", sc), train_dataset=sc.train_dataset())
    cb = StabilityCallback.attach(trainer, config={"policy": {"halt_on": "critical"}, "report": {"enabled": False}},
                                  run_dir=tmp_path / "stability")
    trainer.train()
    nonfinite, advice = _first(cb.findings, "nonfinite"), cb.run.control.rollback
    assert (nonfinite.step, advice.step, advice.details["from_start"], trainer.state.global_step) == (1, 1, True, 1)
    for f in (nonfinite, advice):
        assert "Nothing was trained before step 1, so no checkpoint comes before it: train again from the " \
               "initial weights" in f.message
        assert "last checkpoint before" not in f.message and "checkpoint saved before" not in f.message
    assert cb.outcome.advice.startswith("trainer.train() again from the initial weights (no checkpoint comes "
                                        "before step 1)")


def _assert_the_end_of_a_halted_run(cb, caplog, tmp_path, bad: int, *, report: bool) -> None:
    """The outcome and the summary block of the NaN run halted at ``bad``: why, the steps, the
    findings by kind (info too), the advice in HF's form only, the run log, the report."""
    halt = f"nonfinite (critical) at step {bad}; policy.halt_on = critical"
    o = cb.outcome
    assert (o.halted, o.halted_at, o.reason, o.crashed, o.exit_code) == (True, bad, halt, False, 3)
    assert o.run_dir == tmp_path / "stability" and o.findings == cb.findings
    assert o.advice == native_forms(cb.run.control.rollback.details, ("hf",))["hf"]
    assert o.advice.startswith(f'trainer.train(resume_from_checkpoint="{tmp_path / "ckpt" / "checkpoint-20"}")')
    html = tmp_path / "stability" / "report.html"
    (summary,) = [r for r in caplog.records if r.getMessage().startswith("stability: the run ")]
    assert summary.levelname == "WARNING" and summary.getMessage().splitlines() == [
        f"stability: the run halted at step {bad}: {halt}",
        f"  steps watched: {bad} (1-{bad})",
        f"  findings: critical: nonfinite x1 (step {bad}), warmup_instability x1 (step {bad}), "
        f"rollback_advice x1 (step {bad}); "
        "info: warmup_end x1 (step 6)",
        f"  roll back: {o.advice}",
        f"  run log: {tmp_path / 'stability' / 'runlog.jsonl'}",
        f"  report: {html if report else 'none (report.enabled is false)'}"]
    assert (o.report_path == html) is report and html.is_file() is report
    if report:   # the replay report, the advice in HF's form under its row
        text = html.read_text()
        assert "rollback_advice" in text and "HF Trainer / accelerate:</b> <code>trainer.train(" in text
        assert "Lightning:" not in text


def test_callback_added_after_the_trainer_was_built_finds_it(tmp_path, caplog):
    """``trainer.add_callback(StabilityCallback(...))``: the trainer is found at train begin, so
    the run has the grad norm, and a NaN without halting keeps training but saves nothing after
    it."""
    sc = build_scenario("nan")
    trainer = Trainer(model=sc.make_model(), args=_args(tmp_path / "ckpt", sc, save_steps=10),
                      train_dataset=sc.train_dataset())
    cb = StabilityCallback(run_dir=tmp_path / "stability")
    trainer.add_callback(cb)
    with caplog.at_level("WARNING", logger="stability_callbacks"):
        trainer.train()
    assert cb.trainer is trainer and "could not find its Trainer" not in caplog.text
    (bad,) = sc.fault_steps
    assert _first(cb.findings, "nonfinite").step == bad
    assert trainer.state.global_step == sc.max_steps              # halt_on: never (default)
    assert _checkpoints(tmp_path / "ckpt") == [10, 20]            # 30 (the final save) suppressed
    assert _actions(tmp_path / "stability") == [
        (30, "save_blocked", f"the Trainer's own save; refused: the weights are damaged "
                             f"(nonfinite at step {bad})")]
    steps = [r for r in _runlog(tmp_path / "stability") if r["type"] == "step"]
    hf_norms = {h["step"]: h["grad_norm"] for h in trainer.state.log_history if "grad_norm" in h}
    assert steps[4]["metrics"]["grad_norm"] == pytest.approx(hf_norms[5], rel=1e-6)


def test_each_record_says_its_epoch(tmp_path):
    """3 epochs of 4 steps: the run log's step lines say epochs 1, 1, 1, 1, 2, ... (from
    ``TrainerState.epoch``, in (e, e + 1] at epoch e's steps): the Monitor compares the loss's
    shape through an epoch with the epoch before's (docs/findings.md)."""
    sc = build_scenario("healthy", max_steps=4)
    args = _args(tmp_path / "ckpt", sc, max_steps=-1, num_train_epochs=3, warmup_steps=0)
    trainer = Trainer(model=sc.make_model(), args=args, train_dataset=sc.train_dataset(),
                      callbacks=[StabilityCallback(run_dir=tmp_path / "stability")])
    trainer.train()
    steps = [(r["step"], r["epoch"]) for r in _runlog(tmp_path / "stability") if r["type"] == "step"]
    assert steps == [(s, 1 + (s - 1) // 4) for s in range(1, 13)]


def test_without_its_trainer_the_callback_runs_degraded_and_says_so(tmp_path, caplog, monkeypatch):
    """Should a transformers version hide the Trainer from its callbacks: the loss and the batch
    come from the model's forward, there is no grad norm, and one warning says what is missing."""
    monkeypatch.setattr(hf_callback, "_find_trainer", lambda callback, max_frames=32: (None, None))
    sc = build_scenario("data-pocket", batch_size=4, grad_accum=2)
    cb = StabilityCallback(run_dir=tmp_path / "stability")
    trainer = Trainer(model=sc.make_model(), args=_args(tmp_path / "ckpt", sc),
                      train_dataset=sc.train_dataset(), callbacks=[cb])
    with caplog.at_level("WARNING", logger="stability_callbacks"):
        trainer.train()
    assert cb.trainer is None
    assert caplog.text.count("could not find its Trainer") == 1
    spike = _first(cb.findings, "loss_spike")
    assert (spike.step, spike.severity) == (sc.fault_steps[0], "warning")
    records = {r["step"]: r["metrics"] for r in _runlog(tmp_path / "stability") if r["type"] == "step"}
    assert "grad_norm" not in records[1] and records[1]["batch_fingerprint"] != records[2]["batch_fingerprint"]
    for h in (h for h in trainer.state.log_history if "loss" in h and "step" in h):
        window = [records[i]["loss"] for i in range(h["step"] - 4, h["step"] + 1)]
        assert sum(window) / 5 == pytest.approx(h["loss"], rel=1e-5)   # the Trainer's loss


# ---------------------------------------------------------------- loud failures, user folders
def test_a_bad_config_stops_the_run_before_step_one_with_the_key_named(tmp_path, monkeypatch):
    from stability_callbacks import ConfigError

    with pytest.raises(ConfigError, match=r"policy\.halt_on must be 'never' or 'critical', got 'warnings'"):
        StabilityCallback(config={"policy": {"halt_on": "warnings"}})
    # What only the run can check (a sink's environment variable) raises through the Trainer.
    monkeypatch.delenv("NO_SUCH_WEBHOOK", raising=False)
    sc = build_scenario("healthy", max_steps=4)
    cb = StabilityCallback(config={"actions": {"slack": {"webhook_url": "${NO_SUCH_WEBHOOK}"}}})
    trainer = Trainer(model=sc.make_model(), args=_args(tmp_path / "ckpt", sc), train_dataset=sc.train_dataset(),
                      callbacks=[cb])
    with pytest.raises(ConfigError, match="actions.slack.webhook_url: environment variable NO_SUCH_WEBHOOK"):
        trainer.train()
    assert trainer.state.global_step == 0


@pytest.mark.slow
def test_an_unwritable_run_dir_is_one_warning_and_detection_and_alerts_go_on(tmp_path, caplog):
    sc = build_scenario("nan")
    (tmp_path / "a-file").write_text("not a folder")
    with AlertInbox() as inbox:
        cb = StabilityCallback(config={"actions": _webhook(inbox, "critical")}, run_dir=tmp_path / "a-file" / "stability")
        trainer = Trainer(model=sc.make_model(), args=_args(tmp_path / "ckpt", sc), train_dataset=sc.train_dataset(),
                          callbacks=[cb])
        with caplog.at_level("WARNING", logger="stability_callbacks"):
            trainer.train()
        alerts = inbox.kinds()
    (bad,) = sc.fault_steps
    assert caplog.text.count("cannot write the run log") == 1 and "monitoring is off" not in caplog.text
    assert _first(cb.findings, "nonfinite").step == bad
    assert (bad, "nonfinite", "critical") in alerts


@pytest.mark.slow
def test_the_run_lives_under_output_dir_one_run_log_per_run_a_resume_continues_it(tmp_path):
    """No run_dir: ``<output_dir>/stability``. A resume from one of its checkpoints continues
    that run log; a fresh run in the same output_dir moves it aside (``runlog.1.jsonl``)."""
    sc = build_scenario("healthy", max_steps=6)
    out = tmp_path / "out"

    def train(resume=None, **overrides):
        trainer = Trainer(model=sc.make_model(), args=_args(out, sc, save_steps=4, **overrides),
                          train_dataset=sc.train_dataset(), callbacks=[StabilityCallback(config={"actions": {}})])
        trainer.train(resume_from_checkpoint=resume)

    def segments(name="runlog.jsonl"):
        return [(x["segment"], x["start_step"], x["reason"]) for x in map(json.loads, (out / "stability" / name)
                .read_text().splitlines()) if x["type"] == "segment"]

    train(max_steps=4)
    train(resume=str(out / "checkpoint-4"))
    assert segments() == [(0, 0, "start"), (1, 4, "resume")]
    train()
    assert segments() == [(0, 0, "start")]
    assert segments("runlog.1.jsonl") == [(0, 0, "start"), (1, 4, "resume")]


@pytest.mark.slow
def test_stability_scalars_reach_the_reporters_not_the_console(tmp_path, capsys):
    """One dict line per logging step on the console (the Trainer's own, PrinterCallback); our
    ``train/stability/*`` scalars only in the reporter (TensorBoard), and not in log_history."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    sc = build_scenario("healthy", max_steps=10)
    cb = StabilityCallback(config={"actions": {}})
    trainer = Trainer(model=sc.make_model(), args=_args(tmp_path / "ckpt", sc, report_to=["tensorboard"]),
                      train_dataset=sc.train_dataset(), callbacks=[cb])
    trainer.train()
    printed = [line for line in capsys.readouterr().out.splitlines() if line.startswith("{")]
    assert len(printed) == 3 and not any("stability" in line for line in printed)   # steps 5, 10, the summary
    assert not any(k.startswith("stability") for h in trainer.state.log_history for k in h)
    (events,) = (tmp_path / "ckpt" / "runs").glob("*/events.out.tfevents.*")
    ea = EventAccumulator(str(events.parent), size_guidance={"scalars": 0})
    ea.Reload()
    # The signals at the logging steps and at once with a finding: the warmup's end (step 6, the
    # first at the peak LR of warmup_steps=5) is known at step 7; the finding itself is charted
    # at its own step.
    end = sc.warmup_steps + 1
    assert [(f.step, f.kind) for f in cb.findings] == [(end, "warmup_end")]
    assert [e.step for e in ea.Scalars("train/stability/loss")] == [5, end + 1, 10]
    assert [e.step for e in ea.Scalars("train/stability/finding/warmup_end")] == [end]
    assert [e.step for e in ea.Scalars("train/loss")] == [5, 10]


_TRACKIO_RUN = """
import json, sys
from transformers import Trainer, TrainingArguments
from stability_callbacks.demo.scenarios import build_scenario
from stability_callbacks.integrations.hf import StabilityCallback
sc = build_scenario("data-pocket", batch_size=4, grad_accum=2, max_steps=28)
args = TrainingArguments(sys.argv[1], max_steps=sc.max_steps, per_device_train_batch_size=4, gradient_accumulation_steps=2,
                         learning_rate=sc.lr, warmup_steps=sc.warmup_steps, logging_steps=5, report_to=["trackio"],
                         project="stab", run_name="pocket", train_sampling_strategy="sequential", use_cpu=True,
                         disable_tqdm=True, save_strategy="no")
cb = StabilityCallback(config={"actions": {"trackio": {"min_severity": "warning"}}})
Trainer(model=sc.make_model(), args=args, train_dataset=sc.train_dataset(), callbacks=[cb]).train()
from trackio import SQLiteStorage
logs = SQLiteStorage.get_logs("stab", "pocket")
print(json.dumps({"loss_steps": [r["step"] for r in logs if "stability/loss" in r],
                  "hf_steps": [r["step"] for r in logs if "train/loss" in r],
                  "train_stability": any(k.startswith("train/stability") for r in logs for k in r),
                  "spike": [r["step"] for r in logs if "stability/finding/loss_spike" in r],
                  "alerts": [(a["step"], a["title"], a["level"]) for a in SQLiteStorage.get_alerts("stab", run_name="pocket")]}))
"""


@pytest.mark.slow
def test_trackio_sink_writes_alerts_and_scalars_into_the_trainers_trackio_run(tmp_path):
    """``report_to="trackio"`` (HF's TrackioCallback starts a local run) with ``actions.trackio``:
    our scalars at every step and the alert in that run; HF's reporter route leaves Trackio to
    the sink (no ``train/stability/*`` twin). A subprocess: TRACKIO_DIR is read at import."""
    pytest.importorskip("trackio")
    env = dict(os.environ, TRACKIO_DIR=str(tmp_path / "trackio"), OMP_NUM_THREADS="1",
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    r = subprocess.run([sys.executable, "-c", _TRACKIO_RUN, str(tmp_path / "out")], env=env, cwd=tmp_path,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    got = json.loads(r.stdout.strip().splitlines()[-1])
    sc = build_scenario("data-pocket", batch_size=4, grad_accum=2, max_steps=28)
    assert got["loss_steps"] == list(range(1, sc.max_steps + 1))
    # HF's TrackioCallback logs without a step (Trackio then takes the step after the run's
    # latest, ours included): its points are there, at steps we do not pin down.
    assert len(got["hf_steps"]) == sc.max_steps // 5 and not got["train_stability"]
    assert got["spike"] == [sc.fault_steps[0]]
    assert got["alerts"] == [[sc.fault_steps[0], "stability: loss_spike (warning)", "warn"]]


# ----------------------------------------------------------------------- crash and hang alerts
def _fault_at(model, call: int, action) -> None:
    """Run ``action`` at the ``call``-th training forward of ``model`` (GA 1: that step)."""
    calls = []

    def pre_hook(module, args):
        if module.training:
            calls.append(1)
            if len(calls) == call:
                action()

    model.register_forward_pre_hook(pre_hook)


def _webhook(inbox, min_severity):
    return {"webhook": {"url": inbox.url, "min_severity": min_severity, "rate_limit_s": 0}}


@pytest.mark.parametrize("exc_type, added", [(RuntimeError, "init"), (RuntimeError, "add_callback"),
                                             (KeyboardInterrupt, "init")])
def test_crash_sends_one_critical_alert_then_reraises_it_unchanged(tmp_path, exc_type, added):
    """An exception in step 6: one critical alert, delivered to a real local endpoint before
    train() re-raises the very same exception; Ctrl-C is not a crash (no alert)."""
    sc = build_scenario("healthy", max_steps=10)
    model = sc.make_model()
    exc = exc_type("CUDA error: an illegal memory access was encountered at "
                   "https://user:pw@example.org/x?token=abc\n(the rest of the message)")

    def boom():
        raise exc

    _fault_at(model, 6, boom)
    with AlertInbox() as inbox:
        cb = StabilityCallback(config={"actions": _webhook(inbox, "critical")},
                               run_dir=tmp_path / "stability")
        kw = dict(model=model, args=_args(tmp_path / "ckpt", sc), train_dataset=sc.train_dataset())
        trainer = Trainer(**kw, callbacks=[cb]) if added == "init" else Trainer(**kw)
        if added == "add_callback":
            trainer.add_callback(cb)
        with pytest.raises(exc_type) as raised:
            trainer.train()
        alerts = inbox.kinds()
    assert raised.value is exc and raised.traceback[-1].name == "boom"   # unchanged
    assert cb.session.closed and not cb.session._watchdog._thread.is_alive()
    lines = _runlog(tmp_path / "stability")
    assert [x["step"] for x in lines if x["type"] == "step"] == [1, 2, 3, 4, 5]
    if exc_type is KeyboardInterrupt:
        assert alerts == [] and not any(x.get("kind") == "crash" for x in lines)
        return
    assert alerts == [(5, "crash", "critical")]                        # delivered before the raise
    (crash,) = [x for x in lines if x["type"] == "finding" and x["kind"] == "crash"]
    assert crash["details"] == {"exception": "RuntimeError", "in_step": 6, "checkpoint_step": None, "rank": 0,
                                "message": "CUDA error: an illegal memory access was encountered "
                                           "at https://example.org/..."}
    assert crash["message"].startswith("Training crashed in step 6 with RuntimeError: CUDA error")
    assert "pw" not in json.dumps(inbox.alerts) and "token" not in json.dumps(inbox.alerts)


@pytest.mark.slow
def test_hang_alert_then_resolved_from_a_really_stalled_step(tmp_path):
    """Step 8 blocks until the hang alert reaches a real local endpoint; that alert releases it
    (no sleep anywhere): one critical ``hang`` at the last finished step, one ``hang_resolved``
    when step 8 finishes."""
    sc = build_scenario("healthy", max_steps=12)
    model = sc.make_model()
    release = threading.Event()
    _fault_at(model, 8, lambda: release.wait(120))
    with AlertInbox() as inbox:
        inbox.on_kind["hang"] = release.set
        config = {"watchdog": {"hang_min_s": 3.0}, "actions": _webhook(inbox, "info")}
        cb = StabilityCallback(config=config, run_dir=tmp_path / "stability")
        trainer = Trainer(model=model, args=_args(tmp_path / "ckpt", sc), callbacks=[cb],
                          train_dataset=sc.train_dataset())
        trainer.train()
        alerts = [a for a in inbox.alerts if a["kind"] in ("hang", "hang_resolved")]
    assert release.is_set() and trainer.state.global_step == 12
    assert [(a["step"], a["kind"], a["severity"]) for a in alerts] == [
        (7, "hang", "critical"), (8, "hang_resolved", "info")]
    hang, resolved = (a["body"]["finding"] for a in alerts)
    median = hang["details"]["median_step_s"]
    assert hang["details"]["threshold_s"] == pytest.approx(max(3.0, 10 * median), abs=1e-3)
    assert hang["details"]["stall_s"] >= hang["details"]["threshold_s"]
    assert resolved["details"]["stall_s"] >= hang["details"]["stall_s"]
    assert resolved["details"]["stalled_step"] == 7
    logged = [(x["step"], x["kind"]) for x in _runlog(tmp_path / "stability")
              if x["type"] == "finding" and x["kind"].startswith("hang")]
    assert logged == [(7, "hang"), (8, "hang_resolved")]


# --------------------------------------------------------------------------- warmup spike
def test_warmup_spike_escalates_and_bumps_the_save_interval(tmp_path):
    sc = build_scenario("warmup-spike")
    config = {"phase": {"risk_window_factor": 0.5},
              "policy": {"bump_save_interval_to": 2, "bump_duration_steps": 4}}
    trainer = Trainer(model=sc.make_model(), args=_args(tmp_path / "ckpt", sc, save_steps=1000),
                      train_dataset=sc.train_dataset())
    cb = StabilityCallback.attach(trainer, config=config, run_dir=tmp_path / "stability")
    trainer.train()
    first = sc.fault_steps[0]
    esc = _first(cb.findings, "warmup_instability")
    assert (esc.step, esc.severity) == (first, "warning")   # no precursor before the spike: no halt
    assert _first(cb.findings, "loss_spike").step == first
    end = _first(cb.findings, "warmup_end")
    assert end.step == sc.warmup_steps + 1   # the first step at the peak LR
    window_end = end.details["risk_window_end_step"]
    serious = [f.step for f in cb.findings if f.severity != "info"
               and f.kind not in ("warmup_instability", "rollback_advice")]
    bump_end = max([window_end] + [s + 4 for s in serious])
    # The interval decided at step s governs step s (as under Lightning and DeepSpeed).
    bumped = [s for s in range(end.step + 1, bump_end + 1) if s % 2 == 0]
    ckpts = _checkpoints(tmp_path / "ckpt")
    # Every even step while bumped, the save-now at the spike, the final save; nothing between
    # the end of the bump and the end of training (the user's interval, 1000, is back).
    assert ckpts == sorted(set(bumped) | {first, sc.max_steps})
    assert bump_end < sc.max_steps - 2
    assert trainer.state.save_steps == 1000
    # Each save the monitor asked for, with its reason; the final save is the Trainer's own.
    actions = _actions(tmp_path / "stability")
    saves = {step: why for step, what, why in actions if what == "save"}
    assert sorted(saves) == sorted(set(bumped) | {first})
    assert saves[first] == f"save now: loss_spike (warning) at step {first}"
    assert {saves[s].split(":")[0] for s in bumped if s != first} == {"bumped save interval (2 steps)"}
    intervals = [(step, why) for step, what, why in actions if what == "save_interval"]
    assert intervals[0] == (end.step + 1, f"inside the warmup-end risk window (steps "
                                          f"{end.step + 1}-{window_end})")
    assert intervals[-1] == (bump_end + 1, "back to the user's own save interval")


def test_bind_twice_to_another_trainer_is_an_error(tmp_path):
    sc = build_scenario("healthy", max_steps=2)
    t1 = Trainer(model=sc.make_model(), args=_args(tmp_path / "a", sc), train_dataset=sc.train_dataset())
    t2 = Trainer(model=sc.make_model(), args=_args(tmp_path / "b", sc), train_dataset=sc.train_dataset())
    cb = StabilityCallback(trainer=t1)
    with pytest.raises(ValueError, match="trainer"):
        cb.bind(t2)
    cb.close()
    assert "training_step" not in t1.__dict__


# ---------------------------------------------------------------------------- distributed
def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _launch(tmp_path, backend: str, scenario: str, timeout_s: int = 300):
    env = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu",
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
           f"--master_port={_free_port()}", str(REPO / "tests" / "dist" / "hf_worker.py"),
           "--backend", backend, "--scenario", scenario, "--halt-on", "critical",
           "--out", str(tmp_path)]
    proc = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=timeout_s)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]


@pytest.mark.slow
@pytest.mark.parametrize("backend,scenario", [("ddp", "warmup-spike"), ("zero2", "nan")])
def test_two_ranks_decide_the_same_and_exit_cleanly(tmp_path, backend, scenario):
    """torchrun, 2 CPU processes, gloo (~25 s each on 2 idle cores, mostly imports). ZeRO-3 was
    checked by hand with the same worker (``--backend zero3``): same findings, halt and save."""
    if backend.startswith("zero"):
        pytest.importorskip("deepspeed")
    sc = build_scenario(scenario)
    r0, r1 = _launch(tmp_path, backend, scenario)
    assert r0["findings"] == r1["findings"]                     # identical decisions
    assert r0["global_step"] == r1["global_step"] == sc.fault_steps[0]   # halted together
    assert (r0["is_deepspeed"], r0["zero_stage"]) == ((True, 2) if backend == "zero2" else (False, None))
    kinds = {(f["step"], f["kind"]) for f in r0["findings"]}
    # One run log, written by rank 0; Adam statistics cover the whole model (ZeRO-2: the two
    # partitions summed; DDP: the replicated state counted once).
    steps = [r for r in _runlog(tmp_path / "stability") if r["type"] == "step"]
    assert [r["step"] for r in steps] == list(range(1, sc.fault_steps[0] + 1))
    assert steps[5]["metrics"]["adam/exp_avg_sq_numel"] == r0["num_params"]
    if scenario == "warmup-spike":
        assert {(21, "loss_spike"), (21, "warmup_instability")} <= kinds
        assert r0["checkpoints"] == ["checkpoint-21"]           # state good: saved, then stopped
    else:
        assert (22, "nonfinite") in kinds
        assert r0["checkpoints"] == []                          # NaN weights: no save


@pytest.mark.slow
def test_when_rank_1_raises_the_alert_names_rank_1_and_its_exception(tmp_path):
    """torchrun, 2 CPU processes, gloo, DDP: rank 1 raises in step 6; rank 0 then fails in the
    step's all-reduce with gloo's "Connection closed by peer". One crash alert reaches a real
    local endpoint, sent by rank 1 itself (torchrun stops rank 0 once rank 1 exits, so rank 0
    cannot be relied on to page), naming rank 1 and its exception; rank 0's run log records the
    crash with both (~25 s, mostly imports)."""
    sc = build_scenario("healthy", max_steps=10, batch_size=4)
    with AlertInbox() as inbox:
        config = {"actions": {"webhook": {"url": inbox.url, "min_severity": "critical", "rate_limit_s": 0}}}
        env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
        proc = subprocess.run(
            [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--monitor-interval=2",
             f"--master_port={_free_port()}", str(REPO / "tests" / "dist" / "hf_worker.py"),
             "--backend", "ddp", "--scenario", "healthy", "--max-steps", str(sc.max_steps),
             "--config", json.dumps(config), "--raise-on-rank", "1", "--raise-at", "6", "--out", str(tmp_path)],
            env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
        alerts = list(inbox.alerts)
    assert proc.returncode != 0 and "boom on rank 1" in proc.stderr
    assert [(a["step"], a["kind"]) for a in alerts] == [(5, "crash")], proc.stderr[-3000:]
    crash = alerts[0]["body"]["finding"]
    assert crash["details"]["rank"] == 1 and crash["details"]["exception"] == "RuntimeError"
    assert crash["message"].startswith("Training crashed on rank 1 in step 6 with RuntimeError: boom on "
                                       "rank 1: an illegal memory access.")
    assert json.loads((tmp_path / "stability" / "crash" / "rank1.json").read_text())["rank"] == 1
    (logged,) = [x for x in _runlog(tmp_path / "stability") if x.get("kind") == "crash"]
    assert logged["details"]["rank"] == 1 and logged["details"]["then"]["rank"] == 0
    assert "Connection closed by peer" in logged["details"]["then"]["message"]
    assert "Rank 0 failed after it, with RuntimeError" in logged["message"]


# ------------------------------------------------------------------- per-dataset losses
def test_per_dataset_losses_from_the_model_output(tmp_path):
    """A model whose output carries ``stream_losses`` gets ``loss/<name>`` in every record."""
    from transformers import GPT2LMHeadModel

    class TwoStreams(GPT2LMHeadModel):
        def forward(self, input_ids=None, labels=None, **kwargs):
            out = super().forward(input_ids=input_ids, labels=labels, **kwargs)
            out["stream_losses"] = streams = two_stream_losses(out.logits, labels)
            seen.append((streams["a"].item(), streams["b"].item()))
            return out

    seen: list = []

    sc = build_scenario("healthy", max_steps=6, batch_size=4, grad_accum=2)
    model = TwoStreams(sc.make_model().config)
    model.load_state_dict(sc.make_model().state_dict())
    trainer = Trainer(model=model, args=_args(tmp_path / "ckpt", sc), train_dataset=sc.train_dataset())
    StabilityCallback.attach(trainer, run_dir=tmp_path / "stability")
    trainer.train()
    steps = [r["metrics"] for r in _runlog(tmp_path / "stability") if r["type"] == "step"]
    assert len(steps) == 6 and len(seen) == 12
    for i, m in enumerate(steps):       # mean over the step's two micro-batches
        a = (seen[2 * i][0] + seen[2 * i + 1][0]) / 2
        b = (seen[2 * i][1] + seen[2 * i + 1][1]) / 2
        assert (m["loss/a"], m["loss/b"]) == (pytest.approx(a, rel=1e-6), pytest.approx(b, rel=1e-6))


# ------------------------------------------------------------------------ README snippet
def _readme_snippet() -> str:
    """The HF example exactly as README.md shows it (the README must not drift)."""
    text = (Path(__file__).resolve().parent.parent / "README.md").read_text()
    block = text.split("**HF Trainer**", 1)[1].split("```python\n", 1)[1]
    return block.split("```", 1)[0]


README_SNIPPET = _readme_snippet()


def test_readme_snippet_runs(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    exec(compile(README_SNIPPET, "README", "exec"), {})
    lines = _runlog(tmp_path / "out" / "stability")
    assert (25, "loss_spike") in {(x["step"], x["kind"]) for x in lines if x["type"] == "finding"}
    assert (tmp_path / "out" / "hf" / "checkpoint-25" / STATE_FILE).is_file()


@pytest.mark.parametrize("warmup, expected", [(0, [(0, "preflight", "warmup_steps")]), (8, [])])
def test_preflight_audit_runs_once_at_train_begin(tmp_path, warmup, expected):
    sc = build_scenario("healthy", max_steps=3)
    trainer = Trainer(model=sc.make_model(), args=_args(tmp_path / "hf", sc, max_steps=3, warmup_steps=warmup),
                      train_dataset=sc.train_dataset())
    cb = StabilityCallback.attach(trainer, config={"actions": {}}, run_dir=tmp_path / "stability")
    trainer.train()
    pre = [(f.step, f.kind, f.signal) for f in cb.findings if f.kind == "preflight"]
    assert pre == expected
    logged = [x for x in _runlog(tmp_path / "stability") if x["type"] == "finding" and x["kind"] == "preflight"]
    assert [(x["step"], x["signal"]) for x in logged] == [(s, sig) for s, _, sig in expected]


def test_a_scheduler_passed_by_hand_declares_its_own_warmup_not_the_arguments(tmp_path):
    """``Trainer(optimizers=(opt, sched))``: the arguments' ``warmup_steps`` (20) describe a
    scheduler the Trainer never made; the warmup declared is the one the scheduler itself has,
    read from a copy of it: multipliers 1/6 ... 6/6, then flat, so step 6 is the first at the
    peak, where the warmup ends (as with ``warmup_steps=5``: the convention of every framework)."""
    sc = build_scenario("healthy", max_steps=30)
    model = sc.make_model()
    opt = torch.optim.AdamW(model.parameters(), lr=sc.lr)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 6))
    trainer = Trainer(model=model, args=_args(tmp_path / "hf", sc, max_steps=30, warmup_steps=20),
                      train_dataset=sc.train_dataset(), optimizers=(opt, sched))
    cb = StabilityCallback.attach(trainer, config={"actions": {}}, run_dir=tmp_path / "stability")
    trainer.train()
    assert [(f.step, f.kind) for f in cb.findings if f.kind == "warmup_end"] == [(6, "warmup_end")]
