"""Skip step (``policy.skip_step_on``): the policy's rule and findings, the device-side gate, and
real HF / Lightning runs whose skipped step leaves the optimizer exactly as if it never happened.

The DeepSpeed paths (its overflow path at ZeRO 1-3, 2 ranks) run in ``tests/dist/ds_scenarios.py``
(``test_deepspeed.py``).
"""
from __future__ import annotations

import json
import math

import pytest

from stability_callbacks import Monitor, StepRecord
from stability_callbacks.config import ConfigError, load_config

NAN = float("nan")


def _monitor(**policy) -> Monitor:
    return Monitor({"actions": {}, "phase": {"warmup_steps": 5}, "policy": policy})


def _feed(m: Monitor, steps, skipped=(), grad=None, loss=None):
    """Records with a steady loss and grad norm; ``skipped`` steps carry the integration's flag."""
    out = []
    for s in steps:
        met = {"loss": 3.0 - s / 100 if loss is None else loss(s),
               "grad_norm": 1.0 + 0.05 * (s % 3) if grad is None else grad(s), "lr": 1e-3}
        if s in skipped:
            met["skipped_by_policy"] = 1.0
        out += m.update(StepRecord(s, met))
        m.control.step_done()
    return out


# ------------------------------------------------------------------------------ the policy
def test_the_rule_is_a_multiple_of_the_grad_norm_baseline_once_it_is_warm():
    m = _monitor(skip_step_on="grad_outlier", skip_grad_ratio=8.0)
    gns = m._grad_norm_spike
    _feed(m, range(1, 21))
    # 20 points: the baseline is warm, but the first 20 steps are start-up: non-finite only.
    assert gns.base.n == 20 and m.control.skip_threshold == math.inf
    _feed(m, [21])
    assert m.control.skip_threshold == pytest.approx(8.0 * gns.base.baseline, rel=1e-12)
    assert 8.0 < m.control.skip_threshold < 9.0
    # nonfinite: never above inf; never: no rule at all.
    m2 = _monitor(skip_step_on="nonfinite")
    _feed(m2, range(1, 30))
    assert m2.control.skip_threshold == math.inf
    m3 = _monitor()
    _feed(m3, range(1, 30))
    assert m3.control.skip_threshold is None


def test_a_skipped_nan_step_is_a_warning_not_damage():
    m = _monitor(skip_step_on="nonfinite", halt_on="critical")
    found = _feed(m, range(1, 40), skipped={30},
                  grad=lambda s: NAN if s == 30 else 1.0, loss=lambda s: NAN if s == 30 else 2.0)
    kinds = [(f.step, f.kind, f.severity) for f in found if f.kind != "warmup_end"]
    assert kinds == [(30, "nonfinite", "info"), (30, "step_skipped", "warning")]
    skip = next(f for f in found if f.kind == "step_skipped")
    assert skip.message == (
        "Step 30 was not applied (policy.skip_step_on = nonfinite): its grad norm was nan (loss nan). "
        "Adam's moments and step count are untouched; the step's batch is dropped. An isolated skip is "
        "harmless; 3 within 100 steps escalate to critical (1 so far).")
    nonfinite = next(f for f in found if f.kind == "nonfinite")
    assert nonfinite.details["skipped_by_policy"] is True
    assert nonfinite.message.startswith("(Not applied: policy.skip_step_on skipped this step.) Non-finite")
    c = m.control
    assert c.state_is_good and not c.stop and c.rollback is None and not c.save_now


def test_an_outlier_skip_names_the_norm_the_baseline_and_the_threshold():
    m = _monitor(skip_step_on="grad_outlier")
    _feed(m, range(1, 30))
    applied = m.control.skip_threshold
    found = _feed(m, [30], skipped={30}, grad=lambda s: 50.0)
    skip = next(f for f in found if f.kind == "step_skipped")
    base = applied / 10
    assert (skip.severity, skip.value, skip.baseline, skip.threshold) == ("warning", 50.0, base, applied)
    assert f"its grad norm 50 was {50 / base:.1f}x the grad-norm baseline" in skip.message
    assert "(skipped above 10x = 10." in skip.message
    # The grad-norm detector still reports the spike itself (detect), the policy the skip (act).
    assert [f.kind for f in found] == ["grad_norm_spike", "step_skipped"]


