"""The fp16 loss scale collapsing: at 0, at its floor, or pinned while every step overflows."""
from __future__ import annotations

import math
from typing import Sequence

from .. import keys
from ..record import Finding, StepRecord
from ..stats import Latch
from .base import Columns, Context, Detector, positive, positive_int


class LossScaleCollapse(Detector):
    """Critical when the dynamic loss scaler has run out of room, a warning while it halves towards that. How a scaler works decides
    what that looks like: it halves the scale on every overflowed (skipped) step — after
    ``hysteresis`` of them in DeepSpeed and Megatron, 2 by default — and doubles it after a
    window of clean steps, never going below its configured minimum (DeepSpeed and Megatron:
    1; fairseq: 1e-4). So a scale that is *moving* is a scaler at work, and four rules follow:

    - *zero*: the scale is 0 (``reducing to 0``, fairseq's ``loss_scale 0.000``): the gradients
      are multiplied by nothing — no scaler goes there while training works;
    - *pinned*: ``pinned_skips`` consecutive optimizer steps all overflowed while the scale did
      not move (more than the default hysteresis): the scaler is at its floor and cannot go
      lower (DeepSpeed then stops the run; Megatron and metaseq keep skipping every step);
    - *floor*: after moving, the scale sits at ``min_scale``, or within ``floor_halvings``
      halvings of it having fallen as many below its recent peak (one halving of a scale that sat
      at 8 for an epoch, to 4, is a scaler at work);
    - *halvings*: it stands ``min_halvings`` halvings below its recent peak (the peak decays by
      one halving every ``peak_decay_steps`` steps, so the periodic halve-then-regrow of a long
      healthy run never adds up);
    - *falling* (a warning): it stands ``warn_halvings`` halvings below that peak: repeated
      halvings towards the floor, before the scaler runs out of room.

    The *zero*, *pinned* and *floor* findings are unmistakable however early (``past_startup``):
    a scale at its minimum is a run that cannot train, and a start-up search that ends there
    has failed. *Floor* asks the scale to have fallen there or to overflow there: one that ended
    its search below the floor assumed and trains there, or grows back, has a lower floor.

    A scale that never moves and never skips is not a dynamic scaler at all: bf16 Megatron and
    static-scale runs print ``loss scale: 1.0`` on every line, and that is silent (a step skipped
    for overflow, even one, shows a scaler at work: a log excerpt may begin in a cascade). The
    start-up search (halving from 2^32 on every step) meets the *zero* and *pinned* rules, and
    *floor* when it stops at the floor and stays (its scaler can go no lower), when the start-up
    ends with the scale at the floor and no step known to have gone through, or when a replayed
    log ends in it there (apex, which has no floor, goes on to 1e-202) — not while it passes
    below the floor assumed (fairseq's is 1e-4: it may find its scale at 0.25 and grow back) —
    and never *halvings*. The
    search ends at its first successful step (``skipped`` 0; at the latest with the Monitor's
    start-up, a log excerpt beginning mid-run is no search): halvings after
    that count, however early (apex halving on ten iterations in a row after steps went through
    is a collapse, not a search), and the finding says so (``details.past_startup``: the policy
    keeps its severity in the first steps). Negative values (``loss scale: -1.0`` in builds without a
    scaler) are print artefacts and ignored. ``skipped`` may be a count per logged interval: an
    interval overflowed entirely when it counts every step since the previous record.
    One warning and one critical finding per episode. O(1); state: 8 scalars.

    >>> d = LossScaleCollapse()
    >>> [f.details["rule"] for s in range(21, 41)
    ...  for f in d.update(StepRecord(s, {"loss_scale": 1.0, "skipped": 0.0}), Context(s))]
    []
    >>> [(f.step, f.details["rule"]) for s in range(41, 46)      # skips: a scaler, at its floor
    ...  for f in d.update(StepRecord(s, {"loss_scale": 1.0, "skipped": 1.0}), Context(s))]
    [(41, 'floor')]
    >>> d = LossScaleCollapse(min_scale=1e-4)                    # a scaler whose floor is not min_scale
    >>> [(f.step, f.details["rule"]) for s in range(21, 46)
    ...  for f in d.update(StepRecord(s, {"loss_scale": 1.0, "skipped": float(s > 40)}), Context(s))]
    [(43, 'pinned')]
    """

    name = "loss_scale_collapse"
    kind = "loss_scale_collapse"
    signals = (keys.LOSS_SCALE,)
    _state = ("peak", "peak_step", "latch", "warned", "last", "last_step", "moved", "pinned", "searching")

    def __init__(self, *, min_halvings: int = 6, min_scale: float = 1.0, floor_halvings: int = 2,
                 peak_decay_steps: int = 200, pinned_skips: int = 3, warn_halvings: int = 3):
        self.min_halvings = positive_int("min_halvings", min_halvings)
        self.min_scale = positive("min_scale", min_scale)
        self.floor_halvings = positive_int("floor_halvings", floor_halvings)
        self.peak_decay_steps = positive_int("peak_decay_steps", peak_decay_steps)
        self.pinned_skips = positive_int("pinned_skips", pinned_skips)
        self.warn_halvings = positive_int("warn_halvings", warn_halvings)
        self.peak: float | None = None       # log2 of the peak scale (after start-up)
        self.peak_step: int | None = None
        self.latch = Latch()   # re-armed once the scale is back within half the halvings, off its floor
        self.warned = Latch()  # the warning's: re-armed once back within half the warn_halvings
        self.last: float | None = None       # the previous scale, and its step
        self.last_step: int | None = None
        self.moved = False                   # the scale has changed at least once: a dynamic scaler
        self.pinned = 0                      # overflowed steps in a row at an unchanged scale
        self.searching = True                # the start-up search: until the first successful step
        self._log2_min = math.log2(self.min_scale)
        self._log2 = (math.nan, math.nan)    # the last scale seen and its log2 (derived, not state)

    def update_run(self, run: Sequence[StepRecord], ctxs: Sequence[Context], cols: Columns | None = None) -> None:
        """update()'s "most steps" inline (its first test, the state's part of it answered until
        update() next changes the state; and all it does with them), update() for the rest."""
        steady = self._steady()
        for record, ctx in zip(run, ctxs):
            m = record.metrics
            skipped = m.get(keys.OVERFLOW_SKIPPED)
            if steady is not None and m.get(keys.LOSS_SCALE) == steady and (skipped is None or skipped == 0.0):
                self.pinned, self.last_step, self.peak_step = 0, record.step, record.step
                self.latch.armed = self.warned.armed = True
                continue
            found = self.update(record, ctx)
            if found:
                ctx.found += found
            steady = self._steady()

    def _steady(self) -> float | None:
        """The scale at which a step is one of update()'s "most steps", if any: the last one, at its
        peak, the search over."""
        s = self.last
        if s is None or self.searching or not (s == self._log2[0] and self._log2[1] == self.peak and s > 0.0):
            return None
        return s

    def update(self, record: StepRecord, ctx: Context) -> list[Finding]:
        m = record.metrics
        s = m.get(keys.LOSS_SCALE)
        if s is None or not 0.0 <= s < math.inf:
            return []
        step, skipped = record.step, m.get(keys.OVERFLOW_SKIPPED)
        if (s == self.last and s == self._log2[0] and self._log2[1] == self.peak and s > 0.0
                and (skipped is None or skipped == 0.0) and not self.searching):
            # Most steps: the scale unchanged at its peak, nothing skipped, the search over. What the
            # rule below does with such a step, and all: nothing moved, overflowed nor pinned; at its
            # peak, no halving to count; both latches re-armed.
            self.pinned, self.last_step, self.peak_step = 0, step, step
            self.latch.armed = self.warned.armed = True
            return []
        interval = step - self.last_step if self.last_step is not None else 1
        overflowed = skipped is not None and skipped >= max(interval, 1)
        same = self.last is not None and s == self.last
        # a scale that moved, or a step skipped for overflow: a dynamic scaler at work
        self.moved = self.moved or (self.last is not None and not same) or (skipped is not None and skipped >= 1)
        # (a count of skips printed as inf or 1e300 is no count to add: one skip more)
        self.pinned = self.pinned + (int(skipped) if skipped < 1e9 else 1) \
            if skipped is not None and overflowed and same else 0
        ended = False   # the search ended with the start-up, no step known to have gone through
        if self.searching and (not ctx.in_startup or (skipped is not None and skipped == 0.0)):
            self.searching = False   # a step went through (the search found its scale), or the run's start-up is over
            ended = skipped is None or skipped != 0.0
        self.last, self.last_step = s, step
        if s == 0.0:
            return self._fire(step, s, "zero", ctx, on=True)
        if self.pinned >= self.pinned_skips:
            return self._fire(step, s, "pinned", ctx, on=True)
        ls = self._log2[1] if s == self._log2[0] else self._remember_log2(s)
        if self.searching:
            # The search halves by design. One that fails stops at the floor and stays there (its
            # scaler can go no lower: DeepSpeed then exits) or never ends (apex: the floor, once
            # the start-up is over); one that passes below the floor assumed has a lower one
            # (fairseq: 1e-4) and may yet find its scale and grow back.
            at_floor = self.moved and same and ls <= self._log2_min
            return self._fire(step, s, "floor", ctx, on=at_floor, off=not at_floor)
        if ended and self.moved and ls <= self._log2_min:   # a search that ended at the floor failed
            return self._fire(step, s, "floor", ctx, on=True)
        near_floor = self.moved and ls - self._log2_min <= self.floor_halvings
        if ls == self.peak and not (near_floor and overflowed):   # at its peak, not overflowing at its
            self.peak_step = step                # floor (most steps): no halving to count, nothing to
            self.latch.armed = self.warned.armed = True   # report, both latches re-armed
            return []
        if self.peak is not None and self.peak_step is not None:
            decay = (step - self.peak_step) // self.peak_decay_steps
            if decay > 0:
                self.peak = max(ls, self.peak - decay)
                self.peak_step = step
        if self.peak is None or ls >= self.peak:
            self.peak, self.peak_step = ls, step
        drop = self.peak - ls
        # near the floor by repeated halvings, or at it having fallen there or overflowing there:
        # one halving of a scale that has sat at 8 for an epoch, to 4, is a scaler at work (a
        # fairseq reference log); a scale that ended its search below the floor assumed, and
        # trains there or grows back, is a scaler whose floor is lower (fairseq's 1e-4)
        near_floor = near_floor and ((ls <= self._log2_min and (overflowed or drop >= 1))
                                     or drop >= self.floor_halvings)
        rule = "halvings" if drop >= self.min_halvings else "floor"
        off = drop < self.min_halvings / 2 and not near_floor
        if drop >= self.min_halvings or near_floor:
            out = self._fire(step, s, rule, ctx, on=True, off=off)
        else:   # the latch can only re-arm (hot path: no call)
            out = []
            if off:
                self.latch.armed = True
        off = drop < self.warn_halvings / 2 and not near_floor
        if drop >= self.warn_halvings and not out and self.latch.armed:
            if self.warned.update(on=True, off=off):
                out = self._fire(step, s, "falling", ctx, on=True)
        elif off:
            self.warned.armed = True
        return out

    def at_end(self, ctx: Context) -> list[Finding]:
        """The end of a replayed log still in the search, its scale within ``floor_halvings`` of
        the floor or below it: no step went through, and none will (an excerpt of overflow lines
        halving to 0.5, or to 1e-202): the search failed."""
        s = self.last
        if not self.searching or s is None or s <= 0.0 or not self.moved:
            return []
        if math.log2(s) - self._log2_min > self.floor_halvings:
            return []
        return self._fire(ctx.step, s, "floor", ctx, on=True)

    def _peak_said(self, peak: float) -> str:
        """The recent peak as a sentence says it: a level the scale came down from, which decays one
        halving per ``peak_decay_steps`` steps (so a long run's periodic halvings never add up): not
        always a value the log printed."""
        return f"{peak:g}, a level that decays one halving per {self.peak_decay_steps} steps"

    def _remember_log2(self, s: float) -> float:
        """log2 of a new scale (a scale stays the same for hundreds of steps); derived, not state."""
        self._log2 = (s, math.log2(s))
        return self._log2[1]

    def _fire(self, step: int, s: float, rule: str, ctx: Context, *, on: bool, off: bool = False) -> list[Finding]:
        if rule != "falling" and not self.latch.update(on, off):
            return []
        peak_log2 = self.peak
        peak = 2.0 ** peak_log2 if peak_log2 is not None else None
        if rule == "zero":
            what = (f"The fp16 loss scale reached 0 at step {step}: every gradient is multiplied by "
                    f"zero, so no step trains the model.")
        elif rule == "pinned":
            what = (f"Every optimizer step has overflowed for {self.pinned} steps up to step {step} "
                    f"while the fp16 loss scale stayed at {s:g}: the scaler is at its minimum and "
                    f"cannot go lower, so every step is skipped (DeepSpeed stops the run here).")
        elif rule == "falling":
            assert peak_log2 is not None and peak is not None   # the rule is judged against the peak
            what = (f"The fp16 loss scale has halved to {s:g} at step {step}, "
                    f"{_halvings(peak_log2 - math.log2(s))} below its recent peak ({self._peak_said(peak)}): "
                    f"the scaler keeps finding overflows. At {self.min_scale:g} DeepSpeed/Megatron stop the "
                    f"run or skip every step.")
            return [self.finding(
                step, severity="warning", value=s, baseline=peak, threshold=peak / 2 ** self.warn_halvings,
                onset_step=self.peak_step,
                message=(f"{what} Keep a checkpoint from now, while the weights are good; if it goes on "
                         f"halving, consider bf16 or a lower LR."),
                rule=rule, halvings=peak_log2 - math.log2(s),
                pinned_skips=self.pinned, past_startup=not self.searching)]
        else:
            what = (f"The fp16 loss scale collapsed to {s:g} at step {step}"
                    + (f", {_halvings(peak_log2 - math.log2(s))} below its recent peak ({self._peak_said(peak)})"
                       if peak_log2 is not None and peak is not None else "")
                    + f"; at {self.min_scale:g} DeepSpeed/Megatron stop the run or skip every step.")
        at_peak = f" (before step {self.peak_step})" if peak is not None else ""
        return [self.finding(
            step, severity="critical", value=s, baseline=peak,
            threshold=peak / 2 ** self.min_halvings if peak is not None else None,
            onset_step=self.peak_step,
            message=(f"{what} Gradients overflow fp16 on almost every step: roll back to a checkpoint "
                     f"from before the overflows began{at_peak}, and consider bf16 or a lower LR."),
            rule=rule, halvings=(peak_log2 - math.log2(s)) if peak_log2 is not None and s > 0 else None,
            pinned_skips=self.pinned, past_startup=not self.searching or rule != "halvings")]


def _halvings(n: float) -> str:
    return f"{n:.0f} halving" + ("" if round(n) == 1 else "s")
