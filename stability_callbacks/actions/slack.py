"""Slack incoming webhook: one mrkdwn message per alert, stdlib ``urllib`` (no dependency).

Slack answers 200 ``ok``; 4xx with a short code (``invalid_payload``, ``no_service``) is
permanent; 429 carries ``Retry-After``; 5xx and timeouts are worth a retry (FRAMEWORK_NOTES 5).
The URL is the secret (whoever has it can post): it is read from the environment
(``"${SLACK_WEBHOOK_URL}"``), redacted from every description we log, and never in ``repr``.
"""
from __future__ import annotations

import http.client
import json
import socket
import urllib.error
import urllib.parse
import urllib.request

from .sink import (Alert, AlertSink, DeliveryError, alert_text, check_number,
                   resolve_env_reference)


class NotifySlack(AlertSink):
    """POST each alert to a Slack incoming webhook (rank 0, background thread).

    Keys: ``webhook_url`` (a URL or ``"${ENV_VAR}"``), ``channel`` (optional; honoured by legacy
    webhooks only), ``required`` (False: an unset variable turns Slack off instead of raising),
    ``timeout_s`` per request, plus the :class:`AlertSink` keys. Cost: one HTTP request per
    alert that passes the rate limit, off the training thread.

    >>> NotifySlack(webhook_url="${NO_SUCH_VARIABLE_SET}")
    Traceback (most recent call last):
    ...
    ValueError: actions.slack.webhook_url: environment variable NO_SUCH_VARIABLE_SET is not set
    """

    name = "slack"
    config_path = "actions.slack"
    CONFIG_KEYS = ("webhook_url", "channel", "required", "min_severity", "rate_limit_s",
                   "timeout_s", "max_retries", "backoff_s", "max_backoff_s", "queue_size")

    def __init__(self, *, webhook_url: str, channel: str | None = None, required: bool = True,
                 min_severity: str = "warning", rate_limit_s: float = 600.0,
                 timeout_s: float = 5.0, max_retries: int = 3, backoff_s: float = 1.0,
                 max_backoff_s: float = 30.0, queue_size: int = 64):
        super().__init__(min_severity=min_severity, rate_limit_s=rate_limit_s,
                         queue_size=queue_size, max_retries=max_retries, backoff_s=backoff_s,
                         max_backoff_s=max_backoff_s)
        key = "actions.slack.webhook_url"
        if not isinstance(required, bool):
            raise ValueError(f"actions.slack.required must be true or false, got {required!r}")
        url, variable = resolve_env_reference(key, webhook_url)
        self.url_source = f"${{{variable}}}" if variable else "a literal URL"
        self.enabled = True
        if url is None:
            if required:
                raise ValueError(f"{key}: environment variable {variable} is not set")
            self.enabled = False   # build_sinks leaves a disabled sink out
        elif not _is_http_url(url):
            # Name where it came from, never the value: a malformed URL is still a secret.
            where = f"environment variable {variable}" if variable else "the literal value"
            raise ValueError(f"{key}: {where} is not an http(s) URL "
                             f"(expected https://hooks.slack.com/services/...)")
        if channel is not None and (not isinstance(channel, str) or not channel.strip()):
            raise ValueError(f"actions.slack.channel must be a non-empty string, got {channel!r}")
        self._url = url
        self.channel = channel
        self.required = required
        self.timeout_s = check_number("actions.slack.timeout_s", timeout_s, minimum=0.001)

    def __repr__(self) -> str:
        return (f"NotifySlack(webhook_url=<{self.url_source}>, channel={self.channel!r}, "
                f"min_severity={self.min_severity!r}, rate_limit_s={self.rate_limit_s})")

    def payload(self, alert: Alert) -> dict:
        body = {"text": alert_text(alert, markdown=True)}
        if self.channel:
            body["channel"] = self.channel
        return body

    def deliver(self, alert: Alert) -> None:
        data = json.dumps(self.payload(alert)).encode("utf-8")
        request = urllib.request.Request(self._url, data=data, method="POST",
                                         headers={"Content-Type": "application/json"})
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
            raise DeliveryError(f"no answer within timeout_s={self.timeout_s}",
                                retryable=True) from None
        except (http.client.HTTPException, ConnectionError, OSError) as exc:
            raise DeliveryError(self.redact(f"connection error: {type(exc).__name__}"),
                                retryable=True) from None

    def redact(self, text: str) -> str:
        if self._url:
            text = text.replace(self._url, "<webhook>")
            path = urllib.parse.urlsplit(self._url).path
            if len(path) > 1:
                text = text.replace(path, "<webhook-path>")
        return text


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