def test_repeated_skips_escalate_once_per_burst_and_block_saves():
    m = _monitor(skip_step_on="nonfinite", halt_on="critical", skip_escalate_count=3,
                 skip_window_steps=10)
    for s in (10, 20):
        m.note_checkpoint(s, f"ckpt/{s}")
    skipped = {24, 27, 29, 31}
    found = _feed(m, range(1, 32), skipped=skipped, grad=lambda s: NAN if s in skipped else 1.0)
    skips = [(f.step, f.severity, f.onset_step) for f in found if f.kind == "step_skipped"]
    # The 3rd skip within 10 steps is critical (onset: the first); the 4th is a warning again.
    assert skips == [(24, "warning", 24), (27, "warning", 27), (29, "critical", 24), (31, "warning", 31)]
    critical = next(f for f in found if f.kind == "step_skipped" and f.severity == "critical")
    assert critical.message.endswith(
        "That is 3 skips since step 24 (within 10 steps): the weights or the data stream are going "
        "bad. Roll back to the last checkpoint before step 24 and skip the data since.")
    c = m.control
    assert c.stop and not c.state_is_good   # escalated skips: damage, a halt with advice
    assert c.rollback.details["checkpoint_step"] == 20 and c.rollback.details["skip_steps"] == [24, 29]
    assert c.stop_reason == "step_skipped (critical) at step 29; policy.halt_on = critical"


@pytest.mark.parametrize("policy, message", [
    ({"skip_step_on": "always"},
     "policy.skip_step_on must be one of ('never', 'nonfinite', 'grad_outlier'), got 'always'"),
    ({"skip_grad_ratio": 1}, "policy.skip_grad_ratio must be a number > 1, got 1"),
    ({"skip_escalate_count": 0}, "policy.skip_escalate_count must be a positive integer, got 0"),
])
def test_bad_skip_keys_name_key_and_value(policy, message):
    with pytest.raises(ConfigError) as e:
        load_config({"policy": policy})
    assert str(e.value) == message


def test_grad_outlier_needs_the_grad_norm_detector():
    with pytest.raises(ValueError, match="grad_outlier needs detectors.grad_norm_spike"):
        Monitor({"policy": {"skip_step_on": "grad_outlier"}, "detectors": {"grad_norm_spike": False}})


# ------------------------------------------------------------------------- the device side
torch = pytest.importorskip("torch")

from stability_callbacks.integrations.torch.skip_step import GatedStep, SkipStep  # noqa: E402


def _model_and_grads(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Linear(8, 4)
    model(torch.randn(16, 8)).pow(2).mean().backward()
    return model


def _snapshot(model, opt):
    return ([p.detach().clone() for p in model.parameters()],
            {k: {n: v.clone() for n, v in st.items()} for k, st in enumerate(opt.state.values())})


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "foreach"])
def test_a_skipped_step_leaves_params_moments_and_step_count_bit_exact(fused):
    model = _model_and_grads()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, fused=fused, foreach=None if fused else True)
    skip = SkipStep()
    gate = GatedStep(opt, skip=skip)
    assert gate.fused is fused
    opt.step()                                   # no decision this step: a plain step
    before = _snapshot(model, opt)
    norm = torch.nn.utils.get_total_norm([p.grad for p in model.parameters()])
    skip.set_threshold(float(norm) / 2)          # this norm is an "outlier"
    assert float(skip.decide(norm)) == 1.0
    opt.step()
    after = _snapshot(model, opt)
    assert all(torch.equal(a, b) for a, b in zip(before[0], after[0]))
    assert all(torch.equal(before[1][k][n], after[1][k][n]) for k in before[1] for n in before[1][k])
    assert "found_inf" not in vars(opt)          # the flag never outlives the call
    skip.report(_Probe())                        # the step is over: the next one decides anew
    skip.set_threshold(math.inf)
    assert float(skip.decide(norm)) == 0.0
    opt.step()
    assert next(iter(opt.state.values()))["step"] == 2.0
    gate.close()
    assert "step" not in vars(opt)


class _Probe:
    def __init__(self):
        self.extras = {}

    def set_extra(self, name, value, op=None):
        self.extras[name] = (float(value), op)

    def set_grad_norm(self, value):
        self.norm = value


def test_the_flag_reaches_the_record_and_a_non_finite_norm_is_skipped_at_any_threshold():
    skip, probe = SkipStep(), _Probe()
    assert float(skip.decide(torch.tensor(NAN))) == 1.0 and float(skip.decide(torch.tensor(math.inf))) == 1.0
    skip.report(probe)
    assert probe.extras == {"skipped_by_policy": (1.0, "max")} and skip.flag is None
    assert skip.decide(2.5) is None                       # a host float comes too late to gate


