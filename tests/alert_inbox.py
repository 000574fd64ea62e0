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
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

_TITLE = re.compile(r"stability: (\w+) \((\w+)\)")


class AlertInbox(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _Handler)
        self.alerts: list[dict] = []          # {"kind", "severity", "step", "body"} per POST
        self.on_kind: dict[str, object] = {}  # kind -> callable, run once when it arrives
        self._events: dict[str, threading.Event] = defaultdict(threading.Event)
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/alerts"

    def __enter__(self) -> "AlertInbox":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
        self.server_close()

    def wait_for(self, kind: str, timeout_s: float = 60.0) -> bool:
        """True once an alert of ``kind`` has arrived (False after ``timeout_s``: a failure)."""
        with self._lock:
            event = self._events[kind]
        return event.wait(timeout_s)

    def kinds(self) -> list[tuple]:
        """``(step, kind, severity)`` of every alert received, in order (step None for Apprise)."""
        with self._lock:
            return [(a["step"], a["kind"], a["severity"]) for a in self.alerts]

    def _received(self, body: dict) -> None:
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


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 (http.server's naming)
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.server._received(json.loads(body))   # recorded before the sender hears back
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass
