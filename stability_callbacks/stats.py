"""O(1) streaming statistics the detectors are built from (river-style: ``update`` / ``get``).

Everything works on Python floats. State is a handful of floats (plus one short fixed window
in :class:`RollingMedian`), exported with ``state_dict`` for checkpoints. Detectors compose
these parts rather than writing their own: an EW mean is :class:`EWMean`, "fire once, re-arm"
is :class:`Latch`.
"""
from __future__ import annotations

import math
from collections import deque
from typing import Iterable

_NEVER = 1 << 62   # a count no stream reaches


class EWMean:
    """Exponentially weighted mean: ``mean += a·(x − mean)``. O(1); state: ``[n, mean]``.

    ``start`` says how the first points count — the three ways an EW mean can begin, each with
    its use here:

    - ``"first"``: the first value is the mean, then ``a = alpha`` (pandas ``adjust=False``): a
      fast level that must not be pulled toward an arbitrary initial value;
    - ``"running"``: ``a = max(alpha, 1/n)``, a plain running mean of the first ``1/alpha``
      points, then exponential: a typical size that is usable from the second point on;
    - ``"zero"``: starts at 0.0 with ``a = alpha``, as Adam's moments do. After ``n`` updates
      the weights sum to ``1 − (1 − alpha)^n``, so the mean is biased toward 0 for about
      ``1/alpha`` updates; :attr:`debiased` divides that sum out (Adam's bias correction).

    >>> e = EWMean(0.5, start="zero")
    >>> [e.update(x) for x in [4.0, 4.0]]
    [2.0, 3.0]
    >>> e.debiased                    # 0.5·4 + 0.25·4, over weights 0.75
    4.0
    >>> f = EWMean(0.5, start="first")
    >>> [f.update(x) for x in [4.0, 2.0]]
    [4.0, 3.0]
    """

    __slots__ = ("alpha", "start", "n", "mean", "warm", "whole_from")
    STARTS = ("first", "running", "zero")

    def __init__(self, alpha: float, *, start: str = "first"):
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"alpha must be in (0, 1], got {alpha!r}")
        if start not in self.STARTS:
            raise ValueError(f"start must be one of {', '.join(self.STARTS)}, got {start!r}")
        self.alpha = alpha
        self.start = start
        self.n = 0
        self.mean = 0.0
        # One update rule for all three: weight max(alpha, 1/n) for the first `warm` points
        # (first: the first point gets weight 1; running: while 1/n ≥ alpha; zero: never).
        self.warm = {"first": 1, "running": int(1.0 / alpha) + 1, "zero": 0}[start]
        self.whole_from = _NEVER   # the first n at which the zero start's weights sum to 1.0 exactly

    def update(self, x: float) -> float:
        """Add ``x``; returns the new mean."""
        n = self.n = self.n + 1
        mean = self.mean
        mean += (self.alpha if n > self.warm else max(self.alpha, 1.0 / n)) * (x - mean)
        self.mean = mean
        return mean

    @property
    def debiased(self) -> float:
        """The mean over the weights actually given (differs from ``mean`` only for ``zero``)."""
        n = self.n
        if self.start != "zero" or n == 0 or n >= self.whole_from:
            return self.mean
        if self.alpha >= 1.0:
            return self.mean
        weight = -math.expm1(n * math.log1p(-self.alpha))
        if weight == 1.0:   # (1 - alpha)^n is below half an ulp of 1 (~730 points at 0.05): it stays so,
            self.whole_from = n   # and dividing by 1.0 is exact; not state (it follows from alpha)
        return self.mean / weight

    def state_dict(self) -> list:
        return [self.n, self.mean]

    def load_state_dict(self, s) -> None:
        self.n, self.mean = int(s[0]), float(s[1])


