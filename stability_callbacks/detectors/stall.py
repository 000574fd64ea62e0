"""A frozen loss: the same printed value again and again, or exactly zero out of nowhere."""
from __future__ import annotations

import math
from typing import Any, Sequence

from .. import keys
from ..record import Finding, StepRecord
from ..stats import Latch
from .base import Columns, Context, Detector, check, count, fmt, positive, positive_int


#: The loss's own moves per point (Stall._moving): the EW weight of the last, and the points it needs.
_MOVE_ALPHA = 0.1
_MOVE_POINTS = 20
_HALF_SQRT_PI = 0.5 * math.sqrt(math.pi)   # σ of one point from the mean |change| of two (as loss_spike's)
#: The points of a loss exactly 0.0 from the first with neither the LR nor the grad norm logged (an
#: objective that can be 0, GRPO's, logs its grad norm beside it, or names itself): a warning from here.
_ZEROS_UNSEEN = 3
#: Evaluations in a row whose loss prints the same to every digit (the *frozen evaluation* rule), and
#: the coarsest print that can tell (four significant digits).
_EVALS_FROZEN = 4
_EVAL_RESOLUTION = 1e-3


def half_precision_grid(x: float, before: float | None) -> float:
    """The spacing of the grid a loss computed in bf16 (or fp16) lies on, when two consecutive
    values both fit that format's mantissa (8 significant bits for bf16, 11 for fp16), else 0.
    Such a loss repeats as often as its grid allows, however many decimals its print shows
    (``4.375`` then ``4.125``: bf16, steps of 2**-5 near 4). One round value proves nothing (a
    float32 loss of exactly 1.0); two in a row by chance is a 2**-32 coincidence.

    >>> half_precision_grid(4.375, 4.125), half_precision_grid(1.0, None), half_precision_grid(2.3456, 2.3461)
    (0.03125, 0.0, 0.0)
    """
    if before is None or x == 0.0 or before == 0.0 or not (math.isfinite(x) and math.isfinite(before)):
        return 0.0
    bits = max(_significant_bits(x), _significant_bits(before))
    for mantissa in (8, 11):   # bf16, fp16
        if bits <= mantissa:
            return 2.0 ** (math.floor(math.log2(abs(x))) - (mantissa - 1))
    return 0.0


