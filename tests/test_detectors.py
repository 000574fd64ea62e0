"""Every detector on a seeded synthetic stream: the exact steps of its findings."""
import json
import math

import pytest
from physics import adam_run
from streams import healthy, scale

from stability_callbacks import Monitor, StepRecord
from stability_callbacks.record import KINDS
from stability_callbacks.detectors import DETECTORS, Context


def run(records, config=None, *, warmup_steps=None, tensor_names=None):
    m = Monitor(config)
    m.tensor_names = tensor_names
    if warmup_steps:
        m.set_warmup_steps(warmup_steps)
    out = []
    for r in records:
        out += m.update(r)
    return out


def kinds(findings, *, min_severity="info"):
    order = {"info": 0, "warning": 1, "critical": 2}
    return [(f.step, f.kind, f.severity) for f in findings if order[f.severity] >= order[min_severity]
            and f.kind != "warmup_end"]


def resumed_from(recs, at=300):
    """What an integration does when it resumes from the checkpoint of step ``at``: the state
    of a Monitor fed ``recs[:at]`` goes through JSON into a fresh Monitor, which then opens the
    resume segment (start_step = the step resumed from). Returns it and the resume's findings."""
    before = Monitor()
    for r in recs[:at]:
        before.update(r)
    m = Monitor()
    m.load_state_dict(json.loads(json.dumps(before.state_dict())))
    return m, m.begin_segment(at, "resume")


def test_healthy_stream_is_quiet():
    found = run(healthy(2000, adam=True))
    assert kinds(found) == []
    assert [(f.step, f.kind) for f in found if f.kind == "warmup_end"] == [(50, "warmup_end")]


def test_fast_spike_is_info_and_recovers():
    recs = scale(healthy(), "loss", lambda s: 1.8 if s == 300 else 1.0)
    assert kinds(run(recs)) == [(300, "loss_spike", "info"), (301, "spike_recovered", "info")]


def test_slow_spike_warns_and_recovers_slowly():
    # a spike decaying over ~150 steps
    recs = scale(healthy(800), "loss", lambda s: 1 + 1.2 * math.exp(-(s - 300) / 100) if s >= 300 else 1.0)
    found = run(recs)
    assert kinds(found) == [(300, "loss_spike", "info"), (302, "loss_spike", "warning"),   # persisted 3 points
                            (437, "spike_recovered", "warning")]                           # slow: > 100 steps
    # back within a tenth of the rise in log(loss): +8.2% of the +120% (x2.2^0.1)
    assert found[-1].details["speed"] == "slow" and found[-1].details["recovery_steps"] == 137


def test_a_spike_of_orders_of_magnitude_is_not_back_while_it_stays_orders_of_magnitude_up():
    # x1000, then x100 for good: a tenth of the rise measured in log(loss) is back within x2, so
    # no "came back, no action needed" at x100 (before: a tenth of the rise in the loss's own
    # units, 100x its level, counted as back)
    recs = scale(healthy(800), "loss", lambda s: 1.0 if s < 300 else 1000.0 if s == 300 else 100.0)
    found = [f for f in run(recs) if f.kind in ("spike_recovered", "spike_unrecovered")]
    assert [(f.step, f.kind, f.severity) for f in found] == [(600, "spike_unrecovered", "critical")]


def test_unrecovered_spike_is_critical_with_rollback_advice():
    recs = scale(healthy(800), "loss", lambda s: 1.6 if s >= 300 else 1.0)
    found = run(recs)
    assert kinds(found) == [(300, "loss_spike", "info"), (302, "loss_spike", "warning"),
                            (340, "level_shift", "warning"), (600, "spike_unrecovered", "critical"),
                            (600, "rollback_advice", "critical")]
    assert found[-1].onset_step == 300 and found[-1].details["skip_steps"] == [300, 600]


def test_a_recovered_spike_does_not_start_the_episode_of_a_later_failure():
    """A spike at 300 back at once, then a NaN 10 steps later (within the lead window): the
    NaN's episode begins at the NaN. Without the recovery it would begin at the spike."""
    recs = scale(healthy(400), "loss", lambda s: 1.8 if s == 300 else math.nan if s == 310 else 1.0)
    found = run(recs)
    assert kinds(found)[:2] == [(300, "loss_spike", "info"), (301, "spike_recovered", "info")]
    (advice,) = [f for f in found if f.kind == "rollback_advice"]
    assert (advice.step, advice.onset_step, advice.details["skip_steps"], advice.details["led_by"]) == (
        310, 310, [310, 310], None)
    # A spike still open when the NaN comes is the same episode.
    recs = scale(healthy(400), "loss", lambda s: math.nan if s == 310 else 1.6 if s >= 300 else 1.0)
    (advice,) = [f for f in run(recs) if f.kind == "rollback_advice"]
    assert (advice.onset_step, advice.details["skip_steps"]) == (300, [300, 310])


def test_divergence_without_spike():
    recs = scale(healthy(800), "loss", lambda s: math.exp(0.004 * (s - 400)) if s >= 400 else 1.0)
    assert kinds(run(recs)) == [(438, "divergence", "critical"), (438, "rollback_advice", "critical")]


def test_level_shift():
    recs = scale(healthy(900), "loss", lambda s: 1.25 if s >= 400 else 1.0)
    found = kinds(run(recs, {"detectors": {"loss_spike": False, "divergence": False}}))
    assert found == [(440, "level_shift", "warning")]


def test_sudden_drop_is_info():
    recs = scale(healthy(1500), "loss", lambda s: 0.6 if s >= 800 else 1.0)
    found = kinds(run(recs))
    assert found == [(804, "sudden_drop", "info")]


def test_stall_and_exact_zero():
    recs = healthy(300)
    for r in recs[200:]:   # one computation again and again: its gradient too
        r.metrics["loss"], r.metrics["grad_norm"] = 1.234, 0.5
    # full-precision values before it: three identical ones are already beyond chance (and
    # 1.234 is 56% below the loss before it: a sudden drop too, as the fast level shows at 204)
    assert kinds(run(recs)) == [(203, "stall", "critical"), (204, "sudden_drop", "info")]
    recs = healthy(300)
    for r in recs[100:]:
        r.metrics["loss"] = 0.0
    # from ~2.9 to exactly 0.0 in one step: at once, not after 16 zeros (inside the risk window, but
    # a broken loss path is no training instability: not escalated)
    assert kinds(run(recs)) == [(101, "stall", "critical")]


