"""Reference tests for every streaming statistic: each against a direct (non-streaming)
computation of what it claims to be, on seeded random streams."""
import json
import math
import random
import statistics

import pytest

from stability_callbacks.stats import EWMean, Latch, RiseAboveLow, RobustLevel, RollingMedian


def _stream(n=300, seed=0):
    rng = random.Random(seed)
    return [rng.lognormvariate(0.0, 1.0) for _ in range(n)]


@pytest.mark.parametrize("alpha", [0.05, 0.3, 1.0])
def test_ew_mean_zero_start_is_the_weighted_sum_and_debiased_is_its_weighted_mean(alpha):
    xs = _stream()
    e = EWMean(alpha, start="zero")
    for n, _ in enumerate(xs, 1):
        e.update(xs[n - 1])
        w = [alpha * (1 - alpha) ** (n - i) for i in range(1, n + 1)]
        ref = sum(wi * x for wi, x in zip(w, xs))
        assert e.mean == pytest.approx(ref, rel=1e-12)
        assert e.debiased == pytest.approx(ref / sum(w), rel=1e-12)


@pytest.mark.parametrize("alpha", [0.05, 0.3, 1.0])
def test_ew_mean_first_start_gives_the_first_value_the_remaining_weight(alpha):
    xs = _stream(seed=1)
    e = EWMean(alpha, start="first")
    for n in range(1, len(xs) + 1):
        e.update(xs[n - 1])
        ref = (1 - alpha) ** (n - 1) * xs[0] + sum(alpha * (1 - alpha) ** (n - i) * xs[i - 1]
                                                   for i in range(2, n + 1))
        assert e.mean == pytest.approx(ref, rel=1e-12)
        assert e.debiased == e.mean


def test_ew_mean_running_start_is_the_plain_mean_then_exponential():
    xs = _stream(seed=2)
    alpha = 0.1
    e = EWMean(alpha, start="running")
    for n in range(1, len(xs) + 1):
        e.update(xs[n - 1])
        if n <= 10:
            ref = statistics.fmean(xs[:n])
        else:   # the plain mean of the first 10, then weight alpha
            ref = (1 - alpha) ** (n - 10) * statistics.fmean(xs[:10]) + sum(
                alpha * (1 - alpha) ** (n - i) * xs[i - 1] for i in range(11, n + 1))
        assert e.mean == pytest.approx(ref, rel=1e-12)


def test_ew_mean_rejects_bad_arguments():
    with pytest.raises(ValueError, match="alpha"):
        EWMean(0.0)
    with pytest.raises(ValueError, match="start"):
        EWMean(0.1, start="last")


def _latch_reference(ons, offs):
    """Fires at i when on[i] and nothing fired since the last point where off held (or ever)."""
    fired, armed = [], True
    for on, off in zip(ons, offs):
        armed = armed or off
        fired.append(on and armed)
        armed = armed and not (on and armed)
    return fired


def test_latch_fires_once_per_episode():
    rng = random.Random(3)
    ons = [rng.random() < 0.3 for _ in range(500)]
    offs = [rng.random() < 0.2 for _ in range(500)]
    latch = Latch()
    assert [latch.update(on, off) for on, off in zip(ons, offs)] == _latch_reference(ons, offs)
    # explicitly: a point can re-arm and fire; without a re-arm it never fires twice
    latch = Latch()
    assert [latch.update(on=True, off=o) for o in (False, False, True, False)] == [True, False, True, False]


def test_rolling_median_is_the_median_of_the_last_window():
    xs = _stream(seed=4)
    for size in (1, 4, 7):
        m = RollingMedian(size)
        for n in range(1, len(xs) + 1):
            m.update(xs[n - 1])
            assert m.median == statistics.median(xs[max(0, n - size):n])
            assert m.full == (n >= size)


def _rise_reference(vs, persist, thr):
    out, low, count, armed = [], math.inf, 0, True
    for v in vs:
        low = min(low, v)
        rise = v - low
        if rise <= thr:
            count = 0
            armed = armed or rise < thr / 2
            out.append(False)
            continue
        count += 1
        out.append(count >= persist and armed)
        if out[-1]:
            armed = False
    return out


def test_rise_above_low_against_a_direct_scan():
    rng = random.Random(5)
    vs, v = [], 0.0
    for _ in range(2000):
        v += rng.gauss(0.0, 0.3)
        vs.append(v)
    r = RiseAboveLow(persist=4)
    got = [r.update(x, s, threshold=1.0) for s, x in enumerate(vs)]
    assert got == _rise_reference(vs, 4, 1.0) and sum(got) >= 3
    assert r.low == min(vs) and vs[r.low_step] == r.low


