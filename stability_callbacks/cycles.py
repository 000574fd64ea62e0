"""The run's own cycles: the loss's shape within an epoch against the epoch before, and its rise
after a warm restart of the LR. What the run does every cycle is no instability.

**Epochs.** A run that feeds its data in the same order every epoch draws the same shape every
epoch. A speech recognizer whose batches are sorted by utterance length (SortaGrad, ``sorting:
ascending``) has a CTC loss summed over frames that grows with the utterances, batch after batch,
and falls back when the next epoch starts again from the short ones; unshuffled data with one bad
stretch spikes at the same point of every epoch. Against the points just before it, each such rise
looks like a spike or a divergence; against the same point of the epoch before, it is what the run
always does.

So, where a record says which epoch it belongs to (:attr:`StepRecord.epoch`: a replayed log's
epoch × batch count, a live trainer's epoch), :class:`EpochProfile` keeps the log of the loss
through the epoch before, and a warning or critical about a rise — ``loss_spike``,
``spike_unrecovered``, ``divergence`` — is made info when, at the same point of the epoch before,
the loss stood as high and had risen at least half as much from the rise's start (one inside this
epoch): the epoch's own shape; or as high, where the loss fell at this epoch's start by half the
rise or more and has climbed back (the first epoch's rise may be hidden by how fast the run learned
then; a loss continuous across the epoch's start, as a shuffled run's is, does not fall there). A
rise above the epoch before's at that point (a real divergence, which the data order does not
explain) is left as it was; so is everything in the first epoch, which has no epoch before it. A
rise made info is watched: once the loss stands above the epoch before's at the same point for 3
points in a row, it is said again at the severity its detector gave it. A spike's return made info
likewise where its rise was.

**Warm restarts.** A schedule with warm restarts (SGDR, cosine with restarts) sends the LR back up
to its peak at each cycle's start (``lr_anomaly`` says so, info), and the loss rises as the
optimizer leaves the minimum it had settled in. :class:`Restarts` makes info a rise that begins
within the first points after such a restart while the loss stays below its level where the
cycle before began (the run's first loss, for the first restart): the last time the LR stood
there, the loss stood higher. Watched as above: 3 points in a row above that level, and it is said
again.
"""
from __future__ import annotations

import bisect
import math

from .detectors.base import fmt
from .record import Finding
from .stats import median

#: The kinds whose warning about a rise the run's cycles can explain.
_RISES = frozenset({"loss_spike", "spike_unrecovered", "divergence"})
#: Points kept of an epoch (thinned by halves past twice as many): its shape, not every step.
_KEEP = 256
#: The points either side of an offset whose median is the epoch before's loss there.
_NEAR = 2
#: Points in a row above the epoch before's at the same point that undo a rise made info.
_ABOVE = 3
#: How much higher than the epoch before's point a rise may stand and still be its shape:
#: 3σ of log(loss)'s noise against it, and no less than 10% (a noise told by a few points).
_MARGIN_SIGMAS, _MARGIN_LEAST = 3.0, math.log(1.1)
#: That noise: an EW mean (weight 1/n, then _ALPHA) of the changes' size, known from _LEAST_CHANGES.
_ALPHA, _LEAST_CHANGES = 0.05, 5
_HALF_SQRT_PI = 0.5 * math.sqrt(math.pi)


