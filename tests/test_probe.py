"""StepProbe and the Adam second-moment statistics, single process on CPU (issue 4)."""
import logging
import math

import pytest

torch = pytest.importorskip("torch")

from stability_callbacks import keys  # noqa: E402
from stability_callbacks.integrations.torch import probe as probe_mod  # noqa: E402
from stability_callbacks.integrations.torch import reductions  # noqa: E402
from stability_callbacks.integrations.torch.probe import StepProbe  # noqa: E402
from stability_callbacks.integrations.torch.readings import grad_scaler_readings  # noqa: E402
from stability_callbacks.integrations.torch.reductions import (  # noqa: E402
    adam_moment_stats, batch_fingerprint)


def adam_second_moment_stats(optimizer):
    """Single-process ``(max, l1, numel)`` of ``exp_avg_sq`` as floats/int, for the assertions
    (the probe folds the same local values into its one packed collective)."""
    st = adam_moment_stats(optimizer)
    if st is None:
        return None
    return float(st.v_max), float(st.v_l1), st.numel


def _model(seed=0, dtype=torch.float32):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(),
                               torch.nn.Linear(16, 3)).to(dtype)


def _batch(i, dtype=torch.float32):
    g = torch.Generator().manual_seed(100 + i)
    return torch.randn(8, 6, generator=g).to(dtype), torch.randn(8, 3, generator=g).to(dtype)


def _train(model, opt, probe, steps, dtype=torch.float32):
    """Plain optimizer steps, the probe fed as an integration would (loss, then finish_step)."""
    for step in range(1, steps + 1):
        x, y = _batch(step, dtype)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        probe.add_loss(loss)
        opt.step()
        opt.zero_grad()
        probe.finish_step(step, optimizer=opt)


def _reference_v(opt):
    vs = [opt.state[p]["exp_avg_sq"].reshape(-1).double()
          for g in opt.param_groups for p in g["params"]]
    v = torch.cat(vs)
    return float(v.max()), float(v.sum()), v.numel()


