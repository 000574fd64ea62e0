"""LR discontinuities — e.g. a resume that changed the schedule."""
from __future__ import annotations

import math
from typing import Any, Sequence

from .. import keys
from ..record import Finding, StepRecord
from ..stats import EWMean, Latch
from .base import Columns, Context, Detector, fmt, positive, positive_int
from .stall import printed_resolution


class LrAnomaly(Detector):
    """Warning when the LR moves by more than ``min_change`` (relative) and more than ``ratio`` ×
    the typical per-step change of the schedule so far, relative and in the LR's own units (a
    linear warmdown's last points change by x0.5, x0.1 relative, by its usual step absolutely). A
    warmup ramp, a cosine or a linear warmdown change smoothly and never trigger, to zero too; a
    resume that silently swapped the schedule does.

    Flat stretches: printed LRs are rounded, so a smooth schedule moves in stairs, and step
    schedules (StepLR, MultiStepLR) drop by a factor at a milestone after a flat stretch; such a
    change is spread over the steps since the previous change. A *rise* out of a flat stretch
    that is more than a rounding stair (one printed digit) is not a schedule: no schedule raises
    the LR at once after holding it (a warmup rises from the start), so it is judged as it is
    (a constant LR that jumps x50). One warning per discontinuity: the steps of a ramp that
    follows it (a restarted warmup) are not warned again, until the LR moves like the schedule.

    A rise back to the LR's own earlier peak (within ``min_change``), or below it, is how a
    schedule with warm restarts (SGDR, cosine with restarts) begins its next cycle: ``info``,
    saying so — unless it comes within ``resume_steps`` of a resume, where it is the scheduler
    starting over (the warning). Above the earlier peak it is no restart: the warning.

    After a resume the LR must continue the schedule (a resume that lost the scheduler state
    restarts it: that is the warning) — unless the optimizer restarted too: Adam's step count back
    at 1 (``adam/step``) is a deliberate fresh start, weights only, whose schedule starts over
    with it (the HF Trainer rebuilds both when the checkpoint has no optimizer state). O(1);
    state: 7 scalars.

    >>> d = LrAnomaly()
    >>> lrs = [1e-4 * (1 - s / 1000) for s in range(1, 20)] + [5e-5]
    >>> [f.step for s, lr in enumerate(lrs, 1) for f in d.update(StepRecord(s, {"lr": lr}), Context(s))]
    [20]
    """

    name = "lr_anomaly"
    kind = "lr_anomaly"
    signals = (keys.LR,)
    _state = ("prev", "prev_step", "last_change_step", "typical", "typical_abs", "latch", "resumed", "peak")

    def __init__(self, *, min_change: float = 0.02, ratio: float = 10.0, alpha: float = 0.1,
                 resume_steps: int = 10):
        self.min_change = positive("min_change", min_change)
        self.resume_steps = positive_int("resume_steps", resume_steps)
        self.ratio = positive("ratio", ratio)
        self.alpha = positive("alpha", alpha)
        self.prev: float | None = None
        self.prev_step: int | None = None
        self.last_change_step: int | None = None
        self.typical = EWMean(self.alpha, start="running")   # per-step log change of the schedule
        self.typical_abs = EWMean(self.alpha, start="running")   # ... and per-step change of the LR itself
        self.latch = Latch()      # re-armed by a change like the schedule's
        self.resumed = False      # a resume segment began; its first record not seen yet
        self.peak = 0.0           # the largest LR so far (a warm restart goes back to it)

    def on_segment(self, start_step: int, reason: str) -> None:
        if reason == "rollback":
            self.prev = None   # a rollback re-runs an earlier part of the schedule
        elif reason == "resume":
            self.resumed = True

    # update(): the run of one record (Detector._update_alone); the rule is written as replay's loop
    update = Detector._update_alone

    def update_run(self, run: Sequence[StepRecord], ctxs: Sequence[Context], cols: Columns | None = None) -> None:
        for record, ctx in zip(run, ctxs):
            if self.resumed:
                self.resumed = False
                adam_step = record.metrics.get(keys.ADAM_STEP)
                if adam_step is not None and adam_step <= 2:   # the optimizer started over: so does the schedule
                    self.prev, self.typical = None, EWMean(self.alpha, start="running")
                    self.typical_abs = EWMean(self.alpha, start="running")
            lr = record.metrics.get(keys.LR)
            if lr is None or not (0.0 < lr < math.inf):
                continue
            prev, prev_step, peak = self.prev, self.prev_step, self.peak
            self.prev, self.prev_step = lr, record.step
            if lr > peak:
                self.peak = lr
            if prev is None:
                self.last_change_step = record.step
                continue
            if lr == prev:   # a ratio of 1.0, whose log is 0.0: no change (most steps), said without them
                continue
            ratio = lr / prev
            if not 0.0 < ratio < math.inf:
                continue
            change = abs(math.log(ratio))
            if change == 0.0:
                continue
            since = self.last_change_step if self.last_change_step is not None else (prev_step or record.step)
            self.last_change_step = record.step
            if lr > prev and lr - prev > 1.5 * printed_resolution(prev):   # a rise out of a flat stretch
                since = prev_step or since
            apart = record.step - since
            apart = apart if apart > 1 else 1   # (max(apart, 1), less a call: an LR that decays changes at every point)
            per_step = change / apart
            # ... and in the LR's own units: a schedule decaying to zero (linear, cosine) keeps its
            # step there while its relative change grows without bound (the last points of a linear
            # warmdown: x0.5, x0.1)
            per_step_abs = abs(lr - prev) / apart
            anomalous = (self.typical.n >= 3 and change >= self.min_change
                         and per_step > self.ratio * max(self.typical.mean, 1e-12)
                         and per_step_abs > self.ratio * self.typical_abs.mean)
            if not anomalous:   # a change like the schedule's: learned, and the latch re-armed (hot path: no call)
                self.latch.armed = True
                self.typical.update(per_step)
                self.typical_abs.update(per_step_abs)
                continue
            if self.latch.update(on=True):
                ctx.found.append(self._jump(record.step, lr, prev, prev_step, peak, ctx.steps_since_resume))

    def _jump(self, step: int, lr: float, prev: float, prev_step: int | None, peak: float,
              since_resume: int | None) -> Finding:
        """An LR change unlike the schedule's at ``step`` (from ``prev`` at ``prev_step``): said."""
        restart = lr > prev and lr <= peak * (1.0 + self.min_change) and not (
            since_resume is not None and since_resume <= self.resume_steps)
        if restart:   # back to its earlier peak, or below: a warm restart's next cycle
            where = "its earlier peak" if lr >= peak * (1.0 - self.min_change) else f"below its earlier peak {fmt(peak)}"
            message = (f"The learning rate went back up from {fmt(prev)} at step {prev_step} to {fmt(lr)} at "
                       f"step {step}, {where}: a schedule with warm restarts (SGDR, cosine with "
                       f"restarts) starts its next cycle so; if yours has none, the scheduler started over: "
                       f"check it.")
        else:
            why = ("It follows a resume: the scheduler state was not restored (or was overridden); check "
                   "the LR schedule against the checkpoint." if since_resume is not None else
                   "No resume is seen here: check what sets the LR (a scheduler stepped more or less than "
                   "once per optimizer step, an LR changed by hand or by a callback, a schedule's milestone "
                   "you did not expect), and after a resume the scheduler's restored state.")
            message = (f"The learning rate jumped from {fmt(prev)} at step {prev_step} to {fmt(lr)} at "
                       f"step {step} ({lr / prev - 1:+.1%}), unlike the schedule so far. {why}")
        said: dict[str, Any] = {"restart": True, "peak": peak, "from_step": prev_step} if restart else {}
        return self.finding(step, severity="info" if restart else "warning", value=lr, baseline=prev,
                            message=message, change=lr / prev - 1, **said)
