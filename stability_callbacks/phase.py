"""LR schedule phase per step, the end of warmup, and the warmup-end risk window.

BigScience tr8-104B: every glitch came right after the LR warmup ended, when Adam's variance
peaked. The tracker names the phase of every step (``warmup`` / ``peak`` / ``decay`` /
``rewarm``), emits one ``warmup_end`` finding, and answers whether a step lies in the risk
window ``(warmup_end, warmup_end + risk_window_factor × warmup_length]``.

The warmup length is declared (``warmup_steps``, e.g. read from the scheduler) or inferred
from the LR stream: it ended at the last step of a rise, which is known one sample later. A
warmup is a ramp: the run's first rise may be one sample (a log every 100 steps), a later one
(a re-warmup) rises over two samples at least; a single jump (LR x100 mid-run) is no warmup, it is
``lr_anomaly``'s.
State: 8 scalars.

>>> t = PhaseTracker(warmup_steps=10)
>>> [f.kind for s in range(1, 13) for f in t.update(s, 1e-4 * min(s, 10) / 10)]
['warmup_end']
>>> t.phase, t.in_risk_window(12), t.risk_window
('peak', True, (10, 40))
"""
from __future__ import annotations

import math

from .params import at_least, check, positive_int
from .record import Finding

#: Relative LR change below which two LRs count as equal (printed LRs are rounded).
_LR_TOL = 1e-6
_RISEN, _FALLEN = 1 + _LR_TOL, 1 - _LR_TOL   # the factors an LR must cross to have moved


