"""The torch side of one monitored run, shared by the HF, Lightning and DeepSpeed integrations.

An integration keeps only what is framework-specific (which hook fires when, where the framework
keeps a value, how it saves and stops) and hands the rest to one :class:`LiveSession`:

====================  ========================================================================
micro-batches         :meth:`~LiveSession.add_micro_batch` (the loss, summed on the device; a
                      fingerprint of the token ids; the batch itself, by reference, with
                      ``forensics.dump_batches``) and :meth:`~LiveSession.read_model_output`
                      (per-dataset losses: ``stream_losses`` -> ``loss/<name>``)
before the step       :meth:`~LiveSession.before_optimizer_step`: the point right before the
                      optimizer applies the update, with the pre-clip grad norm
step close            :meth:`~LiveSession.end_step`: the sampling cadence, the micro-batch
                      values into the probe, its one packed collective, the records it hands
                      out fed to the :class:`~stability_callbacks.live.LiveRun`, and a
                      monotonic timestamp per finished step
requests              :meth:`~LiveSession.requests`: why to save now (or None) and whether to
                      stop; a changed save interval, a halt and a refused save are reported as
                      actions (run log + listeners), as is every :meth:`~LiveSession.record_save`
checkpoints           :meth:`~LiveSession.checkpoint` (flush, a sync point; note it; the blob
                      saved with it) and :meth:`~LiveSession.restore` (from the checkpoint
                      actually loaded)
guard                 ``session.guard`` (the run's :class:`~stability_callbacks.live.Guard`):
                      every call above is guarded; a failed start turns the session off
crash, hang           :meth:`~LiveSession.crashed` (the adapter's exception path: one critical
                      ``crash`` alert, then it re-raises); the hang watchdog
                      (:class:`~stability_callbacks.watchdog.HangWatchdog`, rank 0) reads the
                      step timestamps and :meth:`~LiveSession.alive` (evaluation batches)
====================  ========================================================================

Every rank runs the same session on the same reduced records, so every rank reaches the same
requests at the same step (saves are collective under DeepSpeed and FSDP). Ordinary steps cost
a few device ops on scalars and the probe's one packed collective; the syncs are the flushes,
each tagged ``# host-sync:``.

Skip step (``policy.skip_step_on``, :mod:`.skip_step`): ``session.skip``
decides in ``before_optimizer_step``, reports in ``end_step`` and takes the policy's next rule
after it; :meth:`~.adapter.SessionAdapter._gate_step` gates the optimizer's ``step``. An
automatic rollback (:mod:`.auto_rollback`) restores through ``restore`` and opens its segment with
``start(step, "rollback")`` (:meth:`~.adapter.SessionAdapter._begin`). An engine that steps the
optimizer itself (DeepSpeed) is read through :meth:`LiveSession.read_engine`.
"""
from __future__ import annotations

import json
import logging
import os
import time
from collections import deque
from typing import Any, Mapping, Protocol

import torch

from stability_callbacks import keys
from stability_callbacks.control import Action, Control
from stability_callbacks.live import LiveRun
from stability_callbacks.outcome import Outcome
from stability_callbacks.record import Finding, StepRecord
from stability_callbacks.watchdog import HangWatchdog

from .forensics import TorchPeer, held, rows_of
from .optim_state import tensor_names
from .preflight import run_preflight
from .probe import StepProbe
from .readings import step_lr
from .reductions import batch_fingerprint
from .skip_step import SkipStep

__all__ = ["LiveSession", "EngineStep", "STATE_FILE"]

log = logging.getLogger("stability_callbacks")

#: The detector state's file inside a checkpoint folder (HF: every ``checkpoint-N``).
STATE_FILE = "stability_state.json"

#: How many step-end timestamps a session keeps (the hang watchdog's view of the step time).
STEP_TIMES_KEPT = 128