class EpochProfile:
    """The log of the loss through this epoch and the one before (offsets from each one's first step)."""

    def __init__(self) -> None:
        self.epoch: int | None = None
        self.start = 0                        # this epoch's first step
        self.offsets: list[int] = []          # this epoch's points, thinned to ~_KEEP
        self.logs: list[float] = []
        self.stride = 1                       # ... every stride-th point kept
        self.seen = 0
        self.before: tuple[int, list[int], list[float]] | None = None   # the epoch before's (start, offsets, logs)
        self.explained: set[int] = set()      # onsets of the rises made info (their returns too)
        # the last rise made info, watched until the loss stands above the epoch before's at the
        # same point: [kind, severity it had, its step, onset, baseline]
        self.watch: list | None = None
        self.above = 0                        # points in a row above the epoch before's (by the margin)
        # σ of log(loss) against the epoch before's at the same point (what is left when the
        # epoch's shape is taken out: its changes from point to point, EW mean of their size)
        self.resid: float | None = None
        self.dev, self.devs = 0.0, 0

    def update(self, epoch: int, step: int, loss: float | None) -> list[Finding]:
        """The loss at ``step`` of ``epoch``; a rise made info that the loss now leaves behind is
        said as what it is (:meth:`_watched`)."""
        if epoch != self.epoch:
            # only the epoch just before is a neighbour (a log that skips or goes back has none)
            full = self.epoch is not None and epoch == self.epoch + 1 and self.offsets
            self.before = (self.start, self.offsets, self.logs) if full else None
            self.epoch, self.start, self.offsets, self.logs, self.stride, self.seen = epoch, step, [], [], 1, 0
            self.explained = {s for s in self.explained if full and s >= self.before[0]}   # type: ignore[index]
        if loss is None or not 0.0 < loss < math.inf:
            return []
        lx = math.log(loss)
        at = self._before_at(step - self.start) if self.before is not None else None
        if at is not None:   # the residual's noise, from its changes (a trend in it moves them alike)
            r, last = lx - at, self.resid
            self.resid = r
            if last is not None:
                k = self.devs = self.devs + 1
                self.dev += max(1.0 / k, _ALPHA) * (abs(r - last) - self.dev)
            self.above = self.above + 1 if r > self._margin() else 0
        else:
            self.resid, self.above = None, 0
        out = self._watched(step, loss, at) if at is not None and self.watch is not None and self.above >= _ABOVE else []
        self.seen += 1
        if (self.seen - 1) % self.stride:
            return out
        self.offsets.append(step - self.start)
        self.logs.append(lx)
        if len(self.offsets) >= 2 * _KEEP:   # amortized: halve what is kept, keep every other point from now
            self.offsets, self.logs, self.stride = self.offsets[::2], self.logs[::2], 2 * self.stride
        return out

    def _noise(self) -> float:
        """σ of log(loss) against the epoch before's at the same point: √π/2 x the mean size of its
        changes (each the difference of two draws); 0 until _LEAST_CHANGES of them tell it."""
        return _HALF_SQRT_PI * self.dev if self.devs >= _LEAST_CHANGES else 0.0

    def _margin(self) -> float:
        return max(_MARGIN_SIGMAS * self._noise(), _MARGIN_LEAST)

    def _watched(self, step: int, loss: float, at: float) -> list[Finding]:
        """The rise made info last is said again, at the severity its detector gave it: the loss
        has stood above the epoch before's at the same point (by the margin a rise is allowed) for
        _ABOVE points in a row, which the data order does not explain (a real divergence that
        began inside the epoch's climb)."""
        kind, severity, said_at, onset, base = self.watch   # type: ignore[misc]
        self.watch = None
        start = self.before[0]   # type: ignore[index]
        return [Finding(step=step, kind=kind, severity=severity, value=loss, baseline=base, onset_step=onset,
                        message=(f"The loss is above the epoch before's at the same point: {fmt(loss)} at step "
                                 f"{step} vs {fmt(math.exp(at))} at step {start + step - self.start}, for "
                                 f"{_ABOVE} points in a row. The rise from step {onset} ({fmt(base)}), said at "
                                 f"step {said_at} to be the epoch's own shape, is more than that: the loss is "
                                 f"climbing past what the data order explains. Keep the last checkpoint from "
                                 f"before step {onset}; if it goes on, roll back to it and lower the LR."),
                        details={"epoch_shape_left": True, "said_at": said_at})]

    def _before_at(self, offset: int) -> float | None:
        """The epoch before's log(loss) at ``offset`` from its start: the median of its points
        nearest there (None where it has none within the spacing it kept)."""
        if self.before is None:
            return None
        _, offsets, logs = self.before
        i = bisect.bisect_left(offsets, offset)
        if i == len(offsets) and offset - offsets[-1] > 2 * self._spacing():
            return None   # past the epoch before's end
        return median(logs[max(0, i - _NEAR):i + _NEAR])

    def _spacing(self) -> float:
        _, offsets, _ = self.before   # type: ignore[misc]
        return (offsets[-1] - offsets[0]) / max(len(offsets) - 1, 1)

    def judge(self, found: list[Finding]) -> None:
        """Make info, in place, the warnings of ``found`` about a rise that is this epoch's shape
        (the module's docstring)."""
        if self.before is None:
            return
        for f in found:
            if f.severity == "info":
                continue
            if f.kind == "spike_recovered" and f.onset_step in self.explained:
                _explain(f, "its rise was the epoch's own shape (said at its onset)", "epoch_shape")
                continue
            if f.kind not in _RISES or f.onset_step is None:
                continue
            said = self._shape(f)
            if said:
                self.explained.add(f.onset_step)
                self.watch = [f.kind, f.severity, f.step, f.onset_step, f.baseline]
                _explain(f, said, "epoch_shape")

    def _shape(self, f: Finding) -> str | None:
        """Why ``f``'s rise is the epoch's shape, or None where it is not."""
        onset = f.onset_step
        if not f.value or not f.baseline or f.value <= 0.0 or f.baseline <= 0.0 or onset is None:
            return None
        at = self._before_at(f.step - self.start)
        if at is None:
            return None
        rise = math.log(f.value / f.baseline)
        if self.above or math.log(f.value) > at + self._margin():   # (the point now, or what was found)
            return None
        start, _, logs = self.before   # type: ignore[misc]
        then = f"at the same point of the epoch before (step {start + f.step - self.start}) the loss was {fmt(math.exp(at))}"
        inside = onset >= self.start   # the rise began in this epoch (a running median's may not)
        since = self._before_at(onset - self.start) if inside else None
        if since is not None and at - since >= 0.5 * rise:
            return (f"{then} (now {fmt(f.value)}), and had risen as much, from {fmt(math.exp(since))} at step "
                    f"{start + onset - self.start}: it rises so at this point of every epoch — the "
                    f"order of the data within an epoch (batches sorted by length, unshuffled data), not instability")
        end, begun = median(logs[-_NEAR - 1:]), median(self.logs[:_NEAR + 1])
        if end - begun >= 0.5 * rise:
            return (f"{then} (now {fmt(f.value)}); it fell from {fmt(math.exp(end))} to {fmt(math.exp(begun))} when this epoch "
                    f"began and has climbed back through it — the order of the data within an epoch (batches "
                    f"sorted by length: a loss summed over an utterance's frames grows with it), not instability")
        return None

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "start": self.start, "offsets": self.offsets, "logs": self.logs,
                "stride": self.stride, "seen": self.seen,
                "before": list(self.before) if self.before else None, "explained": sorted(self.explained),
                "watch": self.watch, "above": self.above, "resid": self.resid, "dev": self.dev, "devs": self.devs}

    def load_state_dict(self, d: dict) -> None:
        self.epoch, self.start, self.stride, self.seen = d["epoch"], d["start"], d["stride"], d["seen"]
        self.offsets, self.logs = list(d["offsets"]), list(d["logs"])
        b = d["before"]
        self.before = (b[0], list(b[1]), list(b[2])) if b else None
        self.explained = set(d["explained"])
        self.watch, self.above, self.resid = d["watch"], d["above"], d["resid"]
        self.dev, self.devs = d["dev"], d["devs"]


