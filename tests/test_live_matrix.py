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
import torch

pytest.importorskip("transformers")
pytest.importorskip("lightning")
pytest.importorskip("deepspeed")

from live_suite.fields import field_columns  # noqa: E402
from live_suite.matrix import run_scenarios, select, summary  # noqa: E402
from live_suite.scenarios import QUICK, SCENARIOS, Fault, Scenario  # noqa: E402
from live_suite.verdict import judge, read_runlog  # noqa: E402

from stability_callbacks.record import KINDS  # noqa: E402

pytestmark = pytest.mark.slow   # the live matrix's quick subset

#: Quick runs whose expected finding kind this tree does not have yet (``not_learning``, issue 33
#: item 1, comes with the detectors' branch): not run, their tests skipped until it lands.
PENDING = [n for n in QUICK if not SCENARIOS[n].healthy and SCENARIOS[n].fault.expect not in (None, *KINDS)]
RUN = [n for n in QUICK if n not in PENDING]
HEALTHY = [n for n in RUN if SCENARIOS[n].healthy]
FAULTS = [n for n in QUICK if not SCENARIOS[n].healthy]


def _unless_pending(names):
    return [pytest.param(n, marks=pytest.mark.skip(reason=f"no {SCENARIOS[n].fault.expect!r} finding in this tree"))
            if n in PENDING else n for n in names]


@pytest.fixture(scope="module")
def live_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("live_matrix")


@pytest.fixture(scope="module")
def results(live_dir) -> dict:
    return {r["name"]: r for r in run_scenarios(select(only=RUN), live_dir, jobs=2)}


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


@pytest.mark.parametrize("name", _unless_pending(FAULTS))
def test_planted_fault_is_caught_in_time(results, name):
    r, fault = results[name], SCENARIOS[name].fault
    assert r["error"] is None
    assert r["evidence_ok"], r["evidence"]            # the fault really hit the run
    assert r["warnings"] == []                        # nothing serious before the fault
    step, kind, severity, _ = r["catch"]
    assert severity in ("warning", "critical")
    at = step + 1 if kind == "crash" else step        # a crash carries the last finished step
    assert fault.step <= at <= fault.step + fault.within, (kind, step)
    assert r["delay"] == at - fault.step and r["caught"] and r["ok"]


@pytest.mark.parametrize("name", [n for n in FAULTS if SCENARIOS[n].fault.expect == "precursor"])
def test_an_lr_burst_moves_the_update_first_and_sets_the_spike_onset(results, live_dir, name):
    # The burst's step updates the weights with 30x the LR: the update norm jumps at that step,
    # the loss (a forward on the updated weights) one step later.
    assert results[name]["error"] is None
    step = SCENARIOS[name].fault.step
    _, findings = read_runlog(live_dir / name / "runlog.jsonl")
    pre = [f for f in findings if f["kind"] == "precursor"]
    spike = next(f for f in findings if f["kind"] == "loss_spike")
    assert [(f["step"], f["details"]["rule"], f["severity"]) for f in pre] == [
        (step, "update", "info"), (step + 1, "update", "warning")]   # a warning once the loss followed
    assert spike["step"] == step + 1 and spike["onset_step"] == step
    assert spike["details"]["spike_onset_step"] == step + 1
    assert f"at step {step}, 1 step before the loss" in spike["message"]


def test_summary_line(results):
    line = summary([results[n] for n in RUN])
    faults = len(RUN) - len(HEALTHY)
    assert re.fullmatch(rf"healthy runs with warn\+ 0/{len(HEALTHY)}, faults caught "
                        rf"{faults}/{faults}, median delay \d+(\.5)? steps", line), line


