"""The loss jumps right after a resume (data-loader state or RNG not restored)."""
from __future__ import annotations

import math

from .. import keys
from ..record import Finding, StepRecord
from ..stats import Latch, finite_positive
from .base import Context, Detector, fmt, positive, positive_int


class ResumeSpike(Detector):
    """Warning when, within ``window_steps`` after a resume, the loss stands ``min_rise`` and
    ``noise_sigmas`` σ above the loss baseline it had before the checkpoint (``loss_spike``'s
    baseline and noise, restored with the detector state). One per resume. O(1); state: 2 scalars.
    """

    name = "resume_spike"
    kind = "resume_spike"
    signals = (keys.LOSS,)
    _state = ("resume_step", "latch")

    def __init__(self, *, min_rise: float = 0.1, noise_sigmas: float = 3.0, window_steps: int = 50):
        self.min_rise = positive("min_rise", min_rise)
        self.noise_sigmas = positive("noise_sigmas", noise_sigmas)
        self.window_steps = positive_int("window_steps", window_steps)
        self.resume_step: int | None = None
        self.latch = Latch()   # re-armed by every resume

    def wants(self, present: frozenset[str]) -> bool:
        return self.resume_step is not None and super().wants(present)   # nothing to judge before a resume

    def on_segment(self, start_step: int, reason: str) -> None:
        if reason in ("resume", "rollback"):
            self.resume_step = start_step
            self.latch.rearm()

    def update(self, record: StepRecord, ctx: Context) -> list[Finding]:
        base = ctx.loss_baseline
        if self.resume_step is None or not self.latch.armed or base is None:
            return []
        x = record.metrics.get(keys.LOSS)
        if x is None or not finite_positive(x) or not 0 <= record.step - self.resume_step <= self.window_steps:
            return []
        threshold = base * max(1 + self.min_rise, math.exp(self.noise_sigmas * ctx.loss_noise))
        if not self.latch.update(on=x > threshold):
            return []
        return [self.finding(
            record.step, severity="warning", value=x, baseline=base, threshold=threshold,
            onset_step=self.resume_step,
            message=(f"The loss jumped to {fmt(x)} at step {record.step}, right after the resume at step "
                     f"{self.resume_step}, {x / base - 1:.0%} above {fmt(base)} before the checkpoint. "
                     f"Usually the data-loader or RNG state was not restored; small ones recover."),
            rise=x / base - 1)]
