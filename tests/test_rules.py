"""Rules that follow from how the numbers are produced (issue 16): Adam's zero-initialised
second moment, on a real tiny run and on the synthetic physics of tests/physics.py."""
import pytest
from physics import adam_run

from stability_callbacks import Monitor, StepRecord


def run(records, config=None):
    m = Monitor(config)
    return [f for r in records for f in m.update(r)]


def found(findings):
    return [(f.step, f.kind, f.severity) for f in findings if f.kind != "warmup_end"]


# -- Adam's second moment: judged bias-corrected ---------------------------------------------------
RISING = dict(grad_scale=lambda s: 1.0 if s <= 20 else min(1 + (s - 20) / 40, 3.0))


def test_a_real_tiny_adamw_run_fills_exp_avg_sq_and_stays_quiet():
    """AdamW, 20-step warmup to LR 3e-3 (the healthy Lightning run of issue 16): the raw
    exp_avg_sq more than doubles between steps 21 and 60 while nothing is wrong."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    w = torch.randn(16, 1)
    with_keys, without = [], []
    for step in range(1, 201):
        lr = 3e-3 * min(step / 20, 1.0)
        for group in opt.param_groups:
            group["lr"] = lr
        x = torch.randn(32, 16)
        loss = torch.nn.functional.mse_loss(model(x), torch.sin(x @ w))
        opt.zero_grad()
        loss.backward()
        opt.step()
        v = [opt.state[p]["exp_avg_sq"] for p in model.parameters()]
        m = {"loss": loss.item(), "lr": lr, "adam/exp_avg_sq_max": max(float(t.max()) for t in v),
             "adam/exp_avg_sq_l1": sum(float(t.sum()) for t in v), "adam/exp_avg_sq_numel": 1153.0}
        without.append(StepRecord(step, dict(m)))
        with_keys.append(StepRecord(step, {**m, "adam/beta2": opt.param_groups[0]["betas"][1],
                                           "adam/step": float(opt.state[model[0].weight]["step"])}))
    assert with_keys[59].metrics["adam/exp_avg_sq_l1"] > 2 * with_keys[20].metrics["adam/exp_avg_sq_l1"]
    assert [f.kind for f in run(with_keys) if f.kind in ("second_moment_surge", "warmup_instability")] == []
    assert [f.kind for f in run(without) if f.kind in ("second_moment_surge", "warmup_instability")] == []


@pytest.mark.parametrize("keys", [True, False], ids=["beta2-and-step", "assumed"])
def test_the_fill_up_of_a_healthy_run_is_not_a_surge(keys):
    recs = adam_run(400, keys=keys)
    l1 = [r.metrics["adam/exp_avg_sq_l1"] for r in recs]
    assert l1[39] / l1[20] > 1.9 and l1[399] / l1[20] > 6   # raw: still filling up
    assert found(run(recs)) == []


def test_gradients_growing_after_warmup_are_caught():
    assert found(run(adam_run(400, **RISING))) == [(60, "second_moment_surge", "warning"),
                                                   (60, "warmup_instability", "critical")]
    # beta2 = 0.95 fills up in ~20 steps: known from the record, the rise shows earlier
    assert found(run(adam_run(400, beta2=0.95, **RISING))) == [(48, "second_moment_surge", "warning"),
                                                               (48, "warmup_instability", "critical")]


def test_a_gradient_spike_is_one_jump_not_also_a_post_peak_rise():
    found_ = run(adam_run(400, spike_at=300))
    assert [(f.step, f.kind, f.details.get("rule")) for f in found_ if f.kind != "warmup_end"] == [
        (300, "second_moment_surge", "jump")]
    assert "bias-corrected" in found_[-1].message