def test_robust_level_on_a_constant_a_trend_and_noise():
    b = RobustLevel(alpha=0.05)
    for _ in range(50):
        b.update(3.0)
    assert b.baseline == pytest.approx(3.0, rel=1e-12) and b.scale == b.min_scale
    # a loss falling geometrically (a straight line in log space): the damped trend follows it
    # (lagging a third as far as a plain EW mean of the log, slope·(1-a)/a = 0.19) and the bias
    # of its residuals takes out the rest: the forecast is on the line
    b, plain = RobustLevel(alpha=0.05), EWMean(0.05)
    for s in range(600):
        b.update(10.0 * math.exp(-0.01 * s))
        plain.update(math.log(10.0) - 0.01 * s)
    next_log = math.log(10.0) - 0.01 * 600
    assert plain.mean - next_log == pytest.approx(0.01 * 0.95 / 0.05 + 0.01, rel=1e-3)
    assert 0 < b.level + b.damping * b.trend - next_log < (plain.mean - next_log) / 3
    assert b.forecast == pytest.approx(next_log, abs=1e-6) and b.scale == b.min_scale
    # Gaussian noise in log space: scale = 1.25 x mean absolute deviation ≈ sigma
    rng = random.Random(6)
    b = RobustLevel(alpha=0.01)
    for _ in range(20_000):
        b.update(math.exp(rng.gauss(0.0, 0.2)))
    assert b.scale == pytest.approx(0.2, rel=0.1) and b.baseline == pytest.approx(1.0, rel=0.05)
    # one flagged outlier moves the level by at most alpha x clip_sigmas x scale
    before, scale = b.level, b.scale
    b.update(1e6, flagged=True)
    assert abs(b.level - before) <= 0.01 * 3.0 * scale + 1e-12


def theil_sen(recent):
    """The Theil-Sen line through ``recent``: (its value at the last point, its slope)."""
    m = len(recent)
    slope = statistics.median((recent[j] - recent[i]) / (j - i) for i in range(m) for j in range(i + 1, m))
    return statistics.median(v + slope * (m - 1 - i) for i, v in enumerate(recent)), slope


def test_robust_level_cold_start_is_the_median_and_mad_then_a_theil_sen_line():
    rng = random.Random(8)
    logs = [math.log(9.0)] + [-0.01 * i + rng.gauss(0.0, 0.02) for i in range(1, 30)]   # a wild first point
    b = RobustLevel(alpha=0.05, cold_start_samples=20)
    for n, lx in enumerate(logs[:19], 1):
        b.update_log(lx)
        seen = logs[:n]
        med = statistics.median(seen)
        assert b.cold and b.cold_median() == pytest.approx(med, abs=1e-12)
        if n < 10:   # the median and its MAD
            assert b.forecast == pytest.approx(med, abs=1e-12)
            mad = statistics.median(abs(v - med) for v in seen)
            assert b.scale == pytest.approx(max(1.4826 * mad, b.min_scale) if n >= 3 else b.min_scale, rel=1e-9)
        else:        # from the 10th, the Theil-Sen line through the later half, refitted each point
            level, slope = theil_sen(seen[n // 2:])
            assert b.forecast == pytest.approx(level + slope, abs=1e-12)
    steps = [logs[i] - logs[i - 1] for i in range(1, 19)]
    mid = statistics.median(steps)   # the noise of one point, from the changes between points
    assert b.cold_noise() == pytest.approx(1.4826 / math.sqrt(2) * statistics.median(abs(d - mid) for d in steps))
    assert b.cold_fall() == pytest.approx(statistics.median(logs[:9]) - statistics.median(logs[10:19]))
    b.update_log(logs[19])   # the 20th: the Theil-Sen line through the later 10 takes over
    level, slope = theil_sen(logs[10:20])
    assert not b.cold and b.seen == []
    assert b.forecast == pytest.approx(level + slope, abs=1e-12)
    assert b.forecast == pytest.approx(-0.2, abs=0.03)   # on the line, not pulled up by the 9.0


@pytest.mark.parametrize("make", [lambda: EWMean(0.1, start="zero"), lambda: EWMean(0.1, start="running"),
                                  lambda: RobustLevel(0.1), lambda: RobustLevel(0.1, cold_start_samples=200),
                                  lambda: RollingMedian(5),
                                  lambda: RiseAboveLow(3), lambda: Latch()],
                         ids=["ewmean-zero", "ewmean-running", "robust", "robust-cold", "median", "rise", "latch"])
def test_state_round_trips_through_json(make):
    xs = _stream(seed=7)

    def feed(stat, x, i):
        if isinstance(stat, RiseAboveLow):
            return stat.update(x, i, threshold=0.5)
        if isinstance(stat, Latch):
            return stat.update(on=x > 2.0, off=x < 0.5)
        stat.update(x)
        return stat.state_dict()

    a = make()
    for i, x in enumerate(xs[:150]):
        feed(a, x, i)
    b = make()
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    assert [feed(a, x, i) for i, x in enumerate(xs[150:])] == [feed(b, x, i) for i, x in enumerate(xs[150:])]
