"""Generic webhook: one templated JSON POST per alert, stdlib ``urllib`` (no dependency).

Works with anything that takes a JSON POST: Discord (``template: {content: "{text}"}``), an MS
Teams connector (``{text: "{text}"}``), Mattermost, a pager bridge, your own service. 2xx is
success; 429 (with ``Retry-After``), 5xx, timeouts and connection errors are retried by the
dispatcher; other 4xx are permanent. The URL and the header values are secrets (a token in the
path or query, ``Authorization``): they come from the environment (``"${ALERT_WEBHOOK_URL}"``,
``"Bearer ${ALERT_TOKEN}"``), are redacted from every description we log, and never in ``repr``.
"""
from __future__ import annotations

import http.client
import json
import os
import re
import socket
import string
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Mapping

from ..params import at_least, check, flag
from .sink import Alert, AlertSink, DeliveryError, alert_text, alert_title, env_reference, expand_env

#: What a template may use. A string value that is exactly one placeholder keeps the field's
#: JSON type (``"{step}"`` → 7010, ``"{finding}"`` → the finding object); inside other text
#: every field is formatted as text (``{{`` / ``}}`` for literal braces).
TEMPLATE_FIELDS = ("title", "text", "kind", "severity", "step", "message", "run", "report",
                   "finding")
DEFAULT_TEMPLATE = {"title": "{title}", "text": "{text}", "run": "{run}", "finding": "{finding}"}
_HEADER_NAME = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")   # an HTTP token (RFC 9110)


class NotifyWebhook(AlertSink):
    """POST each alert as JSON to a URL (rank 0, background thread).

    Keys: ``url`` (literal or ``"${ENV_VAR}"``), ``headers`` (name → value; values may hold
    ``${ENV_VAR}``), ``template`` (the JSON body, with placeholders :data:`TEMPLATE_FIELDS`;
    default :data:`DEFAULT_TEMPLATE`), ``required`` (false: an unset URL variable turns the
    sink off instead of raising), ``timeout_s`` per request, plus the :class:`AlertSink` keys.
    Cost: one HTTP request per alert that passes the rate limit, off the training thread.

    >>> NotifyWebhook(url="${ALERT_WEBHOOK_URL}", template={"content": "{txt}"})
    Traceback (most recent call last):
    ...
    ValueError: template.content: unknown placeholder {txt} (known: title, text, kind, severity, step, message, run, report, finding)
    """

    name = "webhook"
    url_key = "url"                        # the config key holding the URL (Slack: webhook_url)
    url_hint = "an http(s) URL"
    markdown = False

    def __init__(self, *, url: str, headers: Mapping[str, str] | None = None,
                 template: Any = None, required: bool = True, min_severity: str = "warning",
                 rate_limit_s: float = 600.0, timeout_s: float = 5.0, max_retries: int = 3,
                 backoff_s: float = 1.0, max_backoff_s: float = 30.0, queue_size: int = 64):
        super().__init__(min_severity=min_severity, rate_limit_s=rate_limit_s,
                         queue_size=queue_size, max_retries=max_retries, backoff_s=backoff_s,
                         max_backoff_s=max_backoff_s)
        self.required = flag("required", required)
        self.timeout_s = float(at_least("timeout_s", timeout_s, 0.001))
        self._set_url(url)
        headers = {} if headers is None else headers
        check("headers", headers, isinstance(headers, Mapping), "a mapping of header names to values")
        for k, v in headers.items():
            if not isinstance(k, str) or not _HEADER_NAME.match(k):
                raise ValueError(f"headers: {k!r} is not an HTTP header name")
            env_reference(f"headers.{k}", v)   # a string; never echoed (it may be a token)
            if "\r" in v or "\n" in v:
                raise ValueError(f"headers.{k}: a header value cannot contain a line break")
        self._header_config = dict(headers)
        self.template = DEFAULT_TEMPLATE if template is None else template
        _check_template("template", self.template)
        self._headers: dict[str, str] = {}
        self._secrets: list[tuple[str, str]] = []

    # -- configuration --------------------------------------------------------------------------
    def _set_url(self, url: Any) -> None:
        key = self.url_key
        self._url_variable = env_reference(key, url)
        self._url: str | None = None
        if self._url_variable is None:
            if not _is_http_url(url.strip()):
                # Name where it came from, never the value: a malformed URL is still a secret.
                raise ValueError(f"{key}: the literal value is not {self.url_hint}")
            self._url = url.strip()
        self.url_source = f"${{{self._url_variable}}}" if self._url_variable else "a literal URL"

    def resolve(self) -> str | None:
        key = self.url_key
        if self._url_variable is not None:
            url = (os.environ.get(self._url_variable) or "").strip()
            if not url:
                if self.required:
                    raise ValueError(f"{key}: environment variable {self._url_variable} is not set")
                return "its environment variable is unset and required is false"
            if not _is_http_url(url):
                raise ValueError(f"{key}: environment variable {self._url_variable} is not "
                                 f"{self.url_hint}")
            self._url = url
        self._headers = {k: expand_env(f"headers.{k}", v) for k, v in self._header_config.items()}
        for k, v in self._headers.items():
            if "\r" in v or "\n" in v:
                raise ValueError(f"headers.{k}: the value from the environment contains a line break")
        resolved = self._url
        assert resolved is not None   # the literal URL (_set_url) or the variable's value (above)
        secrets = [(resolved, "<webhook>")]
        path = urllib.parse.urlsplit(resolved)
        tail = path.path + (f"?{path.query}" if path.query else "")
        if len(tail) > 1:
            secrets += [(tail, "<webhook-path>"), (path.path, "<webhook-path>")]
        if path.query:
            secrets.append((path.query, "<webhook-query>"))
        secrets += [(v, "<secret>") for v in self._headers.values() if v]
        self._secrets = [(s, r) for s, r in secrets if len(s) > 1]
        return None

    def __repr__(self) -> str:
        return (f"{type(self).__name__}({self.url_key}=<{self.url_source}>, "
                f"headers={sorted(self._header_config)}, min_severity={self.min_severity!r}, "
                f"rate_limit_s={self.rate_limit_s})")

    # -- delivery -------------------------------------------------------------------------------
    def payload(self, alert: Alert) -> Any:
        f = alert.finding
        fields = {"title": alert_title(f), "text": alert_text(alert, markdown=self.markdown),
                  "kind": f.kind, "severity": f.severity, "step": f.step, "message": f.message,
                  "run": alert.run_name, "report": alert.report_path or "", "finding": f.to_json()}
        return _render(self.template, fields)

    def deliver(self, alert: Alert) -> None:
        if self._url is None:
            raise DeliveryError(f"{self.url_key} not resolved", retryable=False)
        data = json.dumps(self.payload(alert)).encode("utf-8")
        request = urllib.request.Request(self._url, data=data, method="POST",
                                         headers={"Content-Type": "application/json", **self._headers})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
                response.read(1024)
        except urllib.error.HTTPError as exc:
            # str(HTTPError) is "HTTP Error 500: ..." (no URL), but exc.url holds it: never log exc.
            body = _read_short(exc)
            retry_after = _retry_after_s(exc.headers.get("Retry-After") if exc.headers else None)
            retryable = exc.code == 429 or exc.code >= 500
            raise DeliveryError(self.redact(f"HTTP {exc.code}{': ' + body if body else ''}"),
                                retryable=retryable, retry_after_s=retry_after) from None
        except urllib.error.URLError as exc:
            raise DeliveryError(self.redact(f"connection error: {_reason(exc.reason)}"),
                                retryable=True) from None
        except (TimeoutError, socket.timeout):
            raise DeliveryError(f"no answer within timeout_s={self.timeout_s:g}",
                                retryable=True) from None
        except (http.client.HTTPException, ConnectionError, OSError) as exc:
            raise DeliveryError(self.redact(f"connection error: {type(exc).__name__}"),
                                retryable=True) from None

    def redact(self, text: str) -> str:
        for secret, mark in self._secrets:
            text = text.replace(secret, mark)
        return text


