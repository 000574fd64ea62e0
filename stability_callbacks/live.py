"""The framework-neutral glue every integration shares: Monitor + run log + alert sinks.

An integration turns framework hooks into :class:`StepRecord` s (through the torch probe),
calls :meth:`LiveRun.observe` once per optimizer step, and carries out ``run.control``.
Everything here runs on every rank (so every rank decides the same); only rank 0 writes the
run log and sends alerts. Nothing here raises into the training loop: a failure is logged
once and that part goes quiet (DESIGN invariant 4).
"""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Mapping

from . import keys
from .control import Control
from .monitor import Monitor
from .record import Finding, StepRecord
from .runlog import RUNLOG_NAME, RunLog

log = logging.getLogger("stability_callbacks")

STATE_FILE = "stability_state.json"


def reporter_scalars(record: StepRecord, findings: list[Finding]) -> dict[str, float]:
    """What integrations send to the framework's own loggers (TensorBoard, W&B, ...), in the
    one key scheme of :mod:`~stability_callbacks.keys`: ``stability/<key>`` per signal and
    ``stability/finding/<kind>`` = severity (1 info, 2 warning, 3 critical) per finding.

    >>> reporter_scalars(StepRecord(3, {"loss": 2.5}), [Finding(3, "loss_spike", "warning", "...")])
    {'stability/loss': 2.5, 'stability/finding/loss_spike': 2.0}
    """
    out = keys.charted(record.metrics)
    for f in findings:
        out[keys.finding_tag(f.kind)] = keys.SEVERITY_CODE[f.severity]
    return out


class InstancePatches:
    """Methods replaced on one object's instance ``__dict__``, put back by :meth:`restore`.

    Instance attributes shadow the class's methods (``nn.Module.__setattr__`` stores plain
    functions there too, where ``Module.__call__`` finds ``forward``). An earlier instance-level
    wrap is kept and restored; otherwise the instance entry is removed and the class's shows.
    """

    def __init__(self, obj: Any):
        self.obj = obj
        self._originals: dict[str, Any] = {}

    def set(self, name: str, fn: Any) -> None:
        self._originals[name] = self.obj.__dict__.get(name)
        setattr(self.obj, name, fn)

    def restore(self) -> None:
        for name, prev in self._originals.items():
            if prev is None:
                self.obj.__dict__.pop(name, None)
            else:
                setattr(self.obj, name, prev)
        self._originals.clear()


class LogOnce:
    """Each problem is logged once, then monitoring carries on without the failing part (DESIGN
    invariant 4). A mixin for integrations (which set ``self._warned = set()`` in their own
    ``__init__``), or an instance of its own for module-level code."""

    def __init__(self):
        self._warned: set = set()

    def _warn(self, key: str, msg: str, *args) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.warning(msg, *args)

    def _degrade(self, key: str, what: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.exception("stability: %s; monitoring continues without it", what)


class LiveRun:
    """One monitored training run.

    >>> import tempfile
    >>> run = LiveRun(config={"actions": {}}, run_dir=tempfile.mkdtemp())
    >>> run.start(0)
    []
    >>> [f.kind for s in range(1, 32) for f in run.observe(StepRecord(s, {"loss": 9.0 if s == 31 else 2 + s % 3 / 100}))]
    ['loss_spike']
    >>> run.control.save_now
    True
    >>> run.close()
    """

    def __init__(self, config: str | Mapping | None = None, *, monitor: Monitor | None = None,
                 run_dir: str | Path | None = "out/stability", is_rank0: bool = True,
                 run_name: str | None = None, wandb_run=None, tb_writer=None,
                 report_path: str | None = None, metrics_every_n_steps: int = 0):
        self.monitor = monitor if monitor is not None else Monitor(config)
        self.is_rank0 = is_rank0
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.run_name = run_name or (self.run_dir.name if self.run_dir else "run")
        self.metrics_every_n_steps = metrics_every_n_steps
        self.findings: list[Finding] = []
        self._failed: set[str] = set()
        self.runlog = RunLog(self.run_dir / RUNLOG_NAME) if (is_rank0 and self.run_dir) else None
        from .actions import build_sinks   # config errors (bad URL, unset variable) surface here, early
        actions = dict(self.monitor.config["actions"])
        if "tensorboard" in actions and tb_writer is None and self.run_dir is not None:
            actions["tensorboard"] = {"log_dir": str(self.run_dir / "tensorboard"), **actions["tensorboard"]}
        self.dispatcher = build_sinks(actions, is_rank0=is_rank0,
                                      run_name=self.run_name, report_path=report_path,
                                      wandb_run=wandb_run, tb_writer=tb_writer)

    @property
    def control(self) -> Control:
        return self.monitor.control

    @property
    def runlog_path(self) -> Path | None:
        return self.runlog.path if self.runlog else None

    def start(self, step: int, reason: str = "start") -> list[Finding]:
        """A segment begins: a fresh start, a resume, or a rollback to an older checkpoint."""
        found = self._guard("start", lambda: self.monitor.begin_segment(step, reason), [])
        if self.runlog:
            self._guard("runlog", lambda: self.runlog.segment(self.monitor.segment, step, reason))
        self._emit(found)
        return found

    def observe(self, record: StepRecord) -> list[Finding]:
        """Feed one optimizer step. Returns its findings; requests are on ``control``."""
        record.segment = self.monitor.segment
        found = self._guard("monitor", lambda: self.monitor.update(record), [])
        if self.runlog:
            self._guard("runlog", lambda: self.runlog.step(record))
        if self.metrics_every_n_steps and record.step % self.metrics_every_n_steps == 0:
            self._guard("metrics", lambda: self.dispatcher.log_metrics(record.step, record.metrics))
        self._emit(found)
        return found

    def emit(self, found: list[Finding]) -> None:
        """Findings that come from no step record (the preflight audit): run log + alerts."""
        self._emit(list(found))

    def _emit(self, found: list[Finding]) -> None:
        self.findings.extend(found)
        for f in found:
            if self.runlog:
                self._guard("runlog", lambda f=f: self.runlog.finding(f))
            self._guard("alerts", lambda f=f: self.dispatcher.submit(f))
        self.control.alerts = []   # delivered here; the integration carries out the rest

    def checkpoint_saved(self, step: int, path: str | None = None) -> None:
        self.monitor.note_checkpoint(step, path)
        if self.runlog:
            self._guard("runlog", lambda: self.runlog.checkpoint(step, None if path is None else str(path)))

    def state_dict(self) -> dict[str, Any]:
        return {"monitor": self.monitor.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.monitor.load_state_dict(state["monitor"])

    def close(self, timeout_s: float = 5.0) -> None:
        self._guard("alerts", lambda: self.dispatcher.close(timeout_s=timeout_s))
        if self.runlog:
            self._guard("runlog", self.runlog.close)

    def _guard(self, part: str, fn, default=None):
        try:
            return fn()
        except Exception:   # monitoring never takes training down
            if part not in self._failed:
                self._failed.add(part)
                log.exception("stability_callbacks: %s failed; continuing without it", part)
            return default
