"""Worker for tests/test_probe_distributed.py: 2 ranks, gloo, CPU.

Launched once with ``python -m torch.distributed.run --standalone --nproc_per_node=2``; it runs
every case in one process group (DDP, FSDP2 with uneven/empty shards, DeepSpeed ZeRO 0/1/2/3,
each in fp32 and bf16) and writes ``rank<r>.json`` into the directory given as argv[1]:
per case, the probe's StepRecords and a full-gather reference computed with collectives
(``full_tensor()`` / ``safe_get_full_optimizer_state``) that are too costly per step: the global
statistics after the last step, and after every step each parameter tensor's full ``exp_avg_sq``
sum and ``exp_avg`` sum of squares (the per-tensor summary's input, recomputed by the test).
"""
import json
import os
import sys
import time

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from stability_callbacks import keys  # noqa: E402
from stability_callbacks.integrations.torch.probe import StepProbe  # noqa: E402
from stability_callbacks.integrations.deepspeed.readings import deepspeed_readings  # noqa: E402
from stability_callbacks.integrations.torch.reductions import batch_fingerprint  # noqa: E402

STEPS = 6      # the per-tensor ratios need 5 samples of baseline: the 6th step has them
BETA2 = 0.98   # not torch's default: the records must carry the optimizer's own (adam/beta2)


def make_model(dtype):
    # 671 parameters (odd: ZeRO pads the last partition) and a (1, 7) / (1,) pair that FSDP2
    # places wholly on rank 0, leaving rank 1 with empty shards; (7, 16) splits 4 / 3.
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(33, 16), torch.nn.Tanh(), torch.nn.Linear(16, 7),
                               torch.nn.Tanh(), torch.nn.Linear(7, 1)).to(dtype)


def batch(rank, step, dtype):
    g = torch.Generator().manual_seed(1000 * step + rank)   # different data per rank
    x = torch.randn(4, 33, generator=g).to(dtype)
    y = torch.randn(4, 1, generator=g).to(dtype)
    ids = torch.randint(0, 50257, (4, 16), generator=g)
    return x, y, ids


def adam_step_of(optimizer):
    """Adam's own update count, read from every state entry of the optimizer that keeps it (the
    reference for adam/step; DeepSpeed's wrappers may have taken a step of their own: bf16 ZeRO-0's
    FP16_UnfusedOptimizer steps once on zero gradients to create the state)."""
    steps = {float(st["step"]) for st in optimizer.state.values() if "step" in st}
    assert len(steps) == 1, steps
    return steps.pop()


def ref_from_full(vs, params, world, ms=None):
    v = torch.cat([t.reshape(-1).double() for t in vs])
    p = torch.cat([t.reshape(-1).double() for t in params])
    ref = {"max": float(v.max()), "l1": float(v.sum()), "numel": v.numel(),
           "param_norm": float(torch.linalg.vector_norm(p))}
    if ms is not None:
        ref["exp_avg_norm"] = float(torch.linalg.vector_norm(torch.cat([t.reshape(-1).double() for t in ms])))
    return ref


def per_tensor(vs, ms):
    """Per parameter tensor (optimizer order): [sum of exp_avg_sq, sum of exp_avg^2, numel]."""
    return [[float(v.double().sum()), float(m.double().square().sum()), v.numel()] for v, m in zip(vs, ms)]


def reduced_expectations(losses, fps):
    """Per-step loss mean and fingerprint sum over ranks, by explicit all_reduce."""
    t = torch.tensor([losses[-1], fps[-1]], dtype=torch.float64)
    dist.all_reduce(t)
    return float(t[0]) / dist.get_world_size(), float(t[1])


