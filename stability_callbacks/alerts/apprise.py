"""Apprise: one alert to Discord, MS Teams, email, ntfy, PagerDuty, Telegram, ... (the optional
``apprise`` package: ``pip install 'stability-callbacks[apprise]'``).

Each URL is an Apprise notification URL (``discord://…``, ``msteams://…``, ``mailtos://…``,
``ntfy://…``, ``pagerduty://…``, ``json://host/path`` for any JSON endpoint) and a secret: it
comes from the environment (``"${APPRISE_URL}"``), is never printed, and while this sink is
alive the loggers Apprise writes through (``apprise``, ``urllib3``) get a filter that
redacts every URL and URL path in their records (Apprise logs the URL it posts to at DEBUG, and
a URL it cannot parse at ERROR). Apprise reports no HTTP status, so
every failed delivery is retried by the dispatcher (``max_retries``, with backoff).
"""
from __future__ import annotations

import inspect
import logging
import os
import re
from typing import Any

from ..params import at_least, check, flag
from .sink import Alert, AlertSink, DeliveryError, alert_text, alert_title, env_reference

_NOTIFY_TYPES = {"info": "info", "warning": "warning", "critical": "failure"}
#: Loggers that may print an Apprise URL or its path: Apprise itself, and urllib3 under
#: ``requests`` (``"POST /path HTTP/1.1" 200``).
_LOGGERS = ("apprise", "urllib3.connectionpool", "urllib3.connection", "urllib3.util.retry")
_ANY_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://\S+")
INSTALL_HINT = "the apprise package is not installed (pip install 'stability-callbacks[apprise]')"


class NotifyApprise(AlertSink):
    """Send each alert through Apprise to every URL in ``urls`` (rank 0, background thread).

    Keys: ``urls`` (one URL or a list; each a literal or ``"${ENV_VAR}"``), ``required``
    (false: unset variables are skipped, and the sink is off when none is set),
    ``timeout_s`` (the most one notify call may take; Apprise ≥ 2 stops waiting after it),
    plus the :class:`AlertSink` keys. Cost: Apprise's own requests, off the training thread.
    """

    name = "apprise"

    def __init__(self, *, urls: str | list[str], required: bool = True,
                 min_severity: str = "warning", rate_limit_s: float = 600.0,
                 timeout_s: float = 10.0, max_retries: int = 2, backoff_s: float = 1.0,
                 max_backoff_s: float = 30.0, queue_size: int = 64):
        super().__init__(min_severity=min_severity, rate_limit_s=rate_limit_s,
                         queue_size=queue_size, max_retries=max_retries, backoff_s=backoff_s,
                         max_backoff_s=max_backoff_s)
        try:
            import apprise  # noqa: F401  (optional: checked here, so a config names the problem)
        except ImportError:
            raise ValueError(INSTALL_HINT) from None
        self.required = flag("required", required)
        self.timeout_s = float(at_least("timeout_s", timeout_s, 0.001))
        items = [urls] if isinstance(urls, str) else urls
        check("urls", urls, isinstance(items, list) and bool(items), "a URL or a non-empty list of URLs")
        self._url_config = []
        for i, u in enumerate(items):
            variable = env_reference(f"urls[{i}]", u)
            if variable is None and "://" not in u:
                raise ValueError(f"urls[{i}]: the literal value is not an Apprise URL (scheme://...)")
            self._url_config.append((u.strip(), variable))
        self._apprise: Any = None   # apprise.Apprise, imported when the sink starts
        self._secrets: list[str] = []
        self._filter = _Redact(self)

    def __repr__(self) -> str:
        sources = [f"<${{{v}}}>" if v else "<a literal URL>" for _, v in self._url_config]
        return (f"NotifyApprise(urls=[{', '.join(sources)}], min_severity={self.min_severity!r}, "
                f"rate_limit_s={self.rate_limit_s})")

    def resolve(self) -> str | None:
        import apprise
        urls = []
        for i, (value, variable) in enumerate(self._url_config):
            if variable is None:
                urls.append((i, value, "the literal value"))
                continue
            v = (os.environ.get(variable) or "").strip()
            if v:
                urls.append((i, v, f"environment variable {variable}"))
            elif self.required:
                raise ValueError(f"urls[{i}]: environment variable {variable} is not set")
        if not urls:
            return "its environment variables are unset and required is false"
        # Every piece Apprise might print on its own (it splits on spaces and commas), longest first.
        pieces = {p for _, u, _ in urls for p in [u, *re.split(r"[\s,]+", u)] if len(p) > 3}
        for _, u, _ in urls:
            after = u.split("://", 1)[-1]
            pieces.add(after)
            if "/" in after:
                pieces.add("/" + after.split("/", 1)[1])
                pieces.add("/" + after.split("/", 1)[1].split("?", 1)[0])
        self._secrets = sorted((p for p in pieces if len(p) > 3), key=len, reverse=True)
        self._attach_filter()
        obj = apprise.Apprise()
        for i, u, where in urls:
            if not obj.add(u):
                self._detach_filter()
                raise ValueError(f"urls[{i}]: {where} is not a URL Apprise supports")
        self._apprise = obj
        self._timeout_kw = ({"timeout": self.timeout_s}
                            if "timeout" in inspect.signature(obj.notify).parameters else {})
        return None

    def deliver(self, alert: Alert) -> None:
        if self._apprise is None:
            raise DeliveryError("urls not resolved", retryable=False)
        f = alert.finding
        result = self._apprise.notify(body=alert_text(alert, markdown=False), title=alert_title(f),
                                      notify_type=_NOTIFY_TYPES[f.severity], body_format="text",
                                      **self._timeout_kw)
        if result:
            return
        status = getattr(getattr(result, "status", None), "name", None)
        if status == "TIMEOUT":
            raise DeliveryError(f"no answer within timeout_s={self.timeout_s:g}", retryable=True)
        services = list(result) if hasattr(result, "__iter__") else []
        failed = [getattr(s, "name", "?") for s in services if not s]
        what = (f"{len(failed)} of {len(services)} service(s) failed ({', '.join(failed)})"
                if services else "notify failed")
        raise DeliveryError(self.redact(f"apprise: {what}"), retryable=True)

    def close(self) -> None:
        self._detach_filter()

    def redact(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "<apprise-url>")
        return text

    def _attach_filter(self) -> None:
        for name in _LOGGERS:
            logging.getLogger(name).addFilter(self._filter)

    def _detach_filter(self) -> None:
        for name in _LOGGERS:
            logging.getLogger(name).removeFilter(self._filter)


class _Redact(logging.Filter):
    """Rewrites a record whose text holds one of the sink's secrets; drops nothing."""

    def __init__(self, sink: NotifyApprise):
        super().__init__()
        self.sink = sink

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            text = record.getMessage()
        except Exception:
            return True
        # Apprise shortens long URLs in its messages ("scheme://SECR...x"), so a shortened one
        # matches no secret: any URL in these loggers' text goes, then the known pieces.
        clean = self.sink.redact(_ANY_URL.sub("<apprise-url>", text))
        if clean != text:
            record.msg, record.args = clean, None
        return True
