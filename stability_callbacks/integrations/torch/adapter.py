"""What the three framework adapters share around their :class:`~.session.LiveSession`: the
constructor's common keyword arguments, the guard, opening the session, the views users read
(``findings``, ``saved``, ``should_stop``, ``outcome``), wrapping a framework's methods on one instance, the
crash alert around its training entry point, and the plumbing of skip step and automatic
rollback. Framework-neutral: each framework's package builds on it.
"""
from __future__ import annotations

import os
from typing import Any, Mapping

from stability_callbacks.advice import advice_forms_for
from stability_callbacks.config import Config
from stability_callbacks.control import Control
from stability_callbacks.forensics import StepIndices
from stability_callbacks.live import Guard, LiveRun
from stability_callbacks.outcome import Outcome
from stability_callbacks.params import ConfigError
from stability_callbacks.runlog import RUN_DIR_NAME
from stability_callbacks.record import Finding

from .session import LiveSession
from .skip_step import gate_optimizer

__all__ = ["SessionAdapter", "RUN_DIR_NAME", "CONFIG_ERRORS"]

#: What a bad configuration raises at train begin (a sink's environment variable unset): the
#: user's to see, before step one; everything else there is monitoring's own failure.
CONFIG_ERRORS = (ConfigError,)


class SessionAdapter:
    """What the three integrations share around their session: the constructor's common keyword
    arguments, the guard (made first, so that even a failed start is caught), the session once
    the framework says training begins, the views users and tests read, and the plumbing of an
    automatic rollback (``_rollback``: the framework's :class:`~.rollback.RollBack`, None when
    off) and of the gated optimizer step (``_gate``: :func:`~.skip_step.gate_optimizer`).

    The common keyword arguments: ``config`` (a preset name, YAML path, dict, a
    :class:`~stability_callbacks.config.Config`, or None = the defaults; read and validated here,
    once, so a bad key raises before anything runs) and ``overrides`` (``{"policy.halt_on":
    "critical"}``: ``section.key`` -> value, on top of ``config``), or ``monitor`` (a ready
    ``Monitor``, its config with it); ``run_dir`` (the run log JSONL and reports; one run log per run; default: a
    ``stability`` folder where the framework keeps the run,
    :data:`~stability_callbacks.runlog.RUN_DIR_NAME`);
    ``run_name``; ``listeners`` (:class:`~stability_callbacks.live.RunListener` s: records,
    findings, actions).
    """

    #: The framework, for the rollback advice's native form (:mod:`stability_callbacks.advice`).
    framework = ""

    def __init__(self, *, config: Any = None, monitor: Any = None,
                 run_dir: str | os.PathLike | None = None, run_name: str | None = None,
                 listeners=(), overrides: Mapping[str, Any] | None = None):
        if monitor is not None and overrides:
            raise ValueError("overrides apply to config, not to a ready monitor (it brings its own config)")
        #: The configuration, read once (a bad key raises here, named): the Monitor's when given.
        self.config: Config = monitor.config if monitor is not None else Config.load(config, overrides)
        self.monitor, self.run_name = monitor, run_name
        self.run_dir = None if run_dir is None else os.fspath(run_dir)
        self.listeners = list(listeners)
        self.guard = Guard()
        self.session: LiveSession | None = None
        self._rollback = self._gate = None

    def _open(self, *, is_rank0: bool, run_dir: str | None, run_name: str | None = None, wandb_run=None,
              monitor: Any = None, process_group=None, listeners=(), sinks_off=None) -> LiveSession:
        """The session (and its LiveRun: config errors surface here); ``run_dir``: the folder the
        framework keeps the run in, for the default (``<run_dir>``, unless given to the
        constructor)."""
        self.session = LiveSession(LiveRun(
            config=self.config, monitor=monitor if monitor is not None else self.monitor,
            run_dir=self.run_dir or run_dir, is_rank0=is_rank0, run_name=run_name or self.run_name,
            wandb_run=wandb_run, advice_forms=advice_forms_for(self.framework), sinks_off=sinks_off,
            listeners=[*self.listeners, *listeners], guard=self.guard, sees_checkpoints=True),
            process_group=process_group)
        return self.session

    @property
    def run(self) -> LiveRun | None:
        """The :class:`~stability_callbacks.live.LiveRun` (Monitor, run log, sinks)."""
        return None if self.session is None else self.session.run

    @property
    def control(self) -> Control | None:
        """The Monitor's requests (:class:`~stability_callbacks.control.Control`): the one
        object the Monitor made, held by the run and the session alike."""
        return None if self.session is None else self.session.control

    @property
    def findings(self) -> list[Finding]:
        """Every finding of this run so far."""
        return [] if self.session is None else self.session.findings

    @property
    def outcome(self) -> Outcome | None:
        """How the run ended (:class:`~stability_callbacks.outcome.Outcome`: ``halted``,
        ``reason``, ``findings``, ``run_dir``, ``exit_code``, ...), once training has ended;
        None before. The same on every rank."""
        return None if self.session is None else self.session.outcome

    @property
    def saved(self) -> list[tuple[int, str | None]]:
        """``(step, path)`` of the saves made on the monitor's request, oldest first."""
        return [] if self.session is None else list(self.session.saves)

    @property
    def should_stop(self) -> bool:
        """True once the policy asked for a halt; the same step on every rank."""
        return self.session is not None and bool(self.session.control.stop)

    @property
    def stopped_at(self) -> int | None:
        """The step at which the integration carried out the halt."""
        return None if self.session is None else self.session.stopped_at

    def _off(self) -> bool:
        return self.session is None or self.session.off

    def _alive(self) -> None:
        """An evaluation batch: progress, not a hang (:meth:`LiveSession.alive`)."""
        if not self._off():
            self.session.alive()

    def _wrap(self, patches, name: str, *, before=None, after=None) -> bool:
        """Wrap method ``name`` of ``patches.obj`` on that instance (``patches``: its
        :class:`~stability_callbacks.live.InstancePatches`): while monitoring is on,
        ``before(*args, **kwargs)`` runs before each call and ``after(result, *args, **kwargs)``
        after it; the result is returned as it is. False (nothing wrapped) when there is no such
        method."""
        orig = getattr(patches.obj, name, None)
        if orig is None:
            return False

        def call(*args, **kwargs):
            if before is not None and not self._off():
                before(*args, **kwargs)
            out = orig(*args, **kwargs)
            if after is not None and not self._off():
                after(out, *args, **kwargs)
            return out
        patches.set(name, call)
        return True

    def _crashed(self, exc: BaseException) -> None:
        """Training raised ``exc``: the crash alert (:meth:`LiveSession.crashed`); the caller
        re-raises it."""
        if self.session is not None:
            self.session.crashed(exc)

    def _reporting_crashes(self, fn):
        """``fn`` (a framework's training entry point), reporting the exception it raises
        (:meth:`_crashed`) before it propagates: the same object, its traceback untouched."""
        def call(*args, **kwargs):
            try:
                return fn(*args, **kwargs)
            except BaseException as exc:
                self._crashed(exc)
                raise
        return call

    def _auto_rollback(self) -> bool:
        """Whether ``policy.auto_rollback`` is on (``{}``: on, with its defaults)."""
        # the section as given (no ``.policy`` chain here: that is the Monitor's, test_layers)
        return self.config["policy"].get("auto_rollback") not in (None, False)

    def _records_samples(self) -> bool:
        """Whether ``forensics.record_samples`` is on (its default: :class:`Forensics`')."""
        return self.config.forensics.record_samples

    def _sample_ring(self) -> StepIndices | None:
        """The run's index ring (data forensics), for a sampler built before the run exists;
        None while monitoring is off."""
        return None if self._off() else self.session.run.forensics.indices

    @property
    def _rolling(self) -> bool:
        """An automatic rollback was accepted and its checkpoint is not loaded yet (the run goes
        on in the same session)."""
        return self._rollback is not None and self._rollback.pending is not None

    def _begin(self, step: int, reason: str, **facts) -> None:
        """:meth:`LiveSession.start` of a segment: ``rollback`` while one is pending, whose
        standing requests then replace those of the checkpoint loaded (``facts``: the
        checkpoint loaded, the preflight's facts)."""
        rolling = self._rolling
        self.session.start(step, "rollback" if rolling else reason, **facts)
        if rolling:
            self._rollback.restored()

    def _gate_step(self, optimizer, *, next_step) -> None:
        """Gate ``optimizer.step`` (what the framework calls) for skip step and an automatic
        rollback's LR window (``next_step``: returns the step about to run). An engine that
        skips through its own overflow path is set up first by its package
        (:func:`~stability_callbacks.integrations.deepspeed.skip_step.gate_engine`)."""
        lr_factor = self._rollback.lr_factor(next_step) if self._rollback is not None else None
        self._gate = gate_optimizer(self.session.skip, optimizer, lr_factor=lr_factor)

    def _ungate(self) -> None:
        if self._gate is not None:
            self._gate.close()
            self._gate = None

    def _requests(self, step: int, **kwargs) -> tuple[Any, str | None, bool]:
        """``(rollback, why, stop)`` after ``step``: an automatic rollback accepted now (refused:
        a halt, in ``stop``), then :meth:`LiveSession.requests` (``kwargs``). A rollback abandons
        this branch: no save then (``why`` None); the framework stops and goes back."""
        rollback = self._rollback.accept(step) if self._rollback is not None else None
        why, stop = self.session.requests(step, **kwargs)
        return rollback, None if rollback is not None else why, stop
