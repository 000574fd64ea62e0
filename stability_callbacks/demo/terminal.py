"""What the demo's user sees: a listener on the run (records, findings, checkpoints, actions)
that prints them as they happen and keeps the outcome, and a local Slack-compatible inbox."""
from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from ..control import Action
from ..live import RunListener
from ..record import Finding, StepRecord

STYLE = {"info": "dim", "warning": "bold yellow", "critical": "bold red"}


class LocalSlackInbox:
    """A Slack-incoming-webhook look-alike on ``127.0.0.1`` (a thread): answers ``ok`` to every
    POST and hands the message text to ``on_message``. The demo points ``actions.slack`` at it
    so the real sink, with its queue and retries, delivers the alerts the user sees arrive."""

    def __init__(self, on_message):
        inbox = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                try:
                    text = json.loads(body.decode("utf-8")).get("text", "")
                except ValueError:
                    text = body.decode("utf-8", "replace")
                # Shown before the answer: once the sink has its "ok", the run may end.
                inbox.messages.append(text)
                on_message(text)
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *args):   # no access log on the terminal
                pass

        self.messages: list[str] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, name="demo-inbox",
                                        daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/services/demo/webhook"

    def __enter__(self) -> "LocalSlackInbox":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._server.shutdown()
        self._server.server_close()


@dataclass
class DemoOutcome:
    """What the run did, for the summary and the exit code."""

    scenario: str
    framework: str
    max_steps: int
    fault_steps: tuple
    expected: dict
    last_step: int = 0
    halted_at: int | None = None
    checkpoints: list = field(default_factory=list)       # [(step, path, reason)]
    interval_changes: list = field(default_factory=list)  # [(step, old, new)]
    rollback: Finding | None = None
    findings: list = field(default_factory=list)
    records: list = field(default_factory=list)
    alerts: list = field(default_factory=list)
    report_html: Path | None = None
    report_png: Path | None = None
    exit_code: int = 0
    auto_rollback: bool = False
    rollbacks: list = field(default_factory=list)          # the run log's rollback actions
    timeline: object = None                                # the stitched run (after a rollback)
    timeline_png: Path | None = None


class LiveDisplay(RunListener):
    """The terminal: a listener on the run's records, findings, checkpoints and actions (every
    framework alike), printing them as they happen and keeping the outcome."""

    def __init__(self, console, outcome: DemoOutcome, *, user_save_steps: int):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.console = console
        self.outcome = outcome
        self.progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), TextColumn("loss {task.fields[loss]}"),
                                 TimeElapsedColumn(), console=console, transient=False)
        self.task = self.progress.add_task("training", total=outcome.max_steps, loss="-")
        self.user_save_steps = self._interval = user_save_steps
        self._advice: Finding | None = None
        self._save_reasons: dict[int, str] = {}

    def __enter__(self) -> "LiveDisplay":
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()

    def _print(self, text: str) -> None:
        self.console.print(text, highlight=False)

    def on_segment(self, segment: int, start_step: int, reason: str) -> None:
        if reason == "rollback":
            self.progress.update(self.task, description="[yellow]rolled back")
            self._print(f"[bold yellow]step {start_step:>3}  SEGMENT  rolled back: training goes on from the "
                        f"checkpoint of step {start_step}; what came after it is an abandoned branch[/]")

    def on_record(self, record: StepRecord) -> None:
        self.outcome.last_step = record.step
        loss = record.metrics.get("loss")
        self.progress.update(self.task, completed=record.step, loss="-" if loss is None else f"{loss:.3f}")

    def on_finding(self, f: Finding) -> None:
        if f.kind == "rollback_advice":
            self._advice = f    # shown with the halt, in its native forms
            return
        self._print(f"[{STYLE.get(f.severity, '')}]step {f.step:>3}  {f.severity.upper():<8} {f.kind}[/]  "
                    f"{f.message}")

    def on_action(self, a: Action) -> None:
        if a.action == "save_interval":
            new = a.interval or self.user_save_steps
            self._print(f"[bold cyan]step {a.step:>3}  ACTION   save interval {self._interval} → {new} "
                        f"steps[/] ({a.reason})")
            self.outcome.interval_changes.append((a.step, self._interval, new))
            self._interval = new
        elif a.action == "stop":
            self.outcome.halted_at = a.step
            self.progress.update(self.task, description="[red]halted")
            self._print(f"[bold red]step {a.step:>3}  ACTION   training halted on {a.reason}[/]")
            if self._advice is not None:
                self._rollback(self._advice)
        elif a.action == "save":
            self._save_reasons[a.step] = a.reason   # printed with its checkpoint, next
        elif a.action == "rollback":
            self._print(f"[bold yellow]step {a.step:>3}  ACTION   automatic rollback[/] to {a.path}: {a.reason}"
                        + (f"; LR x{a.details['lr_factor']:g} for {a.details['lr_factor_steps']} steps"
                           if a.details and a.details.get("lr_factor", 1.0) != 1.0 else ""))
        else:
            self._print(f"[bold cyan]step {a.step:>3}  ACTION   {a.action}[/] {a.reason}")

    def on_checkpoint(self, step: int, path: str | None) -> None:
        reason = self._save_reasons.pop(step, None) or (
            "regular save interval" if step % self.user_save_steps == 0 else "end of training")
        self.outcome.checkpoints.append((step, path, reason))
        self._print(f"[bold cyan]step {step:>3}  ACTION   checkpoint saved[/] {path} ({reason})")

    def alert(self, text: str) -> None:
        self.outcome.alerts.append(text)
        head = text.splitlines()[0] if text else ""
        self._print(f"[magenta]         INBOX    Slack alert received:[/] {head}")

    def _rollback(self, advice: Finding) -> None:
        from ..actions.rollback import native_forms

        self.outcome.rollback = advice
        lines = [f"[bold red]step {advice.step:>3}  CRITICAL rollback_advice[/]  {advice.message}"]
        try:
            forms = native_forms(advice.details)
            lines.append("         in each framework's own terms:")
            lines += [f"           [bold]{name:<9}[/] {text}" for name, text in forms.items()]
        except ValueError as e:
            lines.append(f"         (no native forms: {e})")
        # One print: alerts arriving from the inbox thread must not land inside the block.
        self._print("\n".join(lines))