def test_a_loss_near_its_floor_dividing_by_100_is_no_collapse_once_it_was_that_low_before():
    """DPO's -log sigma(beta * margin) once most pairs are ranked: a batch mean that its few
    wrong pairs dominate visits lows, goes back up, then falls 100x in a step. Only a fall
    below everything of the last points is a collapse (the guard of stall's collapse rule)."""
    recs = healthy(120)
    for r in recs[60:]:
        wobble = 1 + 0.1 * math.sin(r.step)      # distinct values: no repeating-value stall
        low = 0.005 if r.step <= 90 else 0.0009  # 0.16 -> 0.0009: x178 in a step, 0.005 seen before
        r.metrics["loss"] = (0.16 if r.step % 4 else low) * wobble
    assert [k for k in kinds(run(recs)) if k[1] == "stall"] == []
    recs = healthy(120)
    for r in recs[100:]:
        r.metrics["loss"] = 1.8e-6         # from the loss's level (~3) in one step: a collapse
    assert [k for k in kinds(run(recs)) if k[1] == "stall"][0] == (101, "stall", "critical")


def test_nonfinite_once_per_episode():
    recs = healthy(400)
    for r in recs[299:305]:
        r.metrics["loss"] = math.nan
    recs[350].metrics["grad_norm"] = math.inf
    found = kinds(run(recs))
    # the loss back at its level for 10 steps after each: saves resume (the policy's info), and
    # the next damage is advised on again
    assert found == [(300, "nonfinite", "critical"), (300, "rollback_advice", "critical"),
                     (315, "saves_resumed", "info"), (351, "nonfinite", "critical"),
                     (351, "rollback_advice", "critical"), (361, "saves_resumed", "info")]


def test_grad_norm_spike_isolated_then_repeating():
    recs = scale(healthy(800), "grad_norm", lambda s: 8.0 if s in (300, 500, 540, 580) else 1.0)
    found = kinds(run(recs))
    assert found == [(300, "grad_norm_spike", "info"), (500, "grad_norm_spike", "info"),
                     (540, "grad_norm_spike", "info"), (580, "grad_norm_spike", "warning")]


def test_grad_norm_growth():
    recs = scale(healthy(1500), "grad_norm", lambda s: math.exp((s - 600) / 200) if s >= 600 else 1.0)
    assert kinds(run(recs)) == [(883, "grad_norm_growth", "warning")]


def test_param_norm_growth():
    recs = healthy(1000)
    for r in recs:
        r.metrics["param_norm"] = 100.0 * (1 + max(0, r.step - 400) / 300)
    assert kinds(run(recs)) == [(575, "param_norm_growth", "warning")]


def test_second_moment_surge_jump_and_post_peak_rise():
    recs = scale(healthy(800, adam=True), "adam/exp_avg_sq_max", lambda s: 30.0 if s == 400 else 1.0)
    assert kinds(run(recs)) == [(400, "second_moment_surge", "warning")]
    # Gradients growing after warmup (step 50): judged over 20-step windows against the first
    # one after the peak (steps 54-73: the end is known at 53), from exp_avg_sq as Adam builds it.
    recs = adam_run(800, warmup=50, grad_scale=lambda s: 1.0 if s <= 50 else math.sqrt(1 + (s - 50) / 25))
    found = [f for f in run(recs) if f.kind == "second_moment_surge"]
    assert [(f.step, f.details["rule"], f.details["window"]) for f in found] == [(113, "post_peak_rise", [94, 113])]


def test_overflow_burst_and_loss_scale_collapse():
    recs = healthy(600)
    scale_ = 65536.0
    for r in recs:
        skip = 400 <= r.step < 410
        if skip:
            scale_ /= 2
        r.metrics.update(skipped=1.0 if skip else 0.0, loss_scale=scale_)
    # three halvings in a row: a warning (with the burst of skips); six: critical
    assert kinds(run(recs)) == [(402, "loss_scale_collapse", "warning"), (402, "overflow_burst", "warning"),
                                (405, "loss_scale_collapse", "critical"), (405, "rollback_advice", "critical"),
                                (415, "saves_resumed", "info")]


def test_startup_scale_search_and_periodic_overflow_are_healthy():
    recs = healthy(3000)
    scale_ = 2.0 ** 32
    for r in recs:
        skip = r.step <= 16 or r.step % 200 in (0, 1)
        if skip:
            scale_ /= 2
        elif r.step % 100 == 50:
            scale_ *= 2
        r.metrics.update(skipped=1.0 if skip else 0.0, loss_scale=scale_)
    assert kinds(run(recs)) == []


def test_lr_anomaly_on_schedule_swap():
    recs = healthy(600)
    for r in recs[400:]:
        r.metrics["lr"] *= 0.7
    assert kinds(run(recs)) == [(401, "lr_anomaly", "warning")]


def test_warmup_instability_escalation_and_save_interval_bump():
    recs = scale(healthy(600), "loss", lambda s: 3.0 if s == 70 else 1.0)
    m = Monitor({"policy": {"bump_save_interval_to": 25}})
    intervals, found = {}, []
    for r in recs:
        found += m.update(r)
        intervals[r.step] = m.control.save_interval_steps
        m.control.step_done()
    # a spike inside the risk window, no precursor before it: a warning escalation (save now, the
    # interval bump), not a halt; it recovers by itself at 71
    assert kinds(found) == [(70, "loss_spike", "warning"), (70, "warmup_instability", "warning"),
                            (71, "spike_recovered", "info")]
    assert m.phase.risk_window == (50, 200)
    assert intervals[40] is None and intervals[51] == 25 and intervals[200] == 25
    assert intervals[600] == 25   # still bumped: 1000 steps after the warning


