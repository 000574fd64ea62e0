"""Core values: one optimizer step's metrics, and one finding (docs/design.md, Metric keys and Findings)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Mapping

SEVERITIES = ("info", "warning", "critical")
_RANK = {name: i for i, name in enumerate(SEVERITIES)}

KINDS = (
    "nonfinite", "loss_spike", "spike_recovered", "spike_unrecovered", "divergence",
    "level_shift", "sudden_drop", "stall", "grad_norm_spike", "grad_norm_growth",
    "param_norm_growth", "second_moment_surge", "overflow_burst", "loss_scale_collapse",
    "lr_anomaly", "warmup_end", "warmup_instability", "resume", "resume_spike",
    "data_repetition", "preflight", "rollback_advice", "crash", "hang", "hang_resolved",
    "step_skipped", "auto_rollback", "precursor", "not_learning", "saves_resumed",
)


def severity_rank(severity: str) -> int:
    """``info`` < ``warning`` < ``critical`` as 0 < 1 < 2."""
    return _RANK[severity]


@dataclass(slots=True)
class StepRecord:
    """One optimizer step: ``step`` plus metric keys (``stability_callbacks.keys``) → floats.

    >>> StepRecord(7, {"loss": 2.5}).get("grad_norm") is None
    True
    """

    step: int
    metrics: dict[str, float] = field(default_factory=dict)
    segment: int = 0
    #: The LR warmup declared for the run (a replayed run log's ``segment`` line carries it): the
    #: Monitor takes it as if the integration had declared it. Not a metric; not written back.
    warmup_steps: int | None = None
    #: The model's output size a replayed run log declares (its ``model`` line), likewise.
    num_outputs: int | None = None
    #: The epoch this step belongs to, where the run counts epochs (a replayed log's epoch x batch
    #: count, a live trainer's epoch): the loss's shape through an epoch is compared with the epoch
    #: before's (:mod:`stability_callbacks.cycles`). Not a metric.
    epoch: int | None = None
    #: Checkpoints saved since the record before, as a replayed log names them: ``((step, path),
    #: ...)``; the Monitor notes each before this record (:meth:`Monitor.note_checkpoint`), so the
    #: rollback advice can name the one to resume from. Not a metric; not written back (a run log
    #: has ``checkpoint`` lines of its own).
    checkpoints: tuple | None = None

    def get(self, key: str) -> float | None:
        return self.metrics.get(key)

    def to_json(self) -> dict[str, Any]:
        """The run-log line (docs/design.md, Run log); non-finite floats become strings JSON can carry."""
        out = {"type": "step", "step": self.step, "segment": self.segment,
               "metrics": {k: _json_float(v) for k, v in self.metrics.items()}}
        if self.epoch is not None:
            out["epoch"] = self.epoch
        return out

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> "StepRecord":
        epoch = obj.get("epoch")
        return cls(int(obj["step"]), {k: float(v) for k, v in obj.get("metrics", {}).items()},
                   int(obj.get("segment", 0)), epoch=int(epoch) if epoch is not None else None)


@dataclass(slots=True)
class Finding:
    """What a detector saw (docs/design.md, Findings). ``message`` is the 3 a.m. sentence."""

    step: int
    kind: str
    severity: str
    message: str
    signal: str | None = None
    value: float | None = None
    baseline: float | None = None
    threshold: float | None = None
    phase: str | None = None
    in_warmup_risk_window: bool = False
    onset_step: int | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"step": self.step, "kind": self.kind, "severity": self.severity,
                "signal": self.signal, "value": _json_float(self.value),
                "baseline": _json_float(self.baseline), "threshold": _json_float(self.threshold),
                "phase": self.phase, "in_warmup_risk_window": self.in_warmup_risk_window,
                "onset_step": self.onset_step, "message": self.message, "details": self.details}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> "Finding":
        def f(key):
            v = obj.get(key)
            return None if v is None else float(v)
        return cls(step=int(obj["step"]), kind=obj["kind"], severity=obj["severity"],
                   message=obj.get("message", ""), signal=obj.get("signal"), value=f("value"),
                   baseline=f("baseline"), threshold=f("threshold"), phase=obj.get("phase"),
                   in_warmup_risk_window=bool(obj.get("in_warmup_risk_window", False)),
                   onset_step=obj.get("onset_step"), details=dict(obj.get("details") or {}))

    def at_least(self, severity: str) -> bool:
        return _RANK[self.severity] >= _RANK[severity]


def _json_float(v):
    # JSON has no NaN/Inf; json.dumps would write invalid tokens. Keep them as strings that
    # float() reads back ("nan", "inf", "-inf").
    if v is None or isinstance(v, bool) or not isinstance(v, float) or math.isfinite(v):
        return v
    return repr(v)
