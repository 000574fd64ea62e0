"""Divergence without a spike: the loss drifts up and keeps going."""
from __future__ import annotations

import math
from typing import Sequence

from .. import keys
from ..record import Finding, StepRecord
from ..stats import EWMean, Latch, RiseAboveLow, RollingMedian
from .base import Columns, Context, Detector, check, fmt, positive, positive_int


_SQRT2 = math.sqrt(2.0)


class Divergence(Detector):
    """Sustained upward drift of the loss (the 104B "diverging that didn't go through a spike"),
    judged on the run's own time scales (docs/design.md, Findings).

    Data order moves a loss for a while without anything being wrong: a run whose data is not
    shuffled across shards swings between easier and harder stretches for tens of steps (a GPT-2
    124M run: between 3.05 and 3.4 while its 100-step mean falls from 3.32 to 3.26). So the level
    judged is the running median of the last ``window`` losses (blind to one-step blips), and
    the rule learns how long the run's own swings last: the *swing horizon* H is the longest
    rise of that level by half a threshold above its low that came back (below a quarter), in
    points (rises no longer than the window are the median's own noise; at most
    ``max_horizon_samples``). Then:

    - once H is longer than the window, the level is the median smoothed over H points (a swing
      is averaged out, a sustained rise is not);
    - a *rise* is the level standing more than ``min_rise`` (and ``noise_sigmas`` × the noise of
      one point: the spread of the point-to-point changes around their mean, which a trend does
      not widen)
      above its lowest value for ``persist_samples`` consecutive points (near the loss's floor,
      ``min_rise`` of the floor that ``loss_spike`` measures rises against);
    - it is a ``warning`` while it lasts no longer than the swings this run has already shown,
      and ``critical`` once it outlasts them (``persist_samples`` + H points), or at once when it
      comes with the grad norm or the update norm (``update_norm``) grown ``growth_ratio``-fold
      since the low (gradients that grow with the loss are no data-order swing). A run with no
      swings (H = 0) gets the critical finding at once.

    Spike episodes are left to ``loss_spike``: the median restarts after one (the horizon is kept),
    and nothing is reported (nor escalated) at a point where the loss itself is back within the
    threshold of the low: a bump that came back holds the median up for half a window, and a
    recovery wins. One episode per rise, re-armed when the level falls back.
    O(window) per update with a window of 7; state: three windows and 15 scalars.

    >>> d = Divergence()
    >>> xs = [3.0 - 0.001 * s for s in range(200)] + [2.8 * 1.01 ** s for s in range(1, 40)]
    >>> [(f.step, f.severity) for s, x in enumerate(xs, 1)
    ...  for f in d.update(StepRecord(s, {"loss": x}), Context(s))]
    [(216, 'critical')]
    """

    name = "divergence"
    kind = "divergence"
    signals = (keys.LOSS,)
    _state = ("med", "noise", "step_change", "prev_log", "rise", "points", "swing", "horizon", "smooth", "grad_med",
              "update_med", "at_low", "episode", "level", "spread", "prev", "fall", "faster", "faster_from", "below", "start", "runaway",
              "epochs", "spike_points")

    def __init__(self, *, window: int = 7, min_rise: float = 0.1, noise_sigmas: float = 4.0,
                 persist_samples: int = 4, max_horizon_samples: int = 500, growth_ratio: float = 1.5,
                 runaway_factor: float = 10.0):
        self.window = positive_int("window", window)
        self.min_rise = positive("min_rise", min_rise)
        self.noise_sigmas = positive("noise_sigmas", noise_sigmas)
        self.persist_samples = positive_int("persist_samples", persist_samples)
        self.max_horizon_samples = positive_int("max_horizon_samples", max_horizon_samples)
        self.growth_ratio = check("growth_ratio", growth_ratio,
                                  isinstance(growth_ratio, (int, float)) and growth_ratio > 1, "a number > 1")
        self._log_min_rise = math.log1p(self.min_rise)
        self._mid = window // 2 if window % 2 else None   # a full window's median: its middle value
        self.med = RollingMedian(window)
        # The noise: the mean |change of log(loss) from one point to the next − its mean| (a trend
        # moves every step alike: what it leaves is noise), debiased: the first points tell it.
        self.noise = EWMean(0.05, start="zero")
        self.step_change = EWMean(0.05, start="running")
        self.prev_log: float | None = None
        self.rise = RiseAboveLow(self.persist_samples)
        self.points = 0                # points judged since the (re)start
        self.swing: int | None = None  # the point where the level last rose half a threshold above its low
        self.horizon = 0               # H: the longest such rise that came back (points)
        self.smooth: float | None = None   # the level judged: the median, smoothed over H points
        self.grad_med = RollingMedian(window)     # log grad norm, blind to blips
        self.update_med = RollingMedian(window)   # log update norm
        self.at_low: list = [None, None]   # [log grad norm, log update norm] when the level was lowest
        self.episode: list | None = None   # [first step, escalated] of the rise being reported
        self.spike_points = 0   # the points of the loss spike open now, or just closed (the low kept)
        # The runaway below zero, on the loss itself (any sign): its level and spread (EW, additive),
        # the previous value, the fall into it, how many falls in a row grew and from where, the
        # points far below in a row, its starting scale, a latch.
        self.runaway_factor = positive("runaway_factor", runaway_factor)
        self.level = EWMean(0.05, start="running")
        self.spread = EWMean(0.05, start="running")
        self.prev: float | None = None
        self.fall = 0.0
        self.faster = 0   # falls in a row, each larger than the one before
        self.faster_from: int | None = None   # ... after this point's step
        self.below = 0    # points in a row a third of runaway_factor below the level
        # the loss's own scale: [points, largest |loss|, closed, all above zero, ...] of its first 20
        # non-zero points, or of those before it first went below zero (3 at least, every one above
        # it: a loss below zero from its start has no crossing to close on): where it stood before
        # the fall, a scale where they stood a level away from zero (_scaled)
        self.start = [0, 0.0, False, True, 0.0, 0.0, 0.0]   # ..., the sum of those points, and the sums of
        # the changes between them and of their squares (their noise, which a trend does not widen)
        self.runaway = Latch()
        # epochs rising: [the value the rises started from, its step, rises in a row, the last value, told,
        #                 told it exploded]
        self.epochs: list = [None, None, 0, None, False, False]

    def _restart(self, keep_low: bool = False):
        """A fresh median (the points of a spike are no level); ``keep_low``: the low before it
        stays the reference while the spike is open (see :meth:`update`)."""
        self.med = RollingMedian(self.window)
        self.prev_log = None
        if keep_low:
            self.rise.count = 0
        else:
            self.rise.restart()
        self.swing, self.smooth, self.episode = None, None, None

    def on_segment(self, start_step: int, reason: str) -> None:
        self._restart()

    # update(): the run of one record (Detector._update_alone); the rule is written as replay's loop
    # (each `return` of a point's update a `continue`, its findings added to its context's), the
    # loss, its log and the grad norm's log read from the run's columns (Columns)
    update = Detector._update_alone

    # long: the detector's rule, the slow and fast trend windows read in one pass per point;
    # split, each piece would carry the same locals. Left to the detectors' owners (issue 35
    # keeps rules alone).
    def update_run(self, run: Sequence[StepRecord], ctxs: Sequence[Context], cols: Columns | None = None) -> None:
        cols = cols or Columns.of(run)
        window = self.window   # (configuration: set once, read at every point)
        for record, ctx, x, lx, lg in zip(run, ctxs, cols.loss, cols.loss_log, cols.grad_log):
            if x is None or not math.isfinite(x):
                continue
            runaway = self._runaway(record.step, x)
            if runaway or x <= 0.0 or ctx.loss_signed:
                if runaway:
                    ctx.found += runaway
                continue
            rising = self._epochs_rising(record.step, x, ctx) if ctx.steps_are_epochs else []
            if ctx.loss_spike_open:
                self.spike_points += 1
                self._restart(keep_low=True)
                if rising:
                    ctx.found += rising
                continue
            if self.spike_points:
                # a spike of a point or two that "came back" within its noise still above its low (a
                # loss that stepped up x4 and stays) is judged against the low before it; one that
                # lasted longer has a tail of its own coming down: from its level now, as a new start
                if self.spike_points > 2:
                    self.rise.restart()
                self.spike_points = 0
            if ctx.found and any(f.kind == "spike_unrecovered" for f in ctx.found):
                self._restart()   # loss_spike said the spike's level is the new one (a critical): from it
                if rising:
                    ctx.found += rising
                continue
            assert lx is not None   # log(x) (Columns): 0 < x < inf here
            # (the windows appended to directly: RollingMedian.update, less a call per point)
            if lg is not None:   # log(grad norm) where 0 < it < inf (Columns)
                self.grad_med.window.append(lg)
            u = record.metrics.get(keys.UPDATE_NORM)
            if u is not None and 0.0 < u < math.inf:
                self.update_med.window.append(math.log(u))
            last = self.med.window   # the last `window` logs
            last.append(lx)
            prev, self.prev_log = self.prev_log, lx
            nz = self.noise
            if prev is not None:   # the noise, from the steps between points around their mean (the trend)
                d = lx - prev
                sc = self.step_change   # (both EWMean.update, written out: the same sums, less two calls)
                nz.n += 1               # (a zero start: alpha from the first point)
                nz.mean += nz.alpha * ((abs(d - sc.mean) if sc.n else 0.0) - nz.mean)
                n = sc.n = sc.n + 1
                sc.mean += (sc.alpha if n > sc.warm else max(sc.alpha, 1.0 / n)) * (d - sc.mean)
            if len(last) < window or rising or self.epochs[4]:   # not full (RollingMedian.full);
                if rising:                                  # an epoch rise said is said once
                    ctx.found += rising
                continue
            # (RollingMedian.median of a full window of odd size, less its call; EWMean.debiased once
            # its weights sum to 1, less its call)
            med = sorted(last)[self._mid] if self._mid is not None else self.med.median
            noise = (nz.mean if nz.n >= nz.whole_from else nz.debiased) / _SQRT2   # the mean absolute
            # deviation of one point; of a mean over the last w losses (a window the reader knows:
            # Lightning 1.x's bar) a step changes it by a w-th of a loss's, the level it wanders by √w times that
            w = record.metrics.get(keys.LOSS_WINDOW)
            if w:
                noise *= math.sqrt(w)
            self.points += 1
            h = self.horizon
            a = 2.0 / (h + 1) if h > self.window else 1.0
            level = self.smooth = med if self.smooth is None else self.smooth + a * (med - self.smooth)
            rise = self.rise
            low = rise.low if rise.low is not None else level
            if ctx.loss_floor_log > low:   # near its floor a rise is measured against the floor (LossSpike)
                log_rise = math.log1p(self.min_rise * math.exp(min(ctx.loss_floor_log - low, 700.0)))
            else:
                log_rise = self._log_min_rise
            thr = self.noise_sigmas * 1.25 * noise
            thr = thr if thr > log_rise else log_rise   # max(log_rise, thr), less a call
            fired = rise.update(level, record.step, thr)
            # The swings the run has shown: rises of half a threshold that came back, and how long.
            low = level if level < low else low   # rise.low_value: the low, or this level below it
            up = level - low
            if self.swing is None and up > thr / 2:
                self.swing = self.points
            elif self.swing is not None and up < thr / 4:
                if self.points - self.swing > self.window:   # shorter ones are the median's own noise
                    self.horizon = min(max(self.horizon, self.points - self.swing), self.max_horizon_samples)
                self.swing = None
            if rise.low_step == record.step:   # a new low: what the grad and update norms were there
                self.at_low = [self._now(self.grad_med), self._now(self.update_med)]
            # Recovery wins: the median lags a loss that came back by half a window (a 4-point bump
            # holds it up for 4 points); nothing is reported while the loss itself is back below.
            # ... and a rise is more than the loss's additive noise allows a median (~0.67σ for the
            # difference of two medians of 7): near zero, log(loss) magnifies a likelihood's noise.
            if not fired and self.episode is None:   # nothing to report, nor to re-arm or close (the
                continue                             # episode; `back` is read by neither: not worked out)
            back = lx - low <= thr or (
                math.exp(level) - math.exp(low) <= self.noise_sigmas * 0.67 * ctx.loss_step_noise)
            if fired and back:
                rise.latch.rearm()   # judged again at the next point
                fired = False
            if fired:
                self.episode = [record.step, False]
            elif self.episode is not None and rise.count == 0:
                self.episode = None   # it fell back: a swing after all
            ep = self.episode
            if ep is None or ep[1] or back:
                continue
            lasted = rise.count
            grown = self._grown()
            outlasted = lasted >= self.persist_samples + h
            if not (fired or outlasted or grown):
                continue
            ep[1] = outlasted or grown
            ctx.found.append(self._finding(record.step, level, thr, lasted, h, grown, critical=ep[1]))

    def _runaway(self, step: int, x: float) -> list[Finding]:
        """The *runaway* rule: a loss falling without bound (a likelihood whose variance collapses,
        an objective with no floor) runs below zero and on until it is NaN. Judged on the loss
        itself, additively (any sign), on its own scales, by ``runaway_factor`` (10: an order of
        magnitude):

        - *magnitude*: its EW level (~20 points) is below zero, ``runaway_factor`` times the
          largest magnitude of its first 20 non-zero points, or of those before it first went
          below zero (3 at least, all above it: in a short log the first 20 hold the fall itself;
          a loss below zero from its start keeps its first 20), where it
          stood before training moved it, and the loss still below that level: a Gaussian NLL whose variance collapses
          falls -1 -> -44 over 250 steps at a slowing pace, then NaN; a healthy one that crosses
          zero settles a few times its start below it;
        - *accelerating*: a point below zero, ``runaway_factor`` times its spread (the EW mean
          absolute deviation around its EW level; points of a speeding fall a third of that far
          below do not enter either) below that level, each of its last two falls larger than the
          one before and the point before a third as far below already (a steady fall keeps its
          distance to the lagging level at about its spread; noise, even an RL loss's heavy-tailed
          noise, rarely gives two such points in a row), or one jump 10 times that far:
          37 -> -15.8 -> -92 -> -801 -> NaN is caught at -15.8.

        Critical, once per run-away (re-armed once its level is back within a third of its own
        scale and no point is far below). O(1); state: 2 EW means,
        8 scalars."""
        prev, fall_before = self.prev, self.fall
        self.prev = x
        self.fall = prev - x if prev is not None else 0.0
        if 0.0 < fall_before < self.fall:   # falls growing in a row
            self.faster += 1
        else:
            self.faster, self.faster_from = 0, step   # they grow after this point, if at all
        start = self.start
        if x < 0.0 and start[0] >= 3 and start[3]:   # it crossed zero after 3 points above it
            start[2] = True
        if not start[2] and x != 0.0:
            start[0] += 1
            start[1] = max(start[1], abs(x))
            start[2] = start[0] >= 20
            start[3] = start[3] and x > 0.0
            start[4] += x
            if prev is not None and start[0] > 1:
                d = x - prev
                start[5] += d
                start[6] += d * d   # (inf past a float's range, never an error)
        level, spread = self.level.mean, self.spread.mean
        warm = self.level.n >= self.window and spread > 0.0
        far = (level - x) / spread if warm else 0.0
        third = self.runaway_factor / 3
        if far < third or not self.faster:   # a point of a speeding fall, far below,
            # is not the loss's own level and spread (a steady fall keeps moving them)
            # (EWMean.update of each, written out: the same sums, less two calls; both 'running' of
            # one alpha and updated here only, together: one count, one weight)
            lv, sp = self.level, self.spread
            n = lv.n = lv.n + 1
            a = lv.alpha if n > lv.warm else max(lv.alpha, 1.0 / n)
            lv.mean += a * (x - lv.mean)
            sp.n = n
            sp.mean += a * ((abs(x - level) if n > 1 else 0.0) - sp.mean)
        self.below = self.below + 1 if far >= third else 0
        # back: its level within a third of that of its own scale, no point far below
        back = far < third and (not start[2] or level > -third * start[1])
        if x >= 0.0 or self.level.n < 3:
            if back:   # re-armed (hot path: no call)
                self.runaway.armed = True
            return []
        # the magnitude needs no spread: a level of 3 points will do (a short log of epochs)
        deep = start[2] and level < -self.runaway_factor * start[1] and x < level and self._scaled()
        speeding = warm and far >= self.runaway_factor and (
            (self.faster >= 2 and self.below >= 2) or far >= 10 * self.runaway_factor)
        if not self.runaway.update(on=deep or speeding, off=back):
            return []
        if speeding:
            onset = self.faster_from if self.faster_from is not None else step
            how = (f"{far:.0f}x its own spread ({fmt(spread)}) below its level {fmt(level)}, and faster "
                   f"({fmt(self.fall)} in one step, {fmt(fall_before)} the point before; speeding up since step "
                   f"{onset})")
        else:
            onset = self.faster_from if self.faster_from is not None else step
            how = (f"its level {fmt(level)} is {-level / start[1]:.0f}x the largest magnitude of its first points "
                   f"({fmt(start[1])}) below zero, and still falling")
        return [self.finding(
            step, severity="critical", value=x, baseline=level, onset_step=onset,
            message=(f"The loss is falling without bound: {fmt(x)} at step {step}, {how}. An objective that runs "
                     f"away below zero (a likelihood whose variance collapses, an unbounded term) ends in NaN: "
                     f"roll back to a checkpoint from before the fall and bound the objective (a likelihood's "
                     f"variance or log-variance clamped; a critic's targets and the rewards' scale checked) or "
                     f"lower the LR."),
            rule="runaway", how="accelerating" if speeding else "magnitude", spreads=far, spread=spread,
            start_scale=start[1], past_startup=True)]   # unmistakable, however early

    def _scaled(self) -> bool:
        """Whether the first points stood a level away from zero (their mean 3 of one point's noise
        from it, the noise from the changes between them, which a falling trend does not widen; as
        a Gaussian NLL's ~1.4 does): a scale the loss had before training moved it. A loss that
        starts at zero within its noise (SimSiam's negative cosine similarity from a random init:
        ~-0.005 +- 0.003) has none: ten times that is no runaway (it falls to its floor, -1); the
        accelerating rule still judges it."""
        n, sx, sd, sdd = self.start[0], self.start[4], self.start[5], self.start[6]
        if n < 3:
            return True
        mean, d = sx / n, sd / (n - 1)
        point_var = max(sdd / (n - 1) - d * d, 0.0) / 2.0   # one point's, from its changes around their mean
        return mean * mean > 9.0 * point_var

    def _epochs_rising(self, step: int, x: float, ctx: Context) -> list[Finding]:
        """A replayed log whose steps are epochs (it prints nothing finer): each point is the mean
        of a whole pass over the data, which batch noise hardly moves, so the median of 7 (blind to
        one batch's blip) and the swings of data order are not needed — and a log of 9 epochs
        never fills them. The loss rising at more than ``persist_samples`` points in a row (5: six
        points in rising order are a 1-in-720 draw of a flat noisy level, and a 40-epoch log holds
        35 such windows), by more than ``min_rise`` in all from where the rises began, is a drift:
        a warning, once per run of rises (none while the LR warms up: a rise there is the
        warmup's)."""
        e = self.epochs
        prev, e[3] = e[3], x
        if prev is None or x <= prev or ctx.phase in ("warmup", "rewarm"):
            e[0], e[1], e[2], e[4], e[5] = x, step, 0, False, False
            return []
        e[2] += 1
        if e[4] and not e[5] and x >= e[0] * self.runaway_factor:
            e[5] = True   # the drift said has grown an order of magnitude: exploding
            return [self.finding(
                step, severity="critical", value=x, baseline=e[0], threshold=e[0] * self.runaway_factor,
                onset_step=e[1],
                message=(f"The loss is exploding: it rose at each of its last {e[2]} epochs, from {fmt(e[0])} at "
                         f"epoch {e[1]} to {fmt(x)} at epoch {step} ({x / e[0]:.3g}x), an order of magnitude "
                         f"and more. Training on will not bring it back: roll back to a checkpoint from before "
                         f"epoch {e[1]} and lower the LR."),
                rule="epochs", rise=x / e[0] - 1, points_above=e[2], exploding=True)]
        if e[4] or e[2] <= self.persist_samples or x < e[0] * (1.0 + self.min_rise):
            return []
        e[4] = True
        return [self.finding(
            step, severity="warning", value=x, baseline=e[0], threshold=e[0] * (1.0 + self.min_rise),
            onset_step=e[1],
            message=(f"The loss is drifting up without a spike: it rose at each of its last {e[2]} points, from {fmt(e[0])} "
                     f"at epoch {e[1]} to {fmt(x)} at epoch {step} (+{x / e[0] - 1:.0%}); an epoch's mean over "
                     f"the whole data set hardly moves by batch noise. Keep the last checkpoint from before epoch "
                     f"{e[1]}; if it goes on rising, lower the LR (or check what changed at epoch {e[1]})."),
            rule="epochs", rise=x / e[0] - 1, points_above=e[2])]

    def _now(self, med: RollingMedian) -> float | None:
        return med.median if med.window else None

    def _grown(self) -> str | None:
        """The signal (grad norm, update norm) that grew ``growth_ratio``-fold since the low."""
        for name, med, low in (("grad norm", self.grad_med, self.at_low[0]),
                               ("update norm", self.update_med, self.at_low[1])):
            now = self._now(med)
            if now is not None and low is not None and now - low >= math.log(self.growth_ratio):
                return f"the {name} rose x{math.exp(now - low):.1f} since then"
        return None

    def _finding(self, step: int, level: float, thr: float, lasted: int, h: int, grown: str | None,
                 *, critical: bool) -> Finding:
        lo, now, low_step = math.exp(self.rise.low_value), math.exp(level), self.rise.low_step
        what = (f"its running median{f' (averaged over {h} points, the swings this run has shown)' if h > self.window else ''} "
                f"rose from {fmt(lo)} at step {low_step} to {fmt(now)} at step {step} (+{now / lo - 1:.0%}, "
                f"{lasted} points above +{math.expm1(thr):.0%})")
        if critical:
            why = (grown if grown else
                   f"longer than any swing this run has shown ({h} points)" if h else
                   "and this run has shown no swings of its own")
            message = (f"The loss is diverging without a spike: {what}; {why}. Training on will not "
                       f"fix it: roll back to a checkpoint before step {low_step} and lower the LR or "
                       f"change the data order.")
        else:
            message = (f"The loss is drifting up without a spike: {what}. This run's loss has swung "
                       f"for up to {h} points before (data order); this becomes critical if the rise "
                       f"outlasts that ({self.persist_samples + h} points) or the grad norm grows "
                       f"with it. Keep the last checkpoint before step {low_step}.")
        return self.finding(step, severity="critical" if critical else "warning", value=now, baseline=lo,
                            threshold=lo * math.exp(thr), onset_step=low_step, message=message,
                            rise=now / lo - 1, swing_horizon_samples=h, points_above=lasted,
                            grown=grown)
