"""The loss settles at a new, higher level and stays there."""
from __future__ import annotations

import math
from typing import Sequence

from .. import keys
from ..record import Finding, StepRecord
from ..stats import EWMean, RobustLevel
from .base import Columns, Context, Detector, fmt, positive, positive_int


class LevelShift(Detector):
    """A fast level (EW of log-loss) stands ``min_shift`` above the slow robust baseline and is
    *stable* there (moves less than half the shift) for ``persist_samples`` points: the loss did
    not spike-and-recover nor keep rising; it switched level (near the loss's floor the shift is
    measured against the floor ``loss_spike`` uses). Warning, then the slow baseline
    restarts at the new level. The slow reference has no trend term: extrapolating the early,
    steep fall of a sparsely logged run would put it far below the loss and fake a shift up
    (it lags above a falling loss instead, which only makes the rule more conservative).
    O(1); state: 2 levels, 4 scalars.
    """

    name = "level_shift"
    kind = "level_shift"
    signals = (keys.LOSS,)
    _state = ("slow", "fast", "anchor", "anchor_step", "count", "last")

    def __init__(self, *, min_shift: float = 0.1, persist_samples: int = 30,
                 fast_alpha: float = 0.2, slow_alpha: float = 0.05):
        self.min_shift = positive("min_shift", min_shift)
        self.persist_samples = positive_int("persist_samples", persist_samples)
        self.fast_alpha = positive("fast_alpha", fast_alpha)
        self.slow_alpha = positive("slow_alpha", slow_alpha)
        self.slow = RobustLevel(self.slow_alpha, trend_alpha=0.0)
        self.fast = EWMean(self.fast_alpha)
        self._log_min_shift = math.log1p(self.min_shift)
        self.anchor: float | None = None
        self.anchor_step: int | None = None
        self.count = 0
        self.last: float | None = None

    # update(): the run of one record (Detector._update_alone); the rule is written as replay's loop
    update = Detector._update_alone

    def update_run(self, run: Sequence[StepRecord], ctxs: Sequence[Context], cols: Columns | None = None) -> None:
        cols = cols or Columns.of(run)   # the loss and its log, where 0 < loss < inf (Columns)
        for record, ctx, x, lx in zip(run, ctxs, cols.loss, cols.loss_log):
            if lx is None or x == self.last or ctx.loss_signed:   # frozen: `stall`'s
                continue
            self.last = x
            fe = self.fast   # (EWMean.update, written out: the same sum, less a call)
            n = fe.n = fe.n + 1
            fast = fe.mean = fe.mean + (fe.alpha if n > fe.warm else max(fe.alpha, 1.0 / n)) * (lx - fe.mean)
            slow = self.slow
            if slow.n and ctx.loss_floor_log > slow.level:   # near its floor: against the floor
                thr = math.log1p(self.min_shift * math.exp(min(ctx.loss_floor_log - slow.level, 700.0)))
            else:
                thr = self._log_min_shift
            if slow.n < self.persist_samples or not fast - slow.level > thr:
                slow.update_log(lx)   # the reference holds still only while a candidate shift is judged
                self.anchor, self.count = None, 0
                continue
            if self.anchor is None or abs(fast - self.anchor) > thr / 2:
                self.anchor, self.anchor_step, self.count = fast, record.step, 0
                continue
            self.count += 1
            if self.count >= self.persist_samples:
                ctx.found.append(self._shifted(record.step, fast))

    def _shifted(self, step: int, fast: float) -> Finding:
        """The shift found at ``step``: said, and the slow baseline restarted at the new level."""
        before, now = self.slow.baseline, math.exp(fast)
        self.slow = RobustLevel(self.slow_alpha, trend_alpha=0.0)
        self.slow.update(now)
        self.anchor, self.count = None, 0
        return self.finding(
            step, severity="warning", value=now, baseline=before, onset_step=self.anchor_step,
            message=(f"The loss settled at a new, higher level: ~{fmt(now)} since step "
                     f"{self.anchor_step} vs {fmt(before)} before (+{now / before - 1:.0%}), "
                     f"neither recovering nor diverging. Check for repeated or changed data and "
                     f"compare with a rollback to before step {self.anchor_step}."),
            shift=now / before - 1)
