"""A real local HTTP endpoint for the alert sinks of the crash and hang tests.

It takes what the ``webhook`` sink posts (its default JSON body carries the finding) and what
Apprise's ``json://`` target posts (title ``stability: <kind> (<severity>)``), keeps every body,
and sets one event per finding kind it has received, so a test waits on the delivery itself
(:meth:`AlertInbox.wait_for`) instead of sleeping. ``on_kind`` runs a callback on the server's
thread when a kind arrives (the hang test releases its stalled training step with it).
"""
from __future__ import annotations

import json
import re
import threading
from collections import defaultdict

from stability_callbacks.demo.terminal import LocalSlackInbox

_TITLE = re.compile(r"stability: (\w+) \((\w+)\)")


class AlertInbox(LocalSlackInbox):
    """The demo's local inbox (a threaded HTTP server answering ``ok``), keeping what arrives."""

    path = "/alerts"

    def __init__(self):
        super().__init__()
        self.alerts: list[dict] = []          # {"kind", "severity", "step", "body"} per POST
        self.on_kind: dict[str, object] = {}  # kind -> callable, run once when it arrives
        self._events: dict[str, threading.Event] = defaultdict(threading.Event)
        self._lock = threading.Lock()

    def wait_for(self, kind: str, timeout_s: float = 60.0) -> bool:
        """True once an alert of ``kind`` has arrived (False after ``timeout_s``: a failure)."""
        with self._lock:
            event = self._events[kind]
        return event.wait(timeout_s)

    def kinds(self) -> list[tuple]:
        """``(step, kind, severity)`` of every alert received, in order (step None for Apprise)."""
        with self._lock:
            return [(a["step"], a["kind"], a["severity"]) for a in self.alerts]

    def received(self, raw: bytes) -> None:   # recorded before the sender hears back
        body = json.loads(raw)
        finding = body.get("finding") if isinstance(body.get("finding"), dict) else None
        m = _TITLE.search(body.get("title") or "")
        alert = {"kind": finding["kind"] if finding else m and m.group(1),
                 "severity": finding["severity"] if finding else m and m.group(2),
                 "step": finding["step"] if finding else None, "body": body}
        with self._lock:
            self.alerts.append(alert)
            event = self._events[alert["kind"]]
            callback = self.on_kind.pop(alert["kind"], None)
        if callback is not None:
            callback()
        event.set()
