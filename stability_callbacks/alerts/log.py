"""Python ``logging`` of findings: the sink that works everywhere, with nothing to configure, and
the console a live run prints on when the application has configured no logging."""
from __future__ import annotations

import contextlib
import logging
import sys

from ..params import text
from .sink import Alert, AlertSink, finding_line

_LEVELS = {"info": logging.INFO, "warning": logging.WARNING, "critical": logging.ERROR}

#: The package's logger: every line a live run prints goes through it (or a child of it).
LOGGER = "stability_callbacks"


class LogFindings(AlertSink):
    """One log record per finding on the logger ``stability_callbacks.findings``: one line,
    ``SEVERITY: kind at step N: <the message's first sentence>``
    (:func:`~.sink.finding_line`); the whole finding is the record's ``stability_finding``
    attribute, and its full text is in the run log and the report.

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
        self._logger.log(_LEVELS[f.severity], "%s", finding_line(f), extra={"stability_finding": f.to_json()})


class ConsoleHandler(logging.Handler):
    """Standard error, one line per record, without breaking a progress bar: while a ``tqdm``
    bar is drawn (the HF Trainer's, Lightning's) the line goes through tqdm's own
    ``external_write_mode``, which clears the bars, prints and draws them again. Once the
    application configures logging (a root handler), that handler prints instead: this one
    removes itself and gives the logger's level back (:func:`show_on_console` set it), so
    nothing is printed twice and the application's levels hold.
    """

    def __init__(self, *, owns_level: bool = False):
        super().__init__(logging.INFO)
        self.setFormatter(logging.Formatter("%(message)s"))
        self.owns_level = owns_level

    def emit(self, record: logging.LogRecord) -> None:
        if logging.getLogger().handlers:
            lib = logging.getLogger(LOGGER)
            lib.removeHandler(self)
            if self.owns_level:
                lib.setLevel(logging.NOTSET)
            return
        try:
            stream = sys.stderr
            with contextlib.ExitStack() as bars:
                for cls in _bar_classes():
                    bars.enter_context(cls.external_write_mode(file=stream))
                stream.write(self.format(record) + "\n")
                stream.flush()
        except Exception:
            self.handleError(record)


def _bar_classes() -> list:
    """The tqdm classes with bars alive (``tqdm.auto``'s and ``tqdm.std``'s keep separate sets),
    or none when tqdm was never imported (it is the framework's, never imported here)."""
    std = sys.modules.get("tqdm.std")
    if std is None:
        return []
    found, todo = [], [std.tqdm]
    while todo:
        cls = todo.pop()
        todo.extend(cls.__subclasses__())
        if cls.__dict__.get("_instances"):
            found.append(cls)
    return found


def show_on_console() -> None:
    """Print the package's INFO-and-up lines (findings, warnings, a run's summary) on standard
    error when the application configured no logging, as Lightning does for its own logger
    (``lightning/pytorch/__init__.py``): a :class:`ConsoleHandler` on ``stability_callbacks``.
    Without it only warnings would show, through Python's last-resort handler, glued onto a
    progress bar. Nothing changes where the application has a root handler or one of its own on
    this logger. Idempotent."""
    lib = logging.getLogger(LOGGER)
    if lib.handlers or logging.getLogger().handlers:
        return
    owns_level = lib.level == logging.NOTSET
    lib.addHandler(ConsoleHandler(owns_level=owns_level))
    if owns_level:
        lib.setLevel(logging.INFO)