def test_the_lr_factor_holds_for_the_step_call_only():
    model = _model_and_grads()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    w0 = model.weight.detach().clone()
    g = model.weight.grad.clone()
    gate = GatedStep(opt, lr_factor=lambda: 0.5)
    opt.step()
    assert opt.param_groups[0]["lr"] == 0.1                  # the schedule's value, restored
    assert torch.allclose(model.weight, w0 - 0.05 * g, rtol=0, atol=1e-7)
    gate.close()


def test_a_gradscaler_carries_the_skip_and_counts_it_as_an_overflow():
    model = _model_and_grads()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler("cpu", init_scale=256.0)
    opt.zero_grad()
    scaler.scale(model(torch.randn(16, 8)).pow(2).mean()).backward()
    scaler.unscale_(opt)
    skip = SkipStep()
    skip.set_threshold(0.0)
    skip.decide(torch.nn.utils.get_total_norm([p.grad for p in model.parameters()]))
    skip.merge_into_scaler(scaler, opt)
    w0 = model.weight.detach().clone()
    scaler.step(opt)
    scaler.update()
    assert torch.equal(model.weight, w0) and not opt.state     # never stepped
    assert scaler.get_scale() == 128.0 and skip.consumed


# ------------------------------------------------------------------------ real runs: HF
transformers = pytest.importorskip("transformers")

from transformers import Trainer, TrainingArguments  # noqa: E402

from stability_callbacks.demo.scenarios import ScenarioDataset, build_scenario  # noqa: E402
from stability_callbacks.integrations.hf import StabilityCallback  # noqa: E402


pytestmark = pytest.mark.usefixtures("one_thread")


def _hf_args(out, sc, steps, optim):
    # A constant LR: the run without the skipped step then reads every later batch at the same LR.
    return TrainingArguments(output_dir=str(out), max_steps=steps, per_device_train_batch_size=sc.batch_size,
                             learning_rate=sc.lr, lr_scheduler_type="constant", warmup_steps=0,
                             weight_decay=0.0, optim=optim, logging_steps=1000, save_strategy="no",
                             report_to="none", train_sampling_strategy="sequential", use_cpu=True,
                             disable_tqdm=True, logging_nan_inf_filter=False)