@pytest.mark.parametrize("impl", ["default", "foreach", "fused"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_adam_stats_match_a_full_reference(impl, dtype, cpu_pass):
    model = _model(dtype=dtype)
    kw = {"foreach": False} if impl == "default" else {impl: True}
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, **kw)
    probe = StepProbe(adam_every_n_steps=1)
    _train(model, opt, probe, 3, dtype)
    rec = probe.poll()[-1]
    mx, l1, n = _reference_v(opt)
    assert rec.step == 3
    assert rec.metrics[keys.ADAM_V_MAX] == mx          # max is exact
    assert rec.metrics[keys.ADAM_V_L1] == pytest.approx(l1, rel=1e-6)
    assert rec.metrics[keys.ADAM_V_NUMEL] == n == 6 * 16 + 16 + 16 * 3 + 3


def _adam_with_state(*values):
    """An Adam whose ``exp_avg_sq`` tensors are exactly ``values`` (one parameter each)."""
    params = [torch.nn.Parameter(torch.zeros_like(v)) for v in values]
    opt = torch.optim.Adam(params)
    for p in params:
        p.grad = torch.zeros_like(p)
    opt.step()  # creates the state
    for p, v in zip(params, values):
        opt.state[p]["exp_avg_sq"].copy_(v)
    return opt


def _reference(values):
    ref = torch.cat([v.reshape(-1).double() for v in values])
    return float(ref.max()), float(ref.sum()), ref.numel()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_stats_are_accurate_on_large_tensors_and_row_boundaries(dtype, cpu_pass):
    # pitfall 9: _foreach_norm(ord=1) drifted by 1e-3 on CPU for GPT-2-sized state
    g = torch.Generator().manual_seed(1)
    big = (torch.rand(2_500_001, generator=g) * 3).to(dtype)
    big[16383] = 7.5   # the max sits at the end of a row
    small = torch.rand(1001, generator=g).to(dtype)
    half = (torch.rand(40_000, generator=g) * 3).to(dtype)
    half[20_000] = 8.0                                               # inside a row
    mx, l1, n = adam_second_moment_stats(_adam_with_state(big, small, half))
    ref_max, ref_l1, ref_n = _reference([big, small, half])
    assert float(mx) == ref_max == 8.0
    assert float(l1) == pytest.approx(ref_l1, rel=1e-7)
    assert int(n) == ref_n == 2_541_002


def test_mixed_dtype_state_takes_the_torch_kernels_and_is_exact(monkeypatch):
    # the compiled kernel takes one dtype (float32 or bfloat16) for the whole state
    from stability_callbacks.integrations.torch import native
    assert native.moment_kernels() is not None, native.status()
    g = torch.Generator().manual_seed(4)
    values = [torch.rand(70_000, generator=g), torch.rand(3000, generator=g).bfloat16(),
              torch.rand(40, generator=g).double()]
    values[1][7] = 2.0
    ran = []
    monkeypatch.setattr(reductions, "_moments_cpu", lambda *a, real=reductions._moments_cpu: ran.append(1) or real(*a))
    mx, l1, n = adam_second_moment_stats(_adam_with_state(*values))
    ref_max, ref_l1, ref_n = _reference(values)
    assert ran == [1] and float(mx) == ref_max == 2.0 and int(n) == ref_n
    assert float(l1) == pytest.approx(ref_l1, rel=1e-7)


@pytest.mark.parametrize("where", ["same tensor", "other tensor", "tail", "small tensor", "flat"])
def test_max_is_exact_wherever_it_hides(where, cpu_pass):
    # The CPU path reads the max only from rows (of 256 elements) whose sums can reach it,
    # starting from each piece's row with the largest sum. Here four such rows hold 1024 values
    # of 1e4 (a sum of 2.56e6 each) while the max is a lone 1e6 elsewhere, in a row whose sum is
    # far smaller.
    g = torch.Generator().manual_seed(2)
    heavy = torch.exp(2 * torch.randn(12 * 16384 + 5, generator=g))   # log-normal, like Adam's v
    light = torch.exp(2 * torch.randn(3 * 16384 + 77, generator=g)) * 1e-3
    tiny = torch.rand(40, generator=g) * 0.1
    heavy[5 * 1024:6 * 1024] = 1e4   # whole rows: the seed
    target = {"same tensor": (heavy, 9 * 16384 + 100), "other tensor": (light, 20000),
              "tail": (heavy, 12 * 16384 + 2), "small tensor": (tiny, 7)}.get(where)
    if target is not None:
        target[0][target[1]] = 1e6
    else:   # flat state: every block a candidate, so the max is read in full
        heavy.fill_(0.25)
        heavy[-1000] = 0.5
        light.clamp_(max=0.1)
    values = [heavy, light, tiny]
    mx, l1, n = adam_second_moment_stats(_adam_with_state(*values))
    ref_max, ref_l1, ref_n = _reference(values)
    assert float(mx) == ref_max == (1e6 if target is not None else 0.5)
    assert float(l1) == pytest.approx(ref_l1, rel=1e-7)
    assert int(n) == ref_n


def test_cpu_pass_on_several_threads_gives_the_one_thread_result_bit_for_bit():
    """The pieces are spread over threads that take the next one when free: which thread sums
    which piece changes from run to run, the result may not."""
    from stability_callbacks.integrations.torch import reductions
    g = torch.Generator().manual_seed(3)
    vs = [torch.exp(2 * torch.randn(n, generator=g)) for n in (300_001, 70_000, 16_384, 5000, 17)]
    vs[2][9000] = 1e5
    ms = [torch.randn(v.numel(), generator=g) for v in vs]
    one = reductions._moments_cpu(vs, ms, 1)
    for threads in (2, 3, 2, 3):
        many = reductions._moments_cpu(vs, ms, threads)
        assert all(torch.equal(a, b) for a, b in zip(one, many))
    assert float(one[0]) == 1e5 and float(one[1].sum()) == pytest.approx(
        math.fsum(float(v.double().sum()) for v in vs), rel=1e-7)


def test_compiled_pass_on_any_thread_count_gives_the_one_thread_result_bit_for_bit():
    """The compiled pass's threads take its work units as they come: the result may not change."""
    g = torch.Generator().manual_seed(3)
    vs = [torch.exp(2 * torch.randn(n, generator=g)) for n in (3_000_001, 70_000, 16_384, 5000, 17)]
    vs[2][9000] = 1e5
    ms = [torch.randn(v.numel(), generator=g) for v in vs]
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = reductions._moments_native(vs, ms)
        assert one is not None
        for n in (2, 3, 4, 2):
            torch.set_num_threads(n)
            many = reductions._moments_native(vs, ms)
            assert all(torch.equal(a, b) for a, b in zip(one, many))
    finally:
        torch.set_num_threads(threads)
    assert float(one[0]) == 1e5
    assert float(one[1].sum()) == pytest.approx(math.fsum(float(v.double().sum()) for v in vs), rel=1e-9)
    assert float(one[2].sum()) == pytest.approx(math.fsum(float(m.double().square().sum()) for m in ms), rel=1e-9)


def test_cpu_pass_error_on_a_pool_thread_is_raised_to_the_caller():
    from stability_callbacks.integrations.torch import reductions
    seen = []

    def fails_on_three(i):
        seen.append(i)
        if i == 3:
            raise ValueError("piece 3")

    threads = torch.get_num_threads()
    with pytest.raises(ValueError, match="piece 3"):
        reductions._spread(fails_on_three, list(range(8)), 2)
    assert 3 in seen
    assert torch.get_num_threads() == threads   # the caller's intra-op threads: left as they were


def test_zero_and_negative_zero_state(cpu_pass):
    v = torch.zeros(20000)
    v[5] = -0.0
    mx, l1, _ = adam_second_moment_stats(_adam_with_state(v))
    assert float(mx) == 0.0 and float(l1) == 0.0


def test_nonfinite_state_gives_nan_max_whatever_the_sign_bit(cpu_pass):
    p = torch.nn.Parameter(torch.zeros(10))
    opt = torch.optim.Adam([p])
    p.grad = torch.zeros_like(p)
    opt.step()
    opt.state[p]["exp_avg_sq"][3] = -float("nan")   # x86's default NaN has the sign bit set
    st = adam_moment_stats(opt)
    assert math.isnan(float(st.v_max)) and math.isnan(float(st.v_l1))
    opt.state[p]["exp_avg_sq"][3] = float("inf")
    st = adam_moment_stats(opt)
    assert float(st.v_max) == math.inf


def test_loss_is_summed_over_micro_batches_under_accumulation():
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    probe = StepProbe(adam_every_n_steps=0)
    expected = []
    for step in range(1, 3):
        parts = []
        for micro in range(4):   # GA = 4; the loss handed over is already / 4
            x, y = _batch(10 * step + micro)
            loss = torch.nn.functional.mse_loss(model(x), y) / 4
            loss.backward()
            probe.add_loss(loss)
            parts.append(float(loss.detach()))
        opt.step()
        opt.zero_grad()
        probe.finish_step(step, optimizer=opt)
        expected.append(math.fsum(parts))
    recs = probe.poll()
    assert [r.step for r in recs] == [1, 2]
    assert [r.metrics[keys.LOSS] for r in recs] == pytest.approx(expected, rel=1e-6)
    assert keys.ADAM_V_MAX not in recs[0].metrics   # adam sampling off


def test_divide_by_and_nan_loss_is_data_not_an_error():
    probe = StepProbe()
    probe.add_loss(torch.tensor(3.0), divide_by=2)
    probe.add_loss(torch.tensor(1.0), divide_by=2)
    probe.finish_step(1)
    probe.add_loss(torch.tensor(1.0))
    probe.add_loss(torch.tensor(float("nan")))
    probe.finish_step(2)
    r1, r2 = probe.poll()
    assert r1.metrics[keys.LOSS] == 2.0
    assert math.isnan(r2.metrics[keys.LOSS])


def test_grad_norm_reused_or_computed_once_and_usable_for_clipping():
    model = _model()
    x, y = _batch(0)
    torch.nn.functional.mse_loss(model(x), y).backward()
    ref = float(torch.nn.utils.clip_grad_norm_(model.parameters(), math.inf))
    probe = StepProbe(adam_every_n_steps=0)
    norm = probe.compute_grad_norm(model.parameters())
    assert isinstance(norm, torch.Tensor) and float(norm) == pytest.approx(ref, rel=1e-6)
    torch.nn.utils.clip_grads_with_norm_(model.parameters(), 0.01, norm)
    probe.finish_step(1)
    probe.set_grad_norm(1.25)               # a framework's host float (DeepSpeed ZeRO-0 fp16)
    probe.finish_step(2)
    probe.set_grad_norm(torch.tensor(0.5))  # a framework's device tensor
    probe.finish_step(3)
    r1, r2, r3 = probe.poll()
    assert r1.metrics[keys.GRAD_NORM] == pytest.approx(ref, rel=1e-6)   # pre-clip value
    assert r2.metrics[keys.GRAD_NORM] == 1.25 and r3.metrics[keys.GRAD_NORM] == 0.5


def test_cadences_lr_extras_and_param_norm():
    model = _model()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    probe = StepProbe(adam_every_n_steps=2, param_norm_every_n_steps=3)
    for step in range(1, 7):
        x, y = _batch(step)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        probe.add_loss(loss)
        probe.set_lr(1e-3 * step)
        probe.set_extra(keys.BATCH_FINGERPRINT, batch_fingerprint(torch.arange(step * 5)))
        probe.set_extra("loss/a", 0.5, op="mean")
        opt.step()
        opt.zero_grad()
        probe.finish_step(step, optimizer=opt)
    recs = {r.step: r.metrics for r in probe.poll()}
    assert sorted(s for s, m in recs.items() if keys.ADAM_V_MAX in m) == [2, 4, 6]
    assert sorted(s for s, m in recs.items() if keys.PARAM_NORM in m) == [3, 6]
    ref = float(torch.linalg.vector_norm(torch.cat([p.detach().reshape(-1)
                                                    for p in model.parameters()])))
    assert recs[6][keys.PARAM_NORM] == pytest.approx(ref, rel=1e-6)
    assert recs[4][keys.LR] == pytest.approx(4e-3)
    assert recs[5]["loss/a"] == 0.5
    assert recs[5][keys.BATCH_FINGERPRINT] == float(batch_fingerprint(torch.arange(25)))


@pytest.mark.parametrize("impl", ["default", "foreach", "fused"])
def test_adam_beta2_and_step_come_with_the_second_moment(impl):
    # two param groups with different betas: the record carries the largest beta2; the step is
    # the optimizer's update count including this one (torch keeps it as a CPU tensor: read on
    # the host, no device involved), only on the steps the Adam statistics are sampled
    model = _model()
    first, *rest = list(model.parameters())
    kw = {} if impl == "default" else {impl: True}
    opt = torch.optim.AdamW([{"params": [first], "betas": (0.9, 0.95)},
                             {"params": rest, "betas": (0.9, 0.98)}], lr=1e-2, **kw)
    probe = StepProbe(adam_every_n_steps=2)
    _train(model, opt, probe, 4)
    recs = probe.poll()
    assert [(r.step, r.metrics.get(keys.ADAM_BETA2), r.metrics.get(keys.ADAM_STEP)) for r in recs] == [
        (1, None, None), (2, 0.98, 2.0), (3, None, None), (4, 0.98, 4.0)]
    assert float(opt.state[first]["step"]) == 4.0 and opt.state[first]["step"].device.type == "cpu"


def test_optimizers_without_second_moment_skip_with_one_info_line(caplog):
    probe_mod._ONCE._warned.discard("no-second-moment")
    model = _model()
    for opt in (torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9),
                torch.optim.Adafactor(model.parameters(), lr=0.01)):
        probe = StepProbe(adam_every_n_steps=1)
        caplog.clear()
        probe_mod._ONCE._warned.discard("no-second-moment")
        with caplog.at_level(logging.INFO, logger="stability_callbacks"):
            _train(model, opt, probe, 3)
        recs = probe.poll()
        assert [r.step for r in recs] == [1, 2, 3]
        assert all(keys.ADAM_V_MAX not in r.metrics and keys.ADAM_BETA2 not in r.metrics
                   and keys.LOSS in r.metrics for r in recs)
        # issue 16: SGD and Adafactor are no problem to warn about; one INFO line says why.
        notes = [r.levelname for r in caplog.records if "second moment" in r.getMessage()]
        assert notes == ["INFO"], type(opt).__name__