def _explain(f: Finding, why: str, tag: str) -> None:
    """``f`` made info, its message said anew: what it saw, and why that is the run's own cycle (its
    advice, a rollback, would be wrong); what it said is kept in ``details["said"]``."""
    what = {"spike_recovered": "came back from the rise that began",
            "divergence": "rose (its running median) from the level it had",
            }.get(f.kind, "rose from the level it had")
    f.details.update({tag: True, "said": f.message, "severity_said": f.severity})
    f.message = (f"The loss {what} at step {f.onset_step} ({fmt(f.baseline)}) to {fmt(f.value)} at step "
                 f"{f.step} (a {f.kind} {f.severity} on its own); {why}. No action needed; watching that it "
                 f"stays so.")
    f.severity = "info"


#: The points after a warm restart in which a rise begins with it.
_RESTART_POINTS = 5


class Restarts:
    """The loss where each LR cycle began, and a rise that begins with a warm restart (the module's
    docstring)."""

    def __init__(self) -> None:
        self.first: float | None = None     # the loss where the current cycle began (the run's first)
        self.level: float | None = None     # ... where the cycle before began: a rise stays below it
        self.restart: int | None = None     # the last restart's step
        self.before_step: int | None = None   # the step of the LR's point before it
        self.early: list[int] = []          # the steps of the points since it, the first few
        self.watch: list | None = None      # [kind, severity, step, onset, baseline] of a rise made info
        self.above = 0
        #: Whether a step with no finding changes anything here (the Monitor asks before calling:
        #: replay's hot path), derived from the rest as they change (:meth:`_refresh`).
        self.eager = True

    def _refresh(self) -> None:
        """:attr:`eager`: the cycle's first loss not yet seen, the first points after a restart,
        or a rise watched."""
        self.eager = self.first is None or self.watch is not None or (
            self.restart is not None and len(self.early) < _RESTART_POINTS)

    def update(self, step: int, loss: float | None, found: list[Finding]) -> list[Finding]:
        """This step's loss, and its findings so far (a warm restart among them starts a cycle);
        a rise made info that the loss now leaves behind is said again."""
        finite = loss is not None and 0.0 < loss < math.inf
        restart = next((f for f in found if f.kind == "lr_anomaly" and f.details.get("restart")), None)
        if restart is not None and self.first is not None:
            self.level, self.restart, self.before_step, self.early = self.first, step, restart.details.get("from_step"), []
            self.first, self.watch, self.above = None, None, 0   # (the cycle before's rise is over)
        if self.first is None and finite:
            self.first = loss
        if self.restart is not None and len(self.early) < _RESTART_POINTS:
            self.early.append(step)
        self._refresh()
        if self.watch is None or not finite or self.level is None:
            return []
        self.above = self.above + 1 if loss > self.level * math.exp(_MARGIN_LEAST) else 0   # type: ignore[operator]
        if self.above < _ABOVE:
            return []
        kind, severity, said_at, onset, base = self.watch
        self.watch = None
        self._refresh()
        return [Finding(step=step, kind=kind, severity=severity, value=loss, baseline=base, onset_step=onset,
                        message=(f"The loss is above its level where the LR's last cycle began: {fmt(loss)} at step "
                                 f"{step} vs {fmt(self.level)}, for {_ABOVE} points in a row. The rise from step "
                                 f"{onset} ({fmt(base)}), said at step {said_at} to be the warm restart's, is more "
                                 f"than that. Keep the last checkpoint from before step {onset}; if it goes on, "
                                 f"roll back to it and lower the LR's peak."),
                        details={"restart_left": True, "said_at": said_at})]

    def judge(self, found: list[Finding]) -> None:
        """Make info, in place, the warnings of ``found`` about a rise that began with the last warm
        restart and stays below the level where the cycle before began."""
        if self.restart is None or self.level is None:
            return
        for f in found:
            if f.severity == "info" or f.kind not in _RISES or f.onset_step is None or not f.value:
                continue
            began = self.before_step if self.before_step is not None else self.restart
            if not began <= f.onset_step <= (self.early[-1] if self.early else self.restart) or f.value >= self.level:
                continue
            self.watch, self.above, self.eager = [f.kind, f.severity, f.step, f.onset_step, f.baseline], 0, True
            _explain(f, f"the LR went back up to its peak at step {self.restart} (a warm restart, as "
                        f"lr_anomaly said), and the loss rises as the optimizer leaves the minimum it had "
                        f"settled in; it stays below {fmt(self.level)}, where the cycle before began — the "
                        f"last time the LR stood there, the loss stood higher", "warm_restart")

    def state_dict(self) -> dict:
        return {"first": self.first, "level": self.level, "restart": self.restart, "before_step": self.before_step,
                "early": self.early, "watch": self.watch, "above": self.above}

    def load_state_dict(self, d: dict) -> None:
        self.first, self.level, self.restart = d["first"], d["level"], d["restart"]
        self.before_step, self.early = d["before_step"], list(d["early"])
        self.watch, self.above = d["watch"], d["above"]
        self._refresh()
