"""Python ``logging`` of findings: the sink that works everywhere, with nothing to configure."""
from __future__ import annotations

import logging

from ..params import text
from .sink import Alert, AlertSink, alert_text

_LEVELS = {"info": logging.INFO, "warning": logging.WARNING, "critical": logging.ERROR}


class LogFindings(AlertSink):
    """One log record per finding on the logger ``stability_callbacks.findings``.

    Levels: info → INFO, warning → WARNING, critical → ERROR. Inline (on the caller's thread):
    a local log call is cheap and keeps findings in order with the training log. Keys:
    ``min_severity`` (default ``info``), ``rate_limit_s`` per kind (default 0: every finding),
    ``logger`` (name).

    >>> LogFindings(min_severity="loud")
    Traceback (most recent call last):
    ...
    ValueError: min_severity must be one of ('info', 'warning', 'critical'), got 'loud'
    """

    name = "log"
    inline = True

    def __init__(self, *, min_severity: str = "info", rate_limit_s: float = 0.0,
                 logger: str = "stability_callbacks.findings"):
        super().__init__(min_severity=min_severity, rate_limit_s=rate_limit_s)
        self.logger_name = text("logger", logger)
        self._logger = logging.getLogger(logger)

    def deliver(self, alert: Alert) -> None:
        f = alert.finding
        self._logger.log(_LEVELS[f.severity], "%s", alert_text(alert, markdown=False).replace(
            "\n", " | "), extra={"stability_finding": f.to_json()})