def test_empty_state_before_the_first_step_is_silent(caplog):
    model = _model()
    opt = torch.optim.AdamW(model.parameters())
    probe = StepProbe()
    with caplog.at_level(logging.WARNING, logger="stability_callbacks"):
        probe.finish_step(0, optimizer=opt)
    (rec,) = probe.poll()
    assert rec.metrics == {} and not caplog.records
    assert adam_moment_stats(opt) is None


def test_an_adam_holding_another_models_parameters_takes_updates_of_exactly_zero():
    # issue 33, class 5: the optimizer built before the model was re-created; the model's
    # gradients flow (grad norm > 0), the optimizer's tensors get none, so Adam never creates
    # its state: every step() after the first one watched is an update of exactly 0
    from stability_callbacks import Monitor
    model, stale = _model(0), _model(1)
    probe = StepProbe()
    _train(model, torch.optim.AdamW(stale.parameters(), lr=1e-2), probe, 12)
    recs = probe.poll()
    assert [r.metrics.get(keys.UPDATE_NORM) for r in recs] == [None] + [0.0] * 11   # watched from step 1's close
    m = Monitor()
    found = [(f.step, f.severity, f.details["zero"]) for r in recs for f in m.update(r) if f.kind == "not_learning"]
    assert found == [(6, "warning", "update_norm")]   # 5 points of 0 from step 2 (the random batches' loss is flat)
    # Adam that trains, a step the framework skipped (no step() call), SGD's empty state: no claim
    probe = StepProbe()
    _train(model, torch.optim.AdamW(model.parameters(), lr=1e-2), probe, 4)
    probe.finish_step(5, optimizer=None)
    assert all(r.metrics.get(keys.UPDATE_NORM, 1.0) > 0.0 for r in probe.poll())
    for opt in (torch.optim.SGD(stale.parameters(), lr=0.1), torch.optim.SGD(model.parameters(), lr=0.1)):
        probe = StepProbe()
        _train(model, opt, probe, 3)
        assert all(keys.UPDATE_NORM not in r.metrics for r in probe.poll())


