"""How a live run ended (docs/integrations.md, "The end of a run"): the ``report`` section of the
configuration, the :class:`Outcome` an integration exposes (``callback.outcome``, ``hook.outcome``)
and the short summary block a run prints at its end.

The run (:class:`~stability_callbacks.live.LiveRun`) builds the outcome when it closes;
:func:`~stability_callbacks.replay.report.report_run_end` writes the HTML report next to the run
log (rank 0, ``report.enabled``); the torch side logs the summary, ``replay --follow`` prints it.

>>> from stability_callbacks.record import Finding
>>> o = Outcome(halted=True, reason="nonfinite (critical) at step 22; policy.halt_on = critical",
...             findings=[Finding(5, "warmup_end", "info", "..."), Finding(22, "nonfinite", "critical", "...")],
...             run_dir=None, steps_watched=22, first_step=1, last_step=22, halted_at=22)
>>> o.exit_code
3
>>> print("\\n".join(o.summary_lines()))
stability: the run halted at step 22: nonfinite (critical) at step 22; policy.halt_on = critical
  steps watched: 22 (1-22)
  findings: critical: nonfinite x1 (step 22); info: warmup_end x1 (step 5)
  run log: none (no run folder)
  report: none
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .params import flag
from .record import SEVERITIES, Finding

__all__ = ["RunReport", "Outcome", "REPORT_NAME", "EXIT_HALTED"]

#: The report's file name, next to the run log.
REPORT_NAME = "report.html"
#: The exit code of a halted run (``outcome.exit_code``; ``replay --follow`` uses the same).
EXIT_HALTED = 3
#: Kinds listed per severity in the summary before the rest are counted.
_KINDS_LISTED = 6


class RunReport:
    """The ``report`` section: what a live run writes when it ends.

    - ``enabled``: the HTML report (``replay --report``'s, :mod:`~stability_callbacks.replay.report`)
      written as ``report.html`` next to the run log by rank 0 (needs matplotlib: the ``report``
      extra; without it the summary says so). It reads the run log back: 0.6 s for 1 000 steps,
      3.8 s and 0.4 GB for 100 000 (docs/integrations.md, The end of a run).
    """

    def __init__(self, *, enabled: bool = True):
        self.enabled = flag("enabled", enabled)


@dataclass
class Outcome:
    """How a live run ended, the same on every rank (``runlog_path`` and ``report_path`` are
    rank 0's files: None on the other ranks).

    - ``halted``: the policy stopped the run (``policy.halt_on``, or an automatic rollback it had
      to refuse); ``reason`` says why (the crash's message for a crash; None for a run that ran
      to its end); ``halted_at``: the step the integration stopped at.
    - ``findings``: every finding; ``steps_watched``: the records the monitor saw, steps
      ``first_step``-``last_step``.
    - ``advice``: the rollback advice in the run's framework's form (its sentence when the run's
      framework has no form), when there is advice.
    - :attr:`exit_code`: ``replay``'s codes: 3 halted, 1 a critical finding (a crash included), 0
      otherwise, for a script to end with (``sys.exit(callback.outcome.exit_code)``).
    - ``stopped``: for a watcher from the side (``replay --follow``), why following ended (the
      job's process ended, the log stayed idle, a signal, the end of its input); None for a live
      run. ``halt_done``: what it did to carry out a halt (it cannot stop the job itself).

    >>> print("\\n".join(Outcome(halted=False, reason=None, findings=[], run_dir=None, steps_watched=80,
    ...                         first_step=1, last_step=80, stopped="SIGTERM").summary_lines()[:2]))
    stability: following ended at step 80 (SIGTERM), not halted
      steps watched: 80 (1-80)
    """

    halted: bool
    reason: str | None
    findings: list[Finding]
    run_dir: Path | None
    steps_watched: int = 0
    first_step: int | None = None
    last_step: int | None = None
    halted_at: int | None = None
    crashed: bool = False
    advice: str | None = None
    runlog_path: Path | None = None
    report_path: Path | None = None
    #: Why no report was written (report off, no run log, matplotlib missing, ...).
    report_problem: str | None = None
    stopped: str | None = None
    halt_done: list[str] | None = None

    @property
    def exit_code(self) -> int:
        if self.halted:
            return EXIT_HALTED
        return 1 if any(f.severity == "critical" for f in self.findings) else 0

    @property
    def severe(self) -> bool:
        """Halted, crashed or critical: the summary is logged as a warning, else as info."""
        return self.exit_code != 0

    def summary_lines(self) -> list[str]:
        """The summary block: how it ended and why, the steps watched, the findings by severity
        and kind (info too), the rollback advice, where the run log and the report are."""
        lines = [f"stability: {self._ending()}"]
        if self.halted and self.halt_done is not None:
            lines.append(f"  the job: {'; '.join(self.halt_done)}")
        lines += [f"  steps watched: {self.steps_watched}" + (
                     f" ({self.first_step}-{self.last_step})" if self.first_step is not None else ""),
                 f"  findings: {findings_by_kind(self.findings)}"]
        if self.advice:
            lines.append(f"  roll back: {self.advice}")
        runlog = self.runlog_path or ("none (no run folder)" if self.run_dir is None
                                      else f"none ({self.run_dir} could not be written)")
        report = self.report_path or (f"none ({self.report_problem})" if self.report_problem else "none")
        return lines + [f"  run log: {runlog}", f"  report: {report}"]

    def _ending(self) -> str:
        if self.crashed:
            return f"the run crashed: {self.reason}"
        what = "the run" if self.stopped is None else "following"
        if self.halted:
            at = f" at step {self.halted_at}" if self.halted_at is not None else ""
            if self.halted_at is not None and self.last_step is not None and self.last_step > self.halted_at:
                return f"a halt was asked for{at} ({self.reason}), but training went on to step {self.last_step}"
            return f"{what} halted{at}: {self.reason}"
        end = f" at step {self.last_step}" if self.last_step is not None else ""
        why = f" ({self.stopped})" if self.stopped is not None else ""
        return f"{what} ended{end}{why}, not halted"


def findings_by_kind(findings: list[Finding]) -> str:
    """The findings counted by severity (worst first) and kind, each with its step or steps.

    >>> findings_by_kind([Finding(3, "loss_spike", "warning", ""), Finding(9, "loss_spike", "warning", "")])
    'warning: loss_spike x2 (steps 3-9)'
    >>> findings_by_kind([])
    'none'
    """
    parts = []
    for severity in reversed(SEVERITIES):
        steps: dict[str, list[int]] = {}
        for f in findings:
            if f.severity == severity:
                steps.setdefault(f.kind, []).append(f.step)
        if not steps:
            continue
        kinds = [f"{kind} x{len(s)} (step {s[0]})" if len(s) == 1 else
                 f"{kind} x{len(s)} (steps {min(s)}-{max(s)})" for kind, s in steps.items()]
        more = len(kinds) - _KINDS_LISTED
        if more > 0:
            kinds = kinds[:_KINDS_LISTED] + [f"{more} more kind{'s' if more != 1 else ''}"]
        parts.append(f"{severity}: {', '.join(kinds)}")
    return "; ".join(parts) or "none"

