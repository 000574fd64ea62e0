"""A run that is not learning: the loss never left its first level, sits at chance level, or
nothing moves the weights."""
from __future__ import annotations

import math
from typing import Any

from .. import keys
from ..record import Finding, StepRecord
from ..stats import EWMean
from .base import Context, Detector, check, count, fmt, positive, positive_int
from .stall import printed_resolution

_HALF_SQRT_PI = 0.5 * math.sqrt(math.pi)
_LN2 = math.log(2.0)   # the chance level of the fewest classes there are
_ABSURD = math.log(100.0)   # a run's first point this far above the next is no level of its loss
_SQRT12 = math.sqrt(12.0)   # the σ of a rounding to one digit is the digit / √12
#: What a run that does not learn usually has, for the message.
CAUSES = ("an LR of 0 or far too small, frozen parameters (or an optimizer holding other parameters "
          "than the model's), labels disconnected from the inputs (shuffled apart, all one class), "
          "or a model collapsed to a constant output")


#: A grad norm this fraction of its level or less (in log): nothing moves the weights (the *still*
#: rule), and the name it is said under.
_LOG_VANISHED = math.log(1e-6)
_LN10 = math.log(10.0)
_GRAD_VANISHED = "grad_norm_vanished"


class NotLearning(Detector):
    """The most common question on training forums: "my loss is not decreasing". Three rules, each
    after the LR warmup (a loss need not move while the LR is still small), each a ``warning``
    once per run, since a run that learns nothing is no instability to page for:

    - *flat*: the loss has not left its first level. The first level is the mean ``log(loss)`` of
      the run's first points (``first_samples``, or up to the warmup's end when that is longer: a
      noisy loss needs them); the horizon is the points after it: at least ``horizon_samples`` of
      them (2 while every point printed the same value: no noise to average) and ``horizon_steps``
      steps, both counted and both said (a log numbered by samples seen makes 50 steps two batches;
      each point is at least one optimizer step; an epoch-level log with few points counts too). It
      is judged against the noise that horizon allows: the fall from the first level to the mean
      since is below half of ``min_fall`` (and not a rise of twice that: a loss that rose is
      divergence's), and plus ``z_threshold`` standard errors (the σ of one point from the changes
      between successive points, which a trend does not widen, times √(1/first + 1/horizon), never
      below the print's rounding: its last digit / √12) below ``min_fall`` — a fall of that size
      would have shown and there is none —, and the horizon's points show no downward trend beyond
      their noise (a slow learner, a 7B model's continued pre-training at -1% per hundred steps, is
      learning). Not where one point's σ exceeds ``max_noise`` (0.3 in log(loss), ±35%): each point
      then says more of the batch drawn than of the model (a diffusion loss at random noise levels,
      a fine-tune at batch size 1), and a level that holds is what a trained model shows too; the
      log's end says it cannot tell (``info``). A fall beyond ``min_fall`` by as much, from the first level or from the run's first
      ``first_samples`` points (a loss that fell during the warmup learned there), ends the judging:
      the run learned. Only from the run's start (the first record at the log's own interval: a step
      ≤ 2 x the gap to the second, or step 1 of a live run): an excerpt from mid-run cannot tell
      "never learned" from "learned, then converged". Never for a loss that goes below zero (a
      likelihood, an RL objective), whose level says nothing of learning.
    - *chance*: the loss sits at chance level, ln C for a cross-entropy over C outputs, when C is
      known (``num_outputs``: configured, or declared by a live run from the model's output layer):
      its EW level (~10 points) within ``chance_tolerance`` (2%) of ln C for the horizon, in points
      and in steps (a learning model passes through the band, a GPT-2 at batch size 1 slowly; labels
      disconnected from the inputs hold a classifier 1% above it), provided the first level was
      within ``chance_tolerance`` x 3 of it or above it (a cross-entropy over those C outputs
      starts there from a random init, or above where the init's logits are large; a loss that
      starts below, an MSE, an ELBO, a fine-tune, is not judged against it).
    - *still*: nothing moves the weights, the loss flat meanwhile: the LR, the update norm or
      the grad norm exactly 0 for ``still_samples`` points in a row after the warmup (the LR
      when it dropped there from a tenth of its peak or more, or was never set: a decay printed
      as 0.000000 at a schedule's end is no bug; the grad norm from the run's start only: some
      builds print 0.000 for it on every line, and every parameter frozen gives 0 from step
      1), or the grad norm a millionth of its level before or less after the warmup (every
      ReLU dead after a spike; the level an EW mean of its log, which a spike hardly moves), and
      the loss not fallen by ``min_fall`` (nor by its noise) from its level before. This rule
      alone holds for a loss of any sign too, judged on asinh(loss) (an LR dropped to 0 under an
      objective below zero).

    The points of a loss spike (``ctx.loss_spike_open``) are no level of the loss: not its
    first level, its horizon nor its noise (a spike in the warmup made a run whose units it
    killed, flat since, look as if it had learned).

    Replayed, C is rarely known: the message says so, and how many equally likely classes the
    level is the cross-entropy of (e^level), when that is a level a cross-entropy at chance can
    have (ln 2 or above, within 3 x ``chance_tolerance``); below it (a regression's MSE) it says
    nothing of chance. A GAN's summed adversarial losses stay flat by
    design: the message says so, and ``detectors.not_learning: false`` turns it off for them.
    O(1) per update; state: 24 scalars.

    >>> d = NotLearning()
    >>> [(f.step, f.details["rule"]) for s in range(1, 60)
    ...  for f in d.update(StepRecord(s, {"loss": 2.303 + 0.002 * (s % 3)}), Context(s))]
    [(54, 'flat')]
    """

    name = "not_learning"
    kind = "not_learning"
    signals = (keys.LOSS,)
    _state = ("start", "first", "noise_mean", "noise_dev", "noise_long", "prev_log", "fast", "horizon", "still", "chance",
              "outputs", "signed", "learned", "told", "lr", "grad_level", "grad_zero_from")

    def __init__(self, *, first_samples: int = 3, horizon_samples: int = 3, horizon_steps: int = 50,
                 min_fall: float = 0.05, z_threshold: float = 3.0, still_samples: int = 5,
                 chance_tolerance: float = 0.02, num_outputs: int | None = None, trend_sigmas: float = 2.0,
                 max_noise: float = 0.3):
        self.first_samples = positive_int("first_samples", first_samples)
        self.horizon_samples = positive_int("horizon_samples", horizon_samples)
        self.horizon_steps = positive_int("horizon_steps", horizon_steps)
        self.min_fall = check("min_fall", min_fall, isinstance(min_fall, (int, float)) and 0 < min_fall < 1, "in (0, 1)")
        self.z_threshold = positive("z_threshold", z_threshold)
        self.trend_sigmas = positive("trend_sigmas", trend_sigmas)
        self.max_noise = positive("max_noise", max_noise)
        self.still_samples = positive_int("still_samples", still_samples)
        self.chance_tolerance = check("chance_tolerance", chance_tolerance, isinstance(chance_tolerance, (int, float))
                                      and 0 < chance_tolerance < 1, "in (0, 1)")
        self._need = -math.log1p(-self.min_fall)        # min_fall as a fall of log(loss)
        self._tol = math.log1p(self.chance_tolerance)
        self.num_outputs = check("num_outputs", num_outputs, num_outputs is None or (
            isinstance(num_outputs, int) and not isinstance(num_outputs, bool) and num_outputs >= 2),
            "an integer >= 2 or null")
        self.start: list | None = None    # [first step, second step, from the run's start]
        self.first = [0, 0.0, 0, 0.0]     # the first level: [points, sum of log(loss), last step,
                                          # sum over the first first_samples of them]
        self.noise_mean = EWMean(0.1, start="running")   # the change of log(loss) between points
        self.noise_dev = EWMean(0.1, start="running")    # ... its absolute deviation around that
        self.noise_long = EWMean(0.001, start="running")  # ... the same over ~1,000 points
        self.prev_log: float | None = None
        self.prev_before = 0.0   # the log(loss) of the point before this one (derived, not state)
        self.fast = EWMean(0.1, start="running")         # the level of the loss (for chance, still)
        self.horizon: list | None = None  # after the warmup: [first step, points, sum of log(loss),
                                          # sum of index x log(loss)]
        self.still: list | None = None    # [first step, points, sum of log(loss), log level before, what is 0,
                                          #  sums of i x log(loss) and log(loss)^2]
        self.chance: list | None = None   # [the step the level entered the chance band, points since]
        self.outputs: int | None = None   # C declared by a live run (num_outputs wins)
        self.signed = False
        self.learned = False   # the loss fell from its first level: the flat rule is done
        self.told = False      # reported (once per run)
        self.lr = [0.0, 0.0]   # the largest LR so far, and the last one above 0
        self.grad_level: float | None = None   # the EW mean of log(grad norm) over points not vanished
        self.grad_zero_from: int | None = None  # the step from which the grad norm has printed exactly 0

    def _chance_log(self) -> float | None:
        """log(ln C) when C is known and the first level started within 3 tolerances of it or
        above it, else None (derived, not state): a cross-entropy over C outputs starts there from
        a random init, or above it where the init's logits are large (a T5 built from its config
        starts above ln V and can fall to it during the warmup, and stay: it learned nothing past a
        uniform guess); a loss that starts below it (a fine-tune, an MSE) says nothing of chance.
        A single output (C = 1) is a binary classifier's logit where its loss starts within 3
        tolerances of ln 2, a binary cross-entropy's chance level (not above it: an MSE on one
        output starts anywhere)."""
        c = self.num_outputs or self.outputs
        f = self.first
        if not c or not f[0]:
            return None
        chance = math.log(math.log(max(c, 2)))
        start = f[1] / f[0] - chance
        return chance if (abs(start) if c == 1 else -start) <= 3 * self._tol else None

    def declare_outputs(self, n: int | None) -> None:
        """The model's output size, from a live run (unless ``num_outputs`` is configured); 1: a
        single logit, judged against ln 2 where the loss starts there."""
        if n is not None and n >= 1:
            self.outputs = int(n)

    @property
    def sigma(self) -> float:
        """The σ of one point's log(loss), from the changes between successive points."""
        return _HALF_SQRT_PI * self.noise_dev.mean

    def _noise(self) -> float:
        """The σ the flat rule judges with: the recent one (:attr:`sigma`, ~10 points), or the
        run's own over ~1,000 points where that is larger — a noisy loss's recent σ dips now and
        then below its own, and a rule checked at every point would call a level flat in such a
        dip (a diffusion loss at random noise levels, ±100% a point, called not learning)."""
        return _HALF_SQRT_PI * max(self.noise_dev.mean, self.noise_long.mean)

    def update(self, record: StepRecord, ctx: Context) -> list[Finding]:
        m = record.metrics
        x = m.get(keys.LOSS)
        if x is None or not math.isfinite(x) or self.told:
            return []
        step = record.step
        if x <= 0.0 or ctx.loss_signed:   # below zero, or declared an objective of any sign
            self.signed = True
        warm = ctx.phase != "warmup"
        if self.signed:
            # a loss of any sign says nothing of learning by its level; "nothing moves the weights"
            # (an LR dropped to exactly 0) still holds, the loss judged on asinh (its log's shape far
            # from 0, linear near it): a mis-set schedule's LR of 0 under an objective below zero
            return self._still_only(step, m, math.asinh(x), warm, moved=True)
        lx = math.log(x)
        if ctx.loss_spike_open:
            # a spike's points are no level of the loss: not its first level, its horizon nor its
            # noise (a spike in the warmup made a run whose ReLUs it killed, flat since, look as if
            # it had learned); "nothing moves the weights" is still judged, against the level before
            return self._still_only(step, m, lx, warm, moved=False)
        if self.learned and (not (self.num_outputs or self.outputs) or self._chance_log() is None):
            # the flat rule is done and no chance level applies: only "nothing moves the weights"
            # is left to judge (the noise as it was when the loss fell)
            return self._still_only(step, m, lx, warm, moved=True)
        f = self.first
        if f[0] == 1 and self.horizon is None and self.prev_log is not None and self.prev_log - lx > _ABSURD:
            # the run's first point 100x the next is no level of the loss (a first batch at an absurd
            # scale, then chance at once): the level starts here, and the fall is no noise either
            f[0], f[1], self.prev_log = 0, 0.0, None
        self._learn(step, lx)
        out = self._still(step, m, lx, warm)
        if not out and self.horizon is None and (f[0] < self.first_samples or not warm):
            f[0], f[1], f[2] = f[0] + 1, f[1] + lx, step   # the first level: the first points, the warmup's
            if f[0] == self.first_samples:
                f[3] = f[1]   # ... and the run's very start
            return []
        if not out and warm:   # the horizon: the points after both
            out = self._flat_or_chance(step, lx, x, m.get(keys.LOSS_RESOLUTION), ctx.steps_are_epochs)
        if out:
            self.told = True
        return out

    def _still_only(self, step: int, m, y: float, warm: bool, *, moved: bool) -> list[Finding]:
        """Only the *still* rule on this point, ``y`` its loss on the scale judged (log, or asinh
        for a loss of any sign); ``moved``: the point is the loss's latest (the level before a
        stretch), which a spike's points are not."""
        if moved:
            self.prev_before, self.prev_log = self.prev_log if self.prev_log is not None else y, y
        out = self._still(step, m, y, warm)
        self.told = bool(out)
        return out

    # -- bookkeeping ---------------------------------------------------------------------------
    def _learn(self, step: int, lx: float) -> None:
        start = self.start
        if start is None:
            self.start = [step, None, step <= 1]
        elif start[1] is None:   # the log's own interval: a first record at it is the run's start
            start[1] = step
            start[2] = start[2] or start[0] <= 2 * max(step - start[0], 1)
        prev, self.prev_log = self.prev_log, lx
        self.prev_before = prev if prev is not None else lx
        if prev is not None:
            d = lx - prev
            dev = abs(d - self.noise_mean.mean) if self.noise_mean.n else 0.0
            self.noise_dev.update(dev)
            self.noise_long.update(dev)
            self.noise_mean.update(d)
        self.fast.update(lx)

    # -- the rules -----------------------------------------------------------------------------
    def _flat_or_chance(self, step: int, lx: float, x: float, printed: float | None,
                        epochs: bool) -> list[Finding]:
        """The flat and chance rules over the horizon (``epochs``: the steps are epochs, each a
        pass over the data: ``horizon_steps``, counted in optimizer steps, is met)."""
        f, h = self.first, self.horizon
        if h is None:
            h = self.horizon = [step, 0, 0.0, 0.0]
        i = h[1]   # the point's index in the horizon, for its trend: sums of y and i*y
        h[1] += 1
        h[2] += lx
        h[3] += i * lx
        first, since = f[1] / f[0], h[2] / h[1]
        c = self.num_outputs or self.outputs
        chance = self._chance_log()
        tol = self._tol
        if chance is not None:   # the EW level in the band: since when
            if abs(self.fast.mean - chance) > tol:
                self.chance = None
            elif self.chance is None:
                self.chance = [step, 1]
            else:
                self.chance[1] += 1
        if (step - h[0] < self.horizon_steps and not epochs) or h[1] < self._horizon_points():
            return []
        fell = first - since
        sigma = self._noise()
        se = sigma * math.sqrt(1.0 / f[0] + 1.0 / h[1])
        need = self._need
        k = self.first_samples   # the very start: a loss that fell during a warmup learned there
        fell_start = f[3] / k - since
        if max(fell - self.z_threshold * se,
               fell_start - self.z_threshold * sigma * math.sqrt(1.0 / k + 1.0 / h[1])) > need:
            self.learned = True   # it fell: no more flat judging (a collapse to chance, an LR of 0 still count)
        if (self.chance is not None and self.chance[1] >= self.horizon_samples
                and (step - self.chance[0] >= self.horizon_steps or epochs)):
            return [self._finding(step, "chance", first, since, fell, se, c, epochs)]
        flat_se = self._flat(fell, se, sigma, printed, x)
        if flat_se is not None:
            return [self._finding(step, "flat", first, since, fell, flat_se, c, epochs)]
        return []

    def _flat(self, fell: float, se: float, sigma: float, printed: float | None, x: float, *,
              from_start: bool = True) -> float | None:
        """The flat rule's test on the horizon so far: the standard error it was judged with, or
        None when the loss left its first level (or the run learned, or, ``from_start``, the log
        starts mid-run)."""
        need = self._need
        h = self.horizon
        if (self.learned or h is None or self.start is None or (from_start and not self.start[2])
                or sigma > self.max_noise or not -2 * need < fell < need / 2
                or fell + self.z_threshold * se >= need or self._falling(h, sigma)):
            return None
        # the print hides what moves less than its last digit: its rounding (uniform over one
        # digit, q/√12) is the least noise there is (looked up only here: a call is rare)
        q = printed if printed is not None and 0.0 < printed < math.inf else printed_resolution(x)
        se = max(se, q / x / _SQRT12 * math.sqrt(1.0 / self.first[0] + 1.0 / h[1]))
        return se if fell + self.z_threshold * se < need else None

    def at_end(self, ctx: Context) -> list[Finding]:
        """The end of a replayed log too short to call (``info``, once, saying what it cannot tell):

        - its loss never left its first level over its horizon in points (2 at least), but over fewer than
          ``horizon_steps`` steps (a handful of records numbered 1, 2, 3): too few optimizer steps
          to call, unless each step is an epoch or many batches, which the numbers alone do not
          say; a log that prints no step numbers (``ctx.steps_by_order``) may also not start where
          the run did, and the message says so;
        - or a log that starts after the run did (its first record is not at its own interval
          from 0) whose loss never left its first level: an excerpt cannot tell "never learned"
          from "learned, then converged", and says so (``details.mid_run``), however long it is;
        - or the LR, update norm or grad norm was exactly 0 on its last points (2 at least), fewer
          than ``still_samples`` of them, the loss flat meanwhile: nothing moved the weights there."""
        if self.told or self.signed:
            return []
        s = self.still
        if s is not None and 2 <= s[1] < self.still_samples:
            out = self._still_finding(ctx.step, s, short=True)
            self.told = bool(out)
            return out
        f, h = self.first, self.horizon
        if h is None and ctx.phase == "warmup":
            return self._in_warmup(ctx)
        # (at the end, a horizon of 2 points will do: a 5-epoch log flat at ln 2 is said, as too
        # short to call, rather than nothing)
        if h is None or not f[0] or self.prev_log is None or h[1] < min(2, self._horizon_points()):
            return []
        first, since = f[1] / f[0], h[2] / h[1]
        fell = first - since
        mid_run = self.start is not None and not self.start[2]
        sigma = self._noise()
        raw = sigma * math.sqrt(1.0 / f[0] + 1.0 / h[1])
        se = self._flat(fell, raw, sigma, None, math.exp(self.prev_log), from_start=not mid_run)
        short = ctx.step - h[0] < self.horizon_steps or h[1] < self._horizon_points()   # an excerpt may be
        # long enough, and still mid-run
        if se is None:
            return self._undecided(ctx, first, since, fell, raw, short, mid_run)
        self.told = True
        return [self._finding(ctx.step, "flat", first, since, fell, se, self.num_outputs or self.outputs,
                              ctx.steps_are_epochs, short=short, by_order=ctx.steps_by_order, mid_run=mid_run)]

    def _in_warmup(self, ctx: Context) -> list[Finding]:
        """The end of a replayed log still inside its LR warmup (SwAV's ten epochs at ln 3000), whose
        loss never left its first level: its first ``first_samples`` points against its last level
        (the EW mean of log(loss)), within half ``min_fall`` and 3σ of that level, over the horizon's
        points and steps after them — an ``info``: a loss may wait for its LR, so it cannot tell."""
        f, k = self.first, self.first_samples
        if self.start is None or not self.start[2] or f[0] < k + self._horizon_points() or not f[3] \
                or self._noise() > self.max_noise:
            return []
        first, last = f[3] / k, self.fast.mean
        spread = 3.0 * self._noise() * math.sqrt(1.0 / k + self.fast.alpha / (2.0 - self.fast.alpha))
        if abs(first - last) > max(self._need / 2, spread) or ctx.step - self.start[0] < self.horizon_steps:
            return []
        self.told = True
        unit = "epoch" if ctx.steps_are_epochs else "step"
        return [self.finding(
            ctx.step, severity="info", value=math.exp(last), baseline=math.exp(first), onset_step=self.start[0],
            message=(f"Too early to tell whether the run learns: the loss has not left its first level, "
                     f"{fmt(math.exp(first))} over its first {k} points and {fmt(math.exp(last))} at {unit} {ctx.step} "
                     f"({abs(math.expm1(last - first)):.1%} {'lower' if last < first else 'higher'}), over {f[0]} points "
                     f"— but the LR was still warming up when the log ended, and a loss may wait for its LR. If it "
                     f"stays there once the LR has peaked, the run is not learning; usual causes then: {CAUSES}."),
            rule="flat", in_warmup=True, noise=self._noise(), first_samples=k)]

    def _undecided(self, ctx: Context, first: float, since: float, fell: float, se: float, short: bool,
                   mid_run: bool) -> list[Finding]:
        """The end of a short log, or of an excerpt from mid-run, whose loss neither fell by
        ``min_fall`` beyond its noise nor showed flat within it (nor rose: divergence's and the
        spikes' to say): an ``info`` that says it cannot tell, with what it measured — not a
        silent all-clear (a short run flat at the class prior, too noisy to call)."""
        h = self.horizon
        # a level that holds within the noise a horizon this long allows, the noise a batch's
        sigma = self._noise()
        noisy = sigma > self.max_noise and fell + self.z_threshold * se < self._need
        # ... or a long log whose noise leaves it unknown whether the loss fell by min_fall (a loss
        # scattering ±4% a point, flat: 3 first points leave ±7% unknown; one that fell by more, beyond
        # its noise, is said below to have learned)
        unsure = fell + self.z_threshold * se >= self._need
        if (h is None or self.learned or not (short or mid_run or noisy or unsure) or self.start is None
                or fell <= -2 * self._need or fell - self.z_threshold * se > self._need or self._falling(h, sigma)
                or fell > _LN2):
            # (a loss at half its first level or less learned, whatever its noise: 10, 1, 0.5 then
            # 0.45, 0.44 is no "cannot tell", its fall counted as its noise)
            return []
        self.told = True
        unit = "epoch" if ctx.steps_are_epochs else "step"
        why = ("an excerpt from mid-run" if mid_run else count(ctx.step - self.start[0], unit) if short else "")
        measured = (f"from {fmt(math.exp(first))} over its first {self.first[0]} points to {fmt(math.exp(since))} on "
                    f"average over the {h[1]} after them ({'down' if fell > 0 else 'up'} {abs(math.expm1(-fell)):.1%})")
        if why:
            said = (f"Cannot tell whether the run learns from this log: {measured}, its noise hides whether it fell by "
                    f"{self.min_fall:.0%} (±{-math.expm1(-self.z_threshold * se):.0%} at {self.z_threshold:g}σ), and "
                    f"{why} is too little to call. If it stays there in a longer log, the run is not learning; usual "
                    f"causes then: {CAUSES}.")
        elif not noisy:   # long enough, but its first points too few for its noise
            said = (f"Cannot tell whether the run learns from this log: {measured}, and its {self.first[0]} first "
                    f"points are too few for its noise (±{math.expm1(sigma):.0%} a point) to tell whether it fell by "
                    f"{self.min_fall:.0%} (±{-math.expm1(-self.z_threshold * se):.0%} at {self.z_threshold:g}σ). "
                    + ("A longer log will tell." if fell >= self._need else
                       f"If it stays there, the run is not learning; usual causes then: {CAUSES}."))
        else:   # long enough, and level within its noise, but that noise is the batch's, not the model's
            said = (f"Cannot tell whether the run learns from its loss's level: {measured}, but its points scatter "
                    f"by ±{math.expm1(sigma):.0%} from one to the next (more than ±{math.expm1(self.max_noise):.0%}): "
                    f"each says more of the batch drawn than of the model, as a diffusion loss at random noise "
                    f"levels does, and a level that holds is what a model trained already (a fine-tune) shows too. "
                    f"Judge it by a held-out metric or samples; if those do not improve either, usual causes: {CAUSES}.")
        return [self.finding(
            ctx.step, severity="info", value=math.exp(since), baseline=math.exp(first), onset_step=h[0],
            message=said,
            rule="undecided", fall=-math.expm1(-fell), fall_bound=-math.expm1(-(fell + self.z_threshold * se)),
            noise=sigma, mid_run=mid_run, too_few_steps=short)]

    def _horizon_points(self) -> int:
        """The points the horizon needs: ``horizon_samples``, or 2 while every point printed the
        same value (:meth:`_printed_still`)."""
        return self.horizon_samples if not self._printed_still() else min(2, self.horizon_samples)

    def _printed_still(self) -> bool:
        """Every point so far the same value, as printed (no change between points at all): no
        noise to average over the horizon, which then needs 2 points, not ``horizon_samples``
        (an epoch-level log of 5 points that never moved by one printed digit). Its steps still
        count, and a print too coarse for a fall of ``min_fall`` to show still gets no call."""
        return self.noise_mean.n > 0 and self.noise_dev.mean == 0.0 and self.noise_mean.mean == 0.0

    def _falling(self, h: list, sigma: float) -> bool:
        """The horizon's points fall along a trend beyond their noise (the least-squares slope of
        log(loss) against the point's index, ``trend_sigmas`` standard errors below 0): a slow
        learner (a 7B continued pre-training, -1% a hundred steps) is learning, however little it
        has fallen yet."""
        n = h[1]
        if n < 3 or sigma <= 0.0:
            return False
        slope, sxx, _ = _line(n, h[2], h[3])
        return slope < -self.trend_sigmas * sigma / math.sqrt(sxx)

    def _still(self, step: int, m, lx: float, warm: bool) -> list[Finding]:
        """The LR or the update norm exactly 0 after the warmup, or the grad norm exactly 0 from
        the run's start — during a warmup too when the LR is exactly 0 as well (no gradient and no
        step: nothing can move), the loss flat meanwhile."""
        # a grad norm of 0 counts from the run's start only: some builds print 0.000 on every line
        # (with an LR that warms up and a loss that moves: no call there during the warmup);
        # an LR of 0 only when it dropped there (a decay to 0 at a schedule's end is no bug)
        lr = m.get(keys.LR)
        g = m.get(keys.GRAD_NORM)
        if g == 0.0:   # (since when, for the message: from the run's first step, say, not the warmup's end)
            if self.grad_zero_from is None:
                self.grad_zero_from = step
        elif g is not None:
            self.grad_zero_from = None
        no_grad = (g == 0.0 and self.start is not None and self.start[2] and (warm or lr == 0.0))
        # a grad norm a millionth of its level or less moves nothing either (every ReLU dead); its
        # level: the EW mean of its log over the points before that were not so (a spike to 1e30 on a
        # diverging run moves it by a factor of ~30, not 1e30: a grad norm of 1 is no dead one there)
        vanished = False
        if g is not None and 0.0 < g < math.inf:
            lg, level = math.log(g), self.grad_level
            vanished = warm and level is not None and lg <= level + _LOG_VANISHED
            if level is None:
                self.grad_level = lg
            elif not vanished:   # (each point moves it by a tenth of a decade at most: a spike hardly;
                c = lg - level   # the clamp written out, less two calls)
                self.grad_level = level + 0.05 * (_LN10 if c > _LN10 else c if c > -_LN10 else -_LN10)
        if not warm and not no_grad:
            self.still = None
            return []
        zero = None
        if warm and lr is not None and lr > 0.0:
            self.lr[0], self.lr[1] = lr if lr > self.lr[0] else self.lr[0], lr   # (max, less a call)
        elif warm and lr == 0.0 and self.lr[1] >= 0.1 * self.lr[0]:
            zero = keys.LR
        if zero is None and no_grad:
            zero = keys.GRAD_NORM   # before the update norm: 0 there says why the update is 0
        elif zero is None and vanished:
            zero = _GRAD_VANISHED
        if zero is None and warm and m.get(keys.UPDATE_NORM) == 0.0:
            zero = keys.UPDATE_NORM
        if zero is None:
            self.still = None
            return []
        s = self.still
        if s is None:   # the loss's level before: the point before (an EW level lags a falling loss)
            s = self.still = [step, 0, 0.0, self.prev_before, zero, 0.0, 0.0]
        s[5] += s[1] * lx   # sums of i x y and y^2 (i = 0, 1, ...): the stretch's own trend
        s[6] += lx * lx
        s[1] += 1
        s[2] += lx
        if s[1] < self.still_samples:
            return []
        return self._still_finding(step, s, short=False)

    def _trending(self, s: list) -> bool:
        """The still stretch's log(loss) moves along a line beyond its own scatter around it (the
        least-squares slope ``z_threshold`` standard errors from 0 — a t of 3 with 3 degrees of
        freedom, 1 in 17 for draws of one distribution, checked again at every point —, or a
        perfect line that moves):
        weights that nothing moves give draws of one distribution, with no trend."""
        n, sy = s[1], s[2]
        if n < 3:
            return False
        slope, sxx, sxy = _line(n, sy, s[5])
        res = max(s[6] - sy * sy / n - slope * sxy, 0.0) / (n - 2)   # the scatter around the line
        return abs(slope) > self.z_threshold * math.sqrt(res / sxx) and abs(slope) * (n - 1) > 1e-9

    def _still_finding(self, step: int, s: list, *, short: bool) -> list[Finding]:
        """The *still* finding over ``s`` (``still``'s state), unless the loss fell meanwhile;
        ``short``: at the end of a log, fewer points than the rule asks (an info saying so)."""
        fell = s[3] - s[2] / s[1]
        se = self.sigma * math.sqrt(1.0 / s[1] + 1.0)
        if fell >= max(-math.log1p(-self.min_fall), self.z_threshold * se) or fell <= -2 * self._need \
                or self._trending(s):   # (a loss that rose meanwhile is divergence's)
            # it falls beyond its noise, or it moves along a trend beyond the stretch's own scatter
            # (losses of unmoved weights are draws of one distribution: no trend): whatever prints
            # 0 here (some builds print a grad norm of 0.000 on every line), something trains
            return []
        what = {keys.LR: "the LR", keys.UPDATE_NORM: "Adam's update norm", keys.GRAD_NORM: "the grad norm",
                _GRAD_VANISHED: "the grad norm"}[s[4]]
        been = (f"a millionth of its level before ({fmt(math.exp(self.grad_level or 0.0))}) or less (every unit "
                f"dead, as a spike or too high an LR leaves ReLUs)" if s[4] == _GRAD_VANISHED else "exactly 0")
        back = math.sinh if self.signed else math.exp   # (a loss of any sign was judged on asinh)
        level, before = back(s[2] / s[1]), back(s[3])
        zero_from = self.grad_zero_from if s[4] == keys.GRAD_NORM else None
        judged = (f"since step {zero_from}, judged from step {s[0]}, the warmup's end ({s[1]} points up to step {step})"
                  if zero_from is not None and zero_from < s[0] else f"since step {s[0]} ({s[1]} points up to step {step})")
        since = (f"{what} has been {been} {judged}, and the loss has not fallen beyond its noise ({fmt(level)} on "
                 f"average, {fmt(before)} the point before): nothing moves the weights")
        message = (f"Too early to call, the log ending here: {since} — {s[1]} points, fewer than the "
                   f"{self.still_samples} the rule asks. If the run went on so, it is not learning. Usual causes "
                   f"then: {CAUSES}." if short else
                   f"The run is not learning: {since}. Usual causes: {CAUSES}. Check the LR schedule, which "
                   f"parameters require gradients and are in the optimizer, and that the loss reaches them.")
        extra: dict[str, Any] = {"too_few_steps": True} if short else {}
        return [self.finding(
            step, severity="info" if short else "warning", value=level, baseline=before, onset_step=s[0],
            message=message, rule="still", zero=s[4], past_startup=True, **extra)]

    def _finding(self, step: int, rule: str, first: float, since: float, fell: float, se: float,
                 c: int | None, epochs: bool, *, short: bool = False, by_order: bool = False,
                 mid_run: bool = False) -> Finding:
        f, h = self.first, self.horizon
        assert h is not None
        level, before = math.exp(since), math.exp(first)
        if c and self._chance_log() is None:
            # the model's output size is known, but the loss did not start near ln C: no
            # cross-entropy over those outputs (a BCE over an embedding, an MSE): nothing of chance
            chance = ""
        elif c:
            classes = max(c, 2)   # a single output: a binary classifier's logit
            of = ("a binary cross-entropy on the model's single output" if c == 1 else
                  f"a cross-entropy over the model's {c} outputs")
            at = f"ln {classes} = {fmt(math.log(classes))}, the chance level {of} would have"
            chance = (f" It sits at {at}, since step {self.chance[0]} ({self.chance[1]} points)."
                      if rule == "chance" and self.chance is not None else f" (If the loss is {of}, its chance "
                      f"level is ln {classes} = {fmt(math.log(classes))}.)")
        elif level >= _LN2 * math.exp(-3 * self._tol):   # a level a cross-entropy at chance can have
            guess = (f", and this level is that of a uniform guess over ~{max(math.exp(level), 2.0):.3g} "
                     f"classes" if level < 25 else "")
            chance = (f" The chance level is unknown here (the model's output size is not): for a "
                      f"cross-entropy over C classes it is ln C{guess}.")
        else:   # below ln 2: no cross-entropy at chance (a regression's MSE, a converged classifier)
            chance = ""
        # what was counted: points and steps both (a log numbered by samples seen makes 50 steps
        # two batches; each point is at least one optimizer step)
        least = f"{self._horizon_points()} points" + (
            ", every point having printed the same value," if self._printed_still() else "")
        span = (f"the {h[1]} epochs from epoch {h[0]} to {step} (a horizon of at least {least.rstrip(',')}; the log's "
                f"steps are epochs, each a pass over the data)" if epochs else
                f"the {h[1]} points from step {h[0]} to {step} (a horizon of at least {least} and "
                f"{self.horizon_steps} steps as the log numbers them)")
        unit = "epoch" if epochs else "step"
        if rule == "chance":
            what = (f"the loss has stayed at chance level: {fmt(math.exp(self.fast.mean))} at step {step}, "
                    f"{fmt(level)} on average over {span}, {fmt(before)} at its start.{chance}")
        else:
            what = (f"the loss has not left its first level: {fmt(before)} over its first {f[0]} points "
                    f"(to {'epoch' if epochs else 'step'} {f[2]}), {fmt(level)} on average over "
                    f"{f'the {h[1]} points from {unit} {h[0]} to the end of the log at {unit} {step}' if short else span}: "
                    f"{abs(math.expm1(-fell)):.1%} {'lower' if fell > 0 else 'higher'}, and no downward trend, "
                    f"where against its noise a fall of {self.min_fall:.0%} would show.{chance}")
        if mid_run:   # an excerpt from later in a run: what it shows, and what it cannot tell
            start = self.start[0] if self.start is not None else h[0]
            few = (f", its horizon only {count(step - h[0])} as the log numbers them (fewer than the "
                   f"{self.horizon_steps} it takes to call)" if short and not epochs else "")
            message = (f"Cannot tell whether the run learns: {what} This log starts at "
                       f"{'epoch' if epochs else 'step'} {start}, after the run did{few}, and an excerpt from "
                       f"later in a run cannot tell 'never learned' from 'learned, then converged': if the "
                       f"loss sat at this level from the run's start for long, the run is not learning. "
                       f"Usual causes then: {CAUSES}.")
        elif short and h[1] < self._horizon_points():   # the log ended before the horizon's points
            message = (f"Too early to tell whether the run learns: {what} That is only {h[1]} points after its first "
                       f"{f[0]}, fewer than the {self._horizon_points()} it takes to call; if the loss stays there, "
                       f"the run is not learning. Usual causes then: {CAUSES}.")
        elif short:   # the horizon in points, not in steps: say both readings
            message = (f"Too early to tell whether the run learns: {what} That is {count(step - h[0])} as the log "
                       f"numbers them, fewer than the {self.horizon_steps} it takes to call: if each is one "
                       f"optimizer step, judge a longer log; if each is an epoch (or many batches), the run is "
                       f"not learning"
                       + (" — if the log starts where the run did: it prints no step numbers, and an excerpt "
                          "from later in a run cannot tell 'never learned' from 'learned, then converged'"
                          if by_order else "") + f". Usual causes then: {CAUSES}.")
        else:
            message = (f"The run is not learning: {what} Usual causes: {CAUSES}. Check the LR, which "
                       f"parameters the optimizer updates, and a batch's inputs against its labels"
                       + (" (a GAN's adversarial losses stay level by design: there this says nothing)."
                          if rule == "flat" else "."))
        extra: dict[str, Any] = {**({"mid_run": True} if mid_run else {}), **({"too_few_steps": True} if short else {})}
        return self.finding(
            step, severity="info" if short or mid_run else "warning", value=level, baseline=before,
            threshold=before * (1 - self.min_fall), onset_step=h[0], message=message,
            rule=rule, fall=-math.expm1(-fell), fall_bound=-math.expm1(-(fell + self.z_threshold * se)),
            noise=self._noise(), first_samples=f[0], horizon_samples=h[1], horizon_steps=step - h[0],
            chance_level=math.exp(chance_log) if (chance_log := self._chance_log()) is not None else None,
            num_outputs=c, past_startup=True, **extra)


def _line(n: int, sy: float, sty: float) -> tuple[float, float, float]:
    """The least-squares line of ``n`` points y_i against their index i = 0..n-1, from the sums of
    y and i x y: its slope, the spread of the indices (Σ(i - ī)²) and Σ(i - ī)(y - ȳ)."""
    st, stt = n * (n - 1) / 2.0, (n - 1) * n * (2 * n - 1) / 6.0   # sums of i and i^2
    sxx, sxy = stt - st * st / n, sty - st * sy / n
    return sxy / sxx, sxx, sxy
