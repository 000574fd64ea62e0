"""Consecutive fp16 overflow skips after start-up."""
from __future__ import annotations

import math
from typing import Sequence

from .. import keys
from ..record import Finding, StepRecord
from ..stats import Latch
from .base import Columns, Context, Detector, positive_int


class OverflowBurst(Detector):
    """Warning when at least ``min_skips`` optimizer steps were skipped for overflow within the
    last ``window_steps`` steps, outside the start-up loss-scale search. Dynamic loss scaling
    skips one or two steps every few hundred by design; that is not a burst, and neither are
    the skips of the start-up search (halving from 2^16-2^32 until the gradients fit) — unless
    the search failed, i.e. ``loss_scale_collapse`` found the scale at its floor: then its skips
    were a burst all along. ``skipped`` may be a count (logs that print every k steps).
    O(window) with a tiny window; state: the window and 2 scalars.

    >>> d = OverflowBurst()
    >>> [f.step for s in range(101, 106) for f in d.update(StepRecord(s, {"skipped": 1.0}), Context(s))]
    [103]
    """

    name = "overflow_burst"
    kind = "overflow_burst"
    signals = (keys.OVERFLOW_SKIPPED,)
    _state = ("recent", "latch", "search_failed")

    def __init__(self, *, min_skips: int = 3, window_steps: int = 10):
        self.min_skips = positive_int("min_skips", min_skips)
        self.window_steps = positive_int("window_steps", window_steps)
        self.recent: list = []          # [[step, skipped_count, in start-up], ...] inside the window
        self.latch = Latch()   # re-armed once the window holds no skip
        self.search_failed = False      # the start-up search reached the scaler's floor

    def update_run(self, run: Sequence[StepRecord], ctxs: Sequence[Context], cols: Columns | None = None) -> None:
        """update()'s most steps inline (nothing skipped past the start-up while no skip is in the
        window: the latch re-armed, nothing found), update() for the rest."""
        for record, ctx in zip(run, ctxs):
            if not self.recent and not ctx.in_startup and record.metrics.get(keys.OVERFLOW_SKIPPED) == 0.0:
                self.latch.armed = True
                continue
            found = self.update(record, ctx)
            if found:
                ctx.found += found

    def update(self, record: StepRecord, ctx: Context) -> list[Finding]:
        k = record.metrics.get(keys.OVERFLOW_SKIPPED)
        if k is None or not 0.0 <= k < math.inf:
            return []
        if ctx.in_startup and not self.search_failed:
            self.search_failed = any(f.kind == "loss_scale_collapse" for f in ctx.found)
        if k == 0.0 and not self.recent:   # most steps: what _count does with them, less its call
            self.latch.armed = True
            return []
        return self._count(record.step, k, ctx.in_startup, record.metrics.get(keys.LOSS_SCALE))

    def at_end(self, ctx: Context) -> list[Finding]:
        """The end of a replayed log whose start-up search ``loss_scale_collapse`` found failed
        only there (the log ends while it still halves): its skips were a burst all along."""
        if self.search_failed or not self.recent or not any(f.kind == "loss_scale_collapse" for f in ctx.found):
            return []
        self.search_failed = True
        return self._count(ctx.step, 0.0, False, None)

    def _count(self, step: int, k: float, in_startup: bool, scale: float | None) -> list[Finding]:
        if k == 0.0 and not self.recent:   # no skip now nor in the window: nothing to count
            self.latch.armed = True        # re-armed, as by a window without a skip (hot path: no call)
            return []
        recent = [e for e in self.recent if step - e[0] < self.window_steps]
        if k > 0:
            recent.append([step, k, in_startup])
        self.recent = recent
        total = sum(c for _, c, st in recent if not st or self.search_failed)
        if not self.latch.update(on=total >= self.min_skips, off=total == 0):
            return []
        first = int(next(s for s, _, st in recent if not st or self.search_failed))
        scale_txt = f" (loss scale now {scale:g})" if scale is not None and scale > 0 else ""
        return [self.finding(
            step, severity="warning", value=total, threshold=self.min_skips, onset_step=first,
            message=(f"{int(total)} optimizer steps were skipped for fp16 overflow "
                     f"{f'between steps {first} and {step}' if first < step else f'in the interval logged at step {step}'}"
                     f"{scale_txt}. Gradients are overflowing: a loss spike or a "
                     f"loss-scale collapse often follows."),
            skips=total)]