def test_wrapped_optimizers_are_unwrapped():
    pl_optimizer = pytest.importorskip("lightning.pytorch.core.optimizer")
    model = _model()
    inner = torch.optim.AdamW(model.parameters())
    x, y = _batch(0)
    torch.nn.functional.mse_loss(model(x), y).backward()
    inner.step()
    wrapped = pl_optimizer.LightningOptimizer(inner)
    got = adam_second_moment_stats(wrapped)
    ref = _reference_v(inner)
    assert float(got[0]) == ref[0] and int(got[2]) == ref[2]


def test_grad_scaler_found_inf_and_scale_decrease():
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=256.0)
    probe_a = StepProbe(adam_every_n_steps=0)   # found_inf read before update()
    probe_b = StepProbe(adam_every_n_steps=0)   # skip derived from the scale falling
    for step in range(1, 5):
        x, y = _batch(step)
        if step == 3:
            x = x * float("inf")
        loss = torch.nn.functional.mse_loss(model(x), y)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        scale, found_inf = grad_scaler_readings(scaler, opt)
        probe_a.set_loss_scale(scale)
        probe_a.set_skipped(found_inf)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        probe_a.finish_step(step)
        probe_b.set_loss_scale(scaler._scale, detect_decrease=True)   # read after update()
        probe_b.finish_step(step)
    a = probe_a.poll()
    assert [r.metrics[keys.OVERFLOW_SKIPPED] for r in a] == [0.0, 0.0, 1.0, 0.0]
    assert [r.metrics[keys.LOSS_SCALE] for r in a] == [256.0, 256.0, 256.0, 128.0]
    b = probe_b.poll()
    assert [r.metrics.get(keys.OVERFLOW_SKIPPED) for r in b] == [None, 0.0, 1.0, 0.0]
    assert [r.metrics[keys.LOSS_SCALE] for r in b] == [256.0, 256.0, 128.0, 128.0]