def test_resume_spike_after_resume():
    recs = healthy(600)
    m, found = resumed_from(recs)
    for r in recs[300:]:
        r.metrics["loss"] *= 1.3 if r.step < 310 else 1.0
        found += m.update(r)
    assert kinds(found) == [(300, "resume", "info"), (301, "loss_spike", "info"),
                            (301, "resume_spike", "warning"), (303, "loss_spike", "warning"),
                            (310, "spike_recovered", "info")]
    # the same resume with the data continuing correctly: nothing but the resume itself
    m, clean = resumed_from(healthy(600))
    clean += [f for r in healthy(600)[300:] for f in m.update(r)]
    assert kinds(clean) == [(300, "resume", "info")]


def test_data_repetition_from_fingerprints_and_from_falsely_low_loss():
    recs = healthy(600)
    for r in recs:
        r.metrics["batch_fingerprint"] = float(1000 + r.step)
    m, found = resumed_from(recs)
    for r in recs[300:320]:
        r.metrics["batch_fingerprint"] = float(1000 + r.step - 300)   # the data restarted
        found += m.update(r)
    rep = [f for f in found if f.kind == "data_repetition"]
    assert [(f.step, f.details["repeats_step"], f.severity) for f in rep] == [(301, 1, "critical")]
    # no fingerprints: the loss is falsely low after the resume
    recs = healthy(600)
    m, found = resumed_from(recs)
    for r in recs[300:]:
        r.metrics["loss"] *= 0.7 if r.step < 400 else 1.0
        found += m.update(r)
    rep = [f for f in found if f.kind == "data_repetition"]
    assert [(f.step, f.details["rule"]) for f in rep] == [(305, "falsely_low_loss")]


def test_per_stream_losses_are_watched_and_named():
    recs = healthy(500)
    for r in recs:
        r.metrics["loss/cm4"] = r.metrics["loss"] * 1.2 * (2.5 if r.step == 300 else 1.0)
        r.metrics["loss/pmd"] = r.metrics["loss"] * 0.8
        r.metrics["loss"] *= 2.2 if r.step == 300 else 1.0
    found = [f for f in run(recs) if f.kind == "loss_spike"]
    assert [(f.step, f.signal) for f in found] == [(300, "loss"), (300, "loss/cm4")]
    main = found[0]
    assert main.details["streams"] == ["loss/cm4"] and "loss/cm4" in main.message


def test_cold_start_catches_huge_jumps_in_short_snippets():
    recs = [StepRecord(s, {"loss": x, "grad_norm": g}) for s, x, g in
            [(11446, 3.06, 12952.0), (11447, 3.11, 262623.0), (11448, 7.71, 254699.0)]]
    assert kinds(run(recs)) == [(11447, "grad_norm_spike", "info"), (11448, "loss_spike", "info")]


def test_early_findings_are_info_unless_unmistakable():
    recs = [StepRecord(s, {"loss": x}) for s, x in [(1, 12.4), (2, 12.5), (3, 44.0), (4, 40.0), (5, math.nan)]]
    assert kinds(run(recs)) == [(3, "loss_spike", "info"), (5, "nonfinite", "critical"),
                                (5, "rollback_advice", "critical")]


# -- contract tests: every detector --------------------------------------------------------------
CUT = 590   # the state is cut after this step: records[:CUT] before, records[CUT:] after


def _base_stream():
    recs = healthy(900, adam=True)
    for r in recs:
        r.metrics.update(param_norm=100.0, loss_scale=2.0 ** 16, skipped=0.0,
                         batch_fingerprint=float(r.step), **{"loss/a": r.metrics["loss"] * 1.1})
    return recs


def _resume_at(recs, step):
    for r in recs:
        if r.step > step:
            r.segment = 1
    return recs


def _log2_scale(s):
    """Collapses 2^16 -> 2^8 at 580-587, sinks to 2^2 at 610-615, regrows to 2^16 at 650 and
    collapses again from 660."""
    if s < 580 or 650 <= s < 660:
        return 16
    if s < 610:
        return max(16 - (s - 579), 8)
    if s < 650:
        return max(8 - (s - 609), 2)
    return max(16 - (s - 659), 8)


def _nan_loss(recs, steps):
    for r in recs:
        if r.step in steps:
            r.metrics["loss"] = math.nan
    return recs


def _set(recs, key, value_by_step):
    for r in recs:
        v = value_by_step(r.step, r.metrics[key])
        if v is not None:
            r.metrics[key] = v
    return recs


# One planted event per detector. Each begins before the cut where the detector has an episode
# to carry across it (so the restored state decides what follows) and fires after the cut.
SCENARIOS = {
    "nonfinite": lambda r: _nan_loss(r, set(range(585, 593)) | {600}),
    "loss_spike": lambda r: scale(r, "loss", lambda s: 2.5 if 588 <= s < 600 else 1.8 if s == 650 else 1.0),
    "stream_loss_spike": lambda r: scale(r, "loss/a", lambda s: 2.5 if 588 <= s < 620 else 1.0),
    "divergence": lambda r: scale(r, "loss", lambda s: math.exp(0.004 * (s - 560)) if s >= 560 else 1.0),
    "level_shift": lambda r: scale(r, "loss", lambda s: 1.25 if s >= 560 else 1.0),
    "sudden_drop": lambda r: scale(r, "loss", lambda s: 0.6 if s >= 588 else 1.0),
    "stall": lambda r: _set(_set(r, "loss", lambda s, v: 1.234 if s >= 589 else None), "grad_norm",
                            lambda s, v: 0.5 if s >= 589 else None),
    "grad_norm_spike": lambda r: scale(r, "grad_norm", lambda s: 8.0 if s == 540 or 589 <= s <= 592 or s == 600 else 1.0),
    "grad_norm_growth": lambda r: scale(r, "grad_norm", lambda s: math.exp((s - 450) / 200) if s >= 450 else 1.0),
    "param_norm_growth": lambda r: _set(r, "param_norm", lambda s, v: 100.0 * (1 + max(0, s - 420) / 300)),
    "second_moment_surge": lambda r: scale(r, "adam/exp_avg_sq_max", lambda s: 30.0 if 585 <= s <= 592 or s == 600 else 1.0),
    "overflow_burst": lambda r: _set(r, "skipped", lambda s, v: 1.0 if s in (585, 586, 587, 589, 590, 592, 593, 594,
                                                                            620, 621, 622) else None),
    "loss_scale_collapse": lambda r: _set(r, "loss_scale", lambda s, v: 2.0 ** _log2_scale(s)),
    "lr_anomaly": lambda r: scale(r, "lr", lambda s: 0.7 if s > CUT else 1.0),
    "resume_spike": lambda r: scale(_resume_at(r, 595), "loss", lambda s: 1.3 if 596 <= s < 606 else 1.0),
    "precursor": lambda r: scale(_with_update(r, d=lambda s: 3.0 if 587 <= s <= 600 else 1.0), "loss",
                                 lambda s: 1.8 if s == 595 else 1.0),   # the loss confirms the lead
    # the LR dropped to 0 at 587 (a scheduler bug) and the loss stays where it was: still 587-591
    "not_learning": lambda r: _set(_set(r, "lr", lambda s, v: 0.0 if s >= 587 else None), "loss",
                                   lambda s, v: 2.2 * (1 + 0.01 * (s % 3)) if s >= 587 else None),
    "data_repetition": lambda r: _set(_resume_at(r, 595), "batch_fingerprint",
                                      lambda s, v: float(s - 595) if s > 595 else None),
}


