"""The hang alert: a watchdog thread that pages when training stops making progress.

A hung job (a rank stuck in a NCCL collective, a data loader or file system that stopped
answering) raises nothing and logs nothing: the only symptom is that steps stop. The watchdog
reads host timestamps the live session already keeps (when each optimizer step finished, and the
last evaluation batch) from a daemon thread on rank 0: no collective, no device sync, no torch
call, nothing on the training thread. When no progress has been made for

    threshold = max(hang_factor x median step time, hang_min_s)

it emits one critical ``hang`` finding (the run's alert sinks page), once per stall, and one
``hang_resolved`` info finding when progress comes back. It is armed once :data:`ARMED_AFTER`
steps have finished: the first steps (compilation, data-loader start-up) are not timed.
The median is over the last steps' intervals (at most 127), so a long evaluation or checkpoint
write now and then does not move it. Torch-free.
"""
from __future__ import annotations

import logging
import statistics
import threading
import time
from typing import Callable, Sequence

from .params import flag, positive
from .record import Finding

log = logging.getLogger("stability_callbacks")

#: Finished steps needed before the watchdog times anything (their intervals give the median).
ARMED_AFTER = 3


class HangWatchdog:
    """Alerts when no optimizer step finishes for far longer than usual (``watchdog`` section).

    - ``enabled``: run the watchdog (rank 0 of a live run; replay has no clock).
    - ``hang_factor``: a stall is this many median step times without progress ...
    - ``hang_min_s``: ... and never less than this many seconds (evaluation, checkpoint writes
      and slow steps below it are not hangs; keep it under your collective timeout, e.g. HF's
      ``ddp_timeout`` of 1800 s, so the page comes before the job is killed).

    :meth:`check` is the whole rule on given timestamps; :meth:`start` runs it every
    ``poll_s`` (``hang_min_s / 20``, at most 1 s) on a daemon thread. State: a few floats.

    >>> w = HangWatchdog(hang_factor=10, hang_min_s=5)
    >>> steps = [0.0, 1.0, 2.0, 3.0]                # 4 steps, one per second
    >>> w.check(12.9, 4, steps) is None              # 9.9 s < max(10 x 1 s, 5 s)
    True
    >>> f = w.check(13.5, 4, steps)                  # 10.5 s after the last step: a hang
    >>> f.kind, f.severity, f.step, f.value, f.threshold
    ('hang', 'critical', 4, 10.5, 10.0)
    >>> w.check(20.0, 4, steps) is None              # once per stall
    True
    >>> r = w.check(31.5, 6, steps + [30.0, 31.0])   # steps 5 and 6 finished at t = 30, 31 s
    >>> r.kind, r.severity, r.step, r.value          # the stall ended with step 5
    ('hang_resolved', 'info', 5, 27.0)
    """

    def __init__(self, *, enabled: bool = True, hang_factor: float = 10.0,
                 hang_min_s: float = 300.0):
        self.enabled = flag("enabled", enabled)
        self.hang_factor = float(positive("hang_factor", hang_factor))
        self.hang_min_s = float(positive("hang_min_s", hang_min_s))
        self.poll_s = min(1.0, self.hang_min_s / 20)
        self._stall: tuple[int, float] | None = None   # (last step, its time) of the alerted stall
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def threshold_s(self, finished_at_s: Sequence[float]) -> tuple[float, float] | None:
        """``(threshold, median step time)`` in seconds, or None while not armed."""
        if len(finished_at_s) < ARMED_AFTER:
            return None
        t = list(finished_at_s)
        median = statistics.median(b - a for a, b in zip(t, t[1:]))
        return max(self.hang_factor * median, self.hang_min_s), median

    def check(self, now_s: float, step: int, finished_at_s: Sequence[float],
              alive_at_s: float | None = None) -> Finding | None:
        """One look at the clock: ``step`` is the last finished step, ``finished_at_s`` the
        monotonic times at which the last steps finished (oldest first), ``alive_at_s`` the
        latest other sign of progress (an evaluation batch). Returns the ``hang`` finding once
        per stall, the ``hang_resolved`` finding once progress came back, else None."""
        if not finished_at_s:
            return None
        last = max(finished_at_s[-1], alive_at_s or 0.0)
        if self._stall is not None:
            stalled_step, since = self._stall
            if last <= since:
                return None
            self._stall = None
            # The first progress after the stall: the next step, or an evaluation batch.
            ended = next((t for t in finished_at_s if t > since), alive_at_s or last)
            moved = (f"step {stalled_step + 1} finished" if step != stalled_step
                     else "evaluation batches are coming again")
            stall = round(ended - since, 3)
            return Finding(stalled_step + (step != stalled_step), "hang_resolved", "info",
                           signal="stall_s", value=stall,
                           message=f"Training is moving again: {moved} {stall:.0f} s after the last "
                                   f"progress at step {stalled_step}. Check the stack dumps or logs "
                                   f"you took during the stall for its cause.",
                           details={"stall_s": stall, "stalled_step": stalled_step})
        armed = self.threshold_s(finished_at_s)
        stalled = now_s - last
        if armed is None or stalled < armed[0]:
            return None
        threshold, median = armed
        self._stall = (step, last)
        return Finding(step, "hang", "critical", signal="stall_s", value=round(stalled, 3),
                       baseline=round(median, 6), threshold=round(threshold, 3),
                       message=f"No training progress for {stalled:.0f} s after step {step}, where "
                               f"a step takes {median:.3g} s (alert after max({self.hang_factor:g} x "
                               f"median, {self.hang_min_s:g} s) = {threshold:.0f} s). The job looks "
                               f"hung: a rank stuck in a collective (NCCL), a data loader or file "
                               f"system that stopped answering. Dump the stacks of every rank now "
                               f"(py-spy dump --pid PID) before the collective timeout kills the job.",
                       details={"stall_s": round(stalled, 3), "median_step_s": round(median, 6),
                                "threshold_s": round(threshold, 3)})

    # ---------------------------------------------------------------------------- the thread
    def start(self, read: Callable[[], tuple], emit: Callable[[Finding], None]) -> None:
        """Run :meth:`check` on a daemon thread until :meth:`stop`: ``read()`` returns
        ``(step, finished_at_s, alive_at_s)``, ``emit(finding)`` delivers. Never raises into
        training: a failure is logged once and the watchdog stops."""
        if not self.enabled or self._thread is not None:
            return

        def run() -> None:
            try:
                while True:
                    stopping = self._stop.wait(self.poll_s)
                    # At the end, only a resolution is news (a stalled step that finished).
                    if not stopping or self._stall is not None:
                        finding = self.check(time.monotonic(), *read())
                        if finding is not None:
                            emit(finding)
                    if stopping:
                        return
            except Exception:   # monitoring never takes training down
                log.exception("stability: the hang watchdog failed; hangs are not watched any more")

        self._thread = threading.Thread(target=run, name="stability-watchdog", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float = 1.0) -> None:
        """Stop the thread (end of training, a crash), after a last look that reports a stall
        which has just ended. Idempotent."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout_s)