def test_batch_fingerprint_is_exact_and_order_sensitive():
    ids = torch.randint(0, 50257, (4, 128), generator=torch.Generator().manual_seed(0))
    f = batch_fingerprint(ids)
    assert f.dtype == torch.float64 and f.shape == ()
    v = float(f)
    assert v == int(v) and 0 <= v < 2 ** 40
    assert float(batch_fingerprint(ids.clone())) == v
    assert float(batch_fingerprint(ids.flip(0))) != v
    bumped = ids.clone()
    bumped[2, 77] += 1
    assert float(batch_fingerprint(bumped)) != v
    # sums over (many) ranks stay exact integers in float64
    assert (f * 8192).item() == v * 8192 < 2 ** 53


@pytest.mark.parametrize("kw", [{"adam_every_n_steps": -1}, {"param_norm_every_n_steps": 1.5},
                                {"lag_steps": -1}, {"extra_reductions": {"x": "avg"}}])
def test_bad_config_values_name_the_key(kw):
    with pytest.raises(ValueError) as e:
        StepProbe(**kw)
    key = next(iter(kw))
    assert key in str(e.value)
    with pytest.raises(ValueError, match="'avg'"):
        StepProbe().set_extra("y", 1.0, op="avg")


def test_flush_returns_everything_and_probe_starts_clean():
    probe = StepProbe()
    probe.add_loss(torch.tensor(2.0))
    probe.discard_step()
    probe.add_loss(torch.tensor(5.0))
    probe.finish_step(7)
    assert [(r.step, r.metrics[keys.LOSS]) for r in probe.flush()] == [(7, 5.0)]
    assert probe.flush() == [] and probe.packed.num_pending == 0