def run_probe_steps(step_fn, optimizer_for_probe, rank, dtype, grad_norm_fn=None, full_moments=None,
                    adam_step=None):
    """``full_moments()``: the full (v, m) of every parameter tensor, a collective on every rank;
    ``adam_step()``: Adam's update count. Both read after every step, for the per-tensor reference."""
    probe = StepProbe(adam_every_n_steps=1, param_norm_every_n_steps=1,
                      extra_reductions={keys.BATCH_FINGERPRINT: "sum", "loss/rank0_only": "mean",
                                        "loss/never_set": "max"})
    losses, fps, history = [], [], []
    for step in range(1, STEPS + 1):
        x, y, ids = batch(rank, step, dtype)
        loss = step_fn(x, y)
        probe.add_loss(loss)
        fp = batch_fingerprint(ids)
        probe.set_extra(keys.BATCH_FINGERPRINT, fp)
        if rank == 0:   # declared, set on one rank: reduced over the ranks that set it
            probe.set_extra("loss/rank0_only", 0.25 * step)
        else:           # undeclared, one rank only: dropped (and no hang)
            probe.set_extra("loss/undeclared", 1.0)
        probe.set_lr(0.01)
        if grad_norm_fn is not None:
            probe.set_grad_norm(grad_norm_fn())
        probe.finish_step(step, optimizer=optimizer_for_probe())
        losses.append(float(loss.detach().float()))
        fps.append(float(fp))
        if full_moments is not None:
            history.append({"t": adam_step(), "tensors": per_tensor(*full_moments())})
    records = probe.poll() + probe.flush()
    loss_mean, fp_sum = reduced_expectations(losses, fps)
    return records, {"loss": loss_mean, "fingerprint": fp_sum, "history": history,
                     "device_path": device_path_vs_cpu(optimizer_for_probe())}


def device_path_vs_cpu(optimizer):
    """This rank's local state through the device pass (its pointer table; CPU tensors taking it,
    issue 36) against the CPU pass: the max bit for bit, the sums' largest relative difference."""
    from stability_callbacks.integrations.torch import reductions
    from stability_callbacks.integrations.torch.optim_state import find_adam_state
    cpu = reductions.moment_stats(find_adam_state(optimizer))
    reductions.FOREACH_FAST_DEVICES += ("cpu",)
    try:
        _, dev = reductions.MomentPass()(optimizer)
    finally:
        reductions.FOREACH_FAST_DEVICES = reductions.FOREACH_FAST_DEVICES[:-1]

    def rel(a, b):
        return float(((a.double() - b.double()).abs() / b.double().abs().clamp_min(1e-300)).max())
    return {"max_equal": float(dev.v_max) == float(cpu.v_max), "l1_rel": rel(dev.v_l1, cpu.v_l1),
            "m_rel": rel(dev.m_sq, cpu.m_sq), "per_tensor_rel": rel(dev.per_tensor, cpu.per_tensor),
            "numel": [dev.numel, cpu.numel]}


def _mse_step(model, opt):
    def step_fn(x, y):
        loss = torch.nn.functional.mse_loss(model(x).float(), y.float())
        loss.backward()
        opt.step()
        opt.zero_grad()
        return loss
    return step_fn


def case_ddp(rank, world, dtype):
    from torch.nn.parallel import DistributedDataParallel as DDP
    model = DDP(make_model(dtype))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, BETA2))

    def full():
        ps = list(model.parameters())
        return [opt.state[p]["exp_avg_sq"] for p in ps], [opt.state[p]["exp_avg"] for p in ps]

    records, exp = run_probe_steps(_mse_step(model, opt), lambda: opt, rank, dtype, full_moments=full,
                                   adam_step=lambda: adam_step_of(opt))
    vs, ms = full()
    ref = ref_from_full(vs, [p.detach() for p in model.parameters()], world, ms)
    return records, {**ref, **exp, "adam_step": adam_step_of(opt)}


def case_fsdp2(rank, world, dtype):
    from torch.distributed.fsdp import fully_shard
    model = make_model(dtype)
    for layer in (model[0], model[2], model[4]):
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, BETA2))
    local = [p.to_local().numel() for p in model.parameters()]

    def full():
        ps = list(model.parameters())
        return ([opt.state[p]["exp_avg_sq"].full_tensor() for p in ps],
                [opt.state[p]["exp_avg"].full_tensor() for p in ps])

    records, exp = run_probe_steps(_mse_step(model, opt), lambda: opt, rank, dtype, full_moments=full,
                                   adam_step=lambda: adam_step_of(opt))
    vs, ms = full()
    params = [p.full_tensor().detach() for p in model.parameters()]
    ref = ref_from_full(vs, params, world, ms)
    return records, {**ref, **exp, "local_numels": local, "adam_step": adam_step_of(opt)}