def _put(recs, key, value_of_step):
    for r in recs:
        r.metrics[key] = value_of_step(r.step)
    return recs


def _repeat_from(recs, step, period, decimals):
    """From ``step`` on, the loss (printed to ``decimals``) repeats the values of ``period`` points
    earlier: a frozen model on cycling batches."""
    for r in recs:
        r.metrics["loss"] = round(r.metrics["loss"], decimals)
        if r.step >= step:
            r.metrics["loss"] = recs[r.step - 1 - period].metrics["loss"]
    return recs


def _adam_from_physics(recs, grad_scale):
    """Adam's exp_avg_sq as Adam builds it (physics.adam_run), with beta2 and step in the record."""
    for r, a in zip(recs, adam_run(len(recs), warmup=50, grad_scale=grad_scale)):
        r.metrics.update({k: v for k, v in a.metrics.items() if k.startswith("adam/")})
    return recs


def _signed(recs):
    """An objective below zero from step 500 (RL-like), a 30-sigma jump at 600."""
    for r in recs:
        if r.step >= 500:
            r.metrics["loss"] = -0.01 * r.metrics["loss"] + (0.05 if r.step == 600 else 0.0)
    return recs


# More planted events, so that more state fields decide what follows the cut (each variant
# exercises fields the detector's main scenario leaves at their start values).
VARIANTS = {
    "stall:repeating": ("stall", lambda r: _repeat_from(r, 587, 8, 4)),
    "stall:after_a_spike": ("stall", lambda r: _set(_set(scale(r, "loss", lambda s: 1000.0 if s == 590 else 1.0), "loss",
                                                         lambda s, v: 1.234 if s >= 600 else None), "grad_norm",
                                                    lambda s, v: 0.5 if s >= 600 else None)),
    "loss_spike:onset": ("loss_spike", lambda r: scale(r, "loss", lambda s: 1.1 if s == 590 else 2.5 if s == 591 else 1.0)),
    "loss_spike:signed": ("loss_spike", _signed),
    "second_moment_surge:post_peak": ("second_moment_surge", lambda r: _put(_adam_from_physics(
        r, lambda s: 1.0 if s < 585 else 1.0 + (s - 585) / 10), "lr",   # a re-warmup 540-560: its risk window
        lambda s: 3e-4 * min(s / 50, 1.0) if s < 540 else 3e-4 * min((s - 539) / 20, 1.0))),
    "grad_norm_growth:every_point": ("grad_norm_growth", lambda r: scale(
        r, "grad_norm", lambda s: 1.3 ** (s - 584) if s >= 585 else 1.0)),
    "resume_spike:resumed_before": ("resume_spike", lambda r: scale(
        _resume_at(r, 585), "loss", lambda s: 1.3 if 592 <= s < 600 else 1.0)),
    "data_repetition:resumed_before": ("data_repetition", lambda r: _set(
        _resume_at(r, 585), "batch_fingerprint", lambda s, v: float(s - 585) if s > 592 else None)),
    "data_repetition:consumed": ("data_repetition", lambda r: _put(
        _resume_at(r, 585), "consumed_samples", lambda s: 8.0 * (s if s <= 590 else s - 300))),
}
CASES = {**{name: (name, fn) for name, fn in SCENARIOS.items()}, **VARIANTS}


def _spy(monitor, name):
    """Record the findings of detector ``name`` as it returns them."""
    det = next(d for d in monitor.detectors if d.name == name)
    seen, update = [], det.update

    def spied(record, ctx):
        found = update(record, ctx)
        seen.extend(found)
        return found
    det.update = spied
    return seen


@pytest.mark.parametrize("case", sorted(CASES))
def test_state_round_trip_mid_episode_gives_identical_nonempty_findings(case):
    name, plant = CASES[case]
    recs = plant(_base_stream())
    a = Monitor()
    for r in recs[:CUT]:
        a.update(r)
    state = json.loads(json.dumps(a.state_dict()))
    b = Monitor()
    b.load_state_dict(state)
    own_a, own_b = _spy(a, name), _spy(b, name)
    rest_a = [f.to_json() for r in recs[CUT:] for f in a.update(r)]
    rest_b = [f.to_json() for r in recs[CUT:] for f in b.update(r)]
    assert [f.to_json() for f in own_a] != []
    assert [f.to_json() for f in own_a] == [f.to_json() for f in own_b]
    assert rest_a == rest_b
    assert len(json.dumps(state)) < 200_000


@pytest.mark.parametrize("name", sorted(DETECTORS))
def test_kinds_are_known_and_update_never_mutates_its_input(name):
    cls = DETECTORS[name]
    assert cls.kinds and set(cls.kinds) <= set(KINDS)
    recs = SCENARIOS[name](_base_stream())
    before = [(r.step, dict(r.metrics), r.segment) for r in recs]
    m = Monitor()
    own = _spy(m, name)
    for r in recs:
        m.update(r)
    assert own and {f.kind for f in own} <= set(cls.kinds)
    assert [(r.step, r.metrics, r.segment) for r in recs] == before