class Latch:
    """Fire once per episode: :meth:`update` is True at the first point where ``on`` holds
    while armed, then False until a point where ``off`` holds re-arms it. ``off`` is applied
    first, so a point can re-arm and fire at once; a caller whose re-arm condition can overlap
    ``on`` excludes ``on`` from it. O(1); state: 1 bool.

    >>> latch = Latch()
    >>> [latch.update(on=v > 2, off=v < 1) for v in [3, 3, 1.5, 3, 0, 3]]
    [True, False, False, False, False, True]
    """

    __slots__ = ("armed",)

    def __init__(self):
        self.armed = True

    def update(self, on: bool, off: bool = False) -> bool:
        if off:
            self.armed = True
        if on and self.armed:
            self.armed = False
            return True
        return False

    def rearm(self) -> None:
        self.armed = True

    def state_dict(self) -> bool:
        return self.armed

    def load_state_dict(self, s) -> None:
        self.armed = bool(s)


class RobustLevel:
    """A robust, trend-following baseline of a positive signal, in log space.

    ``level`` is an EW mean of ``log(x)`` with a damped EW trend (Holt's method, per sample),
    so the baseline follows the natural downward drift of a loss curve instead of lagging
    above it. What that local trend leaves unexplained is judged apart from its systematic
    part: ``bias`` is an EW mean of the residuals (with a trend; a curve that bends faster than the damped
    trend follows, as a loss does while the LR warms up, leaves them all on one side), the
    forecast adds it back, and ``scale`` is an EW mean absolute deviation of the residuals
    *around* it (×1.25 ≈ σ for Gaussian noise). An early descent is then not noise (docs/design.md,
    Findings). Points flagged by the caller are *winsorized* before they enter (clipped to
    ``forecast ± clip_sigmas·scale``), so a spike barely moves the baseline while a genuine new
    level is still reached, slowly.

    Cold start: with ``cold_start_samples`` = k, the first k points are kept as they come
    (flagged or not) and the baseline is what they show, robustly, not an EW mean seeded with the
    first value, which one unlucky first point would skew for tens of points: for the first 9
    points their median and the σ of their median absolute deviation (×1.4826), then a Theil–Sen
    line through the later half of them (the median of the pairwise slopes), refitted at each point (O(k²) while cold, on the first k points only): a loss that falls fast from its
    first steps is well below their median. At the k-th point the EW part takes over from that line.

    ``baseline`` is the forecast for the next point; ``z(x)`` the standardized residual
    against it; ``ratio(x)`` is ``x / baseline``. State: 5 floats (+ the first k logs while cold).

    >>> b = RobustLevel(alpha=0.1)
    >>> for x in [2.0] * 10: b.update(x)
    >>> round(b.baseline, 3), b.ratio(4.0)
    (2.0, 2.0)
    >>> c = RobustLevel(cold_start_samples=5)
    >>> for x in [9.0, 1.0, 1.2, 0.9]: c.update(x)   # a wild first point does not set the level
    >>> round(c.baseline, 3)                          # the median of the logs: √(1.0 × 1.2)
    1.095
    """

    __slots__ = ("alpha", "clip_sigmas", "n", "level", "mad", "min_scale", "trend_alpha", "trend", "damping",
                 "bias", "cold_start_samples", "seen", "_alpha_from", "_steady_from")

    def __init__(self, alpha: float = 0.05, *, clip_sigmas: float = 3.0, min_scale: float = 1e-3,
                 trend_alpha: float = 0.05, damping: float = 0.98, cold_start_samples: int = 0):
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"alpha must be in (0, 1], got {alpha!r}")
        self.alpha = alpha
        self._alpha_from = _first_below(alpha)
        self.clip_sigmas = clip_sigmas
        self.min_scale = min_scale
        self.trend_alpha = trend_alpha
        self.damping = damping
        self.cold_start_samples = cold_start_samples
        # the first n past the cold start, the first point, the weights of 1/n and the first 3 points
        self._steady_from = max(cold_start_samples + 1, 2, self._alpha_from, 4)
        self.n = 0
        self.level = 0.0
        self.trend = 0.0
        self.mad = 0.0
        self.bias = 0.0
        self.seen: list[float] = []

    @property
    def forecast(self) -> float:
        """The expected ``log(x)`` of the next point."""
        return self.level + self.damping * self.trend + self.bias

    @property
    def baseline(self) -> float:
        return math.exp(self.forecast)

    @property
    def scale(self) -> float:
        """Noise scale of ``log(x)`` (≈σ); never below ``min_scale`` (a perfectly flat signal)."""
        return max(1.25 * self.mad, self.min_scale)

    @property
    def cold(self) -> bool:
        """Still in the cold start: the baseline is what the points seen so far show."""
        return self.n < self.cold_start_samples

    def cold_median(self) -> float:
        """While cold, the median of the logs seen (a spike among them barely moves it, as it
        may move their trend); O(k log k)."""
        return median(self.seen) if self.seen else self.level

    def cold_noise(self, upto: int | None = None) -> float:
        """While cold, the σ of one point's log around the curve, from the changes between
        successive points around their median (a trend, even a bending one, moves them alike;
        a spike is one or two changes among them): 1.4826 x their MAD / √2; O(k log k). ``upto``:
        of the first points seen only (those before a spike)."""
        seen = self.seen if upto is None else self.seen[:upto]
        steps = [seen[i] - seen[i - 1] for i in range(1, len(seen))]
        if len(steps) < 2:
            return 0.0
        mid = median(steps)
        return 1.4826 / _SQRT2 * median([abs(d - mid) for d in steps])

    def trending(self) -> bool:
        """While cold (10 points or more), whether the logs seen moved by more than their noise
        explains: their halves' medians apart by 4σ of their difference (1.25σ√(2/h) each: 5σ√(2/h)),
        the σ that of their changes (:meth:`cold_noise`)."""
        h = len(self.seen) // 2
        return h > 0 and abs(self.cold_fall()) > COLD_TREND_SIGMAS * self.cold_noise() * math.sqrt(2.0 / h)

    def cold_fall(self) -> float:
        """While cold, how far the logs seen fell: the median of their first half minus that of
        their second (robust to a spike among them); O(k log k)."""
        seen = self.seen
        h = len(seen) // 2
        return median(seen[:h]) - median(seen[-h:]) if h else 0.0

    def z(self, x: float) -> float:
        return (math.log(x) - self.forecast) / self.scale

    def ratio(self, x: float) -> float:
        return x / self.baseline

    def update(self, x: float, *, flagged: bool = False) -> None:
        self.update_log(math.log(x), flagged=flagged)

    def update_log(self, lx: float, *, flagged: bool = False) -> None:
        """:meth:`update` with ``log(x)`` already computed (the hot path computes it once)."""
        n = self.n = self.n + 1
        if n < self._steady_from:   # the cold start, the first points, a weight of 1/n
            if n <= self.cold_start_samples:
                self._cold(lx)
                return
            if n == 1:
                self.level = lx
                return
            # The weight max(alpha, 1/n): a running mean of the first points, then exponential.
            a = self.alpha if n >= self._alpha_from else 1.0 / n
            young = n <= 3   # a trend (and a bias, a clip unless flagged) from 2-3 points is noise
        else:   # (past all of those: the same rule, its tests answered once in _steady_from)
            a, young = self.alpha, False
        # Four baselines update on every record: the attributes are read once (locals are cheaper), and
        # max(u, v) is written out as `v if v > u else u` (the same value, without a call).
        level, bias, mad = self.level, self.bias, self.mad
        drift = self.damping * self.trend
        pred = level + drift
        d = lx - pred - bias   # what the trend and its bias leave unexplained
        clipped = False
        if flagged or not young:   # clipped to the band: clip_sigmas x max(1.25 x mad, min_scale)
            band, least = 1.25 * mad, self.min_scale
            band = self.clip_sigmas * (least if least > band else band)
            if d > band:
                d, clipped = band, True
            elif d < -band:
                d, clipped = -band, True
        new = pred + a * (bias + d)
        # Flagged points move the level (clipped, so slowly) but never the noise scale, the bias or
        # the trend: an anomaly must not widen the band it is judged by. The trend learns only from
        # ordinary points, so a regime change does not wind it up into an overshoot.
        if not (young or flagged or clipped):
            self.trend = drift + self.trend_alpha * (new - level - drift)
        self.level = new
        if not flagged:
            if not young and self.trend_alpha > 0.0:   # ... nor a bias (without a trend, the
                # level itself is the EW mean the bias would repeat)
                self.bias = bias + a * d
            self.mad = mad + a * (abs(d) - mad)

    def _cold(self, lx: float) -> None:
        seen = self.seen
        seen.append(lx)
        k = len(seen)
        if k < min(self.cold_start_samples, COLD_TREND_SAMPLES):   # the median and MAD of what was seen
            self.level = median(seen)
            self.mad = 1.4826 / 1.25 * median([abs(v - self.level) for v in seen]) if k >= 3 else 0.0
            return
        # A Theil–Sen line (the median of the pairwise slopes) through the later half of the cold
        # points, where the curve is now: its value at the last point is the level, its slope the
        # trend, the spread of the points around it the noise. While cold it is refitted at every
        # point (a loss falling fast from its first steps is below their median: a +35% spike
        # right after a short warmup must stand out, docs/design.md, Findings); at the k-th point
        # the EW part takes over from it.
        if k >= self.cold_start_samples and not self.trending():
            # the handover, where the points show no trend their noise does not explain (a noisy
            # flat loss: a line through 10 draws of ±50% tilts by chance and carries its tilt into
            # the EW part): their median, no trend, and no less noise than their changes show
            self.level = median(seen)
            self.trend = self.bias = 0.0
            self.mad = max(1.4826 / 1.25 * median([abs(v - self.level) for v in seen]), self.cold_noise() / 1.25)
            self.seen = []
            return
        recent = seen[k // 2:]
        m = len(recent)
        slope = median([(recent[j] - recent[i]) / (j - i) for i in range(m) for j in range(i + 1, m)]) if m > 1 else 0.0
        resid = [v + slope * (m - 1 - i) for i, v in enumerate(recent)]   # each moved to the last point
        self.level = median(resid)
        self.trend = slope / self.damping if self.damping else 0.0        # forecast: level + slope
        self.mad = 1.4826 / 1.25 * median([abs(r - self.level) for r in resid])
        self.bias = 0.0
        if k >= self.cold_start_samples:
            self.seen = []

    def state_dict(self) -> list:
        return [self.n, self.level, self.trend, self.mad, self.bias, list(self.seen)]

    def load_state_dict(self, s) -> None:
        self.n, self.level, self.trend, self.mad = int(s[0]), float(s[1]), float(s[2]), float(s[3])
        self.bias, self.seen = float(s[4]), [float(v) for v in s[5]]


_SQRT2 = math.sqrt(2.0)
#: Cold points from which the cold baseline is a trend line (fewer: their median). Up to 20
#: cold points the refit costs <= 45 pairwise slopes per point, on the first points only.
COLD_TREND_SAMPLES = 10
#: How far apart, in σ√(2/h) of one point, the medians of the cold points' halves must be for a trend.
COLD_TREND_SIGMAS = 5.0


def _first_below(alpha: float) -> int:
    """The first n with ``1.0 / n <= alpha`` (as floats): from there on ``max(alpha, 1.0 / n)`` is alpha."""
    n = max(int(1.0 / alpha) - 1, 1)
    while 1.0 / n > alpha:
        n += 1
    return n


def median(xs: Iterable[float]) -> float:
    """The median of ``xs`` (of an even count, the mean of the middle two)."""
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else 0.5 * (s[n // 2 - 1] + s[n // 2])


class RollingMedian:
    """Median of the last ``size`` values: a fixed window, used where blips must not count.

    O(size) per update with a small ``size`` (≤ 15 here). State: the window.

    >>> m = RollingMedian(3)
    >>> for x in [1.0, 100.0, 2.0, 3.0]: m.update(x)
    >>> m.median
    3.0
    """

    __slots__ = ("size", "window")

    def __init__(self, size: int):
        if size < 1:
            raise ValueError(f"size must be ≥ 1, got {size!r}")
        self.size = size
        self.window: deque[float] = deque(maxlen=size)

    def update(self, x: float) -> None:
        self.window.append(x)

    @property
    def full(self) -> bool:
        return len(self.window) == self.size

    @property
    def median(self) -> float:
        w = self.window
        if len(w) == self.size and self.size % 2:   # full, of an odd size (7, the detectors'): the
            return sorted(w)[self.size // 2]        # middle value, as median gives it, less its call
        return median(w) if w else math.nan

    def state_dict(self) -> list:
        return list(self.window)

    def load_state_dict(self, s) -> None:
        self.window = deque((float(v) for v in s), maxlen=self.size)


class RiseAboveLow:
    """The lowest value seen, and whether the value has now stood more than ``threshold`` above
    it for ``persist`` consecutive points. ``update`` returns True once per episode; it re-arms
    when the value falls back below half the threshold. O(1); state: 4 scalars.

    >>> r = RiseAboveLow(persist=2)
    >>> [r.update(v, s, threshold=1.0) for s, v in enumerate([5.0, 4.0, 5.5, 5.6, 5.7], 1)]
    [False, False, False, True, False]
    >>> r.low, r.low_step
    (4.0, 2)
    """

    __slots__ = ("persist", "low", "low_step", "count", "latch")

    def __init__(self, persist: int):
        if persist < 1:
            raise ValueError(f"persist must be ≥ 1, got {persist!r}")
        self.persist = persist
        self.low: float | None = None
        self.low_step: int | None = None
        self.count = 0
        self.latch = Latch()

    def update(self, v: float, step: int, threshold: float) -> bool:
        low = self.low
        if low is None or v < low:
            low = self.low = v
            self.low_step = step
        rise = v - low
        if rise <= threshold:
            self.count = 0
            if rise < threshold / 2:   # re-armed; nothing to fire (hot path: no call)
                self.latch.armed = True
            return False
        self.count += 1
        return self.latch.update(self.count >= self.persist, rise < threshold / 2)

    @property
    def low_value(self) -> float:
        """The lowest value so far (once there has been one: after ``update`` returned True)."""
        if self.low is None:
            raise ValueError("RiseAboveLow has seen no value yet")
        return self.low

    def restart(self) -> None:
        """Forget the low (a new episode of the signal begins)."""
        self.low = self.low_step = None
        self.count = 0

    def state_dict(self) -> list:
        return [self.low, self.low_step, self.count, self.latch.armed]

    def load_state_dict(self, s) -> None:
        self.low, self.low_step, self.count = s[0], s[1], int(s[2])
        self.latch.load_state_dict(s[3])


def finite_positive(v) -> bool:
    """True for a float that can go through ``log``: finite and > 0."""
    return v is not None and v > 0.0 and math.isfinite(v)


def bias_correction(beta: float, t: float) -> float:
    """``1 − beta^t``: the total weight an Adam moment, zero-initialised, has gathered after
    ``t`` updates (``expm1`` keeps it exact for beta near 1); 1 where ``beta`` or ``t`` say no
    correction applies (beta outside (0, 1), no update yet).

    >>> round(bias_correction(0.999, 20), 4), round(bias_correction(0.999, 1000), 3), bias_correction(0.9, 0)
    (0.0198, 0.632, 1.0)
    """
    return -math.expm1(t * math.log(beta)) if 0.0 < beta < 1.0 and t >= 1 else 1.0
