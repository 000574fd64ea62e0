"""Per-step cost of skip step and of the rollback machinery on ordinary steps, side by side.

One model, three kinds of optimizer step interleaved in one run (machine-load drift hits all
alike): **plain** (forward/backward, ``clip_grad_norm_``, ``optimizer.step``), **monitored** (what
an integration does per step through its ``LiveSession``: micro-batch intake, the grad norm reused
for clipping, ``end_step``, requests; no Adam probe, as in ``bench_overhead.py``) and **monitored +
skip** (the same with ``policy.skip_step_on: grad_outlier``: the device-side decision, the gated
``optimizer.step`` and the flag in the record). Run for a fused AdamW (the sync-free ``found_inf``
path) and a foreach AdamW (one host boolean per step).

The rollback machinery on ordinary steps is the skip-aware sampler: one pass over a DataLoader
of a map-style dataset with and without :class:`DataSkipSampler` (two skipped ranges in force), and
the gated step with an LR factor (``lr_factor_steps`` window) versus the plain step.

    python scripts/bench_skip_rollback.py [--layers 4 --width 256 --seq-len 128 --pairs 12]

Prints a table and, last, one JSON line: per optimizer ``step_ms`` of each kind (medians),
``skip_over_monitored`` and ``skip_over_plain`` (ratios of medians), ``host_syncs_per_step`` of
the monitored + skip step (CUDA only, counted under ``torch.cuda.set_sync_debug_mode``), the
LR-window gate's step vs a bare step, and the sampler's ``batch_ms`` with/without.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
import warnings

import torch

from stability_callbacks.control import DataSkips
from stability_callbacks.integrations.torch.auto_rollback import install_sampler
from stability_callbacks.integrations.torch.session import LiveSession
from stability_callbacks.integrations.torch.skip_step import GatedStep
from stability_callbacks.live import LiveRun


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()  # host-sync: benchmark timing boundary


def bench_steps(args, device, fused: bool) -> dict:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    cfg = GPT2Config(n_layer=args.layers, n_embd=args.width, n_head=max(1, args.width // 64),
                     n_positions=args.seq_len, vocab_size=args.vocab)
    model = GPT2LMHeadModel(cfg).to(device).train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=3e-4, fused=fused, foreach=None if fused else True)
    gen = torch.Generator().manual_seed(0)

    def micro_batches():
        for _ in range(args.grad_accum):
            yield torch.randint(0, cfg.vocab_size, (args.batch_size, args.seq_len), generator=gen).to(device)

    def session(skip: bool) -> LiveSession:
        policy = {"skip_step_on": "grad_outlier"} if skip else {}
        s = LiveSession(LiveRun(config={"actions": {}, "policy": policy}, run_dir=None))
        s.probe.device, s.probe.adam_every_n_steps = device, 0
        s.run.start(0)
        return s

    plain_s, skip_s = session(False), session(True)
    state = {"step": 0, "syncs": 0, "calls_s": 0.0, "inner_s": 0.0}

    def clocked(fn, key):
        def call(*a, **kw):
            t0 = time.perf_counter()
            try:
                return fn(*a, **kw)
            finally:
                state[key] += time.perf_counter() - t0
        return call

    # Time inside the skip calls directly (the step-to-step noise of a loaded box hides them):
    # the decision, the record's flag, the next rule, and the gate minus the step it wraps.
    sk = skip_s.skip
    sk.decide, sk.report, sk.set_threshold = (clocked(sk.decide, "calls_s"), clocked(sk.report, "calls_s"),
                                              clocked(sk.set_threshold, "calls_s"))

    def plain_step():
        for ids in micro_batches():
            (model(input_ids=ids, labels=ids).loss / args.grad_accum).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    def monitored_step(s: LiveSession):
        state["step"] += 1
        gate = None
        if s.skip is not None:   # what the adapters install, around a clocked optimizer step
            opt.step = clocked(type(opt).step.__get__(opt), "inner_s")
            gate = GatedStep(opt, skip=s.skip)
        for ids in micro_batches():
            loss = model(input_ids=ids, labels=ids).loss / args.grad_accum
            loss.backward()
            s.add_micro_batch(loss=loss, input_ids=ids)
        norm = s.before_optimizer_step(params=params)    # with skip: the decision, on the device
        torch.nn.utils.clip_grads_with_norm_(params, 1.0, norm)
        s.probe.set_lr(opt.param_groups[0]["lr"])
        t0 = time.perf_counter()
        opt.step()                                        # gated: found_inf or the host boolean
        gated_s = time.perf_counter() - t0
        opt.zero_grad(set_to_none=True)
        s.end_step(state["step"], optimizer=opt)
        s.requests(state["step"])
        s.control.step_done()
        if gate is not None:
            gate.close()
            del opt.step
            state["calls_s"] += gated_s - state["inner_s"]
        state["inner_s"] = 0.0

    kinds = {"plain": plain_step, "monitored": lambda: monitored_step(plain_s),
             "monitored_skip": lambda: monitored_step(skip_s)}

    def run(name):
        _sync(device)
        t0 = time.perf_counter()
        if device.type == "cuda" and name == "monitored_skip":
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                torch.cuda.set_sync_debug_mode("warn")
                try:
                    kinds[name]()
                finally:
                    torch.cuda.set_sync_debug_mode(0)
            state["syncs"] += sum("synchroniz" in str(w.message) for w in caught)
        else:
            kinds[name]()
        _sync(device)
        return (time.perf_counter() - t0) * 1e3

    for name in kinds:                    # warm-up
        run(name)
    times = {k: [] for k in kinds}
    direct = []
    state["syncs"] = 0
    order = list(kinds)
    for i in range(args.pairs):
        for name in order[i % 3:] + order[:i % 3]:   # rotate so none always runs first
            state["calls_s"] = 0.0
            times[name].append(run(name))
            if name == "monitored_skip":
                direct.append(state["calls_s"] * 1e3)
    plain_s.close()
    skip_s.close()
    med = {k: statistics.median(v) for k, v in times.items()}
    return {"optimizer": "AdamW(fused=True)" if fused else "AdamW(foreach=True)",
            "params_m": round(sum(p.numel() for p in params) / 1e6, 1),
            "step_ms": {k: round(v, 2) for k, v in med.items()},
            "skip_over_monitored": round(med["monitored_skip"] / med["monitored"], 4),
            "skip_over_plain": round(med["monitored_skip"] / med["plain"], 4),
            "skip_calls_ms": round(statistics.median(direct), 4),
            "skip_calls_pct_of_plain": round(100 * statistics.median(direct) / med["plain"], 4),
            "host_syncs_per_step": state["syncs"] / args.pairs if device.type == "cuda" else None,
            "step_ms_all": {k: [round(x, 1) for x in v] for k, v in times.items()}}


def bench_lr_gate(args, device) -> dict:
    """An automatic rollback's LR window on ordinary steps: the gated step vs the plain one."""
    torch.manual_seed(0)
    model = torch.nn.Linear(args.width, args.width).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(torch.randn(8, args.width, device=device)).sum().backward()
    skips = DataSkips([[100, 120]], [1, 10 ** 9, 0.5], 1)
    gated, bare = [], []
    for _ in range(args.reps * 5):        # interleaved: the gated step, then the bare one
        gate = GatedStep(opt, lr_factor=lambda: skips.lr_factor_at(5))
        t0 = time.perf_counter()
        opt.step()
        gated.append((time.perf_counter() - t0) * 1e3)
        gate.close()
        t0 = time.perf_counter()
        opt.step()
        bare.append((time.perf_counter() - t0) * 1e3)
    return {"step_ms_gated_lr": round(statistics.median(gated), 4),
            "step_ms_plain": round(statistics.median(bare), 4)}


