"""A frozen loss: the same printed value again and again, or exactly zero out of nowhere."""
from __future__ import annotations

import math

from .. import keys
from ..record import Finding, StepRecord
from ..stats import Latch
from .base import Context, Detector, check, fmt, positive, positive_int


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
    """Critical when the loss has stopped carrying information about training. Two rules:

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
      residuals suggest. A print so coarse that more than ``num_samples`` repeats would be
      needed (2 decimals; Lightning's 3 significant digits of a loss above 1), or a value with a
      single significant digit (``0.0001``, the print floor), cannot tell a freeze from noise:
      the rule stays silent there.
    - *zero*: exactly 0.0 right after a loss that was positive on every point so far and at
      least ``zero_from`` of the largest loss seen. A cross-entropy-like loss reaches zero only
      through its last tiny values (memorising a small set goes 0.01 → 0.001 → 0.0001 → 0.0);
      a jump to exactly zero is a masked loss (no label tokens), an fp16 overflow zeroed, or
      a broken loss path. Losses that start at 0.0 or go negative (RL objectives such as
      GRPO print 0.0 at first) never meet it, and the message says so.

    Either is unmistakable, so it is critical even in the first steps. A run of zeros is not
    a frozen loss by itself (a loss below the print resolution prints 0.0). O(1); state: 9
    scalars.

    >>> d = Stall()
    >>> [f.step for s, x in enumerate([0.9235, 1.0, 1.0, 1.0, 1.0, 1.0], 1)
    ...  for f in d.update(StepRecord(s, {"loss": x, "loss_resolution": 1e-6}), Context(s))]
    [4]
    """

    name = "stall"
    kind = "stall"
    signals = (keys.LOSS,)
    _state = ("last", "last_step", "before", "run_start", "count", "need", "latch", "positive", "peak")

    def __init__(self, *, num_samples: int = 16, min_samples: int = 3, noise_floor: float = 1e-3,
                 false_alarm_rate: float = 1e-6, zero_from: float = 0.01):
        self.num_samples = positive_int("num_samples", num_samples)
        self.min_samples = check("min_samples", min_samples, isinstance(min_samples, int) and
                                 not isinstance(min_samples, bool) and 2 <= min_samples <= num_samples,
                                 f"an integer in [2, num_samples={num_samples}]")
        self.noise_floor = positive("noise_floor", noise_floor)
        self.false_alarm_rate = check("false_alarm_rate", false_alarm_rate,
                                      isinstance(false_alarm_rate, float) and 0 < false_alarm_rate < 1, "in (0, 1)")
        self.zero_from = check("zero_from", zero_from, isinstance(zero_from, (int, float)) and 0 < zero_from <= 1,
                               "in (0, 1]")
        self.last: float | None = None        # the previous finite loss, and its step
        self.last_step: int | None = None
        self.before: float | None = None      # the value before the current run of repeats
        self.run_start: int | None = None     # the step where the current run of identical values began
        self.count = 0                        # ... and its length
        self.need: int | None = None          # how long a run must be to be a freeze (None: never)
        self.latch = Latch()                  # re-armed when the loss moves
        self.positive = True                  # every loss so far > 0 (cross-entropy-like)
        self.peak = 0.0                       # the largest loss so far

    def update(self, record: StepRecord, ctx: Context) -> list[Finding]:
        m = record.metrics
        x = m.get(keys.LOSS)
        if x is None or not math.isfinite(x):   # missing or NaN/Inf: nonfinite's business
            return []
        prev, step = self.last, record.step
        if x == prev and x != 0.0:   # the same value again (zeros are the zero rule's)
            self.count += 1
            if self.count == 2:
                self.run_start = self.last_step
                self.need = self._samples_needed(x, m.get(keys.LOSS_RESOLUTION))
            self.last_step = step
            if self.need is not None and self.latch.update(self.count >= self.need):
                return [self._frozen(step, x)]
            return []
        out: list[Finding] = []
        if x == 0.0 and prev is not None and prev != 0.0 and self.positive and prev >= self.zero_from * self.peak:
            out.append(self._zero(step, prev, self.last_step))
        if x <= 0.0:
            self.positive = False
        elif x > self.peak:
            self.peak = x
        self.last, self.last_step, self.before, self.count = x, step, prev, 1
        self.latch.armed = True   # the loss moved: re-armed (hot path: no call)
        return out

    def _resolution(self, x: float, printed: float | None) -> float:
        if printed is not None and 0.0 < printed < math.inf:
            return printed
        # the finer of the repeated value and the value before the run: 1.000000 after 0.923512
        return min(printed_resolution(x), printed_resolution(self.before) if self.before else math.inf)

    def _samples_needed(self, x: float, printed: float | None) -> int | None:
        q = self._resolution(x, printed)
        if abs(x) < 10.0 * q:   # one significant digit: at the print floor, repeats prove nothing
            return None
        p = (q / abs(x)) / (2.0 * math.sqrt(math.pi) * self.noise_floor)
        if p >= 1.0:
            return None
        k = max(1 + math.ceil(math.log(self.false_alarm_rate) / math.log(p)), self.min_samples)
        return k if k <= self.num_samples else None

    def _frozen(self, step: int, x: float) -> Finding:
        return self.finding(
            step, severity="critical", value=x, onset_step=self.run_start,
            message=(f"The loss has been exactly {x!r} for {self.count} logged points in a row up to "
                     f"step {step}. A loss that is training moves by at least {self.noise_floor:.1%} "
                     f"between points, so this many identical values are not chance: the model is not "
                     f"training (frozen weights or LR 0, a dead graph, a data loader stuck on one batch, "
                     f"or a loss that ignores the model). Stop and inspect the gradients and the last "
                     f"batches."),
            rule="frozen", samples=self.count, needed=self.need)

    def _zero(self, step: int, prev: float, prev_step: int | None) -> Finding:
        return self.finding(
            step, severity="critical", value=0.0, baseline=prev, onset_step=step,
            message=(f"The loss fell from {fmt(prev)} at step {prev_step} to exactly 0.0 at step {step}. "
                     f"A cross-entropy-like loss cannot reach zero in one step: the loss was masked "
                     f"to 0 (a batch without label tokens), zeroed after an fp16 overflow, or the loss "
                     f"path broke. (If this objective can be 0 — RL losses such as GRPO print 0.0 — "
                     f"ignore this.) Check the batch, the labels and the precision before training on."),
            rule="zero", previous=prev)
