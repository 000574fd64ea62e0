"""W&B: ``run.alert`` per finding, and metrics under ``stability/``.

``wandb`` is never imported here: the run comes from the integration (Lightning
``WandbLogger.experiment``, ``replay --follow --wandb-run-id``) or, lazily at each delivery,
from an already imported ``wandb.run`` (HF's ``WandbCallback`` starts it at train begin, a
DeepSpeed ``monitor.wandb`` section at ``deepspeed.initialize``, a loop by ``wandb.init``).
Offline runs record alerts in the run file without sending them.
"""
from __future__ import annotations

import sys
from typing import Mapping

from .. import keys
from ..params import at_least
from .sink import Alert, DeliveryError, MetricSink, alert_text, alert_title

_LEVELS = {"info": "INFO", "warning": "WARN", "critical": "ERROR"}


class NotifyWandb(MetricSink):
    """``run.alert(title, text, level, wait_duration)`` + ``run.log`` of ``stability/*`` metrics.

    The title is stable per kind and severity because W&B throttles per title
    (``wait_duration_s``). Metrics are logged without ``step=`` against their own x-axis
    ``stability/step`` (``define_metric``), so they never fight the framework's own step
    counter. Each alert also logs ``stability/finding/<kind>`` = severity code (1 info,
    2 warning, 3 critical), the key scheme of :mod:`~stability_callbacks.keys` that the
    integrations use too. Keys: ``min_severity`` (warning), ``rate_limit_s`` (300),
    ``wait_duration_s`` (300), ``metrics`` (True), ``metrics_every_n_steps`` (1),
    ``queue_size``. ``run`` (not a config key) is the integration's W&B run.
    """

    name = "wandb"

    def __init__(self, run=None, *, min_severity: str = "warning", rate_limit_s: float = 300.0,
                 wait_duration_s: float = 300.0, metrics: bool = True, metrics_every_n_steps: int = 1,
                 queue_size: int = 1024):
        super().__init__(min_severity=min_severity, rate_limit_s=rate_limit_s, queue_size=queue_size,
                         metrics=metrics, metrics_every_n_steps=metrics_every_n_steps)
        # wandb turns 0 into its 1-minute default; insist on a positive value instead.
        self.wait_duration_s = float(at_least("wait_duration_s", wait_duration_s, 1))
        self._run = run
        self._axis_defined_for = None

    def _current_run(self):
        if self._run is not None:
            return self._run
        wandb = sys.modules.get("wandb")   # only if the user's code imported it
        run = getattr(wandb, "run", None) if wandb is not None else None
        if run is None:
            raise DeliveryError("no active W&B run (wandb.init() not called yet)", retryable=False)
        return run

    def _define_axis(self, run) -> None:
        if self._axis_defined_for is not run:
            run.define_metric(keys.STEP_AXIS)
            run.define_metric(keys.PREFIX + "*", step_metric=keys.STEP_AXIS)
            self._axis_defined_for = run

    def deliver(self, alert: Alert) -> None:
        f = alert.finding
        run = self._current_run()
        run.alert(title=alert_title(f), text=alert_text(alert, markdown=False),
                  level=_LEVELS[f.severity], wait_duration=self.wait_duration_s)
        if self.metrics:
            self._define_axis(run)
            run.log({keys.finding_tag(f.kind): keys.SEVERITY_CODE[f.severity], keys.STEP_AXIS: f.step})

    def write_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        run = self._current_run()
        self._define_axis(run)
        row: dict = keys.charted(metrics)
        row[keys.STEP_AXIS] = step
        run.log(row)