def bench_sampler(args) -> dict:
    n = args.samples
    data = torch.arange(n)

    def one_pass(loader) -> float:
        t0 = time.perf_counter()
        k = 0
        for _ in loader:
            k += 1
        return (time.perf_counter() - t0) * 1e3 / max(k, 1)

    plain = torch.utils.data.DataLoader(data, batch_size=args.batch_size)
    wrapped = torch.utils.data.DataLoader(data, batch_size=args.batch_size)
    install_sampler(wrapped, samples_per_step=args.batch_size * args.grad_accum,
                    skips=lambda: DataSkips([[10, 20], [200, 260]]), start_step=lambda: 0)
    p, w = [], []
    for _ in range(args.reps):
        p.append(one_pass(plain))
        w.append(one_pass(wrapped))
    mp, mw = statistics.median(p), statistics.median(w)
    return {"samples": n, "batch_ms_plain": round(mp, 4), "batch_ms_skip_sampler": round(mw, 4),
            "sampler_over_plain": round(mw / mp, 3)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--width", type=int, default=256)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--grad-accum", type=int, default=2)
    ap.add_argument("--pairs", type=int, default=12, help="rounds of the three interleaved step kinds")
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--samples", type=int, default=20000, help="dataset size of the sampler pass")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    out = {"device": str(device), "threads": torch.get_num_threads(),
           "model": f"GPT-2 {args.layers} layers x {args.width}, seq {args.seq_len}, "
                    f"batch {args.batch_size} x GA {args.grad_accum}",
           "steps": [bench_steps(args, device, fused) for fused in (True, False)],
           "lr_gate": bench_lr_gate(args, device), "sampler": bench_sampler(args)}
    print(f"{'optimizer':<22}{'plain ms':>10}{'monitored':>11}{'+skip':>9}{'skip/mon':>10}"
          f"{'skip/plain':>12}{'skip calls ms':>15}")
    for r in out["steps"]:
        ms = r["step_ms"]
        print(f"{r['optimizer']:<22}{ms['plain']:>10.1f}{ms['monitored']:>11.1f}{ms['monitored_skip']:>9.1f}"
              f"{r['skip_over_monitored']:>10.3f}{r['skip_over_plain']:>12.3f}{r['skip_calls_ms']:>15.3f}")
    g = out["lr_gate"]
    print(f"LR-window gate: {g['step_ms_gated_lr']:.4f} ms per optimizer step vs {g['step_ms_plain']:.4f} bare")
    s = out["sampler"]
    print(f"sampler: {s['batch_ms_plain']:.4f} ms/batch plain, {s['batch_ms_skip_sampler']:.4f} with "
          f"DataSkipSampler ({s['sampler_over_plain']:.2f}x)")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
