"""Sustained growth of a norm (grad norm, parameter norm) — slow drifts, not spikes."""
from __future__ import annotations

import math

from .. import keys
from ..record import Finding, StepRecord
from ..stats import RiseAboveLow, RobustLevel, finite_positive
from .base import Context, Detector, fmt, positive, positive_int


class _SustainedGrowth(Detector):
    """A slow robust level (EW of the log) has stood ``min_growth`` × above its lowest value
    since the reference point for ``persist_samples`` points. Warning once; re-armed when it
    falls back below half that growth (in log terms). O(1); state: 1 level, 4 scalars.
    """

    _state = ("level", "rise")
    what = ""
    advice = ""

    def __init__(self, *, min_growth: float, persist_samples: int, alpha: float, after_warmup: bool,
                 startup_steps: int):
        self.min_growth = positive("min_growth", min_growth)
        self.persist_samples = positive_int("persist_samples", persist_samples)
        self.after_warmup = after_warmup
        self.startup_steps = positive_int("startup_steps", startup_steps)
        self.level = RobustLevel(positive("alpha", alpha))
        self.rise = RiseAboveLow(self.persist_samples)

    def update(self, record: StepRecord, ctx: Context) -> list[Finding]:
        m = record.metrics
        v = m.get(self.signals[0])
        if not finite_positive(v) or (m.get(keys.SKIPPED) or 0.0) >= 1.0:
            return []
        self.level.update(v)
        if record.step <= self.startup_steps or (self.after_warmup and ctx.phase in (None, "warmup")):
            return []
        lv = self.level.level
        if not self.rise.update(lv, record.step, math.log1p(self.min_growth)):
            return []
        lo, now, low_step = math.exp(self.rise.low), math.exp(lv), self.rise.low_step
        growth = now / lo
        return [self.finding(
            record.step, severity="warning", value=now, baseline=lo,
            threshold=lo * (1 + self.min_growth), onset_step=low_step,
            message=(f"{self.what} has grown steadily from {fmt(lo)} at step {low_step} to "
                     f"{fmt(now)} at step {record.step} ({growth:.1f}x). {self.advice}"),
            growth=growth)]


class GradNormGrowth(_SustainedGrowth):
    """Sustained rise of the global grad norm ("the cliff gets sharper": longer-than-chinchilla)."""

    name = "grad_norm_growth"
    kind = "grad_norm_growth"
    signals = (keys.GRAD_NORM,)
    what = "The grad norm"
    advice = ("The run may be climbing the walls of a sharp valley; consider a lower LR or a faster "
              "LR decay, and keep recent checkpoints.")

    def __init__(self, *, min_growth: float = 2.0, persist_samples: int = 50, alpha: float = 0.02,
                 startup_steps: int = 200):
        super().__init__(min_growth=min_growth, persist_samples=persist_samples, alpha=alpha,
                         after_warmup=True, startup_steps=startup_steps)


class ParamNormGrowth(_SustainedGrowth):
    """Sustained rise of the parameter L2 norm after warmup (weight decay / LR decay too slow)."""

    name = "param_norm_growth"
    kind = "param_norm_growth"
    signals = (keys.PARAM_NORM,)
    what = "The parameter norm"
    advice = ("Weight decay or the LR decay may be too weak for a run this long (longer-than-"
              "chinchilla runs diverged this way); consider more weight decay or a faster decay.")

    def __init__(self, *, min_growth: float = 0.5, persist_samples: int = 20, alpha: float = 0.05,
                 startup_steps: int = 100):
        super().__init__(min_growth=min_growth, persist_samples=persist_samples, alpha=alpha,
                         after_warmup=True, startup_steps=startup_steps)
