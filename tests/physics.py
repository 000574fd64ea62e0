"""Synthetic runs that follow how the numbers are produced, for the rules that depend on it:
Adam's zero-initialised second moment, a log printing the loss to a few digits, a bf16 run's
constant loss scale, DeepSpeed's dynamic loss scaler, an RL objective that starts at 0.0.

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


def printed(x: float, decimals: int) -> float:
    """``x`` as a log printing ``decimals`` decimals shows it, read back."""
    return float(f"{x:.{decimals}f}")


def printed_losses(n: int, *, decimals: int, level: float = 2.0, noise: float = 0.01, seed: int = 0,
                   resolution: bool = False, frozen_from: int | None = None) -> list[StepRecord]:
    """A slowly falling loss with ``noise`` relative noise per point, printed to ``decimals``
    decimals (HF: 4, PaddleOCR: 6). ``resolution``: the reader reports ``loss_resolution``.
    ``frozen_from``: from this step on the model is frozen and the same loss is printed."""
    rng = random.Random(seed)
    out, frozen = [], None
    for s in range(1, n + 1):
        x = printed((level + 0.5 * math.exp(-s / 2000)) * math.exp(rng.gauss(0.0, noise)), decimals)
        if frozen_from is not None and s >= frozen_from:
            frozen = x if frozen is None else frozen
            x = frozen
        m = {"loss": x}
        if resolution:
            m["loss_resolution"] = 10.0 ** -decimals
        out.append(StepRecord(s, m))
    return out


def bf16_run(n: int, *, seed: int = 0, every: int = 1) -> list[StepRecord]:
    """bf16 Megatron: no loss scaling, yet ``loss scale: 1.0`` and 0 skipped on every line."""
    rng = random.Random(seed)
    return [StepRecord(s, {"loss": (2.0 + 6.0 * math.exp(-s / 300)) * math.exp(rng.gauss(0.0, 0.01)),
                           "grad_norm": 0.5 * math.exp(rng.gauss(0.0, 0.1)), "loss_scale": 1.0,
                           "skipped": 0.0})
            for s in range(every, n + 1, every)]


def dynamic_scaler_run(n: int, *, overflow, init_scale: float = 2.0 ** 16, min_scale: float = 1.0,
                       hysteresis: int = 2, scale_window: int = 1000, raise_at_min: bool = True,
                       every: int = 1) -> list[StepRecord]:
    """DeepSpeed's DynamicLossScaler (``loss_scaler.py``): an overflowed step is skipped and, once
    ``hysteresis`` overflows have used up the delay, halves the scale (not below ``min_scale``);
    ``scale_window`` clean steps double it. At ``min_scale`` an overflow stops the run when
    ``raise_at_min`` (DeepSpeed), else the step is skipped at the same scale (Megatron, metaseq).
    ``overflow(step)`` says which steps overflow. Records carry the scale after the update;
    ``every``: a log line every that many steps, with the count of skipped steps since the last."""
    scale, left, last_overflow, skips = init_scale, hysteresis, 0, 0
    out = []
    for s in range(1, n + 1):
        skipped = overflow(s)
        skips += skipped
        if skipped:
            if left <= 1:
                if scale <= min_scale and raise_at_min:
                    break   # "Current loss scale already at minimum - cannot decrease scale anymore"
                scale = max(scale / 2.0, min_scale)
            else:
                left -= 1
            last_overflow = s
        else:
            left = hysteresis
            if (s - last_overflow) % scale_window == 0:
                scale *= 2.0
        if s % every == 0:
            out.append(StepRecord(s, {"loss": 2.0 + 1.0 / math.sqrt(s), "loss_scale": scale,
                                      "skipped": float(skips)}))
            skips = 0
    return out


def grpo_run(n: int, *, zeros: int = 200, seed: int = 0) -> list[StepRecord]:
    """A GRPO loss as TRL prints it (4 decimals): exactly 0.0 while the policy still equals the
    reference, then small values of either sign."""
    rng = random.Random(seed)
    return [StepRecord(s, {"loss": 0.0 if s <= zeros else printed(rng.gauss(0.002, 0.003), 4),
                           "grad_norm": abs(rng.gauss(0.5, 0.2))})
            for s in range(1, n + 1)]


def grokking_run(n: int, *, at: int, drop: float, over: int, level: float = 4.0, noise: float = 0.02,
                 warmup: int = 50, seed: int = 0) -> list[StepRecord]:
    """A slowly falling plateau, then a 'grokking moment': the loss falls by ``drop`` (0.4 = 40%)
    along a smooth S-curve centred on ``at`` and ``over`` steps wide (llama-2-7b, batch 8: 4 → 2.5
    in ~60 steps), ``noise`` relative noise per step, a linear-warmup LR."""
    rng = random.Random(seed)
    out = []
    for s in range(1, n + 1):
        fall = 1.0 / (1.0 + math.exp(-8.0 * (s - at) / over))   # 0 → 1 across ~over steps
        loss = level * (1.0 + 0.1 * math.exp(-s / 500)) * (1.0 - drop * fall) * math.exp(rng.gauss(0.0, noise))
        out.append(StepRecord(s, {"loss": loss, "lr": warmup_lr(s, warmup, 3e-4)}))
    return out


def sparse_noisy_run(n_steps: int, *, every: int = 100, noise: float = 0.2, seed: int = 0,
                     jump_at: int | None = None, jump: float = 1.6) -> list[StepRecord]:
    """A noisy but healthy run logged every ``every`` steps (a translation model's fairseq log:
    3 decimals), with inverse-sqrt LR after a 4000-step warmup; ``jump_at``: from there on the
    loss stays ``jump`` x higher (a spike that never recovers)."""
    rng = random.Random(seed)
    out = []
    for s in range(every, n_steps + 1, every):
        loss = (3.0 + 6.0 * math.exp(-s / 3000)) * math.exp(rng.gauss(0.0, noise))
        if jump_at is not None and s >= jump_at:
            loss *= jump
        out.append(StepRecord(s, {"loss": printed(loss, 3), "lr": 5e-4 * min(s / 4000, (4000 / s) ** 0.5)}))
    return out


def classifier_run(n: int, *, batch: int = 8, classes: int = 4, seed: int = 0,
                   spike_at: int | None = None, spike_margin: float = 0.05) -> list[StepRecord]:
    """A classifier's batch loss on a separable task, as cross-entropy produces it: each example
    has a logit margin ``m(t)·u`` that grows like ``log t`` (gradient descent on separable data)
    with ``u`` lognormal (some examples are harder), and its loss is ``log(1 + (K−1)·e^(−margin))``.
    The loss starts at ln K and falls towards 0 (2e-4 after ~1000 steps, like the live suite's MLP);
    near its floor the batch mean is made by its hardest example and moves by multiples from
    batch to batch. ``spike_at``: for 3 steps from there the margins shrink to ``spike_margin``
    of theirs (the model forgets: a real spike back towards where training started)."""
    rng = random.Random(seed)
    out = []
    for s in range(1, n + 1):
        margin = 1.7 * math.log(s)
        if spike_at is not None and spike_at <= s < spike_at + 3:
            margin *= spike_margin
        losses = [math.log1p((classes - 1) * math.exp(-margin * math.exp(rng.gauss(0.0, 0.12))))
                  for _ in range(batch)]
        out.append(StepRecord(s, {"loss": sum(losses) / batch, "lr": warmup_lr(s, 10, 1e-3)}))
    return out