def _significant_bits(x: float) -> int:
    num = abs(x.as_integer_ratio()[0])
    return (num // (num & -num)).bit_length()   # the odd part of the numerator


def printed_resolution(x: float) -> float:
    """The value of the last digit of ``x`` as its shortest round-trip text shows it — what a
    log printed, when ``x`` was read from a log (``2.3456`` → 1e-4, ``6.444662`` → 1e-6). A
    trailing zero is invisible in a float (``1.000000`` reads back as ``1.0`` → 1): readers
    that know the printed text report ``loss_resolution`` instead.

    >>> printed_resolution(2.3456), printed_resolution(6.444662), printed_resolution(1.5e-07)
    (0.0001, 1e-06, 1e-08)
    """
    mantissa, _, exponent = repr(abs(x)).partition("e")
    whole, _, frac = mantissa.partition(".")
    decimals = 0 if frac in ("", "0") else len(frac)
    return 10.0 ** (int(exponent or 0) - decimals)


class Stall(Detector):
    """Critical when the loss has stopped carrying information about training. Four rules:

    - *frozen*: the same value, bit for bit, ``k`` times in a row. A training loss moves from
      one logged point to the next by at least ``noise_floor`` of itself (minibatch noise;
      a mean over many steps still moves ~0.1%), and a log prints it to a resolution ``q``
      (``loss_resolution`` from the reader, else the digits of the values themselves). Two
      consecutive points then print the same with probability p ≈ (q/|x|) / (2√π·σ) — a
      Gaussian step of std √2·σ·|x| landing within one printed digit — and ``k`` points with
      p^(k−1). ``k`` is the smallest count with p^(k−1) ≤ ``false_alarm_rate`` (per point),
      at least ``min_samples``: ``1.000000`` (PaddleOCR, 7 digits) needs 3, HF's 4 decimals
      of a loss near 2 need 5, full float precision 3. σ is ``noise_floor``, not a noise
      measured on the run: smoothed or daily losses move less from point to point than their
      residuals suggest; an epoch's mean (a log that prints nothing finer than its epochs)
      moves by at least ``epoch_noise_floor`` (0.5%: each is a pass over the data, whose mean a
      model that trains changes; a collapse to the majority class prints 0.6931 epoch after
      epoch). A loss the reader knows to be a window statistic (``loss_window``:
      MetricLogger's 20-step median) repeats while its window turns over: ``k`` + the window.
      A loss printed the same beside a grad norm that moved is no step's own (one computation
      gives one gradient: fairseq 0.9 prints the mean over the epoch so far, which moves less than
      its last digit late in the epoch): the count starts again there.
      A print so coarse that more than ``num_samples`` repeats would be needed (2 decimals;
      Lightning's 3 significant digits of a loss above 1), or a value with a single significant digit (``0.0001``, the print floor), cannot tell a freeze from noise:
      the rule stays silent there.
    - *repeating*: the loss repeats, value for value, the values of ``P`` points earlier
      (2 ≤ P ≤ ``max_period_samples``): the weights are frozen and the data loader cycles the
      same batches (a model that trains gives a different loss on the same batch). Each repeat
      is as unlikely by chance as a frozen pair (p above), and ``P`` is tried over the window,
      so the rule fires once ``max_period_samples`` × Π p ≤ ``false_alarm_rate`` over at least
      ``min_samples`` repeats in a row (4 decimals of a loss near 1: 6 repeats).
    - *zero from the start*: every loss from the first is exactly 0.0 while the LR is not 0 and
      the gradient is 0 (or not logged). No model predicts every label with certainty before
      training, so a cross-entropy-like loss cannot be 0 there: it is masked away or cut from the
      model. An objective that can be 0 by construction has a gradient all the same (GRPO: loss
      0.0, grad norm ~0.1), which keeps the rule silent; the zeros may also wait for the LR to
      leave 0 (a warmup that starts there).
    - *zero* / *collapse*: a loss that was positive on every point so far and at least
      ``zero_from`` of the largest loss seen falls to exactly 0.0, or by more than a factor
      1/``zero_from`` per optimizer step and below ``zero_from`` of every value it printed over
      its last ``recent_samples`` points (12.18 → 1.8e-6 in one step). A batch mean that a few
      examples dominate near the loss's floor (DPO's −log σ(β·margin) once most pairs are
      ranked: 0.16 → 0.0012 when the last wrong pair is fixed) has visited such lows before. A cross-entropy-like
      loss reaches zero only through its last tiny values (memorising a small set goes 0.01 →
      0.001 → 0.0001 → 0.0, each step a fraction); one divided by 100 in a step is a masked
      loss (no label tokens), targets leaking into the inputs, an fp16 overflow zeroed, or a
      broken loss path — unless the point before was a spike (a bad batch: the next one is back
      at the level, ``loss_spike``'s recovery). Losses that start at 0.0 or go negative (RL
      objectives such as GRPO print 0.0 at first) never meet it, and the message says so.

    Resolution: the printed digits, or the bf16/fp16 grid when two values in a row fit it
    (:func:`half_precision_grid`: such a loss repeats as often as its grid allows, whatever its
    print shows). Each rule is unmistakable, so it is critical even in the first steps, except a
    loss frozen from the first point of a run that began from nothing (step 0 or 1): a run that
    has learned nothing from its start is a warning, as ``not_learning`` says such runs. A run of
    zeros is not a frozen loss by itself (a loss below the print resolution prints 0.0).
    O(1) per update (amortized); state: the positions of the last ~``max_period_samples``
    distinct values and 16 scalars.

    >>> d = Stall()
    >>> [f.step for s, x in enumerate([0.9235, 1.0, 1.0, 1.0, 1.0, 1.0], 1)
    ...  for f in d.update(StepRecord(s, {"loss": x, "loss_resolution": 1e-6}), Context(s))]
    [4]
    """

    name = "stall"
    kind = "stall"
    signals = (keys.LOSS,)
    _state = ("last", "last_step", "before", "run_start", "count", "need", "latch", "positive", "peak",
              "seen", "seen_count", "period", "run", "repeats", "evidence", "repeat_latch", "last_spiked",
              "zero_since", "zero_told", "recent", "cross_entropy", "game", "player", "need_floor", "last_grad",
              "zero_points", "eval_run", "objective", "move", "move_points")

    def __init__(self, *, num_samples: int = 16, min_samples: int = 3, noise_floor: float = 1e-3,
                 epoch_noise_floor: float = 5e-3, false_alarm_rate: float = 1e-6, zero_from: float = 0.01,
                 max_period_samples: int = 64, recent_samples: int = 8):
        self.num_samples = positive_int("num_samples", num_samples)
        self.min_samples = check("min_samples", min_samples, isinstance(min_samples, int) and
                                 not isinstance(min_samples, bool) and 2 <= min_samples <= num_samples,
                                 f"an integer in [2, num_samples={num_samples}]")
        self.noise_floor = positive("noise_floor", noise_floor)
        self.epoch_noise_floor = positive("epoch_noise_floor", epoch_noise_floor)
        self.need_floor = self.noise_floor    # the floor the current run of repeats is judged by
        self.false_alarm_rate = check("false_alarm_rate", false_alarm_rate,
                                      isinstance(false_alarm_rate, float) and 0 < false_alarm_rate < 1, "in (0, 1)")
        self.zero_from = check("zero_from", zero_from, isinstance(zero_from, (int, float)) and 0 < zero_from <= 1,
                               "in (0, 1]")
        #: The loss is printed as a cross-entropy (a replayed log names it so), which is never
        #: below zero: [its printed name, told]; None: not known to be one.
        self.cross_entropy: list | None = None
        self.last: float | None = None        # the previous finite loss, and its step
        self.last_grad: float | None = None   # the grad norm printed beside it
        self.last_step: int | None = None
        self.before: float | None = None      # the value before the current run of repeats
        self.run_start: int | None = None     # the step where the current run of identical values began
        self.count = 0                        # ... and its length
        self.need: int | None = None          # how long a run must be to be a freeze (None: never)
        self.latch = Latch()                  # re-armed when the loss moves
        self.positive = True                  # every loss so far > 0 (cross-entropy-like)
        self.peak = 0.0                       # the largest loss so far
        self.max_period_samples = check("max_period_samples", max_period_samples,
                                        isinstance(max_period_samples, int) and max_period_samples >= 2,
                                        "an integer ≥ 2")
        self.seen: dict[float, int] = {}      # value -> the index of its latest point (last ~W points)
        self.seen_count = 0                   # points indexed so far
        self.period: int | None = None        # the lag P of the current run of repeats
        self.run: list = []                   # [step, value] of its first 4 repeats (the message)
        self.repeats = 0                      # its length, once weighed
        self.evidence = 0.0                   # ... and log Π p over it
        self.repeat_latch = Latch()           # re-armed when the repeats stop
        self.last_spiked = False              # the previous point was inside a loss-spike episode
        self.zero_since: int | None = None    # the first step, while every loss so far is exactly 0.0
        self.zero_told = False                # ... and that was reported
        self.zero_points = 0                  # ... how many points
        self.objective = False                # an objective that can be 0 (Monitor.declare_objective)
        self.move = 0.0                       # an EW mean of the loss's |change| per point (see _moving)
        self.move_points = 0                  # ... and its points
        self.eval_run: list = [None, None, 0, False, 0, 0]   # an evaluation's loss printed the same on
        # the records in a row: [value, first step, records, told, the longest run before, changes]
        self.recent_samples = positive_int("recent_samples", recent_samples)
        self.recent: list[float] = []         # the last recent_samples positive losses, oldest first
        self._prune_at = 4 * self.max_period_samples
        self.game = False                     # declared a game's players (Monitor.declare_game)
        self.player: list = [None, 0, False]  # [first step, points, told] of a term exactly 0 in a row

    # update(): the run of one record (Detector._update_alone); the rule is written as replay's loop
    update = Detector._update_alone

    def update_run(self, run: Sequence[StepRecord], ctxs: Sequence[Context], cols: Columns | None = None) -> None:
        for record, ctx in zip(run, ctxs):
            m = record.metrics
            x = m.get(keys.LOSS)
            if x is None or not math.isfinite(x):   # missing or NaN/Inf: nonfinite's business
                continue
            if self.game:
                won = self._player_won(record.step, m.get(keys.LOSS_TERMS_ZERO, 0.0))
                if won:
                    ctx.found += won
                    continue
            prev, step = self.last, record.step
            if x < 0.0 and self.cross_entropy is not None and not self.cross_entropy[1]:
                self.cross_entropy[1] = True
                ctx.found.append(self._impossible(step, x))
                continue
            if keys.EVAL_LOSS in m:
                ctx.found += self._evaluation(step, m[keys.EVAL_LOSS], ctx)
            if x == 0.0 and (prev is None or self.zero_since is not None):
                self.zero_since, self.zero_points = (step, 1) if prev is None else (self.zero_since, self.zero_points + 1)
                found = self._zero_from_start(step, m, ctx.run_start is not None)
                if found is not None:
                    self.last, self.last_step = x, step
                    ctx.found.append(found)
                    continue
            elif self.zero_since is not None:
                self.zero_since = None   # it moved: the zeros were the start of an objective that can be 0
            if x == prev and x != 0.0:   # the same value again (zeros are the zero rule's)
                frozen = self._again(step, x, m, ctx)
                if frozen is not None:
                    ctx.found.append(frozen)
                continue
            out: list[Finding] = []
            spiked, self.last_spiked = self.last_spiked, ctx.loss_spike_open
            zf = self.zero_from
            if (prev is not None and 0.0 <= x <= zf * prev and self.positive and not spiked
                    and prev >= zf * self.peak):
                # x == 0.0, or divided by more than 1/zero_from per optimizer step (a point coming
                # back from a spike returns to the loss's level: that is loss_spike's recovery)
                gap = max(step - (self.last_step if self.last_step is not None else step - 1), 1)
                # a fall the loss's own pace explains is no collapse: a likelihood crossing zero lands
                # anywhere near it (0.22 -> 0.002 in a curve falling 0.24 a point)
                pace = abs(ctx.loss_step_mean) + 1.13 * ctx.loss_step_noise
                # (a first epoch's mean holds the untrained model's errors, which a regression's scale
                # leaves unbounded: 15234 -> 35 from epoch 1 to 2 is learning, no collapse)
                if x == 0.0 or (math.log(prev / x) >= gap * -math.log(zf) and x <= zf * min(self.recent)
                                and prev - x > 3.0 * pace * gap and not (ctx.steps_are_epochs and self.before is None)):
                    out.append(self._zero(step, x, prev, self.last_step))
            if x <= 0.0:
                self.positive = False
            else:
                if prev is not None or not ctx.steps_are_epochs:   # (nor is a first epoch's mean a level)
                    self.peak = x if x > self.peak else self.peak   # max(peak, x), less a call
                self.recent.append(x)
                if len(self.recent) > self.recent_samples:
                    del self.recent[0]
            if prev is not None:   # (the loss's own moves: _moving)
                self.move, self.move_points = self.move + _MOVE_ALPHA * (abs(x - prev) - self.move), self.move_points + 1
            self.last, self.last_step, self.before, self.count = x, step, prev, 1
            self.last_grad = m.get(keys.GRAD_NORM)
            self.latch.armed = True   # the loss moved: re-armed (hot path: no call)
            # the repeating rule; its common case inline (a value not seen in the window, no run)
            seen, n = self.seen, self.seen_count
            i = seen.get(x)
            if i is None and self.period is None and len(seen) < self._prune_at:
                seen[x] = n
                self.seen_count = n + 1
            elif self._remember(step, x, True, m.get(keys.LOSS_RESOLUTION)):
                out.append(self._repeating(step, x))
            if out:
                ctx.found += out

    def _again(self, step: int, x: float, m: dict, ctx: Context) -> Finding | None:
        """The loss ``x`` printed again at ``step``: the frozen rule's count, and its finding if due
        — unless the grad norm printed beside it moved: one computation gives one gradient, so a
        loss printed the same beside another gradient is no step's own (fairseq 0.9's mean over the
        epoch so far, moving less than its last digit late in the epoch): the count starts again."""
        self.last_spiked = ctx.loss_spike_open
        g, before = m.get(keys.GRAD_NORM), self.last_grad
        self.last_grad = g
        if g is not None and before is not None and g != before and 0.0 < g < math.inf and 0.0 < before < math.inf:
            self.count, self.last_step = 1, step
            self.latch.armed = True
            return None
        self.count += 1
        self.move, self.move_points = self.move - _MOVE_ALPHA * self.move, self.move_points + 1   # (no move)
        if self.count == 2:
            self.run_start = self.last_step
            self.need_floor = self.epoch_noise_floor if ctx.steps_are_epochs else self.noise_floor
            # (a grad norm printed the same beside it is one computation again: no slow statistic's repeat;
            # a window the reader knows is counted below)
            moving = math.inf if g is not None or m.get(keys.LOSS_WINDOW) else self._moving(x)
            self.need = self._samples_needed(x, m.get(keys.LOSS_RESOLUTION), min(self.need_floor, moving))
            if self.need is not None and m.get(keys.LOSS_WINDOW):
                # a window statistic repeats while its window turns over: count from there
                self.need += int(m[keys.LOSS_WINDOW])
        self.last_step = step
        self._remember(step, x, False, None)
        if self.need is not None and self.latch.update(self.count >= self.need):
            return self._frozen(step, x, ctx.run_start is not None)
        return None

    def _remember(self, step: int, x: float, repeated: bool, printed: float | None) -> bool:
        """Follow the run of repeats at lag P (``repeated``: x is not the previous value again —
        a constant loss is the frozen rule's). True when it fires. O(1): each value's latest
        position is looked up, not searched for, and the chance of the repeats is weighed only
        once there are ``min_samples`` of them (rare on a healthy run)."""
        seen, n = self.seen, self.seen_count
        i = seen.get(x)
        seen[x] = n
        self.seen_count = n + 1
        if len(seen) >= self._prune_at:   # forget values that left the window (amortized)
            self.seen = {v: j for v, j in seen.items() if n - j < self.max_period_samples}
        lag = n - i if i is not None else 0
        if not repeated or x == 0.0 or not 2 <= lag <= self.max_period_samples:
            if self.period is not None:
                self._stop_repeats()
            return False
        if lag != self.period:   # a new candidate period
            self._stop_repeats()
            self.period = lag
        self.repeats += 1
        if len(self.run) < 4:    # the first repeats, for the message
            self.run.append([step, x])
        if self.repeats < self.min_samples:
            return False
        if self.repeats == self.min_samples:   # weigh the run so far: log of the product of p
            ps = [self._chance_equal(v, printed) for _, v in self.run[:self.min_samples]]
            self.evidence = math.nan if None in ps else sum(math.log(q) for q in ps if q is not None)
        else:
            q = self._chance_equal(x, printed)
            self.evidence = self.evidence + math.log(q) if q is not None else math.nan
        if self.evidence != self.evidence:   # a print too coarse to tell: no evidence
            self._stop_repeats()
            return False
        return self.repeat_latch.update(
            self.evidence + math.log(self.max_period_samples) <= math.log(self.false_alarm_rate))

    def _stop_repeats(self) -> None:
        self.period, self.run, self.repeats, self.evidence = None, [], 0, 0.0
        self.repeat_latch.armed = True

    def state_dict(self) -> dict:
        d = super().state_dict()
        d["seen"] = [[v, j] for v, j in self.seen.items()]   # JSON keys are strings: pairs instead
        return d

    def load_state_dict(self, d: dict) -> None:
        d = dict(d)
        seen = d.pop("seen")
        super().load_state_dict({**d, "seen": {}})
        self.seen = {float(v): int(j) for v, j in seen}

    def _chance_equal(self, x: float, printed: float | None, floor: float | None = None) -> float | None:
        """The chance p that a training loss near ``x`` prints the same as another point (None
        when the print is too coarse for a repeat to mean anything), for a loss that moves by
        ``floor`` of itself between points (``noise_floor`` unless said)."""
        q = self._resolution(x, printed)
        if abs(x) < 10.0 * q:   # one significant digit: at the print floor, repeats prove nothing
            return None
        p = (q / abs(x)) / (2.0 * math.sqrt(math.pi) * (floor or self.noise_floor))
        return p if p < 1.0 else None

    def _resolution(self, x: float, printed: float | None) -> float:
        before = self.before if self.before else None
        if printed is not None and 0.0 < printed < math.inf:
            q = printed
        else:   # the finer of the repeated value and the value before the run: 1.000000 after 0.923512
            q = min(printed_resolution(x), printed_resolution(before) if before else math.inf)
        return max(q, half_precision_grid(x, before))   # a bf16 loss is no finer than its grid

    def _moving(self, x: float) -> float:
        """How far, of itself, the loss moved per point before it repeated (an EW mean of its changes,
        the points that did not move counted, over ~``1/_MOVE_ALPHA`` points, as a σ): a statistic that
        moves by less than its last printed digit a point repeats it by chance (an epoch's running mean
        late in the epoch moves by a batch's difference over the batches so far). ``inf`` before
        ``_MOVE_POINTS`` points (a log frozen from its start has no moves to go by)."""
        if self.move_points < _MOVE_POINTS or x == 0.0 or self.move <= 0.0:
            return math.inf
        return self.move * _HALF_SQRT_PI / abs(x)

    def _samples_needed(self, x: float, printed: float | None, floor: float) -> int | None:
        p = self._chance_equal(x, printed, floor)
        if p is None:
            return None
        # (p of 0: a print finer than a float's own steps near x, no repeat of it is chance)
        k = self.min_samples if p <= 0.0 else max(1 + math.ceil(math.log(self.false_alarm_rate) / math.log(p)),
                                                  self.min_samples)
        return k if k <= self.num_samples else None

    def _frozen(self, step: int, x: float, from_nothing: bool) -> Finding:
        between = ("epochs, each a pass over the data" if self.need_floor != self.noise_floor else "points")
        # from the first point of a run that began from nothing (its first record at step 0 or 1,
        # no value before the repeats): it has learned nothing from its start, no instability to
        # page for (as not_learning says it: a warning); one that moved, then froze, broke
        # mid-run, and an excerpt starting later cannot tell (critical)
        start = from_nothing and self.before is None
        extra: dict[str, Any] = {"from_start": True} if start else {}
        return self.finding(
            step, severity="warning" if start else "critical", value=x, onset_step=self.run_start,
            message=(f"The loss has been exactly {x!r} for {self.count} logged points in a row up to "
                     f"step {step}. A loss that is training moves by at least {self.need_floor:.1%} "
                     f"between {between}, so this many identical values are not chance: the model is not "
                     f"training (frozen weights or LR 0, a dead graph, a data loader stuck on one batch, "
                     f"a loss that ignores the model, or a model collapsed to a constant output, whose "
                     f"mean loss over the same data is the same every time)"
                     + (", from its first point: it has not learned at all. Inspect the gradients and the "
                        "first batches." if start else ". Stop and inspect the gradients and the last batches.")),
            rule="frozen", samples=self.count, needed=self.need, **extra)

    def _player_won(self, step: int, zeros: float) -> list[Finding]:
        """*player*: in a game (a GAN's summed terms), a term at 0 or a discriminator's within 0.1% of
        their sum, 1% once the sum has doubled since its low (``loss_terms_zero``), on ``min_samples``
        + 2 points in a row: one player has won outright (a discriminator at 0 gives the generator no
        useful gradient). A warning, once per run of such points."""
        p = self.player
        if not zeros:
            p[0], p[1], p[2] = None, 0, False
            return []
        p[0] = step if p[0] is None else p[0]
        p[1] += 1
        if p[2] or p[1] < self.min_samples + 2:
            return []
        p[2] = True
        return [self.finding(
            step, severity="warning", value=0.0, onset_step=p[0],
            message=(f"A player of the game has won outright: one of the loss's terms has been 0 (or a "
                     f"discriminator's under 0.1% of their sum, 1% once the sum had doubled) on every point since step {p[0]} ({count(p[1], 'point')} "
                     f"up to step {step}). A discriminator whose loss is 0 tells real from generated perfectly, and the generator gets no useful gradient: the "
                     f"game has collapsed. Roll back to a checkpoint before step {p[0]} and weaken the "
                     f"discriminator (a lower LR, label smoothing or input noise) or use a non-saturating or "
                     f"Wasserstein loss."),
            rule="player", points=p[1], past_startup=True)]

    def at_end(self, ctx: Context) -> list[Finding]:
        """A replayed game's log that ends inside a run of a player's term at 0 too short for the *player*
        rule (3 points or 4): said once, as an ``info`` (the points say it; too few to be sure)."""
        p = self.player
        if not self.game or p[2] or p[0] is None or p[1] < self.min_samples:
            return []
        return [self.finding(
            ctx.step, severity="info", value=0.0, onset_step=p[0],
            message=(f"The log ends with one of the game's terms at 0 (or a discriminator's under 0.1% of their sum, 1% once the sum "
                     f"had doubled) on its last {count(p[1], 'point')}, from step {p[0]}: too few to call (the rule wants "
                     f"{self.min_samples + 2}), but a discriminator at 0 has won outright and gives the generator "
                     f"no useful gradient. If the run went on like this, weaken the discriminator (a lower LR, "
                     f"label smoothing or input noise) or use a non-saturating or Wasserstein loss."),
            rule="player", points=p[1])]

    def declare_cross_entropy(self, printed: str) -> None:
        """The loss is a cross-entropy (``printed``: its name in the log), never below zero."""
        if self.cross_entropy is None:
            self.cross_entropy = [printed, False]

    def _impossible(self, step: int, x: float) -> Finding:
        assert self.cross_entropy is not None
        return self.finding(
            step, severity="critical", value=x, onset_step=step,
            message=(f"The loss, printed as {self.cross_entropy[0]!r} (a "
                     f"{'CTC loss' if 'ctc' in self.cross_entropy[0].lower() else 'cross-entropy'}, which is never below "
                     f"zero), is {fmt(x)} at step {step}: it is computed wrong — NLLLoss fed probabilities "
                     f"instead of log-probabilities, a log of values above 1, or targets that are not a "
                     f"distribution — and says nothing of training until that is fixed."),
            rule="impossible", past_startup=True)

    def _zero(self, step: int, x: float, prev: float, prev_step: int | None) -> Finding:
        if x == 0.0:
            what = f"The loss fell from {fmt(prev)} at step {prev_step} to exactly 0.0 at step {step}."
        else:
            what = (f"The loss fell from {fmt(prev)} at step {prev_step} to {fmt(x)} at step {step}: "
                    f"{prev / x:.3g}x lower in {count(step - (prev_step or step - 1))}.")
        return self.finding(
            step, severity="critical", value=x, baseline=prev, onset_step=step,
            message=(f"{what} A loss that was positive on every point before (a cross-entropy, a regression's "
                     f"error on real data) does not fall to zero, or by a factor of {1 / self.zero_from:.0f} in a "
                     f"step, by learning: the loss was masked to 0 (a batch "
                     f"without label tokens), the targets leak into the inputs, it was zeroed after an "
                     f"fp16 overflow, or the loss path broke. (If this objective can be 0 — RL losses "
                     f"such as GRPO print 0.0 — ignore this.) Check the batch, the labels and the "
                     f"precision before training on."),
            rule="zero" if x == 0.0 else "collapse", previous=prev)

    def _zero_from_start(self, step: int, m, from_nothing: bool) -> Finding | None:
        """The *zero from the start* rule: every loss so far, from the first, is exactly 0.0, the LR
        is not 0 and the gradient is 0 or unknown (None: not yet, or an objective whose value can
        be 0 while its gradient is not — GRPO prints 0.0 with a grad norm of ~0.1). With neither
        logged, a warning after ``_ZEROS_UNSEEN`` points, unless the log names an objective that can
        be 0 (:meth:`Monitor.declare_objective`) or prints its zeros to fixed decimals on an excerpt
        from mid-run (``0.0000``: a trained model's loss below the print, not a zero)."""
        lr, g = m.get(keys.LR), m.get(keys.GRAD_NORM)
        res = m.get(keys.LOSS_RESOLUTION)
        blind = lr is None and g is None and self.zero_points >= _ZEROS_UNSEEN and not self.objective \
            and (from_nothing or res is None or res >= 0.1)
        if self.zero_told or not blind and (
                lr is None or not 0.0 < lr < math.inf or (g is not None and 0.0 < g < math.inf)):
            return None
        self.zero_told = True
        grad = ("no grad norm is logged" if g is None else
                f"the grad norm is {g!r}" + (": nothing reaches the weights" if g == 0.0 else ""))
        if blind:
            said = (f"with neither the LR nor the grad norm logged ({self.zero_points} points). A loss "
                    f"computed from a model's predictions is not exactly 0 point after point (no model "
                    f"predicts every label with certainty, least of all before training)")
            unless = ("(If this is an objective that can be 0 — GRPO, a reward-weighted loss — the log "
                      "prints neither the LR nor the grad norm that would tell: ignore this then.)")
        else:
            said = (f"with the LR at {fmt(lr)} and {grad}. A cross-entropy-like loss is 0 only for a "
                    f"model that predicts every label with certainty, which no model does before training")
            unless = ("(An objective that can be 0 — GRPO, a reward-weighted loss — shows a non-zero grad "
                      "norm, and then this is silent.)")
        return self.finding(
            step, severity="warning" if blind else "critical", value=0.0, onset_step=self.zero_since,
            message=(f"The loss has been exactly 0.0 on every logged step since the first (step "
                     f"{self.zero_since}) up to step {step}, {said}: the loss is masked away (no label "
                     f"tokens, all labels -100), multiplied by 0, or cut from the model. Stop and check "
                     f"the labels and the loss path. {unless}"),
            rule="zero_from_start", lr=lr, grad_norm=g)

    def _evaluation(self, step: int, v: float, ctx: Context) -> list[Finding]:
        """The *frozen evaluation* rule: an evaluation's loss printed on the records (a results table's
        rows) the same, to every printed digit, over ``_EVALS_FROZEN`` evaluations in a row. The same
        weights on the same data give the same loss; weights that moved at all change it in some digit
        of four or more. A log may print the last evaluation's loss on every record until the next
        (NeMo's `val_loss` on each step's line): the records between two evaluations are learned from
        the changes seen before (the longest stretch without one), and a repeat counts evaluations in
        those stretches; before two changes, nothing is judged. A warning: the weights stopped
        changing (an LR at 0, parameters frozen, an optimizer that skips every step)."""
        r = self.eval_run   # [value, first step, records in the run, told, longest run ended, changes]
        if v != r[0]:
            if r[0] is not None:
                r[4], r[5] = max(r[4], r[2]), r[5] + 1
            r[:4] = [v, step, 1, False]
            return []
        r[2] += 1
        if r[3] or r[5] < 2 or not math.isfinite(v) or printed_resolution(v) > _EVAL_RESOLUTION * abs(v) \
                or r[2] < _EVALS_FROZEN * r[4]:
            return []
        r[3] = True
        unit = "epoch" if ctx.steps_are_epochs else "step"
        each = "" if r[4] == 1 else f" (the log evaluates every {r[4]} records or so)"
        return [self.finding(
            step, severity="warning", signal=keys.EVAL_LOSS, value=v, onset_step=r[1],
            message=(f"The evaluation loss has been exactly {v!r} from {unit} {r[1]} to {unit} {step}, "
                     f"{r[2] // r[4]} evaluations in a row{each}. The same weights on the same data give the "
                     f"same loss, and weights that moved at all would change it in some printed digit: the "
                     f"weights have stopped changing (an LR at 0, frozen parameters, an optimizer or fp16 "
                     f"scaler that skips every step). Check the LR and that the optimizer updates the weights."),
            rule="frozen_evaluation", evaluations=r[2] // r[4], records_per_evaluation=r[4])]

    def _repeating(self, step: int, x: float) -> Finding:
        period, k, first = self.period or 0, self.repeats, self.run[0][0]
        values = ", ".join(fmt(v) for _, v in self.run)
        return self.finding(
            step, severity="critical", value=x, onset_step=first,
            message=(f"The loss repeats itself exactly: its {k} values from step {first} to step {step} "
                     f"({values}, ...) are, value for value, those of {period} points earlier. A model "
                     f"that trains gives a different loss on the same batch, so the weights are not "
                     f"being updated and the data loader is cycling the same batches (frozen "
                     f"parameters, LR 0, an optimizer that never steps, or gradients that never reach "
                     f"it). Stop and check that the optimizer changes the weights."),
            rule="repeating", period=period, samples=k)
