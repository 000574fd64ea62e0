"""Slack incoming webhook: the generic webhook with Slack's body, one mrkdwn message per alert.

Slack answers 200 ``ok``; 4xx with a short code (``invalid_payload``, ``no_service``) is
permanent; 429 carries ``Retry-After``; 5xx and timeouts are worth a retry (Slack's incoming-webhook
error reference).
The URL is the secret (whoever has it can post): it is read from the environment
(``"${SLACK_WEBHOOK_URL}"``), redacted from every description we log, and never in ``repr``.
"""
from __future__ import annotations

from ..params import check
from .sink import Alert, alert_text
from .webhook import NotifyWebhook


class NotifySlack(NotifyWebhook):
    """POST each alert to a Slack incoming webhook (rank 0, background thread).

    Keys: ``webhook_url`` (a URL or ``"${ENV_VAR}"``), ``channel`` (optional; honoured by legacy
    webhooks only), ``required`` (False: an unset variable turns Slack off instead of raising),
    ``timeout_s`` per request, plus the :class:`AlertSink` keys. Cost: one HTTP request per
    alert that passes the rate limit, off the training thread.

    >>> NotifySlack(webhook_url="${NO_SUCH_VARIABLE_SET}").resolve()
    Traceback (most recent call last):
    ...
    ValueError: webhook_url: environment variable NO_SUCH_VARIABLE_SET is not set
    """

    name = "slack"
    url_key = "webhook_url"
    url_hint = "an http(s) URL (expected https://hooks.slack.com/services/...)"
    markdown = True

    def __init__(self, *, webhook_url: str, channel: str | None = None, required: bool = True,
                 min_severity: str = "warning", rate_limit_s: float = 600.0,
                 timeout_s: float = 5.0, max_retries: int = 3, backoff_s: float = 1.0,
                 max_backoff_s: float = 30.0, queue_size: int = 64):
        super().__init__(url=webhook_url, required=required, min_severity=min_severity,
                         rate_limit_s=rate_limit_s, timeout_s=timeout_s, max_retries=max_retries,
                         backoff_s=backoff_s, max_backoff_s=max_backoff_s, queue_size=queue_size)
        self.channel = check("channel", channel, channel is None or (
            isinstance(channel, str) and bool(channel.strip())), "a non-empty string")

    def __repr__(self) -> str:
        return (f"NotifySlack(webhook_url=<{self.url_source}>, channel={self.channel!r}, "
                f"min_severity={self.min_severity!r}, rate_limit_s={self.rate_limit_s})")

    def payload(self, alert: Alert) -> dict:
        body = {"text": alert_text(alert, markdown=True)}
        if self.channel:
            body["channel"] = self.channel
        return body
