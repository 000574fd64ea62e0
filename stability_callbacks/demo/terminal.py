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


class LocalSlackInbox(ThreadingHTTPServer):
    """A Slack-incoming-webhook look-alike on ``127.0.0.1`` (a thread): answers ``ok`` to every
    POST and hands the message text to ``on_message`` first (once the sink has its ``ok``, the run
    may end). The demo points the real ``actions.slack`` sink, queue and retries, at it."""

    daemon_threads = True
    path = "/services/demo/webhook"

    def __init__(self, on_message=print):
        super().__init__(("127.0.0.1", 0), _Answer)
        self.on_message = on_message
        self._thread = threading.Thread(target=self.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}{self.path}"

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()
        self.server_close()

    def received(self, body: bytes) -> None:
        try:
            text = json.loads(body.decode("utf-8")).get("text", "")
        except ValueError:
            text = body.decode("utf-8", "replace")
        self.on_message(text)


class _Answer(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 (http.server's name)
        self.server.received(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):   # no access log on the terminal
        pass


@dataclass
class DemoOutcome:
    """What the run did, for the summary and the exit code (``timeline``: the run log, stitched)."""

    scenario: str
    framework: str
    max_steps: int
    fault_steps: tuple
    expected: dict
    auto_rollback: bool = False
    last_step: int = 0
    halted_at: int | None = None
    checkpoints: list = field(default_factory=list)       # [(step, path, reason)]
    interval_changes: list = field(default_factory=list)  # [(step, old, new)]
    rollback: Finding | None = None                       # the advice shown with the halt
    rollbacks: list = field(default_factory=list)         # automatic rollbacks, as run-log lines
    alerts: list = field(default_factory=list)
    timeline: object = None
    report_html: Path | None = None
    report_png: Path | None = None
    timeline_png: Path | None = None
    exit_code: int = 0


class LiveDisplay(RunListener):
    """The terminal: a listener on the run's records, findings, checkpoints and actions (every
    framework alike), printing them as they happen and keeping the outcome."""

    def __init__(self, console, outcome: DemoOutcome, *, user_save_steps: int):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.console, self.outcome = console, outcome
        self.progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("loss {task.fields[loss]}"), TimeElapsedColumn(), console=console)
        self.task = self.progress.add_task("training", total=outcome.max_steps, loss="-")
        self.user_save_steps = self._interval = user_save_steps
        self._advice: Finding | None = None
        self._save_reasons: dict[int, str] = {}

    def __enter__(self) -> "LiveDisplay":
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()

    def _print(self, step, what: str, text: str = "", style: str = "bold cyan") -> None:
        self.console.print(f"[{style}]{'' if step is None else f'step {step:>3}':<8}  {what}[/] {text}"
                           .rstrip(), highlight=False)

    def on_segment(self, segment: int, start_step: int, reason: str) -> None:
        if reason == "rollback":
            self.progress.update(self.task, description="[yellow]rolled back")
            self._print(start_step, "SEGMENT  rolled back: training goes on from the checkpoint of step "
                        f"{start_step}; what came after it is an abandoned branch", style="bold yellow")

    def on_record(self, record: StepRecord) -> None:
        self.outcome.last_step = record.step
        loss = record.metrics.get("loss")
        self.progress.update(self.task, completed=record.step, loss="-" if loss is None else f"{loss:.3f}")

    def on_finding(self, f: Finding) -> None:
        if f.kind == "rollback_advice":
            self._advice = f    # shown with the halt, in its native forms
        else:
            self._print(f.step, f"{f.severity.upper():<8} {f.kind}", f.message, STYLE.get(f.severity, ""))

    def on_action(self, a: Action) -> None:
        if a.action == "save_interval":
            new = a.interval or self.user_save_steps
            self._print(a.step, f"ACTION   save interval {self._interval} → {new} steps", f"({a.reason})")
            self.outcome.interval_changes.append((a.step, self._interval, new))
            self._interval = new
        elif a.action == "stop":
            self.outcome.halted_at = a.step
            self.progress.update(self.task, description="[red]halted")
            self._print(a.step, f"ACTION   training halted on {a.reason}", style="bold red")
            if self._advice is not None:
                self._rollback(self._advice)
        elif a.action == "save":
            self._save_reasons[a.step] = a.reason   # printed with its checkpoint, next
        elif a.action == "rollback":
            self.outcome.rollbacks.append(a.to_json())
            lr = (a.details or {}).get("lr_factor", 1.0)
            self._print(a.step, "ACTION   automatic rollback", f"to {a.path}: {a.reason}" + (
                f"; LR x{lr:g} for {a.details['lr_factor_steps']} steps" if lr != 1.0 else ""), "bold yellow")
        else:
            self._print(a.step, f"ACTION   {a.action}", a.reason)

    def on_checkpoint(self, step: int, path: str | None) -> None:
        reason = self._save_reasons.pop(step, None) or (
            "regular save interval" if step % self.user_save_steps == 0 else "end of training")
        self.outcome.checkpoints.append((step, path, reason))
        self._print(step, "ACTION   checkpoint saved", f"{path} ({reason})")

    def alert(self, text: str) -> None:
        self.outcome.alerts.append(text)
        self._print(None, "INBOX    Slack alert received:", text.splitlines()[0] if text else "", "magenta")

    def _rollback(self, advice: Finding) -> None:
        from ..advice import advice_forms_for, native_forms

        self.outcome.rollback = advice
        lines = [f"[bold red]step {advice.step:>3}  CRITICAL rollback_advice[/]  {advice.message}"]
        try:
            forms = native_forms(advice.details, advice_forms_for(self.outcome.framework))
            lines.append("         in the framework's own terms:")
            lines += [f"           [bold]{name:<9}[/] {text}" for name, text in forms.items()]
        except ValueError as e:
            lines.append(f"         (no native forms: {e})")
        # One print: alerts arriving from the inbox thread must not land inside the block.
        self.console.print("\n".join(lines), highlight=False)
