"""An abnormally fast fall of the loss (grokking-like)."""
from __future__ import annotations

import math
from typing import Sequence

from .. import keys
from ..record import Finding, StepRecord
from ..stats import EWMean
from .base import Columns, Context, Detector, check, count, fmt, positive, positive_int


class SuddenDrop(Detector):
    """An abnormally fast fall of the loss (a "grokking moment"). A healthy loss falls fastest
    at the start and ever slower after it; a grokking moment is the opposite — after a plateau
    the fall *accelerates* (llama-2-7b at batch 8: 4 → 2.5 within ~60 steps after a slow
    stretch). Rule, on the fast level (EW of log-loss, ``fast_alpha``): over the last ``window``
    points it fell by at least ``min_drop``, and by ``acceleration`` × more than over the
    ``window`` points before (a plateau, or a slower fall), while staying below ``loss_spike``'s
    baseline (a loss coming back from a spike returns *to* the baseline, not below it), for
    ``persist_samples`` points. Comparing the fall with the run's own earlier pace, rather than
    with a trend-following baseline that follows any fall spread over tens of steps, is what
    lets a gradual grokking drop show.

    The history restarts at the end of the LR warmup (a warmup speeds the fall up by design)
    and after a loss spike; with no LR to find the warmup, the first ``startup_steps`` are
    quiet. Info: usually benign — except within ``after_resume_steps`` of a resume, where a loss
    that suddenly does better is a model re-reading data it memorised (the data loader restarted:
    the seeds' "falsely low loss"), so there it is a warning (``data_repetition`` judges the same
    resume from fingerprints, the consumed-samples count and the pre-checkpoint baseline).
    O(1) per update; state: the last 2·window + 1 fast levels and 4 scalars.
    """

    name = "sudden_drop"
    kind = "sudden_drop"
    signals = (keys.LOSS,)
    _state = ("fast", "history", "warmup_end", "count", "last_step")

    def __init__(self, *, min_drop: float = 0.25, persist_samples: int = 3, window: int = 50,
                 acceleration: float = 3.0, startup_steps: int = 500, min_gap_steps: int = 1000,
                 fast_alpha: float = 0.3, after_resume_steps: int = 200):
        self.min_drop = check("min_drop", min_drop, isinstance(min_drop, (int, float)) and 0 < min_drop < 1,
                              "in (0, 1)")
        self.persist_samples = positive_int("persist_samples", persist_samples)
        self.window = positive_int("window", window)
        self.acceleration = positive("acceleration", acceleration)
        self.startup_steps = positive_int("startup_steps", startup_steps)
        self.min_gap_steps = positive_int("min_gap_steps", min_gap_steps)
        self.fast_alpha = positive("fast_alpha", fast_alpha)
        self.after_resume_steps = positive_int("after_resume_steps", after_resume_steps)
        self.fast = EWMean(self.fast_alpha)
        self._log_keep = math.log1p(-self.min_drop)   # a fall by min_drop, in log(loss)
        self.history: list[float] = []     # the fast level at the last 2·window + 1 points
        self.warmup_end: int | None = None
        self.count = 0
        self.last_step: int | None = None

    # update(): the run of one record (Detector._update_alone); the rule is written as replay's loop
    update = Detector._update_alone

    def update_run(self, run: Sequence[StepRecord], ctxs: Sequence[Context], cols: Columns | None = None) -> None:
        cols = cols or Columns.of(run)   # log(loss), where 0 < loss < inf (Columns)
        for record, ctx, lx in zip(run, ctxs, cols.loss_log):
            if lx is None or ctx.loss_signed:
                continue
            fe = self.fast   # (EWMean.update, written out: the same sum, less a call)
            n = fe.n = fe.n + 1
            fast = fe.mean = fe.mean + (fe.alpha if n > fe.warm else max(fe.alpha, 1.0 / n)) * (lx - fe.mean)
            h = self.history
            if ctx.loss_spike_open or ctx.warmup_end_step != self.warmup_end:
                self.warmup_end = ctx.warmup_end_step
                h.clear()
                self.count = 0
                continue
            h.append(fast)
            w = self.window
            if len(h) <= 2 * w:
                continue
            del h[0]
            fall, before = fast - h[w], h[w] - h[0]   # log change over the last window, and the one before
            base = ctx.loss_baseline
            if ctx.loss_floor_log > h[w]:   # near its floor a fall is measured against the floor (LossSpike)
                drop = self.min_drop * math.exp(min(ctx.loss_floor_log - h[w], 700.0))   # (within a float)
                dropped = drop < 1.0 and fall <= math.log1p(-drop)
            else:
                dropped = fall <= self._log_keep   # (min_drop < 1)
            dropped = (dropped and (before >= 0.0 or fall <= self.acceleration * before)
                       and base is not None and fast < math.log(base))
            self.count = self.count + 1 if dropped else 0
            if self.count == self.persist_samples:
                ctx.found += self._dropped(record, ctx, fast, before)

    def _dropped(self, record: StepRecord, ctx: Context, fast: float, before: float) -> list[Finding]:
        """The fall persisted to ``record``: said, unless its phase or the last one keeps it quiet."""
        h, w = self.history, self.window
        since_resume = ctx.steps_since_resume
        resumed = since_resume is not None and since_resume <= self.after_resume_steps
        if (ctx.phase == "warmup"   # quiet
                or (ctx.warmup_end_step is None and record.step <= self.startup_steps and not resumed)
                or (self.last_step is not None and record.step - self.last_step < self.min_gap_steps)):
            return []
        self.last_step = record.step
        now, then = math.exp(fast), math.exp(h[w])
        pace = (f"after falling only {-math.expm1(before):.0%} over the {w} points before" if before < 0
                else f"after no fall at all over the {w} points before")
        if since_resume is not None and resumed:
            what = (f"{count(since_resume)} after the resume at step {record.step - since_resume}: "
                    f"a resumed run that suddenly does better is usually re-reading data it memorised "
                    f"(the data loader restarted from the beginning). Check the data-loader/sampler state "
                    f"before training on.")
        else:
            what = "the fall sped up (a 'grokking' moment). Often benign."
        return [self.finding(
            record.step, severity="warning" if resumed else "info", value=now, baseline=then,
            message=(f"The loss fell abruptly to ~{fmt(now)} at step {record.step}, {1 - now / then:.0%} "
                     f"below ~{fmt(then)} {w} points earlier, {pace}, {what}"),
            drop=1 - now / then, previous_drop=max(-math.expm1(before), 0.0), after_resume=resumed)]