class LiveSession:
    """One monitored run on the torch side: a :class:`~.probe.StepProbe` configured from
    ``sampling``, the micro-batch accumulators, and the acting bookkeeping, over a ``LiveRun``.

    ``process_group``: the data-parallel group the probe reduces over (None: the default group).
    ``lockstep``: drain the probe's records with a flush at every step (several ranks on an
    accelerator, where copies may land at different times), so every rank sees them alike.

    >>> import tempfile, torch
    >>> s = LiveSession(LiveRun(config={"actions": {}}, run_dir=tempfile.mkdtemp()))
    >>> s.start(0, "start")
    >>> for step in range(1, 4):
    ...     s.add_micro_batch(loss=torch.tensor(2.0 + step / 8), input_ids=torch.arange(8).view(2, 4))
    ...     pairs = s.end_step(step)
    >>> [(r.step, r.metrics["loss"]) for r, _ in pairs], len(s.finished_at_s)
    ([(3, 2.375)], 3)
    >>> s.requests(3)
    (None, False)
    >>> s.close()
    """

    def __init__(self, run: LiveRun, *, process_group=None, lockstep: bool = False):
        self.run = run
        self.guard = run.guard
        #: The run's one :class:`Control` (the Monitor's requests), held.
        self.control: Control = run.control
        sampling = run.config.sampling   # validated, every value present: nothing re-defaulted here
        self.every_n_steps = sampling.every_n_steps
        #: The skip-step decisions (``policy.skip_step_on``), or None when off.
        self.skip = SkipStep() if run.skips_steps else None
        # Every rank declares the same extras, so the packed layout (and the collective) matches.
        self.probe = StepProbe(
            process_group=process_group,
            adam_every_n_steps=sampling.adam_every_n_steps,
            param_norm_every_n_steps=sampling.param_norm_every_n_steps,
            extra_reductions={keys.BATCH_FINGERPRINT: "sum",
                              **({keys.SKIPPED_BY_POLICY: "max"} if self.skip else {}),
                              **{keys.LOSS_STREAM_PREFIX + n: "mean"
                                 for n in sampling.loss_streams}})
        self.lockstep = lockstep
        self.process_group = process_group
        self.started = self.closed = False
        #: The last optimizer step finished (or the step a segment started from).
        self.last_step = 0
        #: Monotonic time (s) at which each of the last steps finished, newest last.
        self.finished_at_s: deque[float] = deque(maxlen=STEP_TIMES_KEPT)
        #: Monotonic time (s) of the last other sign of progress (an evaluation batch).
        self.alive_at_s: float | None = None
        self._watchdog: HangWatchdog | None = None
        #: The model, until the probe's per-tensor statistics are named after its parameters.
        self._to_name = None
        #: Keep the framework-logger scalars of every record observed (:meth:`take_report`).
        self.report = False
        #: A finding came since the scalars were last taken (report them now, not at the next
        #: logging step: its step is the news).
        self.finding_pending = False
        self._signals: dict[str, float] = {}
        self._signals_step: int | None = None
        self._found: list[tuple[int, str, float]] = []
        #: The saves made on the monitor's request: ``(step, path)``, oldest first.
        self.saves: list[tuple[int, str | None]] = []
        #: The first step at which the integration carried out a halt.
        self.stopped_at: int | None = None
        #: The engine that steps the optimizer itself (DeepSpeed), read first at each step close.
        self.engine: EngineStep | None = None
        self._fp: torch.Tensor | None = None
        self._streams: dict[str, tuple[torch.Tensor, int]] = {}
        self._batches: list = []           # this step's micro-batches (forensics.dump_batches)
        self._rows = 0                     # and how many samples they held (forensics' check)
        self._interval: int | None = None   # the save interval last reported
        #: How the run ended (set by :meth:`close`; None while it runs).
        self.outcome: Outcome | None = None

    @property
    def off(self) -> bool:
        """True once monitoring is off for this run (a failed start); training goes on."""
        return self.guard.off

    @property
    def findings(self) -> list[Finding]:
        return list(self.run.findings)

    # ------------------------------------------------------------------------ run structure
    def read_engine(self, engine: "EngineStep | None") -> None:
        """The run steps an engine that owns its optimizer (DeepSpeed; None: it does not): each
        step close first reads what the engine knows of the step (:meth:`EngineStep.read_into`)
        and takes the Adam statistics from ``engine.engine`` (where the ZeRO partitions live)
        rather than from the optimizer the framework hands over."""
        self.engine = engine

    def declare_warmup(self, scheduler_steps: int | None) -> None:
        """The framework's LR warmup, unless ``phase.warmup_steps`` is configured: its scheduler
        peaks after ``scheduler_steps`` ``step()`` calls (None or 0: unknown or none). Declared
        as the step it ends at, the first at the peak LR (docs/design.md, Words that mean one
        thing: warmup end): every framework here steps its scheduler after the optimizer, so
        optimizer step s runs at the LR of s - 1 calls, and the peak's first step is
        ``scheduler_steps + 1`` (HF's ``warmup_steps=10``: step 11; step 10 still runs at 9/10)."""
        self.run.declare_warmup(scheduler_steps + 1 if scheduler_steps else None)

    def declare_game(self, optimizers: int) -> None:
        """The run steps ``optimizers`` optimizers, each on its own player's loss (a GAN's
        discriminator and generator): the loss it reports is theirs pulling against each other
        (:meth:`~stability_callbacks.Monitor.declare_game`)."""
        self.run.declare_game(optimizers)

    def start(self, step: int, reason: str, *, checkpoint: str | None = None, model=None,
              optimizer=None, scheduler=None, **facts) -> None:
        """A segment begins (``start``, ``resume``, ``rollback``; ``checkpoint``: the one loaded,
        when known); a fresh start also runs the preflight audit on
        ``model``/``optimizer``/``scheduler`` (``facts``: precision, ...)."""
        self.run.start(step, reason, checkpoint=checkpoint)
        self.last_step = int(step)
        with self.guard("forensics", "connecting the data forensics"):
            # A segment's steps read their own data: what was held belongs to the steps before.
            self.run.forensics.forget(int(step))
            self.run.forensics.connect(TorchPeer(model, self.process_group))
        if reason == "rollback":   # the per-tensor baselines saw the abandoned steps
            self.probe.layers.reset()
        if reason == "start":
            run_preflight(self.run, model, optimizer, scheduler, **facts)
        if model is not None and hasattr(model, "named_parameters"):
            self._to_name = model
            with self.guard("outputs", "reading the model's output size"):
                self.run.declare_outputs(output_size(model))
        self.started = True
        if self._watchdog is None and self.run.is_rank0:
            with self.guard("watchdog", "starting the hang watchdog"):
                self._watchdog = self.run.config.watchdog.build()
                self._watchdog.start(lambda: (self.last_step, self.finished_at_s, self.alive_at_s),
                                     lambda finding: self.run.emit([finding], wait_s=5.0))

    def alive(self) -> None:
        """A sign of progress between optimizer steps (an evaluation batch): not a hang."""
        self.alive_at_s = time.monotonic()

    def crashed(self, exc: BaseException) -> None:
        """Training raised ``exc``: one critical ``crash`` finding (the last finished step, the
        exception's type and message line), delivered before this returns (the sinks are
        flushed with their deadline), then the session closes without touching the device (it
        may be what failed). ``KeyboardInterrupt`` and ``SystemExit`` are someone stopping the
        run: closed, no alert. Never raises; the caller re-raises ``exc`` unchanged."""
        if self.closed:
            return
        if isinstance(exc, Exception) and not self.off:
            with self.guard("crash", "reporting the crash"):
                dist = torch.distributed
                several = dist.is_available() and dist.is_initialized()
                self.run.crash(self.last_step, exc, rank=dist.get_rank() if several else 0,
                               world_size=dist.get_world_size() if several else 1)
        self.close(flush=False)

    # ------------------------------------------------------------------------- micro-batches
    def add_micro_batch(self, *, loss=None, input_ids=None, divide_by: float = 1.0, batch=None) -> None:
        """One micro-batch: its loss (a tensor as the framework returns it, normally already
        divided by the accumulation steps; else pass ``divide_by``), its token ids (hashed
        into the step's ``batch_fingerprint``, the resume auditor's repeated-data check) and
        the batch as the model was called with it (a mapping of its keyword arguments, or an
        ``(inputs, labels)`` pair), held by reference for ``forensics.dump_batches``."""
        if batch is not None and self.run.forensics.wants_batches:
            self._batches.append(held(batch))
        with self.guard("micro-batch", "reading the micro-batch"):
            self._rows += rows_of(input_ids if input_ids is not None else batch)
            if isinstance(loss, torch.Tensor):
                self.probe.add_loss(loss, divide_by=divide_by)
            if isinstance(input_ids, torch.Tensor) and not input_ids.is_floating_point():
                fp = batch_fingerprint(input_ids)
                self._fp = fp if self._fp is None else self._fp + fp

    def read_model_output(self, output) -> None:
        """Per-dataset losses from a model output (a dict, ``ModelOutput`` or object) carrying
        ``stream_losses = {"name": scalar tensor}``: ``loss/<name>`` is their mean over the
        step's micro-batches, then over ranks (declare the names in ``sampling.loss_streams``
        for multi-rank runs)."""
        with self.guard("model-output", "reading the model output"):
            get = output.get if hasattr(output, "get") else (lambda k, d=None: getattr(output, k, d))
            for name, value in (get("stream_losses", None) or {}).items():
                if isinstance(value, torch.Tensor):
                    v = value.detach().float().mean()
                    total, n = self._streams.get(name, (None, 0))
                    self._streams[name] = (v if total is None else total + v, n + 1)

    def read_lr(self, optimizer) -> None:
        """The LR this step uses: the optimizer's first param group, read before the framework
        steps its scheduler."""
        with self.guard("lr", "reading the learning rate"):
            self.probe.set_lr(step_lr(optimizer))

    def before_optimizer_step(self, *, grad_norm=None, params=None, scaled_by=None):
        """The point right before the optimizer applies this step's update: the pre-clip,
        unscaled global grad norm, as the framework computed it (``grad_norm``: a device tensor
        or host float) or computed here from ``params`` with one foreach reduction.
        ``scaled_by``: the loss scale the grads are still multiplied by (a fused optimizer under
        a GradScaler unscales inside its step), divided out of the recorded norm. Returns the
        norm as given or computed (the tensor to clip with), or None. The skip-step decision
        (``policy.skip_step_on``) is taken here, on the unscaled norm."""
        with self.guard("grad-norm", "reading the grad norm"):
            norm = self.probe.compute_grad_norm(params) if params is not None else grad_norm
            unscaled = norm / scaled_by if scaled_by is not None and norm is not None else norm
            if scaled_by is not None or params is None:
                self.probe.set_grad_norm(unscaled)
            if self.skip is not None:
                self.skip.decide(unscaled)
            return norm
        return None

    # ---------------------------------------------------------------------------- step close
    def end_step(self, step: int, *, optimizer=None, epoch: int | None = None) -> list[tuple[StepRecord, list[Finding]]]:
        """Close optimizer step ``step`` (every rank, the same steps): the micro-batch values go
        into the probe; on the sampling cadence the probe finishes the step (Adam statistics
        from ``optimizer``, one packed collective), otherwise it forgets it. The records the
        probe hands out are fed to the run (``epoch``: the epoch the step belongs to, where the loop
        counts them: :attr:`StepRecord.epoch`). Returns them with their findings. With an engine
        (:meth:`read_engine`) its step is read first and the engine replaces ``optimizer``."""
        records: list[StepRecord] = []
        if self.engine is not None:
            with self.guard("engine", "reading the engine's step"):
                self.engine.read_into(self.probe)
            optimizer = self.engine.engine
        with self.guard("step", "closing the step's sample"):
            probe = self.probe
            # host-sync: lockstep (several ranks on an accelerator) waits for the previous steps'
            # copies, all issued a step ago, so every rank sees the same records at the same step.
            early = probe.flush() if self.lockstep else []
            if self._fp is not None:
                probe.set_extra(keys.BATCH_FINGERPRINT, self._fp, op="sum")
            for name, (total, n) in self._streams.items():
                probe.set_extra(keys.LOSS_STREAM_PREFIX + name, total / n, op="mean")
            if self.skip is not None:
                self.skip.report(probe)
            self._fp, self._streams = None, {}
            if step % self.every_n_steps:
                probe.discard_step()
                records = early
            else:
                probe.finish_step(step, optimizer=optimizer, epoch=epoch)
                records = early + ([] if self.lockstep else probe.poll())
        if self._to_name is not None and self.probe.num_tensors is not None and optimizer is not None:
            with self.guard("names", "naming the parameter tensors"):
                model, self._to_name = self._to_name, None
                names = tensor_names(optimizer, model)
                if len(names) == self.probe.num_tensors:   # else the numbering is not the probe's
                    self.run.name_tensors(names)
        self.run.forensics.step_closed(step, self._batches, rows=self._rows)
        self._batches, self._rows = [], 0
        self.last_step = step
        self.finished_at_s.append(time.monotonic())
        return self._observe(records)

    def flush(self) -> list[tuple[StepRecord, list[Finding]]]:
        """Every pending record now (before a checkpoint, at the end of training)."""
        with self.guard("flush", "flushing the last records"):
            return self._observe(self.probe.flush())   # host-sync: waits for the pending copies
        return []

    def forget_micro_batches(self) -> None:
        """Drop what the current step accumulated (after a checkpoint load)."""
        self._fp, self._streams, self._batches, self._rows = None, {}, [], 0
        self.probe.discard_step()

    def _observe(self, records: list[StepRecord]) -> list[tuple[StepRecord, list[Finding]]]:
        pairs = [(r, self.run.observe(r)) for r in records]
        if self.report:
            for record, found in pairs:
                self._signals.update(keys.charted(record.metrics))
                self._signals_step = record.step
                self._found += [(f.step, keys.finding_tag(f.kind), keys.SEVERITY_CODE[f.severity])
                                for f in found]
                self.finding_pending = self.finding_pending or bool(found)
        if self.skip is not None:
            self.skip.set_threshold(self.control.skip_threshold)   # the rule for the next steps
        return pairs

    def take_report(self) -> tuple[int | None, dict[str, float], list[tuple[int, str, float]]]:
        """The framework-logger scalars of the records observed since the last call (with
        ``report`` on): the newest record's step and its ``stability/<key>`` signals (newest value
        per key), and each finding as ``(its step, stability/finding/<kind>, severity code)``: a
        logger that writes each at its own step charts a finding once, at its step."""
        out = (self._signals_step, self._signals, self._found)
        self._signals, self._signals_step, self._found, self.finding_pending = {}, None, [], False
        return out

    # ------------------------------------------------------------------------------ requests
    def requests(self, step: int, *, interval_saves: bool = True,
                 user_interval: int | None = None) -> tuple[str | None, bool]:
        """What to do after ``step``: why to save now (None: no save) and whether to stop.

        Reports a changed save interval and the halt (once) as actions. A save that is due while
        the weights are damaged is refused: reported as ``save_blocked``, None returned.
        ``interval_saves=False`` for a framework that saves on the interval itself (the HF
        Trainer reads ``state.save_steps``): only a halt and save-now give a reason then, and
        ``user_interval`` is its own interval (a bump never makes saves rarer).
        """
        c = self.control
        c.saves_carried_out, c.user_save_interval_steps = interval_saves, user_interval   # for its messages
        bumped = c.save_interval_steps
        if bumped and user_interval and bumped >= user_interval:
            bumped = None   # the user's own interval is already as frequent
        if bumped != self._interval:
            self._interval = bumped
            self.run.act(Action(step, "save_interval", (c.save_interval_reason if bumped else None)
                                or "back to the user's own save interval", interval=bumped))
        if c.stop and self.stopped_at is None:
            self.stopped_at = step
            self.run.act(Action(step, "stop", c.stop_reason or "requested by the policy"))
        last = self.saves[-1][0] if self.saves else None
        why = c.save_request(step, last) if (interval_saves or c.stop or c.save_now) else None
        return (why if why is None or self.allow_save(step, why) else None), c.stop

    def allow_save(self, step: int, what: str) -> bool:
        """Whether a save (``what``: the monitor's reason, the framework's or the loop's own save)
        may go ahead: not while the weights are damaged (:meth:`save_blocked`)."""
        if self.control.state_is_good:
            return True
        self.save_blocked(step, what)
        return False

    def can_save_into(self, folder: str, step: int) -> bool:
        """Whether the monitor's own save of ``step`` can go into ``folder`` (made when missing).
        A folder that cannot be written is one warning, said once, without a traceback, and no
        save: training and detection go on. Every rank checks the same folder before the
        (collective) save, so a shared one that cannot be written stops every rank's save alike,
        and no rank waits in the save for a rank that failed."""
        try:
            os.makedirs(folder, exist_ok=True)
            if os.access(folder, os.W_OK | os.X_OK):
                return True
            why = "permission denied"
        except OSError as e:
            why = e.strerror or str(e)
        self.guard.warn_once("save-folder", "stability: cannot save the checkpoint of step %d into %s "
                             "(%s); the monitor's saves are off, training and detection go on", step, folder, why)
        return False

    def save_failed(self, step: int, exc: OSError) -> None:
        """The monitor's own save of ``step`` failed while writing (a full disk): one warning,
        said once, without a traceback; training and detection go on."""
        self.guard.warn_once("save-failed", "stability: the checkpoint of step %d could not be saved "
                             "(%s: %s); training and detection go on", step, type(exc).__name__, exc)

    def record_save(self, step: int, path: str | None, reason: str | None = None) -> None:
        """A checkpoint of ``step`` was written to ``path``: on the monitor's request (``reason``:
        a ``save`` action) or by the framework or the loop itself (only the checkpoint line)."""
        path = None if path is None else str(path)
        if reason is not None:
            self.saves.append((step, path))
            self.run.act(Action(step, "save", reason, path=path))
        self.run.checkpoint_saved(step, path)

    def save_blocked(self, step: int, what: str) -> None:
        """A save (``what``) is refused because the weights are damaged: the last good checkpoint
        must not be overwritten or rotated out. Every rank refuses alike."""
        damage = self.control.damage
        self.guard.warn_once(f"save-blocked-{step}", "stability: not saving the checkpoint of "
                             "step %d (%s): %s", step, what, damage)
        self.run.act(Action(step, "save_blocked", f"{what}; refused: {damage}"))

    # ---------------------------------------------------------------------------- checkpoints
    def checkpoint(self, step: int, path: str | None = None, reason: str | None = None) -> dict[str, Any]:
        """A checkpoint of ``step`` is being written: the pending records first (its detector
        state must cover every step up to this one), the checkpoint noted when its ``path`` is
        known (so a resume from it knows it), and the small JSON blob to save with it."""
        self.flush()   # host-sync: a checkpoint is a sync point anyway
        if path is not None:
            self.record_save(step, path, reason)
        return self.state(step)

    def write_state_file(self, folder: str, blob: Mapping[str, Any]) -> None:
        """``blob`` as ``folder/STATE_FILE``, written atomically (one writer: rank 0)."""
        tmp = os.path.join(folder, STATE_FILE + ".tmp")
        with open(tmp, "w") as fh:
            json.dump(blob, fh, allow_nan=True)
        os.replace(tmp, os.path.join(folder, STATE_FILE))

    def restore_file(self, folder: str) -> None:
        """:meth:`restore` from ``folder/STATE_FILE`` (absent or unreadable: start fresh)."""
        path, blob = os.path.join(folder, STATE_FILE), None
        if os.path.isfile(path):
            with self.guard("load-state", f"reading {path} (detectors start fresh)"), open(path) as fh:
                blob = json.load(fh)
        self.restore(blob, folder)

    def state(self, step: int) -> dict[str, Any]:
        """The small JSON blob saved with a checkpoint of ``step`` (after :meth:`flush`)."""
        return {"step": int(step), "live": self.run.state_dict()}

    def restore(self, blob: Mapping[str, Any] | None, source: str) -> None:
        """Detector state from the checkpoint actually loaded (``source`` names it). Without a
        blob, or with one this configuration cannot read, the detectors start fresh."""
        if not blob:
            self.guard.warn_once("no-state", "stability: %s has no stability state; detectors "
                                 "start fresh", source)
            return
        with self.guard("load-state", f"restoring the stability state from {source} (detectors "
                                      f"start fresh)"):
            # Lightning checkpoints written before the session kept the bare LiveRun state.
            self.run.load_state_dict(blob["live"] if "live" in blob else blob)

    def reload(self, blob: Mapping[str, Any] | None, source: str) -> str:
        """A checkpoint was loaded (``blob``: its stability state, ``source``: where from) and
        :meth:`restore` d. Once the session has started, what it recorded since belongs to the
        abandoned future: a ``rollback``; before, a ``resume``. Returns that reason, for the
        :meth:`start` of the next segment."""
        reason = "rollback" if self.started else "resume"
        if self.started:
            self.flush()   # host-sync: a checkpoint load
        self.restore(blob, source)
        self.forget_micro_batches()
        return reason

    def close(self, *, flush: bool = True) -> None:
        """End of training: the watchdog stops, the last records (a sync point; ``flush=False``
        after a crash), then the run log and the sinks; then the :attr:`outcome`, and on rank 0
        the report next to the run log and the summary block (:meth:`_end`). Idempotent; never
        raises."""
        if self.closed:
            return
        self.closed = True
        if self._watchdog is not None:
            self._watchdog.stop()
        if flush and not self.off:
            self.flush()
        self.run.close()
        with self.guard("end", "ending the run (the outcome, the report, the summary)"):
            self.outcome = self.run.outcome(halted_at=self.stopped_at)
            if self.run.is_rank0:
                self._end(self.outcome)

    def _end(self, outcome: Outcome) -> None:
        """Rank 0 at the end: the HTML report next to the run log (``report.enabled``), then the
        summary block through the ``stability_callbacks`` logger (a warning for a halted,
        crashed or critical run)."""
        from stability_callbacks.replay.report import report_run_end

        report_run_end(self.run, outcome)
        log.log(logging.WARNING if outcome.severe else logging.INFO, "%s", "\n".join(outcome.summary_lines()))


class EngineStep(Protocol):
    """What an engine that steps its own optimizer knows after a step (DeepSpeed's
    :class:`~stability_callbacks.integrations.deepspeed.readings.DeepSpeedStep`): ``engine`` holds
    the optimizer state, :meth:`read_into` puts the step's values into the probe, with no sync."""

    engine: Any

    def read_into(self, probe: StepProbe) -> None: ...


def output_size(model) -> int | None:
    """C, the size of the model's output layer, whose cross-entropy starts at ln C (not_learning's
    chance level): an HF model's output embeddings (a language model's head), else the last
    ``torch.nn.Linear`` the model registers (a classifier's head in the usual models). Which
    layer it is is a hint only: the detector uses ln C when the loss starts near it. None
    without such a layer (a convolutional output, a model without a Linear)."""
    head = None
    get = getattr(model, "get_output_embeddings", None)
    if callable(get):
        try:
            head = get()
        except Exception:   # a model whose method needs more than itself: fall back to the modules
            head = None
    if head is None:
        linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
        head = linears[-1] if linears else None
    n = getattr(head, "out_features", None)
    return n if isinstance(n, int) and n >= 1 else None   # 1: a binary classifier's single logit