@pytest.mark.parametrize("name", sorted(DETECTORS))
def test_odd_values_never_raise(name):
    det = DETECTORS[name]()
    odd = [None, math.nan, math.inf, -math.inf, 0.0, -1.0, 1e300, 1e-300]
    for i, v in enumerate(odd * 3, 1):
        m = {k: v for k in ("loss", "grad_norm", "lr", "loss_scale", "skipped", "adam/exp_avg_sq_max",
                            "adam/exp_avg_sq_l1", "adam/exp_avg_sq_numel", "param_norm",
                            "batch_fingerprint", "update_norm", "adam/exp_avg_norm", "adam/beta1", "adam/step",
                            "layers/lower/update_ratio", "layers/upper/update_ratio", "layers/top1/tensor",
                            "layers/top1/update_ratio") if v is not None}
        det.update(StepRecord(i, m), Context(i))


@pytest.mark.parametrize("name", sorted(DETECTORS))
def test_bad_constructor_values_name_the_key(name):
    import inspect
    params = [p for p, v in inspect.signature(DETECTORS[name].__init__).parameters.items()
              if v.kind == inspect.Parameter.KEYWORD_ONLY and isinstance(v.default, (int, float))
              and not isinstance(v.default, bool)]
    for p in params:
        with pytest.raises(ValueError, match=p):
            DETECTORS[name](**{p: -1})


def test_state_load_is_strict():
    m = Monitor()
    state = m.state_dict()
    other = Monitor({"detectors": {"stall": False}})
    with pytest.raises(ValueError, match="detectors"):
        other.load_state_dict(state)
    state["detectors"]["loss_spike"]["extra"] = 1
    with pytest.raises(ValueError, match="loss_spike"):
        m.load_state_dict(state)


def test_big_spike_right_after_a_fast_early_fall():
    # the loss falls 10x in 30 steps (a wide noise estimate), then jumps 16x at step 40
    recs = [StepRecord(s, {"loss": (0.55 + 9.5 * math.exp(-s / 6)) * (16.0 if s == 40 else 1.0)})
            for s in range(1, 60)]
    assert kinds(run(recs)) == [(40, "loss_spike", "warning"), (41, "spike_recovered", "info")]


def test_a_failing_detector_is_logged_once_and_switched_off(caplog):
    m = Monitor()
    stall = next(d for d in m.detectors if d.name == "stall")

    def broken(record, ctx):
        raise RuntimeError("boom")
    stall.update = broken
    recs = scale(healthy(400), "loss", lambda s: 2.0 if s == 300 else 1.0)
    with caplog.at_level("ERROR", logger="stability_callbacks"):
        found = [f for r in recs for f in m.update(r)]
    assert kinds(found) == [(300, "loss_spike", "info"), (301, "spike_recovered", "info")]
    errors = [r for r in caplog.records if "detector stall failed" in r.getMessage()]
    assert len(errors) == 1 and "is now off" in errors[0].getMessage()


def test_data_repetition_from_consumed_samples_going_back():
    recs = healthy(400)
    for r in recs:
        r.metrics["consumed_samples"] = 8.0 * r.step
    m, found = resumed_from(recs)
    for r in recs[300:310]:
        r.metrics["consumed_samples"] = 8.0 * (r.step - 300)   # the loader started from scratch
        found += m.update(r)
    rep = [(f.step, f.details["rule"], f.value, f.baseline) for f in found if f.kind == "data_repetition"]
    assert rep == [(301, "consumed_samples", 8.0, 2400.0)]
    # a correct resume continues the count: nothing
    recs = healthy(400)
    for r in recs:
        r.metrics["consumed_samples"] = 8.0 * r.step
    m, ok = resumed_from(recs)
    ok += [f for r in recs[300:] for f in m.update(r)]
    assert [(f.step, f.kind) for f in ok] == [(300, "resume")]


def test_a_rollback_in_a_replayed_log_is_not_data_repetition():
    recs = healthy(400)
    for r in recs:
        r.metrics["consumed_samples"] = 8.0 * r.step
    m = Monitor()
    found = [f for r in recs[:300] for f in m.update(r)]
    found += [f for r in recs[200:] for f in m.update(r)]   # steps go back: a rollback to 200
    assert [(f.step, f.kind, f.details.get("reason")) for f in found] == [
        (50, "warmup_end", None), (200, "resume", "rollback")]


def test_stream_spikes_start_from_the_loss_spike_settings():
    def stream_kwargs(cfg):
        return next(d for d in Monitor(cfg).detectors if d.name == "stream_loss_spike").loss_spike_kwargs
    assert stream_kwargs(None) == {}
    assert stream_kwargs({"detectors": {"loss_spike": {"horizon_steps": 50, "signal": "loss"}}}) == {"horizon_steps": 50}
    assert stream_kwargs({"detectors": {"loss_spike": {"horizon_steps": 50, "min_rise": 0.2},
                                        "stream_loss_spike": {"horizon_steps": 70}}}) == {"horizon_steps": 70, "min_rise": 0.2}
    with pytest.raises(ValueError, match="stream_loss_spike.horizon_steps"):
        Monitor({"detectors": {"stream_loss_spike": {"horizon_steps": 0}}})


def test_rollback_advice_names_the_checkpoint_in_one_plain_sentence():
    m = Monitor()
    recs = healthy(300)
    for r in recs[:150]:
        m.update(r)
    m.note_checkpoint(100, "out/checkpoint-100")
    recs[200].metrics["loss"] = math.nan
    advice = [f for r in recs[150:] for f in m.update(r) if f.kind == "rollback_advice"]
    assert [f.step for f in advice] == [201]
    assert "Resume from the checkpoint of step 100 (out/checkpoint-100) and skip the batches of steps 201-201" in advice[0].message


def test_default_yaml_lists_every_detector_key_at_its_default():
    import inspect

    import yaml

    from stability_callbacks.config import PRESETS_DIR
    shown = yaml.safe_load((PRESETS_DIR / "default.yaml").read_text())["detectors"]
    assert list(shown) == list(DETECTORS)
    for name, cls in DETECTORS.items():
        if name == "stream_loss_spike":   # loss_spike's keys, unless configured apart
            assert shown[name] == {}
            continue
        defaults = {k: p.default for k, p in inspect.signature(cls.__init__).parameters.items()
                    if p.kind == p.KEYWORD_ONLY}
        assert shown[name] == defaults, name


