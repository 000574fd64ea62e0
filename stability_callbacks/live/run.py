"""The run: :class:`LiveRun` (Monitor + run log + alert sinks + listeners, on every rank),
:class:`RunListener` (what it tells listeners) and :func:`reporter_scalars` (what integrations
send to the framework's own loggers). The package's docstring (:mod:`stability_callbacks.live`)
says how the torch side and ``replay --follow`` feed it.
"""
from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

from .. import keys
from ..config import Config
from ..control import Action, Control, DataSkips
from ..forensics import Forensics
from ..monitor import Monitor
from ..outcome import Outcome
from ..record import Finding, StepRecord
from ..runlog import RUNLOG_NAME, RunLog, knows_checkpoint, set_aside
from .crash_notes import CRASH_DIR, claim_first_crash, exception_text
from .guard import Guard

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

    ``run_dir`` holds the run log (opened at the first :meth:`start`: one per run, see
    :func:`~stability_callbacks.runlog.knows_checkpoint`), the TensorBoard sink's default
    ``log_dir`` and the ranks' crash notes; a folder that cannot be written is one loud warning,
    and detection and alerts go on. ``advice_forms``: the frameworks whose rollback form an
    alert carries (None: all of them; ``()``: none). ``sinks_off``: sink name -> why this run
    leaves that configured sink out (said once). ``amend``: what each finding of a step record
    says before anyone hears of it (``replay --follow`` of a log that prints no step numbers:
    that its steps are record numbers). ``sees_checkpoints``: the integration reports every
    checkpoint the run writes (:meth:`checkpoint_saved`, and the one a segment starts from), so
    rollback advice without a checkpoint before its onset says that none was saved.
    """

    def __init__(self, config: "Config | str | Mapping | None" = None, *, monitor: Monitor | None = None,
                 run_dir: str | Path | None = "out/stability", is_rank0: bool = True,
                 run_name: str | None = None, wandb_run=None, tb_writer=None,
                 report_path: str | None = None, advice_forms: tuple[str, ...] | None = None,
                 sinks_off: Mapping[str, str] | None = None,
                 listeners: Iterable[RunListener] = (), guard: Guard | None = None,
                 amend: Callable[[Finding], Finding] | None = None, sees_checkpoints: bool = False):
        self.monitor = monitor if monitor is not None else Monitor(config)
        #: The configuration, read once (the Monitor's).
        self.config: Config = self.monitor.config
        self.monitor.policy.checkpoints_seen = sees_checkpoints
        #: The Monitor's requests, the one :class:`Control` of the run (held, not looked up).
        self.control: Control = self.monitor.control
        self.is_rank0 = is_rank0
        self.run_dir = Path(run_dir) if run_dir is not None else None
        self.run_name = run_name or (self.run_dir.name if self.run_dir else "run")
        self.findings: list[Finding] = []
        #: The step records observed, and the first and last of their steps.
        self.steps_watched = 0
        self.first_step: int | None = None
        self.last_step: int | None = None
        self.listeners: list = list(listeners)
        self.guard = guard if guard is not None else Guard()
        self.amend = amend
        # The hang watchdog emits from its own thread: one writer at a time (uncontended: ~0.1 us).
        self._lock = threading.RLock()
        self.runlog: RunLog | None = None
        self._runlog_decided = False
        self._created_s = time.time()   # wall clock: crash notes of an earlier run are older
        # A Monitor that was fed before (a second ``fit`` with the same callback) continues its run log.
        self._monitor_ran = self.monitor.last_step is not None
        self._sink_args = dict(wandb_run=wandb_run, tb_writer=tb_writer, report_path=report_path,
                               advice_forms=advice_forms, off=dict(sinks_off or {}))
        self.dispatcher = self._build_dispatcher()   # config errors (bad URL, unset variable) surface here, early
        if is_rank0:
            from ..alerts.log import show_on_console
            show_on_console()
        #: Which data each step read, named at a finding (the ``forensics`` section).
        self.forensics: Forensics = self.config.forensics.build()

    def _build_dispatcher(self, *, is_rank0: bool | None = None, only_messages: bool = False):
        a = self._sink_args
        return self.config.actions.build(
            is_rank0=self.is_rank0 if is_rank0 is None else is_rank0, run_name=self.run_name,
            report_path=a["report_path"], wandb_run=a["wandb_run"], tb_writer=a["tb_writer"],
            tensorboard_dir=None if self.run_dir is None else str(self.run_dir / "tensorboard"),
            advice_forms=a["advice_forms"], off=a["off"], only_messages=only_messages, quiet=only_messages)

    @property
    def sinks_on(self) -> set[str]:
        """The sinks this run delivers to (configured, resolved, on this rank)."""
        return {sink.name for sink in self.dispatcher.sinks}

    @property
    def advice_forms(self) -> tuple[str, ...] | None:
        """The frameworks whose rollback form this run's alerts carry (None: all)."""
        return self._sink_args["advice_forms"]

    @property
    def runlog_path(self) -> Path | None:
        return self.runlog.path if self.runlog else None

    def place(self, run_dir: str | Path) -> None:
        """Put this run in ``run_dir`` after all (before its first :meth:`start`): an integration
        that learns where the user keeps the run only once it runs (DeepSpeed: the checkpoint
        folder a loop loads from)."""
        if self._runlog_decided:
            raise RuntimeError("place() after the run log was opened")
        default_name = self.run_dir is None or self.run_name == self.run_dir.name
        self.run_dir = Path(run_dir)
        if default_name:
            self.run_name = self.run_dir.name
        self.dispatcher.close(timeout_s=0)   # nothing was submitted yet
        self.dispatcher = self._build_dispatcher()

    # -- What an integration reads and requests: named here, so that no integration reaches
    # -- into the Monitor's policy (docs/design.md, "The live run").
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
        if warmup_steps and self.config.phase.warmup_steps is None:
            self.monitor.set_warmup_steps(warmup_steps)

    def declare_game(self, optimizers: int) -> None:
        """Several optimizers, each stepping its own player (a GAN): the loss is judged as a game's
        (:meth:`~stability_callbacks.Monitor.declare_game`), and the run's log says so once."""
        self.monitor.declare_game()
        log.info("stability: the run steps %d optimizers (a GAN's players, each on its own loss): the loss is "
                 "judged as players' losses pulling against each other, an objective of any sign (NaN, jumps "
                 "of orders of magnitude), not against a level it should keep or fall to", optimizers)

    def declare_outputs(self, n: int | None) -> None:
        """The model's output size (a live run reads it from its output layer): not_learning's
        chance level ln n, unless ``detectors.not_learning.num_outputs`` is configured."""
        if n:
            self.monitor.set_num_outputs(n)
            if self.runlog:   # (a segment opened it) replay declares it again from there
                with self._lock, self.guard("runlog"):
                    self.runlog.model(n)

    def name_tensors(self, names: list[str | None]) -> None:
        """The parameter tensors' names in the optimizer's order (None where unknown): findings
        about one tensor name it, not only its index."""
        with self._lock:
            self.monitor.tensor_names = list(names)

    def start(self, step: int, reason: str = "start", *, checkpoint: str | None = None) -> list[Finding]:
        """A segment begins: a fresh start, a resume, or a rollback to an older checkpoint
        (``checkpoint``: the one it loaded, when known: whether the run log in ``run_dir`` is
        this run's, :meth:`_open_runlog`)."""
        with self._lock:
            self._open_runlog(step, reason, checkpoint)
            found = self.guard.call("start", lambda: self.monitor.begin_segment(step, reason), [])
            if checkpoint is not None and reason != "start":   # known even without its stability state
                self.monitor.note_checkpoint(step, checkpoint)
            if self.runlog:
                with self.guard("runlog"):
                    self.runlog.segment(self.monitor.segment, step, reason)
                    if self.monitor.phase.warmup_steps:   # declared (scheduler) or configured
                        self.runlog.phase(self.monitor.phase.warmup_steps)
            self._notify("on_segment", self.monitor.segment, step, reason)
            self._emit(found)
        return found

    def _open_runlog(self, step: int, reason: str, checkpoint: str | None) -> None:
        """Rank 0's run log, once (docs/design.md, Run log): the run log already in ``run_dir``
        is continued by a rollback, by a Monitor that has run before (a second ``fit``), and by a
        resume from a checkpoint it knows; any other run moves it aside (``runlog.<n>.jsonl``)
        and starts its own. A folder that cannot be written: one warning, no run log, the rest
        goes on (docs/design.md, Invariants)."""
        if self._runlog_decided:
            return
        self._runlog_decided = True
        if not (self.is_rank0 and self.run_dir):
            return
        path = self.run_dir / RUNLOG_NAME
        try:
            if path.is_file() and path.stat().st_size and not (
                    reason == "rollback" or self._monitor_ran
                    or (reason == "resume" and knows_checkpoint(path, step, checkpoint))):
                aside = set_aside(path)
                log.info("stability: %s belongs to another run; moved to %s", path, aside.name)
            self.runlog = RunLog(path)
        except OSError as exc:
            self.guard.failed.add("runlog")
            self.guard.warn_once("runlog", "stability: cannot write the run log %s (%s); "
                                 "detection and alerts go on without it", path, exc)

    def observe(self, record: StepRecord) -> list[Finding]:
        """Feed one optimizer step. Returns its findings; requests are on ``control``. The metric
        sinks (W&B, TensorBoard, Trackio) get its scalars on their own ``metrics_every_n_steps``."""
        with self._lock:
            self._open_runlog(record.step, "start", None)
            record.segment = self.monitor.segment
            self.steps_watched += 1
            self.first_step = record.step if self.first_step is None else self.first_step
            self.last_step = record.step
            found = self.guard.call("monitor", lambda: self.monitor.update(record), [])
            if found:   # the samples behind them, before anyone hears of them
                with self.guard("forensics", "naming the samples of a finding"):
                    self.forensics.annotate(found, run_dir=self.run_dir, is_rank0=self.is_rank0)
            if found and self.amend is not None:
                amend = self.amend
                found = self.guard.call("amend", lambda: [amend(f) for f in found], found)
            if self.runlog:
                with self.guard("runlog"):
                    self.runlog.step(record)
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

    def crash(self, step: int, exc: BaseException, *, rank: int = 0, world_size: int = 1) -> Finding:
        """Training raised ``exc`` on ``rank`` after step ``step`` (the last one finished): one
        critical ``crash`` finding. Only the exception's type and the first line of its message
        (:func:`exception_text`) leave the process; the traceback stays in the job's own log.

        Several ranks (docs/design.md, The live run): the rank that fails first names itself and
        sends the alert (rank 0 may not live to: a launcher stops the other ranks once one
        exits, and rank 0 itself only sees "connection closed"); a rank that fails after it
        names that first rank and its exception and records, but sends no second alert. Ranks
        learn of each other through ``run_dir/crash/`` (no collective): every failing rank
        leaves ``rank<r>.json``, and the first claims ``first.json``."""
        text = exception_text(exc)
        name = type(exc).__name__
        mine = {"rank": rank, "time_s": time.time(), "step": step, "exception": name, "message": text}
        first, pages = mine, self.is_rank0   # without notes: rank 0 pages, as on one rank
        if world_size > 1 and self.run_dir is not None:
            with self.guard("crash-note", "leaving a crash note for the other ranks"):
                first = claim_first_crash(self.run_dir / CRASH_DIR, mine, since_s=self._created_s)
                pages = first is mine
        f = self._crash_finding(step, mine, first, world_size)
        if pages and not self.is_rank0:   # only rank 0 holds sinks: build the messaging ones now
            with self.guard("crash-alert", "sending the crash alert from this rank"):
                dispatcher = self._build_dispatcher(is_rank0=True, only_messages=True)
                dispatcher.submit(f)
                dispatcher.close()
            self.findings.append(f)
            self._notify("on_finding", f)
            return f
        if pages:
            self.emit([f])
        else:   # the first failing rank sends the alert (or rank 0): record it here, no second page
            log.error("stability: %s", f.message)
            with self._lock:
                self.findings.append(f)
                if self.runlog:
                    with self.guard("runlog"):
                        self.runlog.finding(f)
                self._notify("on_finding", f)
        return f

    def _crash_finding(self, step: int, mine: dict, first: dict, world_size: int) -> Finding:
        ckpt = next(iter(self.monitor.policy.checkpoints[::-1]), None)
        last = (f" The last checkpoint the monitor knows is step {ckpt[0]} ({ckpt[1]})."
                if ckpt else "")
        where = f" on rank {first['rank']}" if world_size > 1 else ""
        head = (f"Training crashed{where} in step {first['step'] + 1} with {first['exception']}: "
                f"{first['message']}.")
        if first is not mine:
            head += (f" Rank {mine['rank']} failed after it, with {mine['exception']}: "
                     f"{mine['message']}.")
        details = {"exception": first["exception"], "message": first["message"],
                   "in_step": first["step"] + 1, "rank": first["rank"],
                   "checkpoint_step": ckpt[0] if ckpt else None}
        if first is not mine:
            details["then"] = {k: mine[k] for k in ("rank", "exception", "message")}
        return Finding(step, "crash", "critical", signal="exception", details=details,
                       message=f"{head} The last finished step is {step}; monitoring has stopped.{last} "
                               f"Read the traceback in the job's log, fix the cause and restart "
                               f"from a good checkpoint.")

    def _emit(self, found: list[Finding]) -> None:
        self._open_runlog(0, "start", None)   # findings before any segment (a preflight audit)
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
            self._open_runlog(step, "start", None)
            self.monitor.note_checkpoint(step, path)
            if self.runlog:
                with self.guard("runlog"):
                    self.runlog.checkpoint(step, path)
            self._notify("on_checkpoint", step, path)

    def act(self, action: Action) -> None:
        """The integration did something (saved, refused a save, changed the save interval,
        stopped): one ``action`` line in the run log, and the listeners hear of it."""
        with self._lock:
            self._open_runlog(action.step, "start", None)
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

    def outcome(self, *, halted_at: int | None = None) -> Outcome:
        """How the run ended, from what it saw (:class:`~stability_callbacks.outcome.Outcome`);
        ``halted_at``: the step at which the integration carried out a halt."""
        from ..alerts.sink import first_sentence
        c = self.control
        crash = next((f for f in reversed(self.findings) if f.kind == "crash"), None)
        reason = first_sentence(crash.message) if crash else c.stop_reason if c.stop else None
        return Outcome(halted=bool(c.stop), reason=reason, findings=list(self.findings), run_dir=self.run_dir,
                       steps_watched=self.steps_watched, first_step=self.first_step, last_step=self.last_step,
                       halted_at=halted_at, crashed=crash is not None, advice=self._advice(),
                       runlog_path=self.runlog_path)

    def _advice(self) -> str | None:
        """The rollback advice in this run's framework's form; its sentence where the run has no
        form of its own (or several)."""
        advice = self.control.rollback
        if advice is None:
            return None
        from ..advice import native_forms
        forms = self.advice_forms
        try:
            native = native_forms(advice.details, forms) if forms and not advice.details.get(
                "step_is_record_number") else {}
        except (KeyError, TypeError, ValueError):
            native = {}
        return next(iter(native.values())) if len(native) == 1 else advice.message
