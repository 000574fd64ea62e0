"""Per-step monitoring overhead on a GPT-2-small-sized model (124 M parameters, no download).

Plain and monitored optimizer steps of ONE model alternate in one run (so drift in machine load
hits both alike). "Monitored" adds everything an integration does per step through its
``LiveSession`` except the Adam probe: micro-batch intake (device-side loss accumulation, batch
fingerprint), the grad norm reused for clipping (``before_optimizer_step`` +
``clip_grads_with_norm_`` in place of ``clip_grad_norm_``), the LR, ``end_step`` (packing, host
copy, poll, ``LiveRun.observe``: the Monitor) and the requests.
The Adam second-moment probe is timed on its own (``probe_ms``) against ``floor_ms``: one
``sum`` over a single contiguous buffer as large as all ``exp_avg_sq`` together.

    python scripts/bench_overhead.py [--pairs 8] [--seq-len 128] [--batch-size 1] [--grad-accum 2]

The last line printed is JSON: model, step_ms_plain, step_ms_monitored, overhead_pct (median
of paired step differences / median plain step), overhead_pct_direct (median time spent inside
the monitoring calls / median plain step: the same quantity measured without the step-to-step
noise), probe_ms, floor_ms, probe_over_floor, param_norm_ms, host_syncs_per_step (CUDA only,
counted under torch.cuda.set_sync_debug_mode), and the run's settings.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
import warnings

import torch

from stability_callbacks.integrations.torch.optim_state import find_second_moments
from stability_callbacks.integrations.torch.reductions import param_sq_sum, second_moment_stats
from stability_callbacks.integrations.torch.session import LiveSession
from stability_callbacks.live import LiveRun


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()  # host-sync: benchmark timing boundary


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pairs", type=int, default=8, help="plain/monitored step pairs timed")
    ap.add_argument("--warmup-pairs", type=int, default=1)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=1)
    ap.add_argument("--grad-accum", type=int, default=2)
    ap.add_argument("--probe-reps", type=int, default=15)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--probe-only", action="store_true",
                    help="one step to create the Adam state, then only probe_ms vs floor_ms")
    args = ap.parse_args(argv)
    device = torch.device(args.device)

    from transformers import GPT2Config, GPT2LMHeadModel
    torch.manual_seed(0)
    cfg = GPT2Config()          # default sizes: 12 layers, 768 wide, 50257 vocab = 124 M
    model = GPT2LMHeadModel(cfg).to(device)
    model.train()
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1)
    params = [p for p in model.parameters() if p.requires_grad]
    gen = torch.Generator().manual_seed(0)

    def micro_batches():
        for _ in range(args.grad_accum):
            ids = torch.randint(0, cfg.vocab_size, (args.batch_size, args.seq_len), generator=gen)
            yield ids.to(device)

    def plain_step():
        for ids in micro_batches():
            loss = model(input_ids=ids, labels=ids).loss / args.grad_accum
            loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    # No run log, no alert sinks, no Adam probe (timed on its own below): the per-step path.
    session = LiveSession(LiveRun(config={"actions": {}}, run_dir=None))
    session.probe.device, session.probe.adam_every_n_steps = device, 0
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

    def monitored_step():
        state["step"] += 1
        state["monitor_s"] = 0.0
        for ids in micro_batches():
            loss = model(input_ids=ids, labels=ids).loss / args.grad_accum
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

    if args.probe_only:
        args.pairs = 0
        plain_step()
    for _ in range(0 if args.probe_only else args.warmup_pairs):
        time_step(plain_step)
        time_step(monitored_step)
    plain_ms, mon_ms, diffs, direct_ms = [], [], [], []
    state["syncs"] = 0
    for i in range(args.pairs):
        # alternate the order inside a pair so neither kind always runs "second"
        if i % 2 == 0:
            p = time_step(plain_step)
            m = time_step(monitored_step)
        else:
            m = time_step(monitored_step)
            p = time_step(plain_step)
        plain_ms.append(p)
        mon_ms.append(m)
        diffs.append(m - p)
        direct_ms.append(state["monitor_s"] * 1e3)
    syncs_monitored = state["syncs"]
    session.close()

    # Adam probe vs the floor: interleaved repetitions on the real AdamW state
    sm = find_second_moments(opt)
    total = sum(t.numel() for t in sm.tensors)
    flat = torch.empty(total, dtype=torch.float32, device=device).uniform_()
    probe_ms, floor_ms, pnorm_ms = [], [], []
    flat.sum(), second_moment_stats(opt), param_sq_sum(params)   # untimed: first-call costs
    for _ in range(args.probe_reps):
        _sync(device)
        t0 = time.perf_counter()
        flat.sum()
        _sync(device)
        floor_ms.append((time.perf_counter() - t0) * 1e3)
        t0 = time.perf_counter()
        second_moment_stats(opt)
        _sync(device)
        probe_ms.append((time.perf_counter() - t0) * 1e3)
        t0 = time.perf_counter()
        param_sq_sum(params)
        _sync(device)
        pnorm_ms.append((time.perf_counter() - t0) * 1e3)

    def med(xs):
        return statistics.median(xs) if xs else None

    def rnd(x, nd):
        return None if x is None else round(x, nd)

    step_plain = med(plain_ms)
    out = {
        "model": f"gpt2-small ({n_params / 1e6:.1f}M params, GPT2Config() defaults)",
        "device": str(device),
        "threads": torch.get_num_threads(),
        "step_ms_plain": rnd(step_plain, 2),
        "step_ms_monitored": rnd(med(mon_ms), 2),
        "overhead_pct": rnd(100.0 * med(diffs) / step_plain, 3) if plain_ms else None,
        "overhead_pct_direct": rnd(100.0 * med(direct_ms) / step_plain, 4) if plain_ms else None,
        "monitor_ms_direct": rnd(med(direct_ms), 3),
        "probe_ms": round(med(probe_ms), 2),
        "floor_ms": round(med(floor_ms), 2),
        "probe_over_floor": round(med(probe_ms) / med(floor_ms), 3),
        "param_norm_ms": round(med(pnorm_ms), 2),
        "exp_avg_sq_numel": total,
        "host_syncs_per_step": (syncs_monitored / args.pairs)
        if device.type == "cuda" and args.pairs else None,
        "pairs": args.pairs, "seq_len": args.seq_len, "batch_size": args.batch_size,
        "grad_accum": args.grad_accum,
        "step_ms_plain_all": [round(x, 1) for x in plain_ms],
        "step_ms_monitored_all": [round(x, 1) for x in mon_ms],
        "probe_ms_all": [round(x, 1) for x in probe_ms],
        "floor_ms_all": [round(x, 1) for x in floor_ms],
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