def _with_update(recs, d=lambda s: 1.0, mom=lambda s: 1.0, seed=1):
    """Adam's update norm and first moment as the probe reports them: ``update_norm = lr x d``
    (d: the direction's norm, ~40 with 3% noise, times ``d(step)``) and the raw ``exp_avg`` norm,
    an EMA from 0 (beta1 = 0.9) of a mean gradient ~0.2 (times ``mom(step)``)."""
    import random
    rng = random.Random(seed)
    for r in recs:
        s = r.step
        r.metrics.update({"update_norm": r.metrics["lr"] * 40.0 * d(s) * math.exp(rng.gauss(0, 0.03)),
                          "adam/exp_avg_norm": 0.2 * mom(s) * math.exp(rng.gauss(0, 0.03)) * (1 - 0.9 ** s),
                          "adam/beta1": 0.9, "adam/step": float(s)})
    return recs


def test_precursor_leads_the_loss_spike_and_sets_its_onset():
    # the warmup's rising LR (steps 1-50) raises the update norm by design: quiet
    assert kinds(run(_with_update(healthy(600, adam=True)))) == []
    # the update's direction doubles at 300 (the LR unchanged), the loss jumps 4 steps later
    recs = scale(_with_update(healthy(600, adam=True), d=lambda s: 2.5 if 300 <= s <= 306 else 1.0),
                 "loss", lambda s: 1.8 if s == 304 else 1.0)
    found = run(recs)
    # the precursor earns its warning when the loss follows (within confirm_steps)
    assert kinds(found) == [(300, "precursor", "info"), (304, "loss_spike", "info"), (304, "precursor", "warning"),
                            (305, "spike_recovered", "info")]
    pre, spike, confirmed = [f for f in found if f.kind in ("precursor", "loss_spike")]
    assert pre.details["rule"] == "update" and pre.details["ratio"] == pytest.approx(2.5, rel=0.1)
    assert spike.onset_step == 300 and spike.details["spike_onset_step"] == 304
    assert "Adam's update norm rose 2." in spike.message and "at step 300, 4 steps before the loss" in spike.message
    assert (confirmed.onset_step, confirmed.details["confirmed_by"]) == (300, "loss_spike")
    assert "then loss_spike at step 304, 4 steps later" in confirmed.message
    # the update stays 2.5x for 10 steps and nothing follows: info only, however long
    recs = _with_update(healthy(600, adam=True), d=lambda s: 2.5 if 300 <= s < 310 else 1.0)
    assert kinds(run(recs)) == [(300, "precursor", "info")]
    # nor does a spike 21 steps later confirm it (beyond confirm_steps)
    recs = scale(_with_update(healthy(600, adam=True), d=lambda s: 2.5 if 300 <= s <= 306 else 1.0),
                 "loss", lambda s: 1.8 if s == 321 else 1.0)
    assert [(f.step, f.severity) for f in run(recs) if f.kind == "precursor"] == [(300, "info")]


def test_precursor_first_moment_lr_burst_and_layers():
    # the first moment doubles while the direction's norm does not: Marin's "first moment 2x"
    recs = _with_update(healthy(600, adam=True), mom=lambda s: 3.0 if 300 <= s <= 302 else 1.0)
    found = [f for f in run(recs) if f.kind == "precursor"]
    assert [(f.step, f.details["rule"]) for f in found] == [(300, "first_moment")]
    # an LR burst x3 at 400 (below lr_anomaly's 10x): the update norm follows the LR
    recs = _with_update(scale(healthy(600, adam=True), "lr", lambda s: 3.0 if 400 <= s <= 402 else 1.0))
    found = [f for f in run(recs) if f.kind == "precursor"]
    assert [(f.step, f.details["rule"]) for f in found] == [(400, "update")]
    assert "the LR itself 3.0x what it was at the sample before" in found[0].message
    # the lower half of the tensors at 2.4x their history while the upper stay: the split;
    # one tensor at 6x and 5x the others: the layer rule
    recs = _with_update(healthy(600, adam=True))
    for r in recs:
        r.metrics.update({"layers/lower/update_ratio": 2.4 if r.step == 300 else 1.0,
                          "layers/upper/update_ratio": 1.0,
                          "layers/top1/tensor": 3.0, "layers/top1/update_ratio": 6.0 if r.step == 450 else 1.2,
                          "layers/top1/exp_avg_ratio": 5.5 if r.step == 450 else 1.1,
                          "layers/top1/exp_avg_sq_ratio": 1.0})
    found = [f for f in run(recs) if f.kind == "precursor"]
    assert [(f.step, f.details["rule"], f.severity) for f in found] == [(300, "split", "info"), (450, "layer", "info")]
    assert "the update norm of the lower layers rose 2.4x" in found[0].message
    assert "parameter tensor #3 (in the optimizer's order)" in found[1].message
    assert "its first moment 5.5x, its second moment 1.0x" in found[1].message
    assert "tensor_name" not in found[1].details   # a log replayed: no names
    # a live run names its tensors: the finding says which layer moved
    named = [f for f in run(recs, tensor_names=["wte", "wpe", "h.0.attn.weight", "h.0.mlp.c_fc.weight"])
             if f.kind == "precursor"]
    assert ("the update of h.0.mlp.c_fc.weight (parameter tensor #3 in the optimizer's order) rose 6.0x"
            in named[1].message)
    assert named[1].details["tensor_name"] == "h.0.mlp.c_fc.weight"


def test_precursor_is_part_of_the_warmup_end_signature():
    # warmup ends at 50; the update doubles at 80, the loss jumps at 84 and stays up: the 104B pattern
    recs = scale(_with_update(healthy(600, adam=True), d=lambda s: 2.5 if 80 <= s <= 83 else 1.0),
                 "loss", lambda s: 1.8 if 84 <= s <= 86 else 1.0)
    found = run(recs)
    assert [(f.step, f.kind, f.severity, f.onset_step) for f in found if f.kind != "warmup_end"][:5] == [
        (80, "precursor", "info", 80), (84, "loss_spike", "info", 80), (84, "precursor", "warning", 80),
        (86, "loss_spike", "warning", 80), (86, "warmup_instability", "critical", 80)]
    esc = next(f for f in found if f.kind == "warmup_instability")
    assert (esc.details["precursors"], esc.details["spike_onset_step"]) == (["update"], 84)
    assert ("precursor signature (Adam's update or first moment rose first) before its onset at step 84" in esc.message
            and "Roll back to a checkpoint before step 80" in esc.message)


