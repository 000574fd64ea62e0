"""Trackio (the HF-native tracker): ``run.alert`` per finding, and metrics under ``stability/``.

``trackio`` is imported only when the sink is built (``pip install 'stability-callbacks[trackio]'``).
Trackio keeps its current run in a context variable of the thread that called ``trackio.init``,
and this sink delivers from its own thread, so the run is taken when the sink is built: the
integration's, or the one current on the building thread (HF's ``TrackioCallback`` starts it at
train begin, before our callback runs). With ``project`` set and no run current, the sink starts
its own run of that project (named after the run) at its first delivery. Trackio writes locally
(SQLite under ``TRACKIO_DIR``) unless the run was started with a Space.
"""
from __future__ import annotations

import importlib.util
from typing import Any, Mapping

from .. import keys
from ..params import text
from .sink import Alert, DeliveryError, MetricSink, alert_text, alert_title

_LEVELS = {"info": "INFO", "warning": "WARN", "critical": "ERROR"}


class NotifyTrackio(MetricSink):
    """``run.alert(title, text, level, step)`` per finding and ``run.log`` of ``stability/*``
    scalars at the optimizer step (``step=``), with a ``stability/finding/<kind>`` point per
    finding. The alert names the finding's step: left out, Trackio stamps the latest step it has
    seen, a later one whenever delivery lags behind training.

    Keys: ``project`` (start a run of this project when none is current; default: none, the
    sink writes to the current run), ``min_severity`` (warning), ``rate_limit_s`` (300),
    ``metrics`` (True), ``metrics_every_n_steps`` (1), ``queue_size``. ``run`` (not a config
    key) is the integration's Trackio run; ``run_name`` (not a config key) names a run the sink
    starts.
    """

    name = "trackio"

    def __init__(self, run=None, run_name: str | None = None, *, project: str | None = None,
                 min_severity: str = "warning", rate_limit_s: float = 300.0, metrics: bool = True,
                 metrics_every_n_steps: int = 1, queue_size: int = 1024):
        super().__init__(min_severity=min_severity, rate_limit_s=rate_limit_s, queue_size=queue_size,
                         metrics=metrics, metrics_every_n_steps=metrics_every_n_steps)
        if importlib.util.find_spec("trackio") is None:   # checked here, so a config names the problem
            raise ValueError("needs the trackio package: pip install 'stability-callbacks[trackio]'")
        self.project = None if project is None else text("project", project)
        self.run_name = run_name
        self._run = run
        self._trackio: Any = None
        self._owns_run = False

    def resolve(self) -> str | None:
        import trackio   # ~2 s: only when a run builds its sinks
        self._trackio = trackio
        if self._run is None:   # the run current on this (the training) thread, if any
            self._run = trackio.context_vars.current_run.get()
        if self._run is None and self.project is None:
            return "no Trackio run is current and no actions.trackio.project to start one"
        return None

    def _current_run(self):
        if self._run is None:
            if self._trackio is None or self.project is None:
                raise DeliveryError("no Trackio run", retryable=False)
            self._run = self._trackio.init(project=self.project, name=self.run_name, resume="allow",
                                           embed=False)
            self._owns_run = True
        return self._run

    def deliver(self, alert: Alert) -> None:
        f = alert.finding
        run = self._current_run()
        run.alert(title=alert_title(f), text=alert_text(alert, markdown=False),
                  level=getattr(self._trackio.AlertLevel, _LEVELS[f.severity]), step=f.step)
        if self.metrics:
            run.log({keys.finding_tag(f.kind): keys.SEVERITY_CODE[f.severity]}, step=f.step)

    def write_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        self._current_run().log(keys.charted(metrics), step=step)

    def close(self) -> None:
        if self._owns_run and self._run is not None:
            self._run.finish()
