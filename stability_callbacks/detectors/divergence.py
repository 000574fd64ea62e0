"""Divergence without a spike: the loss drifts up and keeps going."""
from __future__ import annotations

import math

from .. import keys
from ..record import Finding, StepRecord
from ..stats import EWMean, RiseAboveLow, RollingMedian, finite_positive
from .base import Context, Detector, fmt, positive, positive_int


class Divergence(Detector):
    """Sustained upward drift of the loss (the 104B "diverging that didn't go through a spike").

    Rule: the median of the last ``window`` losses (blind to one-step blips) has stood more
    than ``min_rise`` (and ``noise_sigmas`` × its own noise) above its lowest value for
    ``persist_samples`` consecutive points (near the loss's floor, ``min_rise`` of the floor that
    ``loss_spike`` measures rises against). Spike episodes are left to ``loss_spike``: the
    window restarts after one. Critical, once per episode; re-armed when the median falls back.
    O(window) per update with a window of 7; state: the window and 6 scalars.
    """

    name = "divergence"
    kind = "divergence"
    signals = (keys.LOSS,)
    _state = ("med", "noise", "rise")

    def __init__(self, *, window: int = 7, min_rise: float = 0.1, noise_sigmas: float = 4.0,
                 persist_samples: int = 4):
        self.window = positive_int("window", window)
        self.min_rise = positive("min_rise", min_rise)
        self.noise_sigmas = positive("noise_sigmas", noise_sigmas)
        self.persist_samples = positive_int("persist_samples", persist_samples)
        self.med = RollingMedian(window)
        # mean |log x − median|; it starts from 0, so the min_rise floor rules until it is learnt
        self.noise = EWMean(0.05, start="zero")
        self.rise = RiseAboveLow(self.persist_samples)

    def _restart(self):
        self.med = RollingMedian(self.window)
        self.rise.restart()

    def on_segment(self, start_step: int, reason: str) -> None:
        self._restart()

    def update(self, record: StepRecord, ctx: Context) -> list[Finding]:
        x = record.metrics.get(keys.LOSS)
        if x is None or not finite_positive(x) or ctx.loss_signed:
            return []
        if ctx.loss_spike_open:
            self._restart()
            return []
        lx = math.log(x)
        self.med.update(lx)
        if not self.med.full:
            return []
        m = self.med.median
        noise = self.noise.update(abs(lx - m))
        rise = self.min_rise
        low = self.rise.low if self.rise.low is not None else m
        if ctx.loss_floor_log > low:   # near its floor a rise is measured against the floor (LossSpike)
            rise *= math.exp(ctx.loss_floor_log - low)
        thr = max(math.log1p(rise), self.noise_sigmas * 1.25 * noise)
        if not self.rise.update(m, record.step, thr):
            return []
        lo, now, low_step = math.exp(self.rise.low_value), math.exp(m), self.rise.low_step
        return [self.finding(
            record.step, severity="critical", value=now, baseline=lo, threshold=lo * math.exp(thr),
            onset_step=low_step,
            message=(f"The loss is diverging without a spike: its running median rose from "
                     f"{fmt(lo)} at step {low_step} to {fmt(now)} at step {record.step} "
                     f"(+{now / lo - 1:.0%}) and keeps climbing. Training on will not fix it: roll "
                     f"back to a checkpoint before step {low_step} and lower the LR or change "
                     f"the data order."),
            rise=now / lo - 1)]