def case_deepspeed(rank, world, dtype, stage, fp32_grad_accum=False):
    import deepspeed
    from deepspeed.utils import safe_get_full_optimizer_state, safe_get_full_fp32_param
    model = make_model(torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.9, BETA2))
    cfg = {"train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1,
           "zero_optimization": {"stage": stage}, "zero_allow_untested_optimizer": True,
           "bf16": {"enabled": dtype == torch.bfloat16}, "gradient_clipping": 1.0,
           "steps_per_print": 10 ** 9, "wall_clock_breakdown": False}
    if fp32_grad_accum:   # selects DeepSpeed's BF16_Optimizer (its own flat partitions)
        cfg["data_types"] = {"grad_accum_dtype": "fp32"}
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=opt, config=cfg)

    def step_fn(x, y):
        out = engine(x)
        loss = torch.nn.functional.mse_loss(out.float(), y.float())
        engine.backward(loss)
        engine.step()
        return loss

    def grad_norm():
        g = engine.get_global_grad_norm()
        return None if g is None else g

    def full():
        if stage == 0:
            # replicated state: the basic optimizer holds every full tensor on every rank
            basic = engine.basic_optimizer
            ps = [p for g in basic.param_groups for p in g["params"]]
            return [basic.state[p]["exp_avg_sq"] for p in ps], [basic.state[p]["exp_avg"] for p in ps]
        mps = list(engine.module.parameters())
        return ([safe_get_full_optimizer_state(p, "exp_avg_sq") for p in mps],
                [safe_get_full_optimizer_state(p, "exp_avg") for p in mps])

    records, exp = run_probe_steps(step_fn, lambda: engine, rank, dtype, grad_norm, full_moments=full,
                                   adam_step=lambda: adam_step_of(engine.basic_optimizer))
    vs, ms = full()
    if stage == 0:
        basic = engine.basic_optimizer
        params = [p.detach() for g in basic.param_groups for p in g["params"]]
    else:
        params = [safe_get_full_fp32_param(p) for p in engine.module.parameters()]
    ref = ref_from_full(vs, params, world, ms)
    ref["adam_step"] = adam_step_of(engine.basic_optimizer)
    readings = deepspeed_readings(engine)
    info = {"optimizer": type(engine.optimizer).__name__,
            "readings": {"loss_scale": readings["loss_scale"],
                         "skipped_steps": readings["skipped_steps"],
                         "grad_norm_type": type(readings["grad_norm"]).__name__}}
    del engine
    return records, {**ref, **exp, **info}


def main(out_dir):
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(1)
    try:
        import cpu_deepspeed  # noqa: F401  (before DeepSpeed initialises)
        import deepspeed
        deepspeed.init_distributed(dist_backend="gloo")
        have_deepspeed = True
    except ImportError:
        have_deepspeed = False

    cases = {}
    for dname, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        cases[f"ddp_{dname}"] = lambda dtype=dtype: case_ddp(rank, world, dtype)
        cases[f"fsdp2_{dname}"] = lambda dtype=dtype: case_fsdp2(rank, world, dtype)
        for stage in (0, 1, 2, 3) if have_deepspeed else ():
            cases[f"zero{stage}_{dname}"] = \
                lambda dtype=dtype, stage=stage: case_deepspeed(rank, world, dtype, stage)
    if have_deepspeed:
        cases["zero1_bf16_fp32acc"] = lambda: case_deepspeed(rank, world, torch.bfloat16, 1, True)
    only = os.environ.get("PROBE_CASES")
    out = {"world": world, "cases": {}}
    for name, fn in cases.items():
        if only and name not in only.split(","):
            continue
        t0 = time.perf_counter()
        try:
            records, ref = fn()
            out["cases"][name] = {"records": [r.to_json() for r in records], "ref": ref,
                                  "seconds": time.perf_counter() - t0}
        except Exception as e:  # report, keep the other cases running
            import traceback
            out["cases"][name] = {"error": f"{type(e).__name__}: {e}",
                                  "trace": traceback.format_exc()[-2000:]}
        dist.barrier()
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(out, f)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
