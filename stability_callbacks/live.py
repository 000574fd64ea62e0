"""The framework-neutral, torch-free glue of a monitored run: Monitor + run log + alert sinks +
listeners, and the one guard that keeps monitoring from taking training down.

The torch side (:class:`~stability_callbacks.integrations.torch.session.LiveSession`) turns
framework hooks into :class:`StepRecord` s, calls :meth:`LiveRun.observe` once per optimizer
step, carries out ``run.control`` and reports what it did with :meth:`LiveRun.act`. Offline
``replay --follow`` feeds the same class from a growing log. Everything here runs on every rank
(so every rank decides the same); only rank 0 writes the run log and sends alerts. Nothing here
raises into the training loop: a failure is logged once and that part goes quiet (docs/design.md,
Invariants).
"""
from __future__ import annotations

import logging
import os
import re
import threading
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

from . import keys
from .control import Action, Control, DataSkips
from .monitor import Monitor
from .record import Finding, StepRecord
from .runlog import RUNLOG_NAME, RunLog

log = logging.getLogger("stability_callbacks")


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


class Guard:
    """The single home of "monitoring never takes training down" (docs/design.md, Invariants).

    Every monitoring call that could fail runs as ``with guard(part, what):``. A failure is
    logged once per part, with its traceback, and swallowed: that part goes quiet and the rest
    carries on. ``fatal=True`` marks a failure that leaves nothing to monitor (a failed start):
    ``guard.off`` turns True and the integration stops calling in. Exceptions of the types in
    ``passthrough`` are the user's to see (a bad config before step one) and propagate.
    ``warn_once`` is the same promise for problems that are not exceptions.

    >>> guard = Guard()
    >>> for _ in range(3):
    ...     with guard("ratio", "computing a ratio"):
    ...         1 / 0
    >>> sorted(guard.failed), guard.off
    (['ratio'], False)
    """

    def __init__(self):
        self.failed: set[str] = set()
        self.off = False
        self._warned: set[str] = set()

    @contextmanager
    def __call__(self, part: str, what: str | None = None, *, fatal: bool = False,
                 passthrough: tuple[type[BaseException], ...] = ()) -> Iterator[None]:
        try:
            yield
        except passthrough:
            raise
        except Exception:   # monitoring never takes training down
            self.off = self.off or fatal
            if part not in self.failed:
                self.failed.add(part)
                log.exception("stability: %s failed; %s", what or part,
                              "monitoring is off for this run" if fatal
                              else "monitoring continues without it")

    def call(self, part: str, fn: Callable[[], Any], default: Any = None) -> Any:
        """``fn()``, or ``default`` when it raised (logged once per part)."""
        with self(part):
            return fn()
        return default

    def warn_once(self, key: str, msg: str, *args, level: int = logging.WARNING) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.log(level, msg, *args)


class RunListener:
    """What a :class:`LiveRun` tells its listeners, on every rank, as it happens: segments,
    step records, findings (those of a record come right after it), checkpoints and the actions
    the integration carried out. Override what you need (any object with some of these methods
    will do); a listener that raises is logged once per event and the run goes on.
    """

    def on_segment(self, segment: int, start_step: int, reason: str) -> None:
        """A segment began: ``start``, ``resume`` or ``rollback`` (from ``start_step``)."""

    def on_record(self, record: StepRecord) -> None:
        """One optimizer step's reduced values, before its findings."""

    def on_finding(self, finding: Finding) -> None:
        """Every finding: of a record, of a segment start (``resume``), of the preflight audit,
        a ``crash``; a ``hang`` / ``hang_resolved`` comes from the watchdog's thread."""

    def on_checkpoint(self, step: int, path: str | None) -> None:
        """A checkpoint was written (by the integration or by the framework itself)."""

    def on_action(self, action: Action) -> None:
        """The integration carried out a request (or refused a save): see :class:`Action`."""