def test_records_come_out_a_fixed_number_of_steps_late():
    # the lag is counted in steps so that every rank sees step N at the same point
    probe = StepProbe(lag_steps=1)
    got = []
    for step in range(1, 4):
        probe.add_loss(torch.tensor(float(step)))
        probe.finish_step(step)
        got.append([r.step for r in probe.poll()])
    assert got == [[], [1], [2]]
    assert [r.step for r in probe.flush()] == [3]


def test_accelerator_branch_matches_the_cpu_branch(monkeypatch, cpu_pass):
    # the foreach branch (CUDA/XPU) runs here through torch's per-tensor CPU fallback
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = _batch(0)
    torch.nn.functional.mse_loss(model(x), y).backward()
    opt.step()
    opt.state[next(iter(model.parameters()))]["exp_avg_sq"][0, 0] = 0.0   # v >= 0 kept
    cpu = adam_moment_stats(opt)
    sq_cpu = reductions.param_sq_sum(model.parameters())
    monkeypatch.setattr(reductions, "FOREACH_FAST_DEVICES", ("cpu",))
    fe = adam_moment_stats(opt)
    assert float(fe.v_max) == float(cpu.v_max)
    assert float(fe.v_l1) == pytest.approx(float(cpu.v_l1), rel=1e-6)
    assert float(reductions.param_sq_sum(model.parameters())) == pytest.approx(float(sq_cpu),
                                                                               rel=1e-6)


