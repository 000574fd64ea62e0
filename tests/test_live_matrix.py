"""The live scenario suite's quick subset (issue 16 item 2): real tiny training runs on the HF
Trainer, Lightning and a DeepSpeed engine, monitored with the default config, judged from their
run logs. Healthy runs: no warning or critical finding, nothing logged at warning, and the loss
really falls. Planted faults: really hit the run, and caught at warning+ within their bound with
nothing serious before them. The full matrix: ``python scripts/live_matrix.py``.

One worker process per framework (``live_suite.matrix``), two at once: ~1 min on 2 idle cores.
"""
from __future__ import annotations

import json
import re

import pytest

pytest.importorskip("transformers")
pytest.importorskip("lightning")
pytest.importorskip("deepspeed")

from live_suite.matrix import run_scenarios, select, summary  # noqa: E402
from live_suite.scenarios import QUICK, SCENARIOS, Fault, Scenario  # noqa: E402
from live_suite.verdict import judge  # noqa: E402

HEALTHY = [n for n in QUICK if SCENARIOS[n].healthy]
FAULTS = [n for n in QUICK if not SCENARIOS[n].healthy]


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("live_matrix")
    return {r["name"]: r for r in run_scenarios(select(quick=True), out, jobs=2)}


def test_the_quick_subset_covers_every_framework_and_both_verdicts():
    assert {SCENARIOS[n].framework for n in HEALTHY} == {"hf", "lightning", "deepspeed"}
    assert {SCENARIOS[n].framework for n in FAULTS} == {"hf", "lightning", "deepspeed"}


@pytest.mark.parametrize("name", HEALTHY)
def test_healthy_run_is_quiet(results, name):
    r = results[name]
    assert r["error"] is None
    assert r["n_steps"] == SCENARIOS[name].steps
    assert r["evidence_ok"], r["evidence"]            # finite, and the loss fell by >10%
    assert r["warnings"] == []                        # no warning or critical finding
    assert r["log_warnings"] == []                    # nor a warning in the library's log


@pytest.mark.parametrize("name", FAULTS)
def test_planted_fault_is_caught_in_time(results, name):
    r, fault = results[name], SCENARIOS[name].fault
    assert r["error"] is None
    assert r["evidence_ok"], r["evidence"]            # the fault really hit the run
    assert r["warnings"] == []                        # nothing serious before the fault
    step, kind, severity, _ = r["catch"]
    assert severity in ("warning", "critical")
    assert fault.step <= step <= fault.step + fault.within, (kind, step)
    assert r["delay"] == step - fault.step and r["caught"] and r["ok"]


def test_summary_line(results):
    line = summary([results[n] for n in QUICK])
    assert re.fullmatch(rf"healthy runs with warn\+ 0/{len(HEALTHY)}, faults caught "
                        rf"{len(FAULTS)}/{len(FAULTS)}, median delay \d+(\.5)? steps", line), line


# --------------------------------------------------------------------- the judge on its own
def _runlog(tmp_path, losses, findings=()):
    lines = [{"type": "segment", "segment": 0, "start_step": 0, "reason": "start"}]
    lines += [{"type": "step", "step": s, "segment": 0, "metrics": {"loss": v, "lr": 1e-3}}
              for s, v in enumerate(losses, 1)]
    lines += [{"type": "finding", "step": s, "kind": k, "severity": sev, "message": "m"}
              for s, k, sev in findings]
    (tmp_path / "runlog.jsonl").write_text("\n".join(json.dumps(x) for x in lines) + "\n")


def test_judge_healthy_and_fault_runs(tmp_path):
    healthy = Scenario("h", "hf", 30)
    _runlog(tmp_path, [3.0 - s / 20 for s in range(30)], [(12, "loss_spike", "info")])
    r = judge(healthy, tmp_path)
    assert (r["ok"], r["warnings"], r["evidence_ok"]) == (True, [], True)
    _runlog(tmp_path, [3.0 - s / 20 for s in range(30)], [(22, "second_moment_surge", "warning")])
    assert judge(healthy, tmp_path)["warnings"] == [[22, "second_moment_surge", "warning", "m"]]
    assert judge(healthy, tmp_path, log_warnings=["WARNING: x"])["ok"] is False
    _runlog(tmp_path, [3.0] * 30)                     # never learned: not a healthy scenario
    assert judge(healthy, tmp_path)["evidence_ok"] is False

    pocket = Scenario("f", "hf", 30, fault=Fault("data-pocket", 25, within=2, length=2))
    losses = [2.0] * 24 + [4.5, 4.4, 2.1, 2.0, 2.0, 2.0]
    _runlog(tmp_path, losses, [(10, "grad_norm_spike", "info"), (26, "loss_spike", "warning")])
    r = judge(pocket, tmp_path)
    assert (r["caught"], r["delay"], r["catch"][1], r["ok"]) == (True, 1, "loss_spike", True)
    assert r["evidence"] == "loss 2 -> 4.5 (x2.2) at step 25"
    _runlog(tmp_path, losses, [(20, "loss_spike", "warning"), (28, "loss_spike", "warning")])
    r = judge(pocket, tmp_path)
    assert (r["caught"], r["delay"], r["ok"]) == (False, 3, False)    # late, and warned before
    assert r["warnings"] == [[20, "loss_spike", "warning", "m"]]
    _runlog(tmp_path, [2.0] * 30, [(25, "loss_spike", "warning")])  # nothing happened to the loss
    assert judge(pocket, tmp_path)["evidence_ok"] is False


def test_judge_overreach_and_dishonest_findings(tmp_path):
    spike = Scenario("f", "hf", 30, warmup=5, fault=Fault("warmup-spike", 25, within=2, length=2,
                                                          critical=False, forbid=("warmup_end",)))
    losses = [2.0] * 24 + [4.5, 4.4, 2.1, 2.0, 2.0, 2.0]
    _runlog(tmp_path, losses, [(25, "loss_spike", "warning")])
    r = judge(spike, tmp_path)
    assert (r["ok"], r["overreach"], r["dishonest"]) == (True, [], [])
    _runlog(tmp_path, losses, [(25, "loss_spike", "warning"), (26, "warmup_instability", "critical"),
                               (27, "warmup_end", "info")])
    r = judge(spike, tmp_path)
    assert [x[:3] for x in r["overreach"]] == [[26, "warmup_instability", "critical"], [27, "warmup_end", "info"]]
    assert r["caught"] and not r["ok"]
    # a rise printed below its own threshold; "no warmup" said of a run that warms up
    lines = (tmp_path / "runlog.jsonl").read_text().splitlines()[:-3] + [
        json.dumps({"type": "finding", "step": 25, "kind": "loss_spike", "severity": "warning", "message": "m",
                    "value": 3.0, "threshold": 3.5}),
        json.dumps({"type": "finding", "step": 0, "kind": "preflight", "severity": "info",
                    "message": "No LR warmup in a 30-step run."})]
    (tmp_path / "runlog.jsonl").write_text("\n".join(lines) + "\n")
    r = judge(spike, tmp_path)
    assert r["dishonest"] == ["loss_spike@25: value 3 below its threshold 3.5",
                              "preflight: 'No LR warmup' on a run with a 5-step warmup"] and not r["ok"]