class LiveRun:
    """One monitored training run.

    >>> import tempfile
    >>> run = LiveRun(config={"actions": {}}, run_dir=tempfile.mkdtemp())
    >>> run.start(0)
    []
    >>> loss = lambda s: 9.0 if s == 31 else 2 + s % 3 / 100
    >>> [f.kind for s in range(1, 32) for f in run.observe(StepRecord(s, {"loss": loss(s)}))]
    ['loss_spike']
    >>> run.control.save_now, run.control.save_reason
    (True, 'save now: loss_spike (warning) at step 31')
    >>> run.close()
    """

    def __init__(self, config: str | Mapping | None = None, *, monitor: Monitor | None = None,
                 run_dir: str | Path | None = "out/stability", is_rank0: bool = True,
                 run_name: str | None = None, wandb_run=None, tb_writer=None,
                 report_path: str | None = None, metrics_every_n_steps: int = 0,
                 listeners: Iterable[RunListener] = (), guard: Guard | None = None):
        self.monitor = monitor if monitor is not None else Monitor(config)
        self.is_rank0 = is_rank0
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.run_name = run_name or (self.run_dir.name if self.run_dir else "run")
        self.metrics_every_n_steps = metrics_every_n_steps
        self.findings: list[Finding] = []
        self.listeners: list = list(listeners)
        self.guard = guard if guard is not None else Guard()
        # The hang watchdog emits from its own thread: one writer at a time (uncontended: ~0.1 us).
        self._lock = threading.RLock()
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

    # -- What an integration reads and requests: named here, so that no integration reaches
    # -- into the Monitor's policy (docs/design.md, "The live run").
    @property
    def config(self) -> dict[str, Any]:
        """The validated configuration (every section present)."""
        return self.monitor.config

    @property
    def skips_steps(self) -> bool:
        """Whether ``policy.skip_step_on`` may drop updates (the integration gates the step)."""
        return self.monitor.policy.skip_step_on != "never"

    @property
    def auto_rollback(self) -> Any:
        """``policy.auto_rollback``'s settings, or None when automatic rollbacks are off."""
        return self.monitor.policy.auto_rollback

    @property
    def data_skips(self) -> DataSkips:
        """The data the run no longer reads and the LR scaling in force (the automatic
        rollbacks' standing requests, saved with every checkpoint)."""
        return self.monitor.policy.data_skips

    def request_data_skips(self, skips: DataSkips) -> None:
        """Install the standing requests of a rollback once its checkpoint is loaded (they
        replace that checkpoint's older ones)."""
        self.monitor.policy.data_skips = skips

    def declare_warmup(self, warmup_steps: int | None) -> None:
        """The framework's LR warmup (its scheduler or arguments), unless ``phase.warmup_steps``
        is configured, which wins."""
        if warmup_steps and self.monitor.config["phase"].get("warmup_steps") is None:
            self.monitor.set_warmup_steps(warmup_steps)

    def start(self, step: int, reason: str = "start") -> list[Finding]:
        """A segment begins: a fresh start, a resume, or a rollback to an older checkpoint."""
        with self._lock:
            found = self.guard.call("start", lambda: self.monitor.begin_segment(step, reason), [])
            if self.runlog:
                with self.guard("runlog"):
                    self.runlog.segment(self.monitor.segment, step, reason)
                    if self.monitor.phase.warmup_steps:   # declared (scheduler) or configured
                        self.runlog.phase(self.monitor.phase.warmup_steps)
            self._notify("on_segment", self.monitor.segment, step, reason)
            self._emit(found)
        return found

    def observe(self, record: StepRecord) -> list[Finding]:
        """Feed one optimizer step. Returns its findings; requests are on ``control``."""
        with self._lock:
            record.segment = self.monitor.segment
            found = self.guard.call("monitor", lambda: self.monitor.update(record), [])
            if self.runlog:
                with self.guard("runlog"):
                    self.runlog.step(record)
            if self.metrics_every_n_steps and record.step % self.metrics_every_n_steps == 0:
                with self.guard("metrics"):
                    self.dispatcher.log_metrics(record.step, record.metrics)
            self._notify("on_record", record)
            self._emit(found)
        return found

    def emit(self, found: list[Finding], *, wait_s: float = -1) -> None:
        """Findings that come from no step record (the preflight audit, a crash, the hang
        watchdog's thread): run log + alerts + listeners. ``wait_s``: how long another thread
        waits for the training thread to leave the run; past it, the findings go to the
        Python log only (the training thread is stuck inside the run: its run log or a
        listener)."""
        if not self._lock.acquire(timeout=wait_s):
            for f in found:
                log.critical("stability: %s (%s at step %d)", f.message, f.kind, f.step)
            return
        try:
            self._emit(list(found))
        finally:
            self._lock.release()

    def crash(self, step: int, exc: BaseException) -> Finding:
        """Training raised ``exc`` after step ``step`` (the last one finished): one critical
        ``crash`` finding, emitted like any other. Only the exception's type and the first line
        of its message (:func:`exception_text`) leave the process; the traceback stays in the
        job's own log."""
        text = exception_text(exc)
        name = type(exc).__name__
        ckpt = next(iter(self.monitor.policy.checkpoints[::-1]), None)
        last = (f" The last checkpoint the monitor knows is step {ckpt[0]} ({ckpt[1]})."
                if ckpt else "")
        f = Finding(step, "crash", "critical", signal="exception",
                    message=f"Training crashed in step {step + 1} with {name}: {text}. The last "
                            f"finished step is {step}; monitoring has stopped.{last} Read the "
                            f"traceback in the job's log, fix the cause and restart from a good "
                            f"checkpoint.",
                    details={"exception": name, "message": text, "in_step": step + 1,
                             "checkpoint_step": ckpt[0] if ckpt else None})
        self.emit([f])
        return f

    def _emit(self, found: list[Finding]) -> None:
        self.findings.extend(found)
        for f in found:
            if self.runlog:
                with self.guard("runlog"):
                    self.runlog.finding(f)
            with self.guard("alerts"):
                self.dispatcher.submit(f)
            self._notify("on_finding", f)

    def checkpoint_saved(self, step: int, path: str | None = None) -> None:
        path = None if path is None else str(path)
        with self._lock:
            self.monitor.note_checkpoint(step, path)
            if self.runlog:
                with self.guard("runlog"):
                    self.runlog.checkpoint(step, path)
            self._notify("on_checkpoint", step, path)

    def act(self, action: Action) -> None:
        """The integration did something (saved, refused a save, changed the save interval,
        stopped): one ``action`` line in the run log, and the listeners hear of it."""
        with self._lock:
            if self.runlog:
                with self.guard("runlog"):
                    self.runlog.action(action)
            self._notify("on_action", action)

    def _notify(self, event: str, *args) -> None:
        for listener in self.listeners:
            fn = getattr(listener, event, None)
            if fn is not None:
                with self.guard(f"listener {type(listener).__name__}.{event}"):
                    fn(*args)

    def state_dict(self) -> dict[str, Any]:
        return {"monitor": self.monitor.state_dict()}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.monitor.load_state_dict(state["monitor"])

    def close(self, timeout_s: float = 5.0) -> None:
        """Deliver the pending alerts (until ``timeout_s`` from now) and close the run log."""
        with self.guard("alerts"):
            self.dispatcher.close(timeout_s=timeout_s)
        if self.runlog:
            with self._lock, self.guard("runlog"):
                self.runlog.close()