# ---- issue 25: the first moment, the update norm and the per-tensor summary (one pass) --------
def _reference_update(opt, lr_used):
    """float64 from the full state: ||exp_avg|| and lr * ||m_hat / (sqrt(mean v_hat) + eps)|| per
    tensor (integrations/torch/layers.py), each group with its own betas, eps and share of the LR."""
    m_sq, update_sq = 0.0, 0.0
    lr0 = opt.param_groups[0]["lr"]
    for g in opt.param_groups:
        b1, b2 = g["betas"]
        for p in g["params"]:
            st = opt.state[p]
            m, v, t = st["exp_avg"].double(), st["exp_avg_sq"].double(), float(st["step"])
            m_sq += float(m.square().sum())
            d = math.sqrt(float(m.square().sum())) / (1 - b1 ** t) / (
                math.sqrt(float(v.mean()) / (1 - b2 ** t)) + g["eps"])
            update_sq += (lr_used * g["lr"] / lr0 * d) ** 2
    return math.sqrt(m_sq), math.sqrt(update_sq)


@pytest.mark.parametrize("impl", ["default", "foreach", "fused"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_first_moment_and_update_norm_match_a_full_reference(impl, dtype, cpu_pass):
    model = _model(dtype=dtype)
    first, *rest = list(model.parameters())
    kw = {"foreach": False} if impl == "default" else {impl: True}
    opt = torch.optim.AdamW([{"params": [first], "lr": 2e-2, "betas": (0.8, 0.95), "eps": 1e-6},
                             {"params": rest, "lr": 1e-2, "betas": (0.9, 0.98)}], **kw)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda i: 1.0 / (1 + i))
    probe = StepProbe(adam_every_n_steps=1)
    for step in range(1, 4):
        x, y = _batch(step, dtype)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        probe.add_loss(loss)
        used = opt.param_groups[0]["lr"]
        probe.set_lr(used)   # read before the scheduler steps, as the integrations do
        opt.step()
        opt.zero_grad()
        sched.step()         # the groups now hold the next step's LR
        probe.finish_step(step, optimizer=opt)
    rec = probe.poll()[-1].metrics
    m_norm, update_norm = _reference_update(opt, used)
    assert rec[keys.ADAM_M_NORM] == pytest.approx(m_norm, rel=1e-6)
    assert rec[keys.UPDATE_NORM] == pytest.approx(update_norm, rel=1e-6)
    assert rec[keys.ADAM_BETA1] == 0.9 and rec[keys.ADAM_BETA2] == 0.98   # the largest of the groups
    assert not any(k.startswith("layers/") for k in rec)                  # 3 samples: no baseline yet


def _seven_tensor_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16),
                               torch.nn.Tanh(), torch.nn.Linear(16, 3), torch.nn.Flatten(0))