class PhaseTracker:
    def __init__(self, *, warmup_steps: int | None = None, risk_window_factor: float = 3.0,
                 min_warmup_samples: int = 2, flat_samples: int = 3):
        check("warmup_steps", warmup_steps, warmup_steps is None or (
            isinstance(warmup_steps, int) and not isinstance(warmup_steps, bool) and warmup_steps >= 0),
            "a non-negative integer or null")
        self.warmup_steps = warmup_steps or None
        self.risk_window_factor = float(at_least("risk_window_factor", risk_window_factor, 0))
        self.min_warmup_samples = positive_int("min_warmup_samples", min_warmup_samples)
        # A printed LR is rounded (llm.c: 6 decimals), so a warmup ramp is a staircase with short
        # plateaus: warmup has ended when the LR falls, or stays flat this many samples.
        self.flat_samples = positive_int("flat_samples", flat_samples)
        self.phase: str | None = None
        self.warmup_end_step: int | None = None
        self.warmup_start_step: int | None = None
        self.risk_window_end: int | None = None
        self.peak_lr = 0.0
        self.prev_lr: float | None = None
        self.prev_step: int | None = None
        self.rising_samples = 0
        self.flat = 0
        #: The steps are epochs (a replayed log that prints nothing finer; the Monitor says so):
        #: the messages count epochs (derived, not state).
        self.epochs = False
        self.last_rise_step: int | None = None
        self.decayed = False
        self.first_lr_step: int | None = None   # the step of the first LR seen
        # The ramp under way: the LR it rose from, its samples to its last rise, its smallest rise (a
        # coarse print's quantum: DINOv2's `lr: 0.0012` rises 1e-4 every third print, flat in between).
        self.ramp_lr = 0.0
        self.ramp_samples = 0
        self.quantum = 0.0

    _STATE = ("phase", "warmup_end_step", "warmup_start_step", "risk_window_end", "peak_lr",
              "prev_lr", "prev_step", "rising_samples", "flat", "last_rise_step", "decayed", "first_lr_step",
              "ramp_lr", "ramp_samples", "quantum")

    def declare_warmup(self, warmup_steps: int | None) -> None:
        """Set the warmup length once an integration reads it from the scheduler."""
        if warmup_steps and self.warmup_end_step is None:
            self.warmup_steps = int(warmup_steps)

    @property
    def risk_window(self) -> tuple[int, int] | None:
        if self.warmup_end_step is None or self.risk_window_end is None:
            return None
        return (self.warmup_end_step, self.risk_window_end)

    def in_risk_window(self, step: int) -> bool:
        w = self.risk_window
        return w is not None and w[0] < step <= w[1]

    def update(self, step: int, lr: float | None) -> list[Finding]:
        out: list[Finding] = []
        if self.warmup_steps is not None:
            if step <= self.warmup_steps:
                self.phase = "warmup"
            elif self.warmup_end_step is None:
                out.append(self._end_warmup(self.warmup_steps, 0, lr))
        if lr is None or not math.isfinite(lr):
            if self.phase is None and self.warmup_end_step is not None:
                self.phase = "peak"
            return out
        prev = self.prev_lr
        self.prev_lr = lr
        prev_step, self.prev_step = self.prev_step, step
        if self.warmup_steps is not None and step <= self.warmup_steps:
            self.peak_lr = max(self.peak_lr, lr)
            return out
        if prev is None:
            if self.first_lr_step is None:
                self.first_lr_step = step
            self.peak_lr = max(self.peak_lr, lr)
            if self.phase is None:
                self.phase = "warmup" if lr == 0.0 else "peak"
                if lr == 0.0:
                    self.warmup_start_step = step
            return out
        rising = lr > prev * _RISEN and lr > 0
        falling = lr < prev * _FALLEN
        if rising and self.rising_samples == 0:
            # (from a printed 0: the LR was below the print's resolution, its plateau at 0 the ramp's first)
            self.ramp_lr, self.ramp_samples, self.quantum = prev, self.flat + 1 if prev == 0.0 else 1, lr - prev
        elif rising:   # (its samples to this rise: the plateau before it too)
            self.quantum, self.ramp_samples = min(self.quantum, lr - prev), self.ramp_samples + self.flat + 1
        self.flat = 0 if (rising or falling) else self.flat + 1
        if rising:
            if self.rising_samples == 0 and self.phase not in ("warmup", "rewarm"):
                # steps are 1-based: a ramp already under way at step 1 began at step 0
                self.warmup_start_step = prev_step - 1 if prev_step == 1 else prev_step
                if prev_step == self.first_lr_step:
                    self.first_lr_step = self.warmup_start_step   # the ramp the run starts with
            self.rising_samples += 1
            self.last_rise_step = step
            # A warmup is a ramp. Once the run is under way, one rising sample is a jump (a resume
            # that changed the LR, an LR x100): lr_anomaly's to report, never a new warmup, so
            # the phase changes only once the rise has lasted a ramp's samples.
            if self.phase not in ("warmup", "rewarm") and self.rising_samples >= self._ramp_samples():
                self.phase = "rewarm" if self.decayed else "warmup"
        elif self.rising_samples and (falling or self.flat >= self._flat_needed()):
            if self.phase in ("warmup", "rewarm") and self.rising_samples >= self._ramp_samples() and (
                    self.warmup_steps is None or self.phase == "rewarm"):
                out.append(self._end_warmup(self.last_rise_step or prev_step or step, self.warmup_start_step or 0,
                                            self.peak_lr, rewarm=self.phase == "rewarm"))
            self.rising_samples = 0
            self.phase = "decay" if falling else "peak"
        elif self.phase in ("warmup", "rewarm") and (falling or self.flat >= self._flat_needed()):
            self.phase = "decay" if falling else "peak"   # a run that starts at LR 0 and never rises
        elif falling:
            self.phase = "decay"
        elif self.phase is None:
            self.phase = "peak"
        if falling:
            self.decayed = True
        if lr > self.peak_lr:
            self.peak_lr = lr
        return out

    def _flat_needed(self) -> int:
        """Flat samples that end a ramp: ``flat_samples``, or twice the plateaus a coarse print
        makes of it (its quantum over its rise per sample to its last rise), 50 at most."""
        rate = (self.peak_lr - self.ramp_lr) / self.ramp_samples if self.ramp_samples else 0.0
        stair = self.quantum / rate if rate > 0.0 else 0.0
        return max(self.flat_samples, min(math.ceil(2.0 * stair), 50))

    def _ramp_samples(self) -> int:
        """Rising samples that make a ramp: the run's first rise may be one sample (a log every
        100 steps), a later one (a re-warmup) rises over two samples at least."""
        return max(self.min_warmup_samples - 1 if self.warmup_start_step == self.first_lr_step else 2, 1)

    def _end_warmup(self, end_step: int, start_step: int, lr, *, rewarm: bool = False) -> Finding:
        length = max(end_step - start_step, 1)
        self.warmup_end_step = end_step
        self.risk_window_end = end_step + int(round(self.risk_window_factor * length))
        if self.phase in (None, "warmup", "rewarm"):
            self.phase = "peak"
        what = "LR re-warmup" if rewarm else "LR warmup"
        lr_txt = f" at LR {lr:.3g}" if lr else ""
        unit = "epoch" if self.epochs else "step"
        return Finding(
            step=end_step, kind="warmup_end", severity="info", signal="lr", value=lr,
            message=(f"{what} ended at {unit} {end_step}{lr_txt} after {length} {unit}s. {unit.capitalize()}s "
                     f"{end_step + 1}-{self.risk_window_end} are the risk window where large runs "
                     f"glitched right after warmup (BigScience tr8-104B): an instability found there at "
                     f"warning or above is escalated (warmup_instability; a spike said as info, within "
                     f"its noise, is not), and a live run saves more often until then."),
            details={"warmup_steps": length, "risk_window_end_step": self.risk_window_end,
                     "rewarm": rewarm})

    def state_dict(self) -> dict:
        d = {k: getattr(self, k) for k in self._STATE}
        d["warmup_steps"] = self.warmup_steps
        return d

    def load_state_dict(self, d: dict) -> None:
        expected = set(self._STATE) | {"warmup_steps"}
        if set(d) != expected:
            raise ValueError(f"phase state keys {sorted(d)} do not match {sorted(expected)}")
        for k in self._STATE:
            setattr(self, k, d[k])
        self.warmup_steps = d["warmup_steps"] or self.warmup_steps
