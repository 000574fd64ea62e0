"""What a real run of each integration writes to its run log is what the detectors need, read
back from the run log (live scenario suite runs: HF Trainer, Lightning, DeepSpeed ZeRO-2 fp16):

- every record carries ``adam/beta2`` (the optimizer's own, not torch's default) and
  ``adam/step`` (Adam's update count: DeepSpeed's skipped fp16 steps are not updates);
- the warmup the integration declared is in the run log (a ``phase`` line), so replaying the run
  log gives the live findings *as they happened*: each at the same record as live (the LR stream
  alone tells a log warmup's end 2 records late).

~40 s on 2 idle cores (one worker per framework).
"""
from __future__ import annotations

import json

import pytest

pytest.importorskip("transformers")
pytest.importorskip("lightning")
pytest.importorskip("deepspeed")

from live_suite.matrix import run_scenarios, select  # noqa: E402
from live_suite.scenarios import SCENARIOS  # noqa: E402

from stability_callbacks import Monitor  # noqa: E402
from stability_callbacks.replay.readers import read_records  # noqa: E402

pytestmark = pytest.mark.slow   # real runs of every framework in the live suite's workers

NAMES = ["hf-cosine-w10-b095", "pl-constant-bf16", "ds-z2-fp16-logwarmup"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("live_records")
    results = {r["name"]: r for r in run_scenarios(select(only=NAMES), out, jobs=2)}
    for name in NAMES:
        assert results[name]["error"] is None, results[name]["error"]
    return {name: [json.loads(line) for line in (out / name / "runlog.jsonl").read_text().splitlines()]
            for name in NAMES}


@pytest.mark.parametrize("name", NAMES)
def test_every_record_carries_the_optimizers_beta2_and_update_count(runs, name):
    steps = [x for x in runs[name] if x["type"] == "step"]
    assert len(steps) == SCENARIOS[name].steps
    assert {x["metrics"]["adam/beta2"] for x in steps} == {SCENARIOS[name].beta2}
    updates = 0
    for x in steps:
        updates += x["metrics"].get("skipped", 0.0) == 0.0   # an fp16 overflow skips the update
        assert x["metrics"]["adam/step"] == updates, x["step"]
    skipped = [x["step"] for x in steps if x["metrics"].get("skipped") == 1.0]
    assert (len(skipped) > 0) == (name == "ds-z2-fp16-logwarmup")   # the fp16 run really skipped


def test_the_declared_warmup_is_in_the_run_log(runs):
    # Every framework declares the first step at the peak LR. DeepSpeed's WarmupLR(200, log):
    # step 201 (its scheduler lags a step); HF: TrainingArguments' warmup_steps=10, declared
    # before the first step: step 11, whose LR is the peak; Lightning: its per-step LambdaLR's
    # first ramp, read from the scheduler, the same
    assert [x for x in runs["ds-z2-fp16-logwarmup"] if x["type"] == "phase"] == [
        {"type": "phase", "warmup_steps": 201}]
    assert [x["warmup_steps"] for x in runs["hf-cosine-w10-b095"] if x["type"] == "phase"] == [11]
    assert [x["warmup_steps"] for x in runs["pl-constant-bf16"] if x["type"] == "phase"] == [11]
    # ... and the model's output size, read from its output layer (GPT-2's vocabulary here)
    for name in NAMES:
        sizes = [x["num_outputs"] for x in runs[name] if x["type"] == "model"]
        assert len(sizes) == 1 and sizes[0] >= 2, name


def _as_it_happened(lines) -> list:
    """``(record step, finding step, kind, severity)`` in run-log order: each finding with the
    record whose update emitted it (a finding line follows its record's step line)."""
    out, last = [], None
    for x in lines:
        if x["type"] == "step":
            last = x["step"]
        elif x["type"] == "finding" and x["kind"] != "preflight":   # preflight: the integration's
            out.append((last, x["step"], x["kind"], x["severity"]))
    return out


@pytest.mark.parametrize("name", NAMES)
def test_replaying_the_run_log_gives_the_live_findings_as_they_happened(runs, name, tmp_path):
    path = tmp_path / "runlog.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in runs[name]) + "\n")
    monitor = Monitor()
    replayed = [(r.step, f.step, f.kind, f.severity) for r in read_records(path, "jsonl") for f in monitor.update(r)]
    assert replayed == _as_it_happened(runs[name])
    if name == "ds-z2-fp16-logwarmup":
        assert replayed == [(202, 201, "warmup_end", "info")]
        # without the phase line the LR tells the end of the log warmup 2 records later
        path.write_text("\n".join(json.dumps(x) for x in runs[name] if x["type"] != "phase") + "\n")
        monitor = Monitor()
        late = [(r.step, f.step, f.kind) for r in read_records(path, "jsonl") for f in monitor.update(r)]
        assert late == [(204, 201, "warmup_end")]
