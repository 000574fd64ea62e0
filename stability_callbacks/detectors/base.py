"""What every detector shares: the per-update context, the state contract, the finding factory."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar, Sequence

# re-exported: the detectors import the parameter checks from here
from .. import keys
from ..params import check, positive, positive_int  # noqa: F401
from ..record import Finding, StepRecord


@dataclass(slots=True)
class Context:
    """Facts the Monitor knows about this step, shared read-only with every detector."""

    step: int
    phase: str | None = None
    in_risk_window: bool = False
    warmup_end_step: int | None = None      # where the LR warmup ended (declared or inferred), once known
    in_startup: bool = False
    run_start: int | None = None            # the run's first step when it began from nothing (its first
                                            # record, at step 0 or 1): no checkpoint can precede it
    steps_since_resume: int | None = None   # None: no resume in this run (or long ago)
    loss: float | None = None               # the step's loss, as the record has it (the policy's)
    loss_spike_open: bool = False           # set by LossSpike for the detectors after it
    loss_spike_onset: int | None = None     # onset of the open loss-spike episode, if any
    loss_baseline: float | None = None      # LossSpike's baseline before this point (warm only)
    loss_noise: float = 0.0                 # ... and the noise σ of log(loss) around it
    loss_slope: float = 0.0                 # ... and its trend: the change of log(loss) per point
    loss_floor_log: float = -math.inf       # log of the level below which the loss is near its floor:
                                            # rises and falls are measured against it (LossSpike's
                                            # floor_fraction x the peak; a log: compared, not divided)
    loss_signed: bool = False               # the loss has gone below zero: log(loss) rules stand aside
    loss_step_noise: float = 0.0            # ... the σ of one point additively (before this point)
    loss_step_mean: float = 0.0             # ... and the mean change from one point to the next
    steps_are_epochs: bool = False          # the log numbers this record by epoch and nothing finer
                                            # (replay): one step is a pass over the data
    steps_by_order: bool = False            # ... or by the record's rank in the log (replay; read at its end)
    tensor_names: list | None = None        # the parameter tensors' names in the optimizer's order (live)
    columns: Columns | None = None          # what several detectors read of the record, worked out
                                            # once (Monitor.update: its one record's; Columns.record)
    found: list[Finding] = field(default_factory=list)   # this step's findings so far (earlier detectors')


@dataclass(slots=True)
class Columns:
    """What several detectors read of each record of a run, worked out once for them all
    (:meth:`Monitor.update_many` builds it for a run, :meth:`Monitor.update` for its one record;
    :meth:`Detector.update_run` builds its own when given none). Exact: each entry is what a
    detector would compute from the record itself (the same ``dict.get``, the same
    ``math.log`` of the same float, the same test), so reading it changes nothing."""

    loss: list[float | None]       # the loss, as the record has it
    loss_log: list[float | None]   # its log where 0 < loss < inf, else None
    grad: list[float | None]       # the grad norm, as the record has it
    grad_log: list[float | None]   # its log where 0 < it < inf, else None
    skipped: list[bool]            # the step was skipped (overflow_skipped >= 1: no update)
    record: StepRecord | None = None   # the record of a run of one they are of (refill): a
                                       # context's columns serve that record only

    @classmethod
    def of(cls, run: Sequence[StepRecord]) -> "Columns":
        cols = cls([], [], [], [], [])
        loss, loss_log, grad, grad_log, skipped = cols.loss, cols.loss_log, cols.grad, cols.grad_log, cols.skipped
        inf, log = math.inf, math.log
        for record in run:
            m = record.metrics
            x = m.get(keys.LOSS)
            loss.append(x)
            loss_log.append(log(x) if x is not None and 0.0 < x < inf else None)
            g = m.get(keys.GRAD_NORM)
            grad.append(g)
            grad_log.append(log(g) if g is not None and 0.0 < g < inf else None)
            skipped.append((m.get(keys.OVERFLOW_SKIPPED) or 0.0) >= 1.0)
        return cols

    def refill(self, record: StepRecord) -> None:
        """The columns of a run of one, ``record``, in place (:meth:`Monitor.update`'s, every step
        of a live run: refilled costs half of built; :meth:`of`'s entries, written out)."""
        self.record = record
        m = record.metrics
        x, g = m.get(keys.LOSS), m.get(keys.GRAD_NORM)
        self.loss[0], self.grad[0] = x, g
        self.loss_log[0] = math.log(x) if x is not None and 0.0 < x < math.inf else None
        self.grad_log[0] = math.log(g) if g is not None and 0.0 < g < math.inf else None
        self.skipped[0] = (m.get(keys.OVERFLOW_SKIPPED) or 0.0) >= 1.0


class Detector:
    """One phenomenon. Subclasses set ``name`` (the config key), ``kind`` (``kinds`` when it
    emits several), ``signals`` (the metric keys it needs: the Monitor skips it when none is
    present) and ``_state`` (the attribute names ``update`` changes — never configuration).
    ``defaults_from`` names another detector whose configuration this one starts from.

    State values are JSON scalars/lists or statistics objects with ``state_dict``.
    """

    name: ClassVar[str]
    kind: ClassVar[str]
    kinds: ClassVar[tuple[str, ...]]
    signals: tuple[str, ...]           # a class attribute, or per instance (LossSpike's stream)
    defaults_from: ClassVar[str | None] = None
    _state: ClassVar[tuple[str, ...]] = ()

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        if "kinds" not in cls.__dict__ and "kind" in cls.__dict__:
            cls.kinds = (cls.kind,)

    def update(self, record: StepRecord, ctx: Context) -> list[Finding]:
        raise NotImplementedError

    def update_run(self, run: Sequence[StepRecord], ctxs: Sequence[Context], cols: Columns | None = None) -> None:
        """Replay's way (:meth:`Monitor.update_many`): :meth:`update` of each record of a run in
        turn, with its step's context, each record's findings added to its context's
        (``ctx.found``, which the detectors after this one read). A detector whose update costs
        little beside its call (~60 ns) writes its common case here inline, or its whole rule as
        this loop and takes its :meth:`update` from :meth:`_update_alone`; each says why that is
        update's own computation. ``cols``: the run's :class:`Columns` (the Monitor's, shared by
        the detectors; one that reads them builds its own when given none)."""
        update = self.update
        for record, ctx in zip(run, ctxs):
            found = update(record, ctx)
            if found:
                ctx.found += found

    def _update_alone(self, record: StepRecord, ctx: Context) -> list[Finding]:
        """:meth:`update` of a detector whose rule is its :meth:`update_run`: the record as a run of
        one, its findings taken back out of ``ctx.found`` and returned (whoever calls update adds
        them, as any detector's)."""
        found = ctx.found
        n = len(found)
        cols = ctx.columns   # the record's own columns where the Monitor worked them out (update())
        self.update_run((record,), (ctx,), cols if cols is not None and cols.record is record else None)
        if len(found) == n:
            return []
        new = found[n:]
        del found[n:]
        return new

    def wants(self, present: frozenset[str]) -> bool:
        """Whether a record with the metric keys ``present`` can change this detector or what it finds: the
        Monitor leaves it out of the records it cannot. Default: one of its ``signals`` is among
        them (or it has none: it looks at every record). An answer that depends on the state may
        change only at a segment, a state load or a record with a set of keys the Monitor has not
        seen before: it asks again after those."""
        return not self.signals or not present.isdisjoint(self.signals)

    def on_segment(self, start_step: int, reason: str) -> None:
        """A new run segment starts (resume / rollback). Default: nothing to do."""

    def at_end(self, ctx: Context) -> list[Finding]:
        """The end of a replayed log (``ctx.step``: its last step): what only the whole log can say.
        Default: nothing."""
        return []

    def state_dict(self) -> dict:
        out = {}
        for k in self._state:
            v = getattr(self, k)
            out[k] = v.state_dict() if hasattr(v, "state_dict") else v
        return out

    def load_state_dict(self, d: dict) -> None:
        if set(d) != set(self._state):
            raise ValueError(f"{self.name}: state keys {sorted(d)} do not match {sorted(self._state)}")
        for k in self._state:
            cur = getattr(self, k)
            if hasattr(cur, "load_state_dict"):
                cur.load_state_dict(d[k])
            else:
                setattr(self, k, d[k])

    def finding(self, step: int, message: str, *, severity: str, kind: str | None = None,
                signal: str | None = None, value=None, baseline=None, threshold=None,
                onset_step: int | None = None, **details) -> Finding:
        return Finding(step=step, kind=kind or self.kind, severity=severity, message=message,
                       signal=signal or (self.signals[0] if self.signals else None),
                       value=_f(value), baseline=_f(baseline), threshold=_f(threshold),
                       onset_step=onset_step, details=details)


def _f(v):
    return None if v is None else float(v)


def count(n: int, noun: str = "step") -> str:
    """``n`` and its noun, singular for one: ``count(1)`` is "1 step", ``count(3, "epoch")`` "3 epochs"."""
    return f"{n:,} {noun}" if n == 1 else f"{n:,} {noun}s"


def fmt(x: float | None) -> str:
    """A number for a sentence: 3 significant digits, scientific when huge or tiny."""
    if x is None:
        return "n/a"
    if not math.isfinite(x):
        return str(x)
    ax = abs(x)
    if ax != 0 and (ax >= 1e5 or ax < 1e-3):
        return f"{x:.3g}"
    return f"{x:.4g}"