def test_a_grad_norm_jump_no_higher_than_its_own_earlier_ones_is_its_tail():
    # a heavy-tailed grad norm (a mixture density's likelihood gradients): jumps of 100x and more
    # that came back with the loss unmoved; the first two warn, a later one no higher than them,
    # past the repeat window, is info said as the run's own tail; a higher one warns again
    from stability_callbacks.detectors import GradNormSpike
    d = GradNormSpike()
    jumps = {100: 300.0, 400: 500.0, 700: 400.0, 1000: 2000.0}
    got = [(f.step, f.severity, f.details.get("seen_before"))
           for s in range(1, 1101)
           for f in d.update(StepRecord(s, {"grad_norm": jumps.get(s, 1.0 + 0.05 * (s % 5))}), Context(s))]
    assert got == [(100, "warning", None), (400, "warning", None), (700, "info", 2), (1000, "warning", None)]
    assert json.loads(json.dumps(d.state_dict())) == d.state_dict()


def test_a_signed_loss_that_starts_at_exactly_zero_is_judged_without_failing():
    # a GRPO loss: exactly 0 on its first steps, then small values of either sign (before: the
    # loss spike detector divided by a noise of 0 and went off at the first non-zero point)
    from stability_callbacks.detectors import LossSpike
    d = LossSpike()
    d.declare_objective()
    values = [0.0] * 5 + [(-1) ** s * 1e-4 * (1 + s % 3) for s in range(60)]
    got = [f.kind for s, x in enumerate(values, 1) for f in d.update(StepRecord(s, {"loss": x}), Context(s))]
    assert got == []


def test_degenerate_streams_turn_no_detector_off():
    # zeros, constants, 1e-300 and 1e300, infinities and NaNs in every signal, one at a time or in
    # batches, declared objectives and games: a detector that raises is turned off (said loudly),
    # so none may (before: loss_spike divided by a noise of 0, stall took the log of 0, and
    # grad_norm_spike overflowed e^f)
    import random
    from stability_callbacks.monitor import Monitor
    rng = random.Random(5)
    special = [0.0, 1e-300, 1e300, -1e300, math.inf, -math.inf, math.nan, 1.0, -1.0, 5e-324, 1e-8]

    def value(key):
        if rng.random() < 0.15:
            return rng.choice(special)
        return {"loss": lambda: rng.choice([0.0, rng.gauss(0, 1), abs(rng.gauss(2, 0.5)), rng.expovariate(1) * 1e-4]),
                "lr": lambda: rng.choice([0.0, 1e-3]), "loss_scale": lambda: 2.0 ** rng.randint(-2, 16),
                "skipped": lambda: rng.choice([0.0, 1.0])}.get(key, lambda: abs(rng.gauss(1, 2)))()

    for _ in range(80):
        m = Monitor()
        [m.declare_objective, m.declare_game, lambda: None][rng.randrange(3)]()
        shape = rng.choice([["loss"], ["loss", "grad_norm"], ["loss", "grad_norm", "lr", "loss_scale", "skipped"],
                            ["grad_norm"], ["loss_scale", "skipped"]])
        records = [StepRecord(s, {k: value(k) for k in shape}) for s in range(1, rng.randint(5, 300))]
        if rng.random() < 0.5:
            m.update_many(records)
        else:
            for r in records:
                m.update(r)
        m.end()
        assert not m._broken, (shape, m._broken)


def _dead_relu_run(with_grad_norm: bool) -> list[StepRecord]:
    # an LR far too high in the warmup: spikes, then every ReLU dead, the loss flat at ln 10 and
    # the grad norm ~1e-9 (the live held-out class: before, nothing beyond the spikes' info)
    import random
    rng = random.Random(3)
    out = []
    for s in range(1, 401):
        if s < 25:
            loss, g = 2.30 + rng.gauss(0, 0.02), 1 + rng.random()
        elif s < 35:
            loss, g = [8.0, 30.0, 15.0, 4.0, 2.4, 60.0, 5.0, 2.35, 2.31, 2.31][s - 25], 50 + rng.random() * 100
        else:
            loss, g = 2.3026 + rng.gauss(0, 0.002), 1e-9 * rng.random()
        m = {"loss": loss, "lr": 0.5 * min(1, s / 40)}
        if with_grad_norm:
            m["grad_norm"] = g
        out.append(StepRecord(s, m))
    return out


@pytest.mark.parametrize("with_grad_norm, step, rule", [(True, 47, "still"), (False, 93, "flat")])
def test_a_run_whose_units_a_warmup_spike_killed_is_not_learning(with_grad_norm, step, rule):
    # the spike's points are no level of the loss (it made the run look as if it had learned), and a
    # grad norm a millionth of its peak moves nothing
    from stability_callbacks.monitor import Monitor
    found = [f for f in Monitor().update_many(_dead_relu_run(with_grad_norm)) if f.kind == "not_learning"]
    assert [(f.step, f.severity, f.details["rule"]) for f in found] == [(step, "warning", rule)]


def test_an_epochs_mean_printed_the_same_epoch_after_epoch_is_a_stall():
    # a short whole run collapsed to the majority class after its first epoch: its mean over the same
    # data is then 0.6931 every epoch; an epoch's mean moves by 0.5% at least while a model trains,
    # so 4 in a row are no chance (before: no stall, and a hedge that blamed noise); a converging
    # run's one repeat is nothing
    from stability_callbacks.detectors import Stall
    for values, want in (([0.9213] + [0.6931] * 5, [5]), ([0.3457, 0.3421, 0.3398, 0.3398, 0.3371], [])):
        d = Stall()
        got = [f for e, v in enumerate(values, 1) for f in d.update(StepRecord(e, {"loss": v}), Context(e, steps_are_epochs=True))]
        assert [f.step for f in got] == want
        assert all("between epochs, each a pass over the data" in f.message for f in got)