#: Environment variables whose values never leave the process in an alert.
_SECRET_NAME = re.compile(r"TOKEN|SECRET|PASSW|KEY|WEBHOOK|AUTH|CREDENTIAL|COOKIE", re.I)
_URL = re.compile(r"\b([a-zA-Z][a-zA-Z0-9+.-]*://)(?:[^/\s@]*@)?([^/\s?#]*)(\S*)")


def exception_text(exc: BaseException, limit: int = 200) -> str:
    r"""The part of an exception's message an alert may carry: its first line, at most
    ``limit`` characters, each URL cut to scheme and host (paths, queries and credentials hold
    tokens), and the value of every environment variable named like a secret replaced by ***.

    >>> exception_text(RuntimeError("POST https://bob:pw@hooks.example/T0/B1?token=x failed\nmore"))
    'POST https://hooks.example/... failed'
    """
    lines = str(exc).strip().splitlines()
    text = lines[0] if lines else ""
    for name, value in os.environ.items():
        if len(value) >= 6 and _SECRET_NAME.search(name) and value in text:
            text = text.replace(value, "***")
    text = _URL.sub(lambda m: m.group(1) + m.group(2) + ("/..." if m.group(3) else ""), text)
    return text if len(text) <= limit else text[:limit - 3] + "..."
