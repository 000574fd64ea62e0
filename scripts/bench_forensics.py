"""What the data forensics costs (docs/design.md, Forensics), printed side by side.

Per step, what every monitored run pays with ``forensics.record_samples`` on (the default):
the shared sampler wrapper drawing each optimizer step's indices into the ring, timed over a
whole epoch of a ``DataLoader`` against the same loader with the plain sampler, and against the
wrapper without the ring (what an automatic rollback alone pays). With ``dump_batches`` the
session also keeps each micro-batch by reference: timed per step against not keeping it. Plain
and monitored repetitions alternate; the best of the repetitions (the one least disturbed by other
jobs, as ``timeit`` reports). At a finding only: the ranking forward of one
step's batch (the ``forward_ms`` a finding reports), with the tiny GPT-2 of the demo scenarios
and the training step it sits next to.

    python scripts/bench_forensics.py [--samples-per-step 512] [--steps 200] [--reps 7]

The last line printed is JSON with every figure.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from stability_callbacks.forensics import Forensics
from stability_callbacks.integrations.torch.forensics import TorchPeer
from stability_callbacks.integrations.torch.auto_rollback import DataSkipSampler


def _epoch_ms(loader) -> float:
    t0 = time.perf_counter()
    for _ in loader:
        pass
    return (time.perf_counter() - t0) * 1e3


def sampler_cost(samples_per_step: int, steps: int, reps: int, batch_size: int) -> dict:
    """ms per optimizer step of iterating a DataLoader (indices only: a dataset that returns its
    index, so the sampler's share is not hidden behind loading) with the plain sampler, the
    wrapper without the ring, and the wrapper recording into the ring."""
    n = samples_per_step * steps
    data = range(n)
    plain = torch.utils.data.DataLoader(data, batch_size=batch_size, collate_fn=list)
    wrapped = torch.utils.data.DataLoader(data, batch_size=batch_size, collate_fn=list, sampler=DataSkipSampler(
        torch.utils.data.SequentialSampler(data), samples_per_step=samples_per_step, skips=lambda: None))
    ring = Forensics().indices
    recording = torch.utils.data.DataLoader(data, batch_size=batch_size, collate_fn=list, sampler=DataSkipSampler(
        torch.utils.data.SequentialSampler(data), samples_per_step=samples_per_step, skips=lambda: None,
        record=lambda: ring))
    times: dict[str, list[float]] = {"plain": [], "wrapped": [], "recording": []}
    for _ in range(reps):
        for name, loader in (("plain", plain), ("wrapped", wrapped), ("recording", recording)):
            times[name].append(_epoch_ms(loader) / steps)
    assert ring.get(steps) == list(range((steps - 1) * samples_per_step, steps * samples_per_step))
    return {k: min(v) for k, v in times.items()}


def holding_cost(micro_batches: int, steps: int, reps: int) -> dict:
    """ms per step of the session's per-step forensics work: each micro-batch's sample count
    (a shape), the step's close with its check against the ring (every run), and with
    ``dump_batches`` a reference per micro-batch (a shallow copy of its mapping)."""
    from stability_callbacks.integrations.torch.forensics import held, rows_of

    batch = {"input_ids": torch.zeros(8, 128, dtype=torch.long), "labels": torch.zeros(8, 128, dtype=torch.long)}
    drawn = list(range(8 * micro_batches))
    off, on = Forensics(), Forensics(dump_batches=True)
    for fz in (off, on):
        fz.indices.samples_per_step = len(drawn)
    times: dict[str, list[float]] = {"record_only": [], "dump_batches": []}
    for _ in range(reps):
        for name, fz in (("record_only", off), ("dump_batches", on)):
            t0 = time.perf_counter()
            for s in range(steps):
                fz.indices.put(s, drawn)   # the sampler's insert (timed with the wrapper above too)
                rows = sum(rows_of(batch) for _ in range(micro_batches))
                kept = [held(batch) for _ in range(micro_batches)] if fz.dump_batches else []
                fz.step_closed(s, kept, rows=rows)
            times[name].append((time.perf_counter() - t0) * 1e3 / steps)
    assert off.indices.mismatch is None
    return {k: min(v) for k, v in times.items()}


def forward_cost(reps: int) -> dict:
    """ms of the ranking forward of one step (the demo scenario's tiny GPT-2, 8 samples x 32
    tokens in 2 micro-batches), next to one training step of the same batch."""
    from stability_callbacks.demo.scenarios import build_scenario

    sc = build_scenario("data-pocket", batch_size=4, grad_accum=2)
    model = sc.make_model()
    ids = sc.train_dataset().input_ids[:8]
    batches = [{"input_ids": ids[:4], "labels": ids[:4]}, {"input_ids": ids[4:], "labels": ids[4:]}]
    peer = TorchPeer(model)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    ranking, training = [], []
    for _ in range(reps):
        rows, ms, _ = peer.rank_rows(batches, list(range(8)), 1, 32)
        ranking.append(ms)
        t0 = time.perf_counter()
        for b in batches:
            (model(**b).loss / 2).backward()
        opt.step()
        opt.zero_grad()
        training.append((time.perf_counter() - t0) * 1e3)
    return {"ranking_forward_ms": statistics.median(ranking), "training_step_ms": statistics.median(training)}


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples-per-step", type=int, default=512, help="samples one optimizer step reads from the sampler")
    ap.add_argument("--batch-size", type=int, default=8, help="the loader's micro-batch size")
    ap.add_argument("--steps", type=int, default=200, help="optimizer steps per timed epoch")
    ap.add_argument("--micro-batches", type=int, default=8, help="micro-batches per step held with dump_batches")
    ap.add_argument("--reps", type=int, default=11)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    s = sampler_cost(a.samples_per_step, a.steps, a.reps, a.batch_size)
    h = holding_cost(a.micro_batches, a.steps * 10, a.reps)
    f = forward_cost(a.reps)
    us = lambda ms: f"{ms * 1e3:8.2f} us"  # noqa: E731
    print(f"per optimizer step, {a.samples_per_step} samples from the sampler in micro-batches of {a.batch_size} "
          f"(DataLoader, indices only; best of {a.reps} epochs of {a.steps} steps):")
    print(f"  plain sampler            {us(s['plain'])}")
    print(f"  wrapper, no ring         {us(s['wrapped'])}   ({us(s['wrapped'] - s['plain'])} vs plain)")
    print(f"  wrapper + ring (default) {us(s['recording'])}   ({us(s['recording'] - s['wrapped'])} vs the wrapper, "
          f"{us(s['recording'] - s['plain'])} vs plain; {s['recording'] / s['plain']:.3f}x plain)")
    print(f"per step, the session's forensics calls ({a.micro_batches} micro-batches):")
    print(f"  record only              {us(h['record_only'])}")
    print(f"  dump_batches (by ref)    {us(h['dump_batches'])}")
    print("at a finding only, one step's ranking forward (tiny GPT-2, 8 x 32 tokens, CPU, 1 thread):")
    print(f"  ranking forward          {f['ranking_forward_ms']:8.2f} ms   (a training step of it: "
          f"{f['training_step_ms']:.2f} ms)")
    out = {"samples_per_step": a.samples_per_step, "batch_size": a.batch_size, "steps": a.steps, "reps": a.reps,
           "step_us_plain": round(s["plain"] * 1e3, 2), "step_us_wrapped": round(s["wrapped"] * 1e3, 2),
           "step_us_recording": round(s["recording"] * 1e3, 2), "recording_vs_plain": round(s["recording"] / s["plain"], 3),
           "hold_us_record_only": round(h["record_only"] * 1e3, 3),
           "hold_us_dump_batches": round(h["dump_batches"] * 1e3, 3),
           "ranking_forward_ms": round(f["ranking_forward_ms"], 2), "training_step_ms": round(f["training_step_ms"], 2)}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
