"""An abnormally fast fall of the loss (grokking-like)."""
from __future__ import annotations

import math

from .. import keys
from ..record import Finding, StepRecord
from ..stats import EWMean, finite_positive
from .base import Context, Detector, fmt, positive, positive_int


class SuddenDrop(Detector):
    """The fast level (EW of log-loss) falls ``min_drop`` below ``loss_spike``'s robust baseline
    and stays there ``persist_samples`` points. Info: usually benign (a "grokking moment"), except right
    after a resume, where a falsely low loss means repeated data — ``data_repetition`` owns that
    window, so this detector is silent there. Ignores the first ``startup_steps``.
    O(1); state: 4 scalars.
    """

    name = "sudden_drop"
    kind = "sudden_drop"
    signals = (keys.LOSS,)
    _state = ("fast", "count", "last_step")

    def __init__(self, *, min_drop: float = 0.25, persist_samples: int = 3,
                 startup_steps: int = 500, min_gap_steps: int = 1000, fast_alpha: float = 0.3):
        self.min_drop = positive("min_drop", min_drop)
        self.persist_samples = positive_int("persist_samples", persist_samples)
        self.startup_steps = positive_int("startup_steps", startup_steps)
        self.min_gap_steps = positive_int("min_gap_steps", min_gap_steps)
        self.fast_alpha = positive("fast_alpha", fast_alpha)
        self.fast = EWMean(self.fast_alpha)
        self.count = 0
        self.last_step: int | None = None

    def update(self, record: StepRecord, ctx: Context) -> list[Finding]:
        x = record.metrics.get(keys.LOSS)
        if not finite_positive(x):
            return []
        fast = self.fast.update(math.log(x))
        before = ctx.loss_baseline
        dropped = (before is not None and not ctx.loss_spike_open
                   and fast - math.log(before) < math.log1p(-min(self.min_drop, 0.99)))
        quiet = (record.step <= self.startup_steps or ctx.steps_since_resume is not None
                 or (self.last_step is not None and record.step - self.last_step < self.min_gap_steps))
        self.count = self.count + 1 if dropped else 0
        if quiet or self.count != self.persist_samples:
            return []
        self.last_step = record.step
        now = math.exp(fast)
        return [self.finding(
            record.step, severity="info", value=now, baseline=before,
            message=(f"The loss fell abruptly to ~{fmt(now)} at step {record.step} from a baseline "
                     f"of {fmt(before)} ({now / before - 1:.0%}). Often a benign 'grokking' drop; if "
                     f"the data loader was just restarted, check for repeated data."),
            drop=1 - now / before)]
