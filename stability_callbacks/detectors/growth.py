"""Sustained growth of a norm (grad norm, parameter norm) — slow drifts, not spikes."""
from __future__ import annotations

import math
from typing import ClassVar, Sequence

from .. import keys
from ..record import Finding, StepRecord
from ..stats import RiseAboveLow, RobustLevel
from .base import Columns, Context, Detector, check, fmt, positive, positive_int


class _SustainedGrowth(Detector):
    """A slow robust level (EW of the log) has stood ``min_growth`` × above its lowest value
    since the reference point for ``persist_samples`` points. Warning once; re-armed when it
    falls back below half that growth (in log terms). O(1); state: 1 level, 4 scalars.
    """

    _state: ClassVar[tuple[str, ...]] = ("level", "rise")
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
        self._log_growth = math.log1p(self.min_growth)

    # update(): the run of one record (Detector._update_alone); the rule is written as replay's loop
    update = Detector._update_alone

    def update_run(self, run: Sequence[StepRecord], ctxs: Sequence[Context], cols: Columns | None = None) -> None:
        if self.signals[0] == keys.GRAD_NORM:   # the grad norm, its log where 0 < it < inf, skipped steps (Columns)
            cols = cols or Columns.of(run)
            values, logs, skips = cols.grad, cols.grad_log, cols.skipped
        else:   # the same, of this detector's own signal
            values, logs, skips = _column(run, self.signals[0])
        for record, ctx, v, lv, skipped in zip(run, ctxs, values, logs, skips):
            if lv is None or skipped or v is None:   # (v is None only where lv is: for the types)
                continue
            self.level.update_log(lv)   # .update(v), less a call
            if self.after_warmup and ctx.phase == "warmup":
                continue
            out = self._fast(record.step, v)
            if out or record.step <= self.startup_steps or (self.after_warmup and ctx.phase is None):
                if out:
                    ctx.found += out
                continue
            lv = self.level.level
            if self.rise.update(lv, record.step, self._log_growth):
                lo, now, low_step = math.exp(self.rise.low_value), math.exp(lv), self.rise.low_step
                ctx.found.append(self._growth(record.step, now, lo, low_step, now / lo))

    def _fast(self, step: int, v: float) -> list[Finding]:
        """A shorter rule where the signal is a noisy sample per point (the grad norm): none here."""
        return []

    def _growth(self, step: int, now: float, lo: float, low_step: int | None, growth: float,
                severity: str = "warning", advice: str = "", **details) -> Finding:
        return self.finding(
            step, severity=severity, value=now, baseline=lo,
            threshold=lo * (1 + self.min_growth), onset_step=low_step,
            message=(f"{self.what} has grown steadily from {fmt(lo)} at step {low_step} to "
                     f"{fmt(now)} at step {step} ({growth:.1f}x). {advice or self.advice}"),
            growth=growth, **details)



def _column(run: Sequence[StepRecord], key: str) -> tuple[list, list, list]:
    """:class:`Columns`' grad norm, its log and skipped steps, of the signal ``key`` instead."""
    values = [r.metrics.get(key) for r in run]
    logs = [math.log(v) if v is not None and 0.0 < v < math.inf else None for v in values]
    return values, logs, [(r.metrics.get(keys.OVERFLOW_SKIPPED) or 0.0) >= 1.0 for r in run]

#: What a grad norm's steady growth says where the loss is a game's (Monitor.declare_game).
_GAME = ("The loss is players' losses pulling against each other (a GAN's): one player's gradients grow as the "
         "other sharpens, so this alone says little; a jump by orders of magnitude would (grad_norm_spike).")


class GradNormGrowth(_SustainedGrowth):
    """Sustained rise of the global grad norm ("the cliff gets sharper": longer-than-chinchilla).

    Two rules: the slow level of the class above (after warmup and ``startup_steps``), and a
    short one for a grad norm that climbs on every point. Each logged grad norm is one batch's
    sample, noisy from batch to batch, so without a trend ``n`` points in a row rise with
    probability 1/n! (any order of exchangeable values is as likely): ``n`` rises in a row with
    n! ≥ 1/``false_alarm_rate`` (10 at 1e-6) and ``1 + min_growth`` × overall is growth, however
    few points the log has (Grokfast: x1.5 per logged step). Not during warmup (the grad norm
    rises with the LR); the first steps' findings are ``info`` by the policy. State: 4 more scalars.
    """

    name = "grad_norm_growth"
    kind = "grad_norm_growth"
    signals = (keys.GRAD_NORM,)
    what = "The grad norm"
    advice = ("The run may be climbing the walls of a sharp valley; consider a lower LR or a faster "
              "LR decay, and keep recent checkpoints.")
    _state = _SustainedGrowth._state + ("climb_from", "climb_step", "climb", "last", "game")

    def __init__(self, *, min_growth: float = 2.0, persist_samples: int = 50, alpha: float = 0.02,
                 startup_steps: int = 200, false_alarm_rate: float = 1e-6):
        super().__init__(min_growth=min_growth, persist_samples=persist_samples, alpha=alpha,
                         after_warmup=True, startup_steps=startup_steps)
        self.false_alarm_rate = check("false_alarm_rate", false_alarm_rate,
                                      isinstance(false_alarm_rate, float) and 0 < false_alarm_rate < 1, "in (0, 1)")
        n, chance = 1, 1.0   # the shortest run of rises that chance alone gives at this rate
        while chance > false_alarm_rate:
            n += 1
            chance /= n
        self.climb_samples = n
        self.climb_from: float | None = None   # where the current run of rises began, and its step
        self.climb_step: int | None = None
        self.climb = 0                          # the points of the run so far
        self.last: float | None = None
        self.game = False   # declared (Monitor.declare_game): players' gradients grow as they sharpen

    def _growth(self, step: int, now: float, lo: float, low_step: int | None, growth: float,
                severity: str = "warning", advice: str = "", **details) -> Finding:
        if self.game:   # a generator's gradients grow as its discriminator sharpens: the game's own
            severity, advice, details["game"] = "info", _GAME, True
        return super()._growth(step, now, lo, low_step, growth, severity, advice, **details)

    def _fast(self, step: int, v: float) -> list[Finding]:
        last, self.last = self.last, v
        if last is None or v <= last or self.climb_from is None:
            self.climb_from, self.climb_step, self.climb = v, step, 1
            return []
        self.climb += 1
        if self.climb != self.climb_samples or v < (1 + self.min_growth) * self.climb_from:
            return []
        return [self._growth(step, v, self.climb_from, self.climb_step, v / self.climb_from,
                             rule="every_point", points=self.climb)]


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
