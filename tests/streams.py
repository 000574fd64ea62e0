"""Seeded synthetic metric streams: a healthy run plus one planted phenomenon each."""
from __future__ import annotations

import math
import random

from stability_callbacks import Monitor, StepRecord


def healthy(n: int = 600, *, seed: int = 0, warmup: int = 50, noise: float = 0.01,
            grad_norm: bool = True, adam: bool = False) -> list[StepRecord]:
    """A decreasing loss with 1% multiplicative noise, linear warmup then cosine decay."""
    rng = random.Random(seed)
    out = []
    for s in range(1, n + 1):
        loss = (2.0 + 6.0 * math.exp(-s / 150)) * math.exp(rng.gauss(0, noise))
        lr = 3e-4 * s / warmup if s <= warmup else 3e-4 * 0.5 * (1 + math.cos(math.pi * (s - warmup) / (2 * n)))
        m = {"loss": loss, "lr": lr}
        if grad_norm:
            m["grad_norm"] = (0.5 + 2.0 * math.exp(-s / 100)) * math.exp(rng.gauss(0, 0.05))
        if adam:
            # exp_avg_sq as torch keeps it: an EMA from 0 (beta2 = 0.999) whose bias-corrected
            # value follows the gradients' second moment
            v = 1e-6 * (1 + 3 * math.exp(-s / 100)) * math.exp(rng.gauss(0, 0.02)) * (1 - 0.999 ** s)
            m.update({"adam/exp_avg_sq_max": v * 50, "adam/exp_avg_sq_l1": v * 1e6,
                      "adam/exp_avg_sq_numel": 1e6})
        out.append(StepRecord(s, m))
    return out


def scale(records, key, factor_by_step):
    """Multiply ``key`` by ``factor_by_step(step)`` (returning 1.0 leaves it alone)."""
    for r in records:
        if key in r.metrics:
            r.metrics[key] *= factor_by_step(r.step)
    return records


def two_stream_losses(logits, labels) -> dict:
    """Per-dataset losses of an LM batch whose first half of rows is stream "a", the rest "b":
    the mean next-token cross-entropy of each half (what a model output's ``stream_losses``
    carries in the per-dataset loss tests of every integration)."""
    import torch

    logits = logits[:, :-1].float()
    per_row = torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1),
        reduction="none").view(labels.shape[0], -1).mean(1)
    half = labels.shape[0] // 2
    return {"a": per_row[:half].mean(), "b": per_row[half:].mean()}


def run(records, config=None):
    """Every record through one Monitor (its requests done each step): the findings and the Monitor."""
    m = Monitor(config)
    out = []
    for r in records:
        out += m.update(r)
        m.control.step_done()
    return out, m


def found(findings, *, min_severity="info"):
    """``(step, kind, severity)`` of the findings at ``min_severity`` or above, warmup_end aside."""
    order = {"info": 0, "warning": 1, "critical": 2}
    return [(f.step, f.kind, f.severity) for f in findings
            if f.kind != "warmup_end" and order[f.severity] >= order[min_severity]]