# --------------------------------------------------------------------- the judge on its own
def _runlog(tmp_path, losses, findings=(), lr=lambda step: 1e-3, **more):
    lines = [{"type": "segment", "segment": 0, "start_step": 0, "reason": "start"}]
    lines += [{"type": "step", "step": s, "segment": 0, "metrics": {"loss": v, "lr": lr(s), **more}}
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


def test_judge_crash_never_learning_and_policy_gradient_runs(tmp_path):
    # a crash finding carries the last finished step: the crash itself is the next step's
    crash = Scenario("c", "hf", 30, model="cnn", fault=Fault("bn-batch1", 20, within=0, expect="crash"))
    message = "ValueError: Expected more than 1 value per channel when training, got input size [1, 32]"
    _runlog(tmp_path, [2.0 - s / 20 for s in range(19)], [(19, "crash", "critical")])
    r = judge(crash, tmp_path, notes={"crash": message})
    assert (r["caught"], r["delay"], r["warnings"], r["evidence_ok"], r["ok"]) == (True, 0, [], True, True)
    _runlog(tmp_path, [2.0 - s / 20 for s in range(19)], [(19, "loss_spike", "warning"), (19, "crash", "critical")])
    r = judge(crash, tmp_path, notes={"crash": message})
    assert r["warnings"] == [[19, "loss_spike", "warning", "m"]] and not r["ok"]
    assert judge(crash, tmp_path, notes={})["evidence_ok"] is False            # no crash: not the fault

    # never learning: flat at chance level (ln 10 for random labels), LR 0 for lr-zero
    labels = Scenario("r", "hf", 60, model="cnn",
                      fault=Fault("random-labels", 1, within=59, expect="not_learning", critical=False))
    flat = [2.30 + 0.02 * (-1) ** s for s in range(60)]
    _runlog(tmp_path, flat, [(40, "not_learning", "warning")])
    r = judge(labels, tmp_path)
    assert (r["caught"], r["delay"], r["evidence_ok"], r["ok"]) == (True, 39, True, True)
    _runlog(tmp_path, flat, [(40, "not_learning", "critical")])
    assert judge(labels, tmp_path)["overreach"] == [[40, "not_learning", "critical", "m"]]
    _runlog(tmp_path, flat, [(40, "loss_spike", "warning")])                   # not the expected kind
    assert judge(labels, tmp_path)["caught"] is False
    _runlog(tmp_path, [2.3 - s / 40 for s in range(60)])                       # it learned after all
    assert judge(labels, tmp_path)["evidence_ok"] is False
    lr_zero = Scenario("z", "hf", 60, model="vae", fault=Fault("lr-zero", 11, within=49, expect="not_learning"))
    _runlog(tmp_path, [400.0] * 60, lr=lambda s: 1e-3 * s / 10 if s <= 10 else 0.0)
    r = judge(lr_zero, tmp_path)
    assert r["evidence_ok"] and r["evidence"] == "loss 400 -> 400 from step 11; LR [0.0] from step 11"
    _runlog(tmp_path, [400.0] * 60)
    assert judge(lr_zero, tmp_path)["evidence_ok"] is False
    # frozen: no gradient (HF: a grad norm of 0; Lightning logs none); a stale optimizer: gradients
    frozen, stale = (Scenario(k, "hf", 60, model="ddpm", fault=Fault(k, 1, within=59, expect="not_learning"))
                     for k in ("frozen", "optimizer-stale"))
    for grad_norm, ok in ((0.0, (True, False)), (1.5, (False, True))):
        _runlog(tmp_path, [1.0] * 60, grad_norm=grad_norm)
        assert (judge(frozen, tmp_path)["evidence_ok"], judge(stale, tmp_path)["evidence_ok"]) == ok
    _runlog(tmp_path, [1.0] * 60)
    assert judge(frozen, tmp_path)["evidence_ok"] and judge(stale, tmp_path)["evidence_ok"]

    # a policy gradient's loss hovers about zero: a healthy run learned when its reward rose
    bandit = Scenario("b", "hf", 40, model="bandit")
    _runlog(tmp_path, [0.05 * (-1) ** s for s in range(40)])
    notes = {"reward_start": 0.0, "reward_end": 0.7, "reward_best": 0.8}
    r = judge(bandit, tmp_path, notes=notes)
    assert r["evidence_ok"] and r["ok"] and r["evidence"].endswith("expected reward 0 -> 0.7 (best arm 0.8)")
    assert judge(bandit, tmp_path, notes={**notes, "reward_end": 0.3})["evidence_ok"] is False


def test_a_fault_run_reads_its_healthy_twins_data_up_to_the_fault():
    twin, unscaled = SCENARIOS["hf-ddpm"], SCENARIOS["hf-ddpm-unnormalized"]
    g, f = unscaled.samples_per_step, unscaled.fault
    healthy = field_columns(twin, twin.steps * g, seed=1, train=True)
    faulty = field_columns(unscaled, unscaled.steps * g, seed=1, train=True)
    start, stop = (f.step - 1) * g, (f.step - 1 + f.length) * g   # steps 400-404
    assert torch.equal(faulty["x0"][:start], healthy["x0"][:start])
    assert torch.equal(faulty["x0"][start:stop], healthy["x0"][start:stop] * 255)
    assert torch.equal(faulty["x0"][stop:], healthy["x0"][stop:]) and torch.equal(faulty["t"], healthy["t"])
    short = field_columns(twin, 100 * g, seed=1, train=True)           # a shorter run: the same first rows
    assert all(torch.equal(short[k], healthy[k][:100 * g]) for k in short)
    bn = SCENARIOS["hf-cnn-bn-batch1"]
    assert len(field_columns(bn, bn.steps * g, seed=1, train=True)["labels"]) == 119 * g + 1