# -- templates ------------------------------------------------------------------------------------
_WHOLE = re.compile(r"^\{(\w+)\}$")
_SAMPLE = {"title": "t", "text": "t", "kind": "k", "severity": "s", "step": 1, "message": "m",
           "run": "r", "report": "", "finding": {}}


def _check_template(key: str, value: Any) -> None:
    """JSON-shaped (mappings with string keys, lists, strings, numbers, booleans, null) and only
    known placeholders; checked once, at construction."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            if not isinstance(k, str):
                raise ValueError(f"{key}: keys must be strings, got {k!r}")
            _check_template(f"{key}.{k}", v)
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            _check_template(f"{key}[{i}]", v)
    elif isinstance(value, str):
        try:
            names = [name for _, name, _, _ in string.Formatter().parse(value) if name is not None]
        except ValueError as e:
            raise ValueError(f"{key}: {e} in {value!r} (write {{{{ and }}}} for literal braces)") from None
        for name in names:
            if name not in TEMPLATE_FIELDS:
                raise ValueError(f"{key}: unknown placeholder {{{name}}} "
                                 f"(known: {', '.join(TEMPLATE_FIELDS)})")
        try:
            value.format_map(_SAMPLE)
        except (ValueError, TypeError) as e:
            raise ValueError(f"{key}: {e} in {value!r}") from None
    elif value is not None and not isinstance(value, (bool, int, float)):
        raise ValueError(f"{key} must be JSON (a mapping, list, string, number, boolean or null), "
                         f"got {type(value).__name__}")


def _render(value: Any, fields: dict[str, Any]) -> Any:
    if isinstance(value, Mapping):
        return {k: _render(v, fields) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_render(v, fields) for v in value]
    if isinstance(value, str):
        m = _WHOLE.match(value)
        if m and m.group(1) in fields:
            return fields[m.group(1)]
        return value.format_map({k: json.dumps(v) if isinstance(v, dict) else v
                                 for k, v in fields.items()})
    return value


# -- HTTP details -----------------------------------------------------------------------------------
def _is_http_url(url: str) -> bool:
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and bool(parts.hostname)


def _read_short(exc: urllib.error.HTTPError) -> str:
    try:
        return exc.read(200).decode("utf-8", "replace").strip()
    except Exception:
        return ""


def _retry_after_s(value: str | None) -> float | None:
    if value is None:
        return None
    try:
        seconds = float(value)
    except ValueError:
        return None   # an HTTP date: fall back to our own backoff
    return seconds if seconds >= 0 else None


def _reason(reason) -> str:
    if isinstance(reason, (TimeoutError, socket.timeout)):
        return "timed out"
    if isinstance(reason, OSError) and reason.strerror:
        return reason.strerror
    return type(reason).__name__ if isinstance(reason, BaseException) else str(reason)
