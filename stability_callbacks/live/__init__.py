"""The framework-neutral, torch-free glue of a monitored run, one module per thing it holds:
the run (:mod:`.run`: Monitor + run log + alert sinks + listeners), the one guard that keeps
monitoring from taking training down (:mod:`.guard`), the crash notes failing ranks leave
(:mod:`.crash_notes`) and the instance patches the integrations wrap methods with (:mod:`.patches`).

The torch side (:class:`~stability_callbacks.integrations.torch.session.LiveSession`) turns
framework hooks into :class:`StepRecord` s, calls :meth:`LiveRun.observe` once per optimizer
step, carries out ``run.control`` and reports what it did with :meth:`LiveRun.act`. Offline
``replay --follow`` feeds the same class from a growing log. Everything here runs on every rank
(so every rank decides the same); only rank 0 writes the run log and sends alerts. Nothing here
raises into the training loop: a failure is logged once and that part goes quiet (docs/design.md,
Invariants).
"""
from __future__ import annotations

from .crash_notes import CRASH_DIR, exception_text
from .guard import Guard
from .patches import InstancePatches
from .run import LiveRun, RunListener, reporter_scalars

__all__ = ["LiveRun", "RunListener", "Guard", "InstancePatches", "reporter_scalars", "exception_text", "CRASH_DIR"]
