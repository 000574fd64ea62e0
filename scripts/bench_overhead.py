"""Per-step monitoring overhead on a GPT-2-small-sized model (124 M parameters, no download).

Plain and monitored optimizer steps of ONE model alternate in one run (so drift in machine load
hits both alike). "Monitored" adds everything an integration does per step through its
``LiveSession``: micro-batch intake (device-side loss accumulation, batch fingerprint), the grad
norm reused for clipping (``before_optimizer_step`` + ``clip_grads_with_norm_`` in place of
``clip_grad_norm_``), the LR, ``end_step`` (the Adam probe every ``--adam-every`` steps, packing,
host copy, poll, ``LiveRun.observe``: the Monitor) and the requests.
The Adam probe's pass is also timed on its own against ``floor_ms``, one ``sum`` over a single
contiguous buffer as large as all ``exp_avg_sq`` together (CUDA: with events), in interleaved
repetitions: ``probe_v_ms``, ``exp_avg_sq`` max + L1 (issue 24's goal: <= 1.2x the floor), and
``probe_ms``, the pass the probe runs: that and ``exp_avg``'s norm, per parameter tensor (issue
25's goal: <= 2.2x).

    python scripts/bench_overhead.py [--pairs 8] [--seq-len 128] [--batch-size 1] [--grad-accum 2]
    python scripts/bench_overhead.py --probe-only --probe-reps 15     # the pass vs the floor only
    python scripts/bench_overhead.py --probe-host [--tensor-scale 10] [--device meta]

``--probe-host`` (issue 36) prints ``probe-host: tensors=N ops=K host_ms=X``: the Adam probe's
call per sampled step on the device path (:class:`~...reductions.MomentPass`: the state's layout
checked, the pass launched, its rows combined) over GPT-2 124M's 148 parameter tensors
(``--tensor-scale 10``: 1480), ``ops`` the ops it dispatches (``tests/host_reads.py``'s
``DispatchedOps``), ``host_ms`` the median host time of one call (``--calls`` of them). On the
``meta`` device (the default where there is no GPU) no kernel runs: the host work alone. A JSON
line follows with the same for the multi-tensor kernels and the layout found afresh each call (the
pass before issue 36), the load average, and which kernel ran.

The last line printed is JSON: model, step_ms_plain, step_ms_monitored, overhead_pct (median
of paired step differences / median plain step), overhead_pct_direct (median time spent inside
the monitoring calls / median plain step: the same quantity measured without the step-to-step
noise), probe_v_ms, probe_ms, floor_ms, probe_v_over_floor and probe_over_floor (medians of the
per-repetition ratios), probe_host_ms (the host's time inside one pass), param_norm_ms,
device_pass / cpu_pass (which moment pass ran, and why), host_syncs_per_step (CUDA only, counted
under torch.cuda.set_sync_debug_mode), the run's settings, and on a device ``before``: the
monitored step, the host time inside the calls, the pass and its host time with the device pass
as it was before issue 36, interleaved in the same run (:func:`pass_before`). ``scripts/gpu_check.py`` calls
:func:`measure`.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import sys
import time
import warnings
from pathlib import Path

import torch

from stability_callbacks.config import Sampling
from stability_callbacks.integrations.torch import native, reductions, triton_kernel
from stability_callbacks.integrations.torch.optim_state import find_adam_state
from stability_callbacks.integrations.torch.reductions import MomentPass, moment_stats, param_sq_sum

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from host_reads import DispatchedOps  # noqa: E402
from stability_callbacks.integrations.torch.session import LiveSession
from stability_callbacks.live import LiveRun

#: GPT-2 small: transformers' GPT2Config() defaults (12 layers, 768 wide, 50257 vocab = 124 M).
GPT2_SMALL: dict = {}
#: A tiny GPT-2 for CPU smoke runs (0.2 M parameters).
GPT2_TINY = {"n_layer": 2, "n_embd": 64, "n_head": 2, "vocab_size": 1000, "n_positions": 128}


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()  # host-sync: benchmark timing boundary


class _Timer:
    """Milliseconds of ``fn()``: CUDA events around the device work (one sync at the end of the
    repetitions), else the wall clock."""

    def __init__(self, device):
        self.cuda = device.type == "cuda"
        self._events: list = []

    def time(self, fn, into: list, host: list) -> None:
        """``into``: the time of ``fn``'s work; ``host``: the host's time inside the call."""
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            t0 = time.perf_counter()
            fn()
            host.append((time.perf_counter() - t0) * 1e3)
            end.record()
            self._events.append((start, end, into))
        else:
            t0 = time.perf_counter()
            fn()
            into.append((time.perf_counter() - t0) * 1e3)
            host.append(into[-1])

    def collect(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()  # host-sync: benchmark timing boundary
            for start, end, into in self._events:
                into.append(start.elapsed_time(end))
            self._events.clear()


def measure(device="cpu", *, model_config: dict | None = None, dtype=torch.float32, pairs: int = 8,
            warmup_pairs: int = 1, seq_len: int = 128, batch_size: int = 1, grad_accum: int = 2,
            probe_reps: int = 15, adam_every: int = Sampling.adam_every_n_steps,
            probe_only: bool = False, compare_before: bool | None = None) -> dict:
    """The figures of one run (the module docstring); ``model_config``: GPT2Config keywords
    (default: GPT-2 small); ``dtype``: the model's and so the Adam state's dtype;
    ``compare_before`` (default: on a device): the same figures for the device pass before issue
    36 (:func:`pass_before`), interleaved with the others, under ``before``."""
    device = torch.device(device)
    if compare_before is None:
        compare_before = device.type != "cpu"
    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    cfg = GPT2Config(**(GPT2_SMALL if model_config is None else model_config))
    model = GPT2LMHeadModel(cfg).to(device, dtype)
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    params = [p for p in model.parameters() if p.requires_grad]
    gen = torch.Generator().manual_seed(0)

    def micro_batches():
        for _ in range(grad_accum):
            ids = torch.randint(0, cfg.vocab_size, (batch_size, seq_len), generator=gen)
            yield ids.to(device)

    def plain_step():
        for ids in micro_batches():
            loss = model(input_ids=ids, labels=ids).loss / grad_accum
            loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    # No run log, no alert sinks: the per-step path.
    session = LiveSession(LiveRun(config={"actions": {}}, run_dir=None))
    session.probe.device, session.probe.adam_every_n_steps = device, adam_every
    session.run.start(0)
    state = {"step": 0, "monitor_s": 0.0, "syncs": 0}

    def timed(fn, *a, **kw):
        # time (and on CUDA, count host syncs of) the monitoring calls only
        t0 = time.perf_counter()
        if device.type == "cuda":
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    out = fn(*a, **kw)
                finally:
                    torch.cuda.set_sync_debug_mode(0)
            state["syncs"] += sum("synchroniz" in str(w.message) for w in caught)
        else:
            out = fn(*a, **kw)
        state["monitor_s"] += time.perf_counter() - t0
        return out

    after_pass = session.probe.moments

    def monitored_step(before=False):
        state["step"] += 1
        state["monitor_s"] = 0.0
        session.probe.moments = pass_before if before else after_pass
        for ids in micro_batches():
            loss = model(input_ids=ids, labels=ids).loss / grad_accum
            loss.backward()
            timed(session.add_micro_batch, loss=loss, input_ids=ids)
        # the callback's norm is the one used for clipping: computed once either way
        norm = session.before_optimizer_step(params=params)
        torch.nn.utils.clip_grads_with_norm_(params, 1.0, norm)
        timed(session.probe.set_lr, opt.param_groups[0]["lr"])
        opt.step()
        opt.zero_grad(set_to_none=True)
        timed(session.end_step, state["step"], optimizer=opt)
        timed(session.requests, state["step"])
        timed(session.control.step_done)

    def time_step(fn):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        return (time.perf_counter() - t0) * 1e3

    if probe_only:
        pairs = 0
        plain_step()
    for _ in range(0 if probe_only else warmup_pairs):
        time_step(plain_step)
        time_step(monitored_step)
    plain_ms, mon_ms, diffs, direct_ms = [], [], [], []
    before_ms, diffs_before, direct_before = [], [], []
    state["syncs"] = 0
    for i in range(pairs):
        # rotate the order inside a pair (or triple) so that no kind always runs first
        kinds = ["plain", "monitored"] + (["before"] if compare_before else [])
        got = {}
        for kind in kinds[i % len(kinds):] + kinds[:i % len(kinds)]:
            if kind == "plain":
                got[kind] = time_step(plain_step)
                continue
            syncs = state["syncs"]
            got[kind] = time_step(lambda before=kind == "before": monitored_step(before=before))
            got[kind + "_direct"] = state["monitor_s"] * 1e3
            if kind == "before":
                state["syncs"] = syncs   # the count is the pass's of this tree
        plain_ms.append(got["plain"])
        mon_ms.append(got["monitored"])
        diffs.append(got["monitored"] - got["plain"])
        direct_ms.append(got["monitored_direct"])
        if compare_before:
            before_ms.append(got["before"])
            diffs_before.append(got["before"] - got["plain"])
            direct_before.append(got["before_direct"])
    syncs_monitored = state["syncs"]
    session.close()

    # The Adam probe's pass vs the floor: interleaved repetitions on the real AdamW state, each
    # repetition in a rotated order (none always runs first).
    adam = find_adam_state(opt)
    v_only = dataclasses.replace(adam, exp_avg=None)
    total = sum(t.numel() for t in adam.exp_avg_sq)
    flat = torch.empty(total, dtype=adam.exp_avg_sq[0].dtype, device=device).uniform_()
    moments = MomentPass()   # the pass as the probe runs it: its layout and table kept
    timed_fns = {"floor": flat.sum, "probe_v": _kept(v_only), "probe": lambda: moments(opt),
                 "param_norm": lambda: param_sq_sum(params)}
    if compare_before:
        timed_fns["probe_before"] = lambda: pass_before(opt)
    times: dict[str, list[float]] = {k: [] for k in timed_fns}
    host: dict[str, list[float]] = {k: [] for k in timed_fns}
    timer = _Timer(device)
    for fn in timed_fns.values():   # untimed: first-call costs
        fn()
    for rep in range(probe_reps):
        names = list(timed_fns)
        for name in names[rep % len(names):] + names[:rep % len(names)]:
            timer.time(timed_fns[name], times[name], host[name])
    timer.collect()
    probe_v_ms, probe_ms, floor_ms, pnorm_ms = (times[k] for k in ("probe_v", "probe", "floor", "param_norm"))

    # The pass against a float64 reference (max exact; sums to accumulation order).
    got = moments(opt)[1]
    ref_l1 = math.fsum(float(t.double().sum()) for t in adam.exp_avg_sq)
    ref_m = math.fsum(float(t.double().square().sum()) for t in adam.exp_avg)
    exact = {"max_equal": float(got.v_max) == max(float(t.max()) for t in adam.exp_avg_sq if t.numel()),
             "l1_rel_err": abs(float(got.v_l1) - ref_l1) / ref_l1,
             "exp_avg_rel_err": abs(float(got.m_sq) - ref_m) / ref_m}

    def med(xs):
        return statistics.median(xs) if xs else None

    def rnd(x, nd):
        return None if x is None else round(x, nd)

    step_plain = med(plain_ms)
    return {
        "model": f"gpt2 ({n_params / 1e6:.1f}M params, {cfg.n_layer} layers x {cfg.n_embd}, {str(dtype)[6:]})",
        "device": str(device) if device.type != "cuda" else torch.cuda.get_device_name(device),
        "threads": torch.get_num_threads(),
        "step_ms_plain": rnd(step_plain, 2),
        "step_ms_monitored": rnd(med(mon_ms), 2),
        "overhead_pct": rnd(100.0 * med(diffs) / step_plain, 3) if plain_ms else None,
        "overhead_pct_direct": rnd(100.0 * med(direct_ms) / step_plain, 4) if plain_ms else None,
        "monitor_ms_direct": rnd(med(direct_ms), 3),
        "probe_v_ms": round(med(probe_v_ms), 3),
        "probe_ms": round(med(probe_ms), 3),
        "floor_ms": round(med(floor_ms), 3),
        "probe_v_over_floor": round(med([a / b for a, b in zip(probe_v_ms, floor_ms)]), 3),
        "probe_over_floor": round(med([a / b for a, b in zip(probe_ms, floor_ms)]), 3),
        "param_norm_ms": round(med(pnorm_ms), 3),
        "probe_host_ms": round(med(host["probe"]), 3),
        "device_pass": _kernel_name(moments) if device.type != "cpu" else None,
        **({"before": {   # the device pass before issue 36 (pass_before), in the same run
            "step_ms_monitored": rnd(med(before_ms), 2),
            "overhead_pct": rnd(100.0 * med(diffs_before) / step_plain, 3) if plain_ms else None,
            "monitor_ms_direct": rnd(med(direct_before), 3),
            "probe_ms": round(med(times["probe_before"]), 3),
            "probe_over_floor": round(med([a / b for a, b in zip(times["probe_before"], floor_ms)]), 3),
            "probe_host_ms": round(med(host["probe_before"]), 3)}} if compare_before else {}),
        "cpu_pass": native.status() if device.type == "cpu" else None,
        "pass_exact": exact,
        "exp_avg_sq_numel": total,
        "host_syncs_per_step": (syncs_monitored / pairs) if device.type == "cuda" and pairs else None,
        "pairs": pairs, "seq_len": seq_len, "batch_size": batch_size, "grad_accum": grad_accum,
        "adam_every": adam_every,
        "step_ms_plain_all": [round(x, 1) for x in plain_ms],
        "step_ms_monitored_all": [round(x, 1) for x in mon_ms],
        "probe_v_ms_all": [round(x, 2) for x in probe_v_ms],
        "probe_ms_all": [round(x, 2) for x in probe_ms],
        "floor_ms_all": [round(x, 2) for x in floor_ms],
    }


def probe_host(device="meta", *, tensor_scale: int = 1, calls: int = 200, before: bool = True) -> dict:
    """``--probe-host``: the dispatched ops and the median host time of one Adam probe call on the
    device path, over GPT-2 124M's parameter tensors repeated ``tensor_scale`` times (state as
    after a step, uninitialised: only its layout matters); ``before``: the same for the pass
    before issue 36 (the layout found afresh each call, torch's multi-tensor kernels)."""
    device = torch.device(device)
    from transformers import GPT2Config, GPT2LMHeadModel
    with torch.device("meta"):
        shapes = [p.shape for p in GPT2LMHeadModel(GPT2Config()).parameters()] * tensor_scale
    params = [torch.nn.Parameter(torch.empty(s, device=device)) for s in shapes]
    opt = torch.optim.AdamW(params, lr=3e-4)
    for p in params:
        opt.state[p] = {"step": torch.tensor(1.0), "exp_avg": torch.empty_like(p), "exp_avg_sq": torch.empty_like(p)}
    saved = reductions.FOREACH_FAST_DEVICES
    if device.type == "cpu":   # CPU tensors on the device path (the kernel's contract in torch ops)
        reductions.FOREACH_FAST_DEVICES = (*saved, "cpu")
    moments = MomentPass()
    try:
        out = {"device": str(device), "tensors": len(shapes),
               **_host_figures(lambda: moments(opt), device, calls)}
        out["kernel"] = _kernel_name(moments)
        if before:
            out["before"] = _host_figures(lambda: pass_before(opt), device, max(10, calls // 10))
            out["before"]["what"] = "the pass before issue 36 (pass_before)"
    finally:
        reductions.FOREACH_FAST_DEVICES = saved
    out["load_avg"] = [round(x, 2) for x in os.getloadavg()]
    return out


def pass_before(optimizer):
    """The device pass as it was before issue 36, kept here only to compare (``before`` figures):
    the layout found afresh each call, then torch's multi-tensor kernels, their one-tensor-per-input
    results stacked, the per-tensor sums through a cached index. ``(AdamState, MomentStats)``, as
    :class:`MomentPass` returns (the probe's ``moments`` can be swapped for it)."""
    state = find_adam_state(optimizer)
    keep = [i for i, t in enumerate(state.exp_avg_sq) if t.numel() > 0]
    vs = [state.exp_avg_sq[i] for i in keep]
    ms = [state.exp_avg[i] for i in keep]
    v_max, piece_v, piece_m = reductions._moments_foreach(vs, ms)
    idx = reductions._index(tuple(state.tensor_of[i] for i in keep), vs[0].device)
    per_tensor = torch.zeros((state.num_tensors, 2), dtype=torch.float64, device=vs[0].device)
    per_tensor.index_add_(0, idx, torch.stack([piece_v, piece_m], 1))
    return state, reductions.MomentStats(v_max, piece_v.sum(), piece_m.sum(), state.numel, state.partitioned,
                                         per_tensor)


def _kept(state):
    """The pass over ``state`` with its table built once (as :class:`MomentPass` keeps it)."""
    if not reductions._takes_device_pass(state):
        return lambda: moment_stats(state)
    plan = reductions._DevicePlan(state)
    return lambda: plan.run(state)


def _host_figures(fn, device, calls: int) -> dict:
    fn()   # the first call builds the layout and the table (and compiles the kernel)
    with DispatchedOps() as mode:
        fn()
    times = []
    for i in range(calls):
        if i % 20 == 0:
            _sync(device)   # never let the device's queue fill up and hold the host back
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    _sync(device)
    return {"ops": sum(mode.ops.values()), "host_ms": round(statistics.median(times), 4),
            "host_ms_p10_p90": [round(statistics.quantiles(times, n=10)[k], 4) for k in (0, 8)],
            "calls": calls, "ops_by_name": dict(mode.ops)}


def _kernel_name(moments: MomentPass) -> str:
    plan = moments._plan
    if plan is None or plan.kernel is None:
        return "multi-tensor kernels"
    return {"cuda": triton_kernel.status(), "meta": "none (meta: shapes only)"}.get(
        plan.device.type, "the kernel's contract in torch ops (CPU)")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=8, help="plain/monitored step pairs timed")
    ap.add_argument("--warmup-pairs", type=int, default=1)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--grad-accum", type=int, default=2)
    ap.add_argument("--probe-reps", type=int, default=15)
    ap.add_argument("--adam-every", type=int, default=Sampling.adam_every_n_steps,
                    help="the Adam probe's cadence in the monitored steps (0: off; default: the config's)")
    ap.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32", help="the model's (and Adam state's) dtype")
    ap.add_argument("--device", default=None,
                    help="default: cuda when there is one, else cpu (--probe-host: else meta)")
    ap.add_argument("--probe-only", action="store_true",
                    help="one step to create the Adam state, then only the pass vs the floor")
    ap.add_argument("--probe-host", action="store_true",
                    help="the Adam probe's dispatched ops and host time per call on the device path (issue 36)")
    ap.add_argument("--tensor-scale", type=int, default=1, help="--probe-host: GPT-2's 148 tensors times this")
    ap.add_argument("--calls", type=int, default=200, help="--probe-host: calls timed")
    args = ap.parse_args(argv)
    cuda = torch.cuda.is_available()
    if args.probe_host:
        if args.device == "cpu":
            ap.error("--probe-host times the device path: --device cuda or meta (CPU tensors take it only "
                     "through the kernel's contract in torch ops, item by item: a test path, not a timing)")
        r = probe_host(args.device or ("cuda" if cuda else "meta"), tensor_scale=args.tensor_scale, calls=args.calls)
        print(f"probe-host: tensors={r['tensors']} ops={r['ops']} host_ms={r['host_ms']}")
        print(json.dumps(r))
        return
    print(json.dumps(measure(args.device or ("cuda" if cuda else "cpu"), dtype={"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype],
                             pairs=args.pairs, warmup_pairs=args.warmup_pairs, seq_len=args.seq_len,
                             batch_size=args.batch_size, grad_accum=args.grad_accum,
                             probe_reps=args.probe_reps, adam_every=args.adam_every,
                             probe_only=args.probe_only)))


if __name__ == "__main__":
    main()
