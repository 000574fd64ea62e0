"""What every detector shares: the per-update context, the state contract, the finding factory."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar, Sequence

# re-exported: the detectors import the parameter checks from here
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
    found: list[Finding] = field(default_factory=list)   # this step's findings so far (earlier detectors')


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

    def update_run(self, run: Sequence[StepRecord], ctxs: Sequence[Context]) -> None:
        """Replay's way (:meth:`Monitor.update_many`): :meth:`update` of each record of a run in
        turn, with its step's context, each record's findings added to its context's
        (``ctx.found``, which the detectors after this one read). A detector whose update costs
        little beside its call (~60 ns) writes its common case here inline, or its whole rule as
        this loop and takes its :meth:`update` from :meth:`_update_alone`; each says why that is
        update's own computation."""
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
        self.update_run((record,), (ctx,))
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