def _without_steps(ds, sc, steps) -> ScenarioDataset:
    """The dataset of a run where the optimizer steps ``steps`` never happened."""
    g = sc.samples_per_step()
    keep = [i for i in range(len(ds)) if i // g + 1 not in steps]
    return ScenarioDataset(ds.input_ids[keep])


def _same_state(a, b) -> bool:
    ma, mb = a.model.state_dict(), b.model.state_dict()
    oa, ob = a.optimizer.state_dict()["state"], b.optimizer.state_dict()["state"]
    return (all(torch.equal(ma[k], mb[k]) for k in ma)
            and all(torch.equal(oa[i][k], ob[i][k]) for i in oa for k in oa[i]))


def _runlog(path):
    return [json.loads(x) for x in path.read_text().splitlines()]


@pytest.mark.parametrize("optim", ["adamw_torch_fused", "adamw_torch"])
def test_hf_nan_step_skipped_as_if_it_never_happened(tmp_path, optim):
    """The batch of step 22 turns the loss NaN (the ``nan`` scenario); with the rule on it is
    skipped and training goes on: weights and AdamW state after 26 steps are bit-identical to
    a run of 25 steps that never saw that batch. fused: the device path (found_inf); foreach:
    the host boolean."""
    sc = build_scenario("nan", max_steps=26, batch_size=4)
    ds = sc.train_dataset()
    a = Trainer(model=sc.make_model(), args=_hf_args(tmp_path / "a", sc, 26, optim), train_dataset=ds)
    cb = StabilityCallback.attach(a, config={"actions": {}, "policy": {"skip_step_on": "nonfinite",
                                                                        "halt_on": "critical"}},
                                  run_dir=tmp_path / "stability")
    a.train()
    b = Trainer(model=sc.make_model(), args=_hf_args(tmp_path / "b", sc, 25, optim),
                train_dataset=_without_steps(ds, sc, {22}))
    b.train()
    assert _same_state(a, b)
    assert a.optimizer.state_dict()["state"][0]["step"] == 25.0
    assert [(f.step, f.kind, f.severity) for f in cb.findings if f.step == 22] == [
        (22, "nonfinite", "info"), (22, "step_skipped", "warning")]
    assert a.state.global_step == 26 and not cb.control.stop
    steps = {x["step"]: x["metrics"] for x in _runlog(tmp_path / "stability" / "runlog.jsonl")
             if x["type"] == "step"}
    assert [s for s, mt in steps.items() if mt["skipped_by_policy"]] == [22]
    assert math.isnan(float(steps[22]["grad_norm"])) and math.isnan(float(steps[22]["loss"]))


def test_hf_grad_outliers_of_a_data_pocket_are_skipped(tmp_path):
    """The pocket (steps 25-27, random tokens) raises the grad norm ~6x its baseline; with
    ``skip_grad_ratio: 3`` its three updates are dropped and the run equals one without it."""
    sc = build_scenario("data-pocket", max_steps=32, batch_size=4)
    ds = sc.train_dataset()
    cfg = {"actions": {}, "policy": {"skip_step_on": "grad_outlier", "skip_grad_ratio": 3.0}}
    a = Trainer(model=sc.make_model(), args=_hf_args(tmp_path / "a", sc, 32, "adamw_torch_fused"),
                train_dataset=ds)
    cb = StabilityCallback.attach(a, config=cfg, run_dir=tmp_path / "stability")
    a.train()
    skips = [(f.step, f.severity) for f in cb.findings if f.kind == "step_skipped"]
    assert skips == [(25, "warning"), (26, "warning"), (27, "critical")]
    # Escalated, but the weights never saw those steps: saving stays allowed (no damage).
    assert cb.control.state_is_good and not cb.findings[-1].details.get("damage")
    b = Trainer(model=sc.make_model(), args=_hf_args(tmp_path / "b", sc, 29, "adamw_torch_fused"),
                train_dataset=_without_steps(ds, sc, {25, 26, 27}))
    b.train()
    assert _same_state(a, b)
    # The loss spiked at the pocket (its batches were read) but the weights never moved: back at once.
    assert [(f.step, f.kind) for f in cb.findings if f.kind in ("loss_spike", "spike_recovered")] == [
        (25, "loss_spike"), (28, "spike_recovered")]


# ------------------------------------------------------------------------ real runs: Lightning
pl = pytest.importorskip("lightning.pytorch")

from stability_callbacks.integrations.lightning import StabilityCallback as PLCallback  # noqa: E402


class _Module(pl.LightningModule):
    def __init__(self, sc, fused):
        super().__init__()
        self.model, self.fused = sc.make_model(), fused

    def training_step(self, batch, batch_idx):
        return self.model(input_ids=batch["input_ids"], labels=batch["labels"]).loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.model.parameters(), lr=3e-3, weight_decay=0.0, fused=self.fused)


def _fit(tmp_path, sc, ds, steps, fused, cb=None, **trainer_kwargs):
    module = _Module(sc, fused)
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=steps, logger=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=False, default_root_dir=tmp_path,
                         callbacks=[cb] if cb else [], **trainer_kwargs)
    trainer.fit(module, torch.utils.data.DataLoader(ds, batch_size=sc.batch_size))
    return module, trainer


@pytest.mark.parametrize("fused", [True, False], ids=["fused", "foreach"])
def test_lightning_nan_step_skipped_as_if_it_never_happened(tmp_path, fused):
    sc = build_scenario("nan", max_steps=26, batch_size=4)
    ds = sc.train_dataset()
    cb = PLCallback(config={"actions": {}, "policy": {"skip_step_on": "nonfinite"}},
                    run_dir=tmp_path / "stability", checkpoint_dir=tmp_path / "ckpt")
    ma, ta = _fit(tmp_path / "a", sc, ds, 26, fused, cb)
    mb, tb = _fit(tmp_path / "b", sc, _without_steps(ds, sc, {22}), 25, fused)
    sa, sb = ta.optimizers[0].state_dict()["state"], tb.optimizers[0].state_dict()["state"]
    assert all(torch.equal(x, y) for x, y in zip(ma.state_dict().values(), mb.state_dict().values()))
    assert all(torch.equal(sa[i][k], sb[i][k]) for i in sa for k in sa[i]) and sa[0]["step"] == 25.0
    assert [(f.step, f.kind, f.severity) for f in cb.findings if f.step == 22] == [
        (22, "nonfinite", "info"), (22, "step_skipped", "warning")]
    assert ta.global_step == 26   # Lightning counts the loop's steps, not the optimizer's
