"""Deliver findings to alert sinks without ever slowing or stopping training.

The training thread only filters (severity, duplicate, per-kind rate limit: O(1), no I/O) and
puts the alert on a bounded queue; one daemon thread per network sink delivers it with a
timeout and retries 429/5xx/timeouts with exponential backoff. A full queue drops (counted,
logged once); a failing sink is logged once and counted. ``close`` flushes what is pending
until a deadline and then walks away from a stuck endpoint (the daemon thread dies with the
process). Network sinks run on rank 0 only (docs/design.md, Invariants).

>>> from stability_callbacks.record import Finding
>>> from stability_callbacks.alerts.log import LogFindings
>>> d = AlertDispatcher([LogFindings(min_severity="warning")], run_name="demo")
>>> d.submit(Finding(10, "loss_spike", "warning", "Loss rose to 9.1 against 6.4."))
>>> d.submit(Finding(10, "loss_spike", "warning", "Loss rose to 9.1 against 6.4."))  # duplicate
>>> d.close(timeout_s=1.0); d.stats()["log"]["delivered"], d.stats()["log"]["duplicates"]
(1, 1)
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from collections import OrderedDict
from typing import Iterable, Mapping

from ..record import Finding, severity_rank
from .sink import Alert, AlertSink, DeliveryError

logger = logging.getLogger("stability_callbacks.actions")

_STOP = object()
_DEDUPE_MEMORY = 4096     # remembered (kind, step, severity, message) keys per sink; LRU


class _SinkWorker:
    """Gate (caller thread) + queue + delivery thread of one sink."""

    def __init__(self, sink: AlertSink):
        self.sink = sink
        self._queue: queue.Queue = queue.Queue(maxsize=sink.queue_size)
        self._seen: OrderedDict = OrderedDict()
        self._last_sent: dict[str, tuple[float, int]] = {}   # kind -> (monotonic time, severity rank)
        self._held_back: dict[str, int] = {}
        self._thread: threading.Thread | None = None
        self._closing = threading.Event()
        self._deadline: float | None = None
        self._failure_logged = False
        self._drop_logged = False
        self.counts = {"delivered": 0, "failed": 0, "duplicates": 0, "rate_limited": 0,
                       "dropped": 0, "metrics_failed": 0}
        self.last_failure: str | None = None
        self._final_cpu_s = 0.0

    # -- caller thread -------------------------------------------------------------------------
    def offer(self, finding: Finding, run_name: str, report_path: str | None,
              advice_forms: tuple[str, ...] | None = None) -> None:
        sink = self.sink
        if not sink.wants(finding):
            return
        key = (finding.kind, finding.step, finding.severity, finding.message)
        if key in self._seen:
            self.counts["duplicates"] += 1
            return
        self._seen[key] = None
        if len(self._seen) > _DEDUPE_MEMORY:
            self._seen.popitem(last=False)
        now = time.monotonic()
        rank = severity_rank(finding.severity)
        last = self._last_sent.get(finding.kind)
        if last is not None and now - last[0] < sink.rate_limit_s and rank <= last[1]:
            self.counts["rate_limited"] += 1
            self._held_back[finding.kind] = self._held_back.get(finding.kind, 0) + 1
            return
        self._last_sent[finding.kind] = (now, rank)
        alert = Alert(finding, run_name, report_path, self._held_back.pop(finding.kind, 0), advice_forms)
        if sink.inline:
            self._deliver_with_retries(alert)
        else:
            self._put(("alert", alert))

    def offer_metrics(self, step: int, metrics: dict[str, float]) -> None:
        if not self.sink.wants_metrics(step):   # the sink's own metrics_every_n_steps
            return
        if self.sink.inline:
            self._write_metrics(step, metrics)
        else:
            self._put(("metrics", step, metrics))

    def _put(self, item) -> None:
        if self._closing.is_set():
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, daemon=True,
                                            name=f"stability-alerts-{self.sink.name}")
            self._thread.start()
        try:
            self._queue.put_nowait(item)
        except queue.Full:
            self.counts["dropped"] += 1
            if not self._drop_logged:
                self._drop_logged = True
                logger.warning("stability alerts: the %s queue is full (%d pending; the endpoint "
                               "is slow or down); dropping new items, counted, not logged again",
                               self.sink.name, self.sink.queue_size)

    # -- delivery thread -----------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self._serve()
        finally:
            self._final_cpu_s = time.thread_time()

    def cpu_s(self) -> float:
        """CPU seconds the delivery thread has used (the most it can have taken from training)."""
        t = self._thread
        if t is None:
            return 0.0
        if t.is_alive() and t.ident is not None and hasattr(time, "pthread_getcpuclockid"):
            try:
                return time.clock_gettime(time.pthread_getcpuclockid(t.ident))
            except (OSError, OverflowError):   # the thread ended between the two calls
                pass
        return self._final_cpu_s

    def _serve(self) -> None:
        while True:
            try:
                # Poll only while closing: a full queue may have kept the stop marker out.
                item = self._queue.get(timeout=0.05 if self._closing.is_set() else 1.0)
            except queue.Empty:
                if self._closing.is_set():
                    return
                continue
            if item is _STOP:
                return
            if self._past_deadline():
                self._give_up_pending(item)
                return
            if item[0] == "alert":
                self._deliver_with_retries(item[1])
            else:
                self._write_metrics(item[1], item[2])

    def _deliver_with_retries(self, alert: Alert) -> None:
        sink = self.sink
        attempt = 0
        while True:
            try:
                sink.deliver(alert)
                self.counts["delivered"] += 1
                return
            except DeliveryError as exc:
                error = exc
            except Exception as exc:  # a sink bug must not kill the thread or training
                error = DeliveryError(f"{type(exc).__name__}: {exc}", retryable=False)
            if not error.retryable or attempt >= sink.max_retries:
                self._record_failure(error.description, attempt)
                return
            delay = (error.retry_after_s if error.retry_after_s is not None
                     else sink.backoff_s * (2 ** attempt))
            delay = min(delay, sink.max_backoff_s)
            if not self._sleep(delay):
                self._record_failure(error.description + " (gave up at the close deadline)",
                                     attempt)
                return
            attempt += 1

    def _sleep(self, delay: float) -> bool:
        """Wait ``delay`` seconds unless that passes the close deadline; False = give up."""
        end = time.monotonic() + delay
        while True:
            if self._deadline is not None and end > self._deadline:
                return False
            remaining = end - time.monotonic()
            if remaining <= 0:
                return True
            # Wakes early when close() is called, so the deadline is re-checked at once.
            if self._closing.wait(remaining):
                if self._deadline is not None and end > self._deadline:
                    return False
                time.sleep(max(0.0, end - time.monotonic()))
                return True

    def _write_metrics(self, step: int, metrics: dict[str, float]) -> None:
        try:
            self.sink.write_metrics(step, metrics)
        except Exception as exc:
            self.counts["metrics_failed"] += 1
            self._log_failure_once(f"{type(exc).__name__}: {exc}")

    def _record_failure(self, description: str, retries: int) -> None:
        self.counts["failed"] += 1
        self._log_failure_once(description + (f" after {retries} retries" if retries else ""))

    def _log_failure_once(self, description: str) -> None:
        self.last_failure = self.sink.redact(description)
        if not self._failure_logged:
            self._failure_logged = True
            logger.warning("stability alerts: %s delivery failed: %s. Training continues; further "
                           "failures of this sink are counted and summarised at close.",
                           self.sink.name, self.last_failure)

    def _past_deadline(self) -> bool:
        return self._deadline is not None and time.monotonic() >= self._deadline

    def _give_up_pending(self, first) -> None:
        pending = [first]
        while True:
            try:
                pending.append(self._queue.get_nowait())
            except queue.Empty:
                break
        self.counts["dropped"] += sum(1 for item in pending
                                      if item is not _STOP and item[0] == "alert")

    # -- shutdown ------------------------------------------------------------------------------
    def begin_close(self, deadline: float) -> None:
        self._deadline = deadline
        self._closing.set()
        try:
            self._queue.put_nowait(_STOP)
        except queue.Full:
            pass  # the thread polls while closing and gives up at the deadline

    def finish_close(self) -> None:
        if self._thread is not None:
            deadline = self._deadline if self._deadline is not None else time.monotonic()
            self._thread.join(max(0.0, deadline - time.monotonic()))
            if self._thread.is_alive():
                # Stuck in a request to a dead endpoint: leave it, the daemon dies with us.
                self.counts["dropped"] += sum(
                    1 for item in list(self._queue.queue)
                    if item is not _STOP and item[0] == "alert")
        try:
            self.sink.close()
        except Exception as exc:
            self._log_failure_once(f"close: {type(exc).__name__}: {exc}")


class AlertDispatcher:
    """Fan findings and metrics out to sinks; never blocks, never raises.

    ``submit`` and ``log_metrics`` cost a few dict operations on the caller's thread; delivery
    happens on one daemon thread per non-inline sink. ``close(timeout_s)`` is the final flush.
    ``advice_forms``: the frameworks whose rollback form an alert carries (None: all).
    """

    def __init__(self, sinks: Iterable[AlertSink] = (), *, run_name: str = "run",
                 report_path: str | None = None, advice_forms: tuple[str, ...] | None = None):
        self.run_name = run_name
        self.report_path = report_path
        self.advice_forms = advice_forms
        self._workers = [_SinkWorker(s) for s in sinks]
        self._metric_workers = [w for w in self._workers if w.sink.handles_metrics]
        self._closed = False
        self._error_logged = False

    @property
    def sinks(self) -> list[AlertSink]:
        return [w.sink for w in self._workers]

    def submit(self, finding: Finding) -> None:
        """Hand one finding to every sink that wants it. Non-blocking; never raises."""
        if self._closed or not self._workers:
            return
        try:
            for w in self._workers:
                w.offer(finding, self.run_name, self.report_path, self.advice_forms)
        except Exception as exc:
            self._log_error_once("submit", exc)

    def log_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        """Scalars for the metric sinks (W&B, TensorBoard, Trackio): metric keys, written as
        ``stability/<key>``, each sink on its own ``metrics_every_n_steps``."""
        if self._closed or not self._metric_workers:
            return
        try:
            batch = dict(metrics)   # the caller may reuse its dict
            for w in self._metric_workers:
                w.offer_metrics(int(step), batch)
        except Exception as exc:
            self._log_error_once("log_metrics", exc)

    def close(self, timeout_s: float = 5.0) -> None:
        """Deliver what is pending until ``timeout_s`` from now, then stop. Idempotent."""
        if self._closed:
            return
        self._closed = True
        deadline = time.monotonic() + max(0.0, float(timeout_s))
        for w in self._workers:
            w.begin_close(deadline)
        for w in self._workers:
            w.finish_close()
        for w in self._workers:
            c = w.counts
            if c["failed"] or c["dropped"] or c["metrics_failed"]:
                logger.warning("stability alerts: %s: %d delivered, %d failed, %d dropped "
                               "(last failure: %s)", w.sink.name, c["delivered"], c["failed"],
                               c["dropped"], w.last_failure)

    def stats(self) -> dict[str, dict[str, int]]:
        """Per-sink counters: delivered, failed, duplicates, rate_limited, dropped, metrics_failed."""
        return {w.sink.name: dict(w.counts) for w in self._workers}

    def delivery_cpu_s(self) -> float:
        """CPU seconds used so far by the delivery threads: with the time spent inside
        ``submit``/``log_metrics``, the most alerting can have slowed the training thread."""
        return sum(w.cpu_s() for w in self._workers)

    def _log_error_once(self, where: str, exc: Exception) -> None:
        if not self._error_logged:
            self._error_logged = True
            logger.warning("stability alerts: %s failed (%s); alerts degrade, training continues",
                           where, type(exc).__name__)
