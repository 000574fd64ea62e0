"""What every alert sink shares: the common config keys, the delivery error, secrets from the
environment, message text.

A sink turns one :class:`Alert` into one delivery (a Slack POST, a W&B alert, a TensorBoard
text event, a log line). It never filters, retries or queues: the
:class:`~stability_callbacks.alerts.dispatch.AlertDispatcher` does that for all of them, so a
sink is a few lines around its transport.
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, Mapping

from ..params import at_least, flag, int_at_least, one_of, positive_int
from ..record import SEVERITIES, Finding, severity_rank


@dataclass(slots=True)
class Alert:
    """One finding as a sink delivers it, with the run context the message needs."""

    finding: Finding
    run_name: str
    report_path: str | None = None
    suppressed: int = 0          # findings of this kind held back by the rate limit since the last one
    #: The frameworks whose rollback form the message carries (None: all; ``()``: none).
    advice_forms: tuple[str, ...] | None = None


class DeliveryError(Exception):
    """A delivery failed. ``retryable`` (429, 5xx, timeout, connection) → the dispatcher backs off
    and tries again; otherwise it gives up at once. ``description`` is safe to log: no secret."""

    def __init__(self, description: str, *, retryable: bool, retry_after_s: float | None = None):
        super().__init__(description)
        self.description = description
        self.retryable = retryable
        self.retry_after_s = retry_after_s


class AlertSink:
    """Base class: the keys every sink accepts (keyword-only; the constructor is the config, and
    its keyword-only parameters are the sink's config keys).

    - ``min_severity``: findings below it are not delivered by this sink.
    - ``rate_limit_s``: at most one alert per finding kind per this many seconds; a higher
      severity of the same kind is never held back (an escalation must page).
    - ``queue_size``: pending deliveries kept for the background thread; beyond it new ones are
      dropped (counted, logged once) so a stuck endpoint costs bounded memory.
    - ``max_retries`` / ``backoff_s`` / ``max_backoff_s``: retries of a retryable failure with
      exponential backoff (``backoff_s * 2**attempt``, or the server's ``Retry-After``), capped.

    A constructor checks values only (no environment, no I/O); :meth:`resolve` reads what comes
    from the environment when the sinks are built for a run.
    """

    name = "sink"                 # the config section, e.g. "slack"
    inline = False                # True: delivered on the caller's thread (cheap, local sinks)
    handles_metrics = False       # True: also receives ``log_metrics`` batches
    run_bound = False             # True: writes into rank 0's own tracker run (never from another rank)
    metrics_every_n_steps = 1     # a metric sink writes the scalars of every n-th step

    def __init__(self, *, min_severity: str = "warning", rate_limit_s: float = 300.0,
                 queue_size: int = 256, max_retries: int = 0, backoff_s: float = 1.0,
                 max_backoff_s: float = 30.0):
        self.min_severity = one_of("min_severity", min_severity, SEVERITIES)
        self.rate_limit_s = float(at_least("rate_limit_s", rate_limit_s, 0))
        self.queue_size = positive_int("queue_size", queue_size)
        self.max_retries = int_at_least("max_retries", max_retries, 0)
        self.backoff_s = float(at_least("backoff_s", backoff_s, 0))
        self.max_backoff_s = float(at_least("max_backoff_s", max_backoff_s, 0))

    def resolve(self) -> str | None:
        """Read what comes from the environment. ``None``: ready; a string: why this sink is
        off (``build_sinks`` leaves it out). Raises ``ValueError`` naming the key, never the
        secret, when the environment is wrong."""
        return None

    def wants(self, finding: Finding) -> bool:
        return severity_rank(finding.severity) >= severity_rank(self.min_severity)

    def deliver(self, alert: Alert) -> None:  # pragma: no cover - interface
        """Deliver one alert; raise :class:`DeliveryError` on failure."""
        raise NotImplementedError

    def write_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        """Record scalar metrics (only sinks with ``handles_metrics``)."""

    def wants_metrics(self, step: int) -> bool:
        """Whether the scalars of ``step`` go to :meth:`write_metrics`."""
        return self.handles_metrics and step % self.metrics_every_n_steps == 0

    def close(self) -> None:
        """Flush local buffers at shutdown (never blocks on the network)."""

    def redact(self, text: str) -> str:
        """``text`` with this sink's secrets removed (every logged description goes through it)."""
        return text


class MetricSink(AlertSink):
    """A sink that also charts the signals: a tracker (W&B, TensorBoard, Trackio) that writes
    ``stability/<key>`` scalars (docs/design.md, Metric keys) besides its alerts.

    Keys, besides :class:`AlertSink`'s: ``metrics`` (True: the scalars and a
    ``stability/finding/<kind>`` point per finding; False: alerts only) and
    ``metrics_every_n_steps`` (1: the scalars of every step the Monitor sees; n: of every
    n-th step). It writes into the run's own tracker, so only rank 0 has one.
    """

    handles_metrics = True
    run_bound = True

    def __init__(self, *, min_severity: str = "warning", rate_limit_s: float = 300.0,
                 queue_size: int = 256, max_retries: int = 0, backoff_s: float = 1.0,
                 max_backoff_s: float = 30.0, metrics: bool = True, metrics_every_n_steps: int = 1):
        super().__init__(min_severity=min_severity, rate_limit_s=rate_limit_s, queue_size=queue_size,
                         max_retries=max_retries, backoff_s=backoff_s, max_backoff_s=max_backoff_s)
        self.metrics = flag("metrics", metrics)
        self.metrics_every_n_steps = positive_int("metrics_every_n_steps", metrics_every_n_steps)

    def wants_metrics(self, step: int) -> bool:
        return self.metrics and step % self.metrics_every_n_steps == 0


# ---------------------------------------------------------------------------------------------
# Secrets from the environment: "${VAR}" as a whole value, or inside one ("Bearer ${TOKEN}").

_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def env_reference(key: str, value: Any) -> str | None:
    """Check a value that may name an environment variable; return the variable when the whole
    value is ``"${VAR}"``, else None (a literal). Never puts the value into a message."""
    if not isinstance(value, str) or not value.strip():
        got = "an empty string" if isinstance(value, str) else "a " + type(value).__name__
        raise ValueError(f"{key} must be a string (a literal or \"${{ENV_VAR}}\"), got {got}")
    m = _ENV_REF.fullmatch(value.strip())
    return m.group(1) if m else None


def expand_env(key: str, value: str) -> str:
    """``value`` with every ``${VAR}`` replaced by the variable's value; an unset variable
    raises ``ValueError`` naming ``key`` and the variable (not the value)."""
    def sub(m):
        v = os.environ.get(m.group(1))
        if not v:
            raise ValueError(f"{key}: environment variable {m.group(1)} is not set")
        return v
    return _ENV_REF.sub(sub, value.strip())


# ---------------------------------------------------------------------------------------------
# Message text, shared so that Slack, W&B and TensorBoard say the same thing.

_SEVERITY_EMOJI = {"info": ":information_source:", "warning": ":warning:",
                   "critical": ":rotating_light:"}


def alert_title(finding: Finding) -> str:
    """A stable title per kind and severity (W&B throttles per title; it must stay < 64 chars)."""
    return f"stability: {finding.kind} ({finding.severity})"[:63]


def alert_lines(alert: Alert, *, markdown: bool) -> list[str]:
    """The message as lines: headline, the finding's sentence, context, report, rollback forms.

    ``markdown=True`` gives Slack mrkdwn (``*bold*``, ``&<>`` escaped, code blocks)."""
    f = alert.finding
    esc = _slack_escape if markdown else (lambda s: s)
    if markdown:
        head = (f"{_SEVERITY_EMOJI.get(f.severity, '')} *{f.severity.upper()}: {f.kind}* "
                f"at step {f.step} (run `{esc(alert.run_name)}`)")
    else:
        head = f"{f.severity.upper()}: {f.kind} at step {f.step} (run {alert.run_name})"
    lines = [head, esc(f.message)]
    context = []
    if f.onset_step is not None and f.onset_step != f.step:
        context.append(f"onset step {f.onset_step}")
    if f.phase:
        context.append(f"LR phase {f.phase}")
    if f.in_warmup_risk_window:
        context.append("inside the warmup-end risk window")
    if f.signal and f.value is not None:
        context.append(f"{f.signal} = {_num(f.value)}"
                       + (f", baseline {_num(f.baseline)}" if f.baseline is not None else "")
                       + (f", threshold {_num(f.threshold)}" if f.threshold is not None else ""))
    if context:
        lines.append("; ".join(context))
    if alert.suppressed:
        lines.append(f"({alert.suppressed} more {f.kind} finding(s) held back by the rate limit "
                     f"since the last alert)")
    if alert.report_path:
        lines.append(f"Report: `{esc(alert.report_path)}`" if markdown
                     else f"Report: {alert.report_path}")
    if f.kind == "rollback_advice" and alert.advice_forms != ():
        lines.extend(_rollback_lines(f, alert.advice_forms, markdown=markdown))
    return lines


def alert_text(alert: Alert, *, markdown: bool) -> str:
    return "\n".join(alert_lines(alert, markdown=markdown))


#: The longest console line of a finding (:func:`finding_line`), in characters.
LINE_CHARS = 200
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z(])")


def first_sentence(text: str) -> str:
    """The first sentence of ``text``, on one line.

    >>> first_sentence("Loss rose to 9.1 at step 25. Roll back.")
    'Loss rose to 9.1 at step 25.'
    """
    return _SENTENCE_END.split(" ".join(text.split()), maxsplit=1)[0]


def finding_line(finding: Finding, limit: int = LINE_CHARS) -> str:
    """A finding as one console line: ``SEVERITY: kind at step N: <its first sentence>``, cut
    to ``limit`` characters (the full text is in the run log and the report).

    >>> finding_line(Finding(22, "nonfinite", "critical", "Loss is NaN at step 22. Roll back."))
    'CRITICAL: nonfinite at step 22: Loss is NaN at step 22.'
    """
    line = f"{finding.severity.upper()}: {finding.kind} at step {finding.step}: {first_sentence(finding.message)}"
    return line if len(line) <= limit else line[:limit - 3].rstrip() + "..."


def _rollback_lines(f: Finding, frameworks: tuple[str, ...] | None, *, markdown: bool) -> list[str]:
    from ..advice import FORM_LABELS, native_forms  # local: rollback is only needed for this one kind
    try:
        forms = native_forms(f.details, frameworks)
    except (KeyError, TypeError, ValueError) as exc:
        # The advice is still in the message; a malformed details dict must not lose the alert.
        return [f"(rollback forms unavailable: {type(exc).__name__})"]
    body = [f"{FORM_LABELS[k]}: {v}" for k, v in forms.items()]
    if markdown:
        return ["*Rollback advice*", "```", *[_slack_escape(b) for b in body], "```"]
    return ["Rollback advice:", *body]


def _slack_escape(text: str) -> str:
    # Slack mrkdwn treats these three as control characters (api.slack.com "Escaping text").
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _num(v: float) -> str:
    return f"{v:.4g}" if isinstance(v, float) else str(v)