def test_a_tensor_whose_first_moment_builds_up_is_the_top_layer_and_moves_its_half():
    # The precursor's signature (Marin 32B: the first moment grew ~2x, the second moment stayed,
    # the update norm rose): at step 9 tensor 2 (the second Linear's weight, lower half of 6)
    # enters its step with 4x its first moment.
    model = _seven_tensor_model()
    params = list(model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    probe = StepProbe(adam_every_n_steps=1)
    for step in range(1, 10):
        x, y = _batch(step)
        loss = torch.nn.functional.mse_loss(model(x).reshape(8, 3), y)
        loss.backward()
        if step == 9:
            opt.state[params[2]]["exp_avg"].mul_(4.0)
        probe.add_loss(loss)
        probe.set_lr(1e-2)
        opt.step()
        opt.zero_grad()
        probe.finish_step(step, optimizer=opt)
    recs = {r.step: r.metrics for r in probe.poll()}
    # ratios once the baselines have 5 samples: from the 6th; the update norm always
    assert [s for s, m in recs.items() if keys.layer_top(1, "tensor") in m] == [6, 7, 8, 9]
    assert all(keys.UPDATE_NORM in m for m in recs.values())
    last, before = recs[9], recs[8]
    assert last[keys.layer_top(1, "tensor")] == 2.0 and before[keys.layer_top(1, "tensor")] != 2.0
    assert last[keys.layer_top(1, "update_ratio")] > 2 and last[keys.layer_top(1, "exp_avg_ratio")] > 2
    assert 0.7 < last[keys.layer_top(1, "exp_avg_sq_ratio")] < 1.5    # the second moment stayed (its drift)
    assert last[keys.layer_top(2, "update_ratio")] < 1.5 > before[keys.layer_top(1, "update_ratio")]
    assert last[keys.LAYERS_LOWER_UPDATE_RATIO] > 1.2 * before[keys.LAYERS_LOWER_UPDATE_RATIO]
    assert last[keys.LAYERS_UPPER_UPDATE_RATIO] < 1.2 * before[keys.LAYERS_UPPER_UPDATE_RATIO]
    assert last[keys.UPDATE_NORM] > 1.5 * before[keys.UPDATE_NORM]


def test_per_tensor_sums_are_the_same_on_both_branches(monkeypatch, cpu_pass):
    model = _seven_tensor_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    x, y = _batch(0)
    torch.nn.functional.mse_loss(model(x).reshape(8, 3), y).backward()
    opt.step()
    cpu = adam_moment_stats(opt)
    monkeypatch.setattr(reductions, "FOREACH_FAST_DEVICES", ("cpu",))
    fe = adam_moment_stats(opt)
    ref = torch.tensor([[float(opt.state[p]["exp_avg_sq"].double().sum()),
                         float(opt.state[p]["exp_avg"].double().square().sum())] for p in model.parameters()],
                       dtype=torch.float64)
    assert torch.allclose(cpu.per_tensor, ref, rtol=1e-6) and torch.allclose(fe.per_tensor, ref, rtol=1e-6)
    assert float(cpu.m_sq) == pytest.approx(float(ref[:, 1].sum()), rel=1e-7)


def test_tensor_names_follow_the_optimizers_order():
    from stability_callbacks.integrations.torch.optim_state import tensor_names
    model = _seven_tensor_model()
    ps = list(model.named_parameters())
    opt = torch.optim.AdamW([{"params": [ps[4][1], ps[5][1]]}, {"params": [p for _, p in ps[:4]]}])
    assert tensor_names(opt, model) == ["4.weight", "4.bias", "0.weight", "0.bias", "2.weight", "2.bias"]


def test_a_failed_pass_leaves_the_summary_out_and_keeps_the_step(monkeypatch, caplog):
    model = _seven_tensor_model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    probe = StepProbe(adam_every_n_steps=1)

    def step(n):
        x, y = _batch(n)
        loss = torch.nn.functional.mse_loss(model(x).reshape(8, 3), y)
        loss.backward()
        probe.add_loss(loss)
        opt.step()
        opt.zero_grad()
        probe.finish_step(n, optimizer=opt)

    step(1)

    def broken(state):
        raise RuntimeError("planted")

    monkeypatch.setattr(reductions, "_moment_stats", lambda state, plan: broken(state))
    with caplog.at_level(logging.ERROR, logger="stability_callbacks"):
        step(2)
        step(3)
    r1, r2, r3 = probe.poll()
    assert keys.UPDATE_NORM in r1.metrics
    for r in (r2, r3):   # off after the failure, said once; the block still travels (layout), empty
        assert keys.LOSS in r.metrics and not any(k.startswith(("adam/", "layers/", "update")) for k in r.metrics)
    assert sum("statistics failed" in rec.getMessage() for rec in caplog.records) == 1
