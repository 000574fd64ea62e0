"""Synthetic runs that follow how the numbers are produced, for the rules that depend on it:
Adam's zero-initialised second moment.

Each returns a list of StepRecords, seeded and exact, like ``streams.healthy``.
"""
from __future__ import annotations

import math
import random

from stability_callbacks import StepRecord


def warmup_lr(step: int, warmup: int, peak: float = 3e-3) -> float:
    return peak * min(step / warmup, 1.0)


def adam_run(n: int, *, warmup: int = 20, beta2: float = 0.999, numel: int = 256, seed: int = 0,
             grad_scale=lambda s: 1.0, spike_at: int | None = None, keys: bool = True) -> list[StepRecord]:
    """Adam's ``exp_avg_sq`` as the probe reads it: ``v ← beta2·v + (1 − beta2)·g²`` per coordinate
    from v = 0, with g ~ N(0, (σ_i · grad_scale(step))²) and per-coordinate σ_i spread over two
    decades (so max and mean differ). ``spike_at``: one step whose gradients are 30x larger.
    ``keys``: also report ``adam/beta2`` and ``adam/step`` (a probe that knows them)."""
    rng = random.Random(seed)
    sigma = [10 ** rng.uniform(-4, -2) for _ in range(numel)]
    v = [0.0] * numel
    out = []
    for s in range(1, n + 1):
        k = grad_scale(s) * (30.0 if s == spike_at else 1.0)
        for i in range(numel):
            g = rng.gauss(0.0, sigma[i] * k)
            v[i] = beta2 * v[i] + (1 - beta2) * g * g
        m = {"lr": warmup_lr(s, warmup), "adam/exp_avg_sq_max": max(v), "adam/exp_avg_sq_l1": sum(v),
             "adam/exp_avg_sq_numel": float(numel)}
        if keys:
            m.update({"adam/beta2": beta2, "adam/step": float(s)})
        out.append(StepRecord(s, m))
    return out