def test_a_grad_norm_back_to_its_scale_after_a_huge_spike_is_no_dead_one():
    # a diverging run: the grad norm 1e30 for 10 points, then ~1 again, the loss up x25: no "every
    # unit dead" (before: its level was its peak, 1e30, and a grad norm of 1 a millionth of it)
    import random
    from stability_callbacks.monitor import Monitor
    rng = random.Random(1)
    recs = [StepRecord(s, {"loss": 2.3 - 0.002 * s if s < 100 else 50 + rng.random(), "lr": 1e-3,
                           "grad_norm": 1e30 if 100 <= s < 110 else 1 + rng.random()}) for s in range(1, 300)]
    assert [f for f in Monitor().update_many(recs) if f.kind == "not_learning"] == []


def test_a_loss_that_starts_at_zero_and_falls_to_its_floor_is_no_runaway():
    # SimSiam's negative cosine similarity: ~-0.005 +- 0.003 through a 50-step warmup, then down to
    # its floor near -0.9 (before: 11x the largest magnitude of its first points, a critical
    # "falling without bound" and a rollback on a healthy run); a Gaussian NLL that starts at 1.4
    # and falls to -30 is still one
    import random
    from stability_callbacks.monitor import Monitor
    rng = random.Random(2)
    simsiam = [StepRecord(s, {"loss": -0.005 - 0.9 * (1 - math.exp(-max(0, s - 30) / 30)) + rng.gauss(0, 0.003),
                              "lr": 0.05 * min(1, s / 50)}) for s in range(1, 301)]
    assert [f for f in Monitor().update_many(simsiam) if f.severity != "info"] == []
    nll = [StepRecord(s, {"loss": 1.4 - 0.15 * s + rng.gauss(0, 0.02)}) for s in range(1, 220)]
    found = [(f.kind, f.details.get("rule")) for f in Monitor().update_many(nll) if f.severity == "critical"]
    assert ("divergence", "runaway") in found


def test_an_lr_dropped_to_zero_under_a_loss_below_zero_is_not_learning():
    # an SGD run whose schedule, mis-set, drops the LR to exactly 0 at step 100, its loss (an
    # objective below zero) flat since (before: nothing: a loss of any sign skipped every rule); a
    # schedule that decays to 0 at its end is no bug
    import random
    from stability_callbacks.monitor import Monitor
    rng = random.Random(4)
    dropped = [StepRecord(s, {"loss": (-1.0 - 0.01 * s if s < 100 else -2.0) + rng.gauss(0, 0.05),
                              "lr": 0.01 * min(1, s / 20) if s < 100 else 0.0}) for s in range(1, 201)]
    found = [f for f in Monitor().update_many(dropped) if f.kind == "not_learning"]
    assert [(f.step, f.severity, f.details["rule"]) for f in found] == [(104, "warning", "still")]
    assert "(-1.997 on average, -1.98 the point before)" in found[0].message
    decayed = [StepRecord(s, {"loss": -1.0 - 0.01 * s + rng.gauss(0, 0.05),
                              "lr": 0.01 * min(1, s / 20) * max(0.0, 1 - s / 200)}) for s in range(1, 201)]
    assert [f for f in Monitor().update_many(decayed) if f.kind == "not_learning"] == []


def test_a_precursor_is_not_confirmed_by_a_hard_batch_near_the_loss_floor():
    # a healthy classifier near zero loss: an output bias's update rises, then a blip measured
    # against the loss's floor (a hard batch, said so): no warning (before: paired into one); a
    # loss spike of its own still confirms it
    from stability_callbacks.detectors import Precursor
    from stability_callbacks.record import Finding
    for details, want in (({"floor": 1e-3}, []), ({"near_floor": True}, []), ({}, ["warning"])):
        d = Precursor()
        d.pending = [300, "update_norm", 2.5, 1.0, 2.0, "update", 2.5, "Adam's update norm rose 2.5x"]
        ctx = Context(304, loss_spike_open=True)
        ctx.found = [Finding(304, "loss_spike" if "floor" in details or not details else "grad_norm_spike", "info",
                             "a blip", details=details)]
        assert [f.severity for f in d._confirm(304, ctx)] == want


def test_a_second_moment_jump_that_a_grad_norm_jump_explains_is_its_echo():
    # an unclipped recurrent autoencoder's early gradient blip of 80x: Adam's exp_avg_sq mean, an
    # EMA of g² (beta2 0.999), rises 7.4x with it (before: a warning, no surge of its own); the same
    # rise with no grad-norm jump before it still warns
    from stability_callbacks.detectors import SecondMomentSurge
    from stability_callbacks.record import Finding
    for blip, want in ((80.0, "info"), (None, "warning")):
        d, v, found = SecondMomentSurge(), 1e-4, []
        for s in range(1, 80):
            v = 0.999 * v + 0.001 * ((80.0 ** 2 if s == 60 else 1.0) * 1e-4)
            ctx = Context(s)
            if s == 60 and blip:
                ctx.found = [Finding(60, "grad_norm_spike", "info", "a blip", details={"ratio": blip})]
            c = 1 - 0.999 ** s
            found += d.update(StepRecord(s, {"adam/exp_avg_sq_l1": v * c * 1000, "adam/exp_avg_sq_numel": 1000.0,
                                             "adam/beta2": 0.999, "adam/step": float(s)}), ctx)
        assert [(f.step, f.details["rule"], f.severity) for f in found] == [(60, "jump", want)]
        assert ("echo of the grad-norm jump at step 60 (80x)" in found[0].message) == (blip is not None)


def test_a_nan_in_a_log_numbered_by_epochs_speaks_of_epochs():
    # (before: "at step 7 .. skip this step's batch" on a Keras log whose steps are its epochs)
    from stability_callbacks.detectors import NonFinite
    d = NonFinite()
    found = [f for e, x in ((6, 0.5), (7, math.nan))
             for f in d.update(StepRecord(e, {"loss": x}), Context(e, steps_are_epochs=True, run_start=1))]
    assert [f.step for f in found] == [7] and found[0].message.startswith("Non-finite values at epoch 7: loss=nan.")
    assert "before this epoch and skip the batches since" in found[0].message
