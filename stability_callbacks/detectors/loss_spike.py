"""Loss spikes: the onset of an abnormal rise, then how (and whether) the loss came back."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from .. import keys
from ..record import Finding, StepRecord
from ..stats import RobustLevel
from .base import Context, Detector, check, fmt, positive, positive_int


@dataclass(slots=True)
class SpikeEpisode:
    """An open loss-spike episode: where it began, the baseline it is judged against, how high
    it went, how many points it has lasted, and whether it has been escalated to a warning."""

    onset: int
    baseline: float
    peak: float
    samples: int = 1
    warned: bool = False
    warm: bool = True      # the baseline was known (≥ cold_start_samples points) at the onset

    def state_dict(self) -> dict:
        return asdict(self)


class LossSpike(Detector):
    """Onset of an abnormal rise of a loss against a robust, detrended baseline.

    Rule: with a warm baseline (≥ ``cold_start_samples`` points) a point is abnormal when it
    is ``z_threshold`` noise-σ above the baseline *and* ``min_rise`` above it relatively — and
    always once it is ``max_threshold_rise`` above (after a fast early fall the noise estimate
    stays wide for a while; a doubling is a spike whatever it says); with a short history (a log snippet, the first steps of a run) only a relative jump of
    ``cold_start_rise`` counts. Abnormal points do not enter the baseline (winsorized), so
    the episode is judged against the level before it.

    An episode emits ``loss_spike`` at its onset (``info``; ``warning`` when the rise is at
    least ``large_rise`` or once it persists ``persist_samples`` points), then exactly one of
    ``spike_recovered`` (back within ``recover_fraction`` of the rise or 3σ of noise; ``fast`` when within
    ``fast_recovery_steps``) or ``spike_unrecovered`` (not back after ``horizon_steps`` *and*
    ``horizon_samples`` logged points: critical). A healthy 20k-step run has ~190 one-step
    blips: they stay ``info``.

    Relative to what: the rule judges ``log(loss)``, where the noise of a cross-entropy-like loss
    is proportional to its level. Near its floor that stops being true: a loss that has fallen
    below ``floor_fraction`` (1%) of the largest value it has had is the mean of a batch in which
    almost every example is fitted, and it is the one or two examples left that move it — by
    whole multiples of a tiny number (a classifier at 2e-4 printing 1e-3: +400%, and 0.04% of
    the 2.1 it started from). There the relative rises above are measured against
    ``floor_fraction`` × that peak instead of the baseline: a spike must undo a visible part of
    what training achieved, not double a rounding error. Above the floor nothing changes.

    An objective that goes below zero (RL losses such as GRPO or PPO, a loss minus a baseline)
    has no level to be relative to: once a negative value is seen the baseline restarts on an
    additive scale and a point is abnormal only when it is ``z_threshold`` σ above it. Such an
    episode is ``info`` (no rise means anything on its own) and ends at the horizon without a
    verdict, and the other loss detectors, which judge ``log(loss)``, leave the signal alone.

    "Unrecovered" claims the loss did not come back to *its* level, so it needs that level
    known and enough points to tell a loss that stayed up from noise: a sparse log (every 100
    steps) has only 3 points in 300 steps, and a cold-start baseline (fewer than
    ``cold_start_samples`` points — possibly one noisy first point) is not a level. An episode
    that opened against a cold baseline is closed at the horizon without a verdict, and the
    baseline restarts at the level the loss has settled at.
    O(1) per update; state: the baseline (4 floats), the episode (6 scalars) and 4 scalars.

    >>> d = LossSpike()
    >>> out = [f.kind for s, x in enumerate([3.0] * 30 + [6.0, 3.0], 1)
    ...        for f in d.update(StepRecord(s, {"loss": x}), Context(s))]
    >>> out
    ['loss_spike', 'spike_recovered']
    """

    name = "loss_spike"
    kind = "loss_spike"
    kinds = ("loss_spike", "spike_recovered", "spike_unrecovered")
    _state = ("base", "episode", "prev_step", "prev_z", "peak", "signed")
    #: Other loss detectors (resume spike, falsely low loss) judge against this baseline.
    baseline_before: float | None = None
    noise_before: float = 0.0
    #: The loss has gone below zero: an additive objective (the log-space loss rules stand aside).
    signed: bool = False

    def __init__(self, *, signal: str = keys.LOSS, baseline_alpha: float = 0.05,
                 z_threshold: float = 6.0, min_rise: float = 0.15, cold_start_samples: int = 20,
                 cold_start_rise: float = 0.3, max_threshold_rise: float = 1.0,
                 large_rise: float = 1.5, persist_samples: int = 3,
                 recover_fraction: float = 0.1, fast_recovery_steps: int = 100,
                 horizon_steps: int = 300, horizon_samples: int = 10, floor_fraction: float = 0.01):
        self.signals = (signal,)
        self.baseline_alpha = check("baseline_alpha", baseline_alpha, 0 < baseline_alpha <= 1, "in (0, 1]")
        self.z_threshold = positive("z_threshold", z_threshold)
        self.min_rise = positive("min_rise", min_rise)
        self.cold_start_samples = positive_int("cold_start_samples", cold_start_samples)
        self.cold_start_rise = positive("cold_start_rise", cold_start_rise)
        self.max_threshold_rise = positive("max_threshold_rise", max_threshold_rise)
        self.large_rise = positive("large_rise", large_rise)
        self.persist_samples = positive_int("persist_samples", persist_samples)
        self.recover_fraction = check("recover_fraction", recover_fraction, 0 < recover_fraction < 1, "in (0, 1)")
        self.fast_recovery_steps = positive_int("fast_recovery_steps", fast_recovery_steps)
        self.horizon_steps = positive_int("horizon_steps", horizon_steps)
        self.horizon_samples = positive_int("horizon_samples", horizon_samples)
        self.floor_fraction = check("floor_fraction", floor_fraction,
                                    isinstance(floor_fraction, (int, float)) and 0 <= floor_fraction < 1, "in [0, 1)")
        self.base = RobustLevel(baseline_alpha)
        self.episode: SpikeEpisode | None = None
        self.prev_step: int | None = None
        self.prev_z = 0.0
        self.peak = 0.0          # the largest loss so far: what "near its floor" is measured by
        self.signed = False
        self.floor = 0.0         # floor_fraction x peak (derived), and its log for the other detectors
        self.floor_log = -math.inf

    @property
    def open(self) -> bool:
        return self.episode is not None

    def threshold(self) -> float:
        """The value above which a point is abnormal right now."""
        b = self.base
        if self.signed:
            return b.forecast + self.z_threshold * max(1.25 * b.mad, b.min_scale * self.peak)
        return self._threshold(b.baseline, b.scale, b.n >= self.cold_start_samples)

    def _threshold(self, base: float, scale: float, warm: bool) -> float:
        # Rises are measured against the baseline, or against floor_fraction x the peak when the
        # loss is below that (see the class docstring); the noise term is relative to the baseline.
        unit = max(base, self.floor)
        if not warm:
            return base + self.cold_start_rise * unit
        return base + min(max(self.min_rise * unit, math.expm1(self.z_threshold * scale) * base),
                          self.max_threshold_rise * unit)

    def update(self, record: StepRecord, ctx: Context) -> list[Finding]:
        x = record.metrics.get(self.signals[0])
        if x is None or not -math.inf < x < math.inf:
            return []
        if x <= 0.0:
            if x == 0.0 or self.signed:
                return self._update_signed(record.step, x) if self.signed else []
            self._become_signed()
            return self._update_signed(record.step, x)
        if self.signed:
            return self._update_signed(record.step, x)
        step = record.step
        if x > self.peak:
            self._new_peak(x)
        b = self.base
        n = b.n
        if n == 0:
            b.update(x)
            self.baseline_before, self.prev_step, self.prev_z = None, step, 0.0
            return []
        # One forecast, one exp, one log per point: this is the hottest path of the Monitor.
        f = b.level + b.damping * b.trend
        base = math.exp(f)
        scale = max(1.25 * b.mad, b.min_scale)
        warm = n >= self.cold_start_samples
        self.baseline_before, self.noise_before = (base if warm else None), scale
        unit = base if base > self.floor else self.floor   # what a rise is measured against
        if warm:
            thr = base + min(max(self.min_rise * unit, math.expm1(self.z_threshold * scale) * base),
                             self.max_threshold_rise * unit)
        else:
            thr = base + self.cold_start_rise * unit
        lx = math.log(x)
        abnormal = x > thr
        z = (lx - f) / scale if n >= 2 else 0.0
        out: list[Finding] = []
        if self.episode is None:
            if abnormal:
                onset = self.prev_step if (self.prev_z > 3.0 and b.n >= self.cold_start_samples
                                           and self.prev_step is not None) else step
                severity = "warning" if x - base >= self.large_rise * unit else "info"
                self.episode = SpikeEpisode(onset, base, x, warned=severity == "warning", warm=warm)
                out.append(self._onset_finding(step, x, base, thr, onset, severity, unit))
            else:
                b.update_log(lx)
        else:
            ep = self.episode
            onset, base0 = ep.onset, ep.baseline
            ep.peak = peak = max(ep.peak, x)
            ep.samples += 1
            back = x <= self._recovery_level(base0, peak)
            if back:
                took = step - onset
                # gone by the next logged point is fast, however sparse the log
                speed = "fast" if took <= self.fast_recovery_steps or ep.samples <= 2 else "slow"
                out.append(self.finding(
                    step, kind="spike_recovered", severity="info" if speed == "fast" else "warning",
                    value=x, baseline=base0, onset_step=onset,
                    message=(f"{self._what()} came back at step {step}: {fmt(x)} vs {fmt(base0)} "
                             f"before the spike (peak {fmt(peak)}), {took} steps after its onset at "
                             f"step {onset} ({speed} recovery). No action needed"
                             + ("." if speed == "fast" else "; keep an eye on the next spikes.")),
                    recovery_steps=took, speed=speed, peak=peak))
                self.episode = None
                b.update(x)
            else:
                if not ep.warned and ep.samples >= self.persist_samples:
                    ep.warned = True
                    out.append(self.finding(
                        step, severity="warning", value=x, baseline=base0, threshold=thr,
                        onset_step=onset,
                        message=(f"{self._what()} spike that began at step {onset} persists: "
                                 f"{fmt(x)} at step {step} vs {fmt(base0)} before it "
                                 f"({ep.samples} points above). A checkpoint is being saved; if it "
                                 f"does not come back, roll back to a checkpoint before step {onset}."),
                        escalated=True, persisted_samples=ep.samples))
                if step - onset >= self.horizon_steps and not ep.warm:
                    # Judged against a cold baseline: no verdict; the loss's level is where it is now.
                    self.episode = None
                    self.base = RobustLevel(self.baseline_alpha)
                    self.base.update(x)
                elif step - onset >= self.horizon_steps and ep.samples >= self.horizon_samples:
                    out.append(self.finding(
                        step, kind="spike_unrecovered", severity="critical", value=x, baseline=base0,
                        onset_step=onset, threshold=self._recovery_level(base0, peak),
                        message=(f"{self._what()} has not recovered {step - onset} steps after the "
                                 f"spike at step {onset}: {fmt(x)} vs {fmt(base0)} before it (peak "
                                 f"{fmt(peak)}). Training more rarely fixes this: roll back to the last "
                                 f"checkpoint before step {onset} and skip the batches since "
                                 f"(or change the seed/data order)."),
                        peak=peak))
                    # Start a fresh baseline at the new level so later spikes are judged anew.
                    self.episode = None
                    self.base = RobustLevel(self.baseline_alpha)
                    self.base.update(x)
        self.prev_step, self.prev_z = step, z
        return out

    def load_state_dict(self, d: dict) -> None:
        super().load_state_dict(d)
        if isinstance(self.episode, dict):   # the JSON form of the open episode
            self.episode = SpikeEpisode(**self.episode)
        self._new_peak(self.peak)

    def _new_peak(self, x: float) -> None:
        self.peak = x
        self.floor = self.floor_fraction * x
        self.floor_log = math.log(self.floor) if self.floor > 0.0 and not self.signed else -math.inf

    def _recovery_level(self, base0: float, peak: float) -> float:
        """Back means within ``recover_fraction`` of the rise, or within the normal noise (3σ)."""
        noise = base0 * math.exp(3.0 * self.base.scale) if self.base.n >= self.cold_start_samples else base0
        return max(base0 + self.recover_fraction * (peak - base0), noise)

    def _what(self) -> str:
        sig = self.signals[0]
        return "The loss" if sig == keys.LOSS else f"The {sig} loss"

    def _onset_finding(self, step, x, base, thr, onset, severity, unit) -> Finding:
        rise = x / base - 1
        near_floor = (f" The loss is near its floor (below {self.floor_fraction:.0%} of its largest value "
                      f"{fmt(self.peak)}), where a few examples move it by multiples, so the rise is "
                      f"measured against {fmt(unit)}: +{(x - base) / unit:.0%}." if unit > base else "")
        return self.finding(
            step, severity=severity, value=x, baseline=base, threshold=thr, onset_step=onset,
            message=(f"{self._what()} jumped to {fmt(x)} at step {step}, {rise:.0%} above its "
                     f"baseline {fmt(base)} (threshold {fmt(thr)}).{near_floor} Most spikes recover "
                     f"within ~100 steps; watching. If it persists, roll back to a checkpoint before "
                     f"step {onset}."),
            rise=rise, **({"floor": unit} if unit > base else {}))

    # -- objectives that go below zero: an additive scale, info only -----------------------------
    def _become_signed(self) -> None:
        self.signed, self.episode = True, None
        self._new_peak(0.0)
        self.base = RobustLevel(self.baseline_alpha)
        self.baseline_before = None

    def _update_signed(self, step: int, x: float) -> list[Finding]:
        self.baseline_before, self.noise_before = None, 0.0
        if abs(x) > self.peak:
            self._new_peak(abs(x))
        b = self.base
        if b.n == 0:
            b.update_log(x)   # update_log: the level of x itself (no log taken on this scale)
            self.prev_step, self.prev_z = step, 0.0
            return []
        f = b.forecast
        # The noise floor: 0.1% of the largest magnitude seen, as log(loss) is floored at 0.1%.
        scale = max(1.25 * b.mad, b.min_scale * self.peak)
        z = (x - f) / scale
        out: list[Finding] = []
        ep = self.episode
        if ep is None:
            if b.n >= self.cold_start_samples and z > self.z_threshold:
                self.episode = SpikeEpisode(step, f, x, warned=True, warm=False)
                out.append(self.finding(
                    step, severity="info", value=x, baseline=f, threshold=f + self.z_threshold * scale,
                    onset_step=step,
                    message=(f"{self._what()} jumped to {fmt(x)} at step {step}, {z:.0f}σ above its "
                             f"baseline {fmt(f)}. It has gone below zero (an RL-style objective), so it "
                             f"is judged on an additive scale and only reported: watching."),
                    rise_sigmas=z, additive=True))
            else:
                b.update_log(x)
        else:
            ep.peak = max(ep.peak, x)
            ep.samples += 1
            if x <= f + 3.0 * scale:
                took = step - ep.onset
                speed = "fast" if took <= self.fast_recovery_steps or ep.samples <= 2 else "slow"
                out.append(self.finding(
                    step, kind="spike_recovered", severity="info", value=x, baseline=ep.baseline,
                    onset_step=ep.onset,
                    message=(f"{self._what()} came back at step {step}: {fmt(x)} vs {fmt(ep.baseline)} "
                             f"before the jump at step {ep.onset} (peak {fmt(ep.peak)}), {took} steps "
                             f"later. No action needed."),
                    recovery_steps=took, speed=speed, peak=ep.peak, additive=True))
                self.episode = None
                b.update_log(x)
            elif step - ep.onset >= self.horizon_steps:   # no verdict on an additive objective
                self.episode = None
                self.base = RobustLevel(self.baseline_alpha)
                self.base.update_log(x)
        self.prev_step, self.prev_z = step, z
        return out
