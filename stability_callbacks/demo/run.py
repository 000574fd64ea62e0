"""``stability-callbacks demo`` (``make demo``): a tiny real training run that goes wrong, caught live.

A 2-layer GPT-2 built from a config (:mod:`stability_callbacks.demo.scenarios`: nothing is
downloaded) trains with the HF ``Trainer`` and the :class:`~stability_callbacks.integrations.hf.
StabilityCallback` (``--framework lightning``: the Lightning ``Trainer`` and its callback;
``--framework deepspeed``: a hand-written loop on a one-process CPU DeepSpeed engine with
``attach(engine)``). The default scenario, ``warmup-spike``, is the BigScience tr8-104B story in
miniature: the LR warmup ends at step 18 and three steps later a pocket of corrupted batches
(uniform random tokens: a bad data shard) reaches the model, inside the warmup-end risk window.
Nothing is scripted on the monitoring side: the loss, grad norm and Adam statistics are the
Trainer's own, and every action below is the callback's, carried out by the Trainer.

What the terminal shows, as it happens: a progress bar; every finding (step, kind, sentence);
the save interval bumped inside the risk window (50 → 5 steps); each checkpoint and why it was
made (regular, bumped interval, extra save on a warning, save before the halt); the alerts
arriving at a local Slack-compatible inbox the demo starts on 127.0.0.1 (the real
``actions.slack`` sink posts to it: no network leaves the machine); the halt
(``policy.halt_on: critical``); the rollback advice in each framework's native form. At the end:
``report.html`` and ``report.png`` (the replay report of the run log) and a summary of what was
caught, when, and how that compares with the loss peak and the planted fault.

Exit code: 0 when the run caught what its scenario planted (``healthy``: no warning at all),
1 when it did not, 2 for a bad option or a framework whose demo is not available.
"""
from __future__ import annotations

import importlib.util
import json
import logging
import math
import os
import shutil
import threading
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from ..record import Finding, StepRecord, severity_rank

FRAMEWORKS = ("hf", "lightning", "deepspeed")
DEFAULT_SCENARIO = "warmup-spike"
#: The "user's" save interval, and the one the policy switches to inside the risk window and
#: after a warning (BigScience went from 1500 to 300 steps; scaled down to the demo's length).
USER_SAVE_STEPS = 50
BUMPED_SAVE_STEPS = 5
_FRAMEWORK_NAMES = {"hf": "the HF Trainer", "lightning": "the Lightning Trainer",
                    "deepspeed": "a DeepSpeed engine"}
# (modules, pip extras): the scenarios build the model with transformers on every framework.
_NEEDS = {"hf": (("torch", "transformers", "matplotlib"), "hf,report"),
          "lightning": (("torch", "transformers", "matplotlib", "lightning"), "hf,report,lightning"),
          "deepspeed": (("torch", "transformers", "matplotlib", "deepspeed"), "hf,report,deepspeed")}
_MONITOR_NAMES = {"hf": "StabilityCallback.attach(trainer)",
                  "lightning": "The Lightning StabilityCallback", "deepspeed": "attach(engine)"}
_STYLE = {"info": "dim", "warning": "bold yellow", "critical": "bold red"}


def demo_config(webhook_url: str) -> dict:
    """The monitor's configuration for the demo: defaults plus an opt-in halt, a save interval
    the demo's length can show, and Slack alerts to the local inbox."""
    return {
        "policy": {"halt_on": "critical", "bump_save_interval_to": BUMPED_SAVE_STEPS},
        # The terminal shows every finding itself; the log sink would print each one twice.
        "actions": {"slack": {"webhook_url": webhook_url, "min_severity": "warning",
                              "rate_limit_s": 0, "timeout_s": 2.0}},
    }


# --------------------------------------------------------------------------- the alert inbox
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


# ------------------------------------------------------------------------------ the terminal
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


class LiveDisplay:
    """Framework-neutral printing of what the monitor found and what the integration did."""

    def __init__(self, console, outcome: DemoOutcome):
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.console = console
        self.outcome = outcome
        self.progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(),
                                 MofNCompleteColumn(), TextColumn("loss {task.fields[loss]}"),
                                 TimeElapsedColumn(), console=console, transient=False)
        self.task = self.progress.add_task("training", total=outcome.max_steps, loss="-")
        self._shown = 0
        self._interval: int | None = None
        self.last_record: StepRecord | None = None

    def __enter__(self) -> "LiveDisplay":
        self.progress.start()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.stop()

    def step(self, step: int, run) -> None:
        self.outcome.last_step = step
        loss = None if self.last_record is None else self.last_record.metrics.get("loss")
        self.progress.update(self.task, completed=step,
                             loss="-" if loss is None else f"{loss:.3f}")
        self.findings(run)

    def findings(self, run) -> None:
        new = run.findings[self._shown:]
        self._shown = len(run.findings)
        for f in new:
            if f.kind == "rollback_advice":
                continue    # shown by rollback(), with its native forms
            style = _STYLE.get(f.severity, "")
            self.console.print(f"[{style}]step {f.step:>3}  {f.severity.upper():<8} {f.kind}[/]  "
                               f"{f.message}", highlight=False)

    def save_interval(self, step: int, interval: int | None) -> None:
        if interval != self._interval and self._interval is not None:
            why = ("the monitor's request: warmup-end risk window or a recent warning"
                   if interval == BUMPED_SAVE_STEPS else "back to the user's value")
            self.console.print(f"[bold cyan]step {step:>3}  ACTION   save interval "
                               f"{self._interval} → {interval} steps[/] ({why})", highlight=False)
            self.outcome.interval_changes.append((step, self._interval, interval))
        self._interval = interval

    def checkpoint(self, step: int, path: str, reason: str) -> None:
        self.outcome.checkpoints.append((step, path, reason))
        self.console.print(f"[bold cyan]step {step:>3}  ACTION   checkpoint saved[/] {path} "
                           f"({reason})", highlight=False)

    def alert(self, text: str) -> None:
        self.outcome.alerts.append(text)
        head = text.splitlines()[0] if text else ""
        self.console.print(f"[magenta]         INBOX    Slack alert received:[/] {head}",
                           highlight=False)

    def halt(self, step: int, run) -> None:
        """The integration is stopping training after ``step``: say why and what to do next."""
        self.outcome.halted_at = step
        self.progress.update(self.task, description="[red]halted")
        trigger = next((f for f in run.findings if f.step == step and f.severity == "critical"
                        and f.kind != "rollback_advice"), None)
        why = f" on {trigger.kind} (critical)" if trigger is not None else ""
        self.console.print(f"[bold red]step {step:>3}  ACTION   training halted{why}: "
                           f"policy.halt_on = critical[/]", highlight=False)
        advice = run.control.rollback   # the policy writes it with every halt
        self.findings(run)
        if advice is not None:
            self.rollback(advice)

    def rollback(self, advice: Finding) -> None:
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
        self.console.print("\n".join(lines), highlight=False)


# ------------------------------------------------------------------------------ frameworks
def _train_hf(sc, config: dict, ckpt_dir: Path, run_dir: Path, display: LiveDisplay) -> None:
    from transformers import Trainer, TrainerCallback, TrainingArguments
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    from ..integrations.hf import StabilityCallback

    args = TrainingArguments(
        output_dir=str(ckpt_dir), max_steps=sc.max_steps, per_device_train_batch_size=sc.batch_size,
        gradient_accumulation_steps=sc.grad_accum, learning_rate=sc.lr,
        warmup_steps=sc.warmup_steps, weight_decay=0.0, logging_steps=10,
        save_strategy="steps", save_steps=USER_SAVE_STEPS, report_to="none",
        train_sampling_strategy="sequential", use_cpu=True, disable_tqdm=True,
        logging_nan_inf_filter=False, seed=sc.seed)
    with _quiet_transformers():
        trainer = Trainer(model=sc.make_model(), args=args, train_dataset=sc.train_dataset())
    for cb in (PrinterCallback, ProgressCallback):   # the demo's own bar and lines instead
        trainer.remove_callback(cb)
    stability = StabilityCallback.attach(trainer, config=config, run_dir=run_dir,
                                         run_name=f"demo-{sc.name}")

    class ShowProgress(TrainerCallback):
        """Added after the StabilityCallback: sees this step's findings and the requests the
        callback has already turned into TrainerControl flags."""

        def __init__(self):
            self.save_reason: dict[int, str] = {}
            self.halted = False

        def on_train_begin(self, args, state, control, **kw):
            display.save_interval(0, state.save_steps)
            if stability.run is not None:
                _keep_last_record(stability.run, display)

        def on_step_end(self, args, state, control, **kw):
            run, step = stability.run, state.global_step
            if run is None:
                return
            display.step(step, run)
            display.save_interval(step, state.save_steps)
            if control.should_training_stop and run.control.stop and not self.halted:
                self.halted = True
                display.halt(step, run)
            if control.should_save:
                self.save_reason[step] = _save_reason(step, state, run, self.halted)

        def on_save(self, args, state, control, **kw):
            step = state.global_step
            display.checkpoint(step, str(Path(args.output_dir) / f"checkpoint-{step}"),
                               self.save_reason.pop(step, "end of training"))

        def on_train_end(self, args, state, control, **kw):
            if stability.run is not None:
                display.findings(stability.run)

    trainer.add_callback(ShowProgress())
    try:
        with _quiet_transformers():
            trainer.train()
    finally:
        stability.close()


@contextmanager
def _quiet_transformers():
    """Tiny-model warnings (no attention mask, loss_type), DeepSpeed's "Setting accelerator to
    CPU" (it is imported by the Trainer when installed) and the checkpoint writer's progress
    bars would drown the story; all restored afterwards. A filter, not a level: DeepSpeed sets
    its logger's level itself when it is first imported."""
    import transformers

    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    ds_logger = logging.getLogger("DeepSpeed")
    ds_filter = _BelowError()
    ds_logger.addFilter(ds_filter)
    try:
        yield
    finally:
        ds_logger.removeFilter(ds_filter)
        transformers.logging.set_verbosity(verbosity)
        transformers.utils.logging.enable_progress_bar()


class _BelowError(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno >= logging.ERROR


def _keep_last_record(run, display: LiveDisplay) -> None:
    """Show the loss on the bar: wrap this LiveRun's ``observe`` (one instance, the demo's own)
    to keep the record it was just given."""
    observe = run.observe

    def observe_and_keep(record: StepRecord):
        display.last_record = record
        return observe(record)

    run.observe = observe_and_keep


def _save_reason(step: int, state, run, halted: bool) -> str:
    if halted:
        return "saved before the halt: the weights are still good"
    why = _extra_save_reason(step, run)
    if why:
        return why
    if state.save_steps == BUMPED_SAVE_STEPS and step % BUMPED_SAVE_STEPS == 0:
        return f"bumped save interval ({BUMPED_SAVE_STEPS} steps)"
    if step % USER_SAVE_STEPS == 0:
        return "regular save interval"
    return "end of training"


def _extra_save_reason(step: int, run) -> str | None:
    from ..policy import EVENT_KINDS

    f = next((f for f in run.findings if f.step == step and f.kind not in EVENT_KINDS
              and severity_rank(f.severity) >= severity_rank("warning")), None)
    return None if f is None else f"extra save: the monitor asked for one on {f.kind}"


def _train_lightning(sc, config: dict, ckpt_dir: Path, run_dir: Path, display: LiveDisplay) -> None:
    import lightning.pytorch as pl
    import torch

    from ..integrations.lightning import StabilityCallback

    class TinyGPT(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = sc.make_model()

        def training_step(self, batch, batch_idx):
            return self.model(input_ids=batch["input_ids"], labels=batch["labels"]).loss

        def configure_optimizers(self):
            opt, sched = sc.make_optimizer(self.model)   # the HF Trainer's AdamW + linear warmup
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    # Lightning hands the scheduler to no callback: tell the monitor the warmup length.
    config = {**config, "phase": {"warmup_steps": sc.warmup_steps}}
    stability = StabilityCallback(config=config, run_dir=run_dir, run_name=f"demo-{sc.name}",
                                  checkpoint_dir=ckpt_dir)

    class ShowProgress(pl.Callback):
        """After the StabilityCallback: sees this step's findings and what it carried out."""

        def __init__(self):
            self.step = 0
            self.saves_shown = 0
            self.halted = False

        def on_train_start(self, trainer, pl_module):
            display.save_interval(0, USER_SAVE_STEPS)
            if stability.run is not None:
                _keep_last_record(stability.run, display)

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            run, step = stability.run, trainer.global_step
            if run is None or step == self.step:
                return
            self.step = step
            display.step(step, run)
            display.save_interval(step, run.control.save_interval_steps or USER_SAVE_STEPS)
            if trainer.should_stop and run.control.stop and not self.halted:
                self.halted = True
                display.halt(step, run)
            for s, path in stability.saved[self.saves_shown:]:
                display.checkpoint(s, path, _hook_save_reason(s, run, self.halted))
            self.saves_shown = len(stability.saved)

        def on_train_end(self, trainer, pl_module):
            if stability.run is not None:
                display.findings(stability.run)

    loader = torch.utils.data.DataLoader(sc.train_dataset(), batch_size=sc.batch_size, shuffle=False)
    with _quiet_lightning():
        trainer = pl.Trainer(max_steps=sc.max_steps, accelerator="cpu", devices=1,
                             accumulate_grad_batches=sc.grad_accum, gradient_clip_val=1.0,
                             callbacks=[stability, ShowProgress()], enable_checkpointing=False,
                             logger=False, enable_progress_bar=False, enable_model_summary=False,
                             default_root_dir=str(ckpt_dir))
        trainer.fit(TinyGPT(), loader)


def _hook_save_reason(step: int, run, halted: bool) -> str:
    """Why the callback/hook saved (Lightning, DeepSpeed: the integration saves by itself)."""
    if halted and run.control.stop:
        return "saved before the halt: the weights are still good"
    why = _extra_save_reason(step, run)
    if why:
        return why
    if run.control.save_interval_steps and step % run.control.save_interval_steps == 0:
        return f"bumped save interval ({run.control.save_interval_steps} steps)"
    return "requested by the monitor"



@contextmanager
def _quiet_lightning():
    """Lightning's start-up notes (GPU available, TPU, a logger tip) and deprecation warnings
    of its pinned dependencies are not the demo's story."""
    import warnings

    names = ("lightning.pytorch", "lightning.fabric", "lightning.pytorch.utilities.rank_zero",
             "lightning.fabric.utilities.rank_zero")
    saved = [(logging.getLogger(n), logging.getLogger(n).level) for n in names]
    for lg, _ in saved:
        lg.setLevel(logging.ERROR)
    try:
        with _quiet_transformers(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in saved:
            lg.setLevel(level)


def _train_deepspeed(sc, config: dict, ckpt_dir: Path, run_dir: Path, display: LiveDisplay) -> None:
    """A hand-written loop (forward, ``engine.backward``, ``engine.step``) on a one-process
    DeepSpeed engine on the CPU, with ``attach(engine)``: the Megatron-DeepSpeed shape."""
    import sys

    if "deepspeed" not in sys.modules:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")   # the demo's model is CPU-sized
    import deepspeed
    import deepspeed.ops
    import torch
    import torch.distributed as dist

    from ..integrations.deepspeed import attach

    # The CPU accelerator JIT-compiles a shared-memory all-reduce at the first init (minutes on
    # a laptop); one process needs no all-reduce at all.
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    created = not dist.is_initialized()
    if created:
        for key, value in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", str(_free_port())),
                           ("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
            os.environ.setdefault(key, value)
    with _quiet_transformers():
        if created:
            deepspeed.init_distributed(dist_backend="gloo", verbose=False)
        try:
            model = sc.make_model()
            engine, _, _, _ = deepspeed.initialize(model=model, config=sc.deepspeed_config(stage=1),
                                                   model_parameters=model.parameters())
            hook = attach(engine, config=config, run_dir=run_dir, run_name=f"demo-{sc.name}",
                          save_dir=ckpt_dir)
            _keep_last_record(hook.run, display)
            display.save_interval(0, USER_SAVE_STEPS)
            loader = torch.utils.data.DataLoader(sc.train_dataset(), batch_size=sc.batch_size,
                                                 shuffle=False)
            last, shown = 0, 0
            try:
                for batch in loader:
                    loss = engine(input_ids=batch["input_ids"], labels=batch["labels"]).loss
                    engine.backward(loss)
                    engine.step()
                    step = int(engine.global_steps)
                    if step == last:
                        continue          # an accumulation micro-batch
                    last = step
                    run = hook.run
                    display.step(step, run)
                    display.save_interval(step, run.control.save_interval_steps or USER_SAVE_STEPS)
                    halted = hook.should_stop
                    if halted:
                        display.halt(step, run)
                    for s in hook.saved_steps[shown:]:
                        display.checkpoint(s, str(ckpt_dir / f"global_step{s}"),
                                           _hook_save_reason(s, run, halted))
                    shown = len(hook.saved_steps)
                    if halted or step >= sc.max_steps:
                        break
                    if step % USER_SAVE_STEPS == 0:        # the loop's own regular save
                        engine.save_checkpoint(str(ckpt_dir), tag=f"global_step{step}")
                        display.checkpoint(step, str(ckpt_dir / f"global_step{step}"),
                                           "regular save interval")
            finally:
                hook.close()
                display.findings(hook.run)
        finally:
            if created:
                dist.destroy_process_group()


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


_RUNNERS = {"hf": _train_hf, "lightning": _train_lightning, "deepspeed": _train_deepspeed}


# ------------------------------------------------------------------------------------ main
def main(*, scenario: str = DEFAULT_SCENARIO, framework: str = "hf", out_dir: str | os.PathLike = "out/demo",
         steps: int | None = None, console=None) -> int:
    """Run the demo (see the module docstring) and return its exit code.

    ``steps`` overrides the scenario's length; ``console``: a ``rich.console.Console``."""
    outcome = run_demo(scenario=scenario, framework=framework, out_dir=out_dir, steps=steps,
                       console=console)
    return outcome if isinstance(outcome, int) else outcome.exit_code


def run_demo(*, scenario: str = DEFAULT_SCENARIO, framework: str = "hf",
             out_dir: str | os.PathLike = "out/demo", steps: int | None = None,
             console=None) -> "DemoOutcome | int":
    """The demo; returns its :class:`DemoOutcome`, or the exit code 2 for a bad option."""
    from rich.console import Console

    console = console or Console(highlight=False)
    from .scenarios import NAMES, build_scenario

    if framework not in FRAMEWORKS:
        console.print(f"[red]error:[/] --framework: {framework!r} is not one of {', '.join(FRAMEWORKS)}")
        return 2
    if scenario not in NAMES:
        console.print(f"[red]error:[/] --scenario: {scenario!r} is not one of {', '.join(NAMES)}")
        return 2
    runner = _RUNNERS.get(framework)
    modules, extras = _NEEDS[framework]
    missing = [m for m in modules if importlib.util.find_spec(m) is None]
    if runner is None or missing:
        why = (f"it needs {', '.join(missing)} (torch==2.13.0 first, then "
               f"pip install 'stability-callbacks[{extras}]')"
               if missing else "its integration is still being written")
        console.print(f"[yellow]The {framework} demo is not available:[/] {why}. "
                      f"Run it with --framework hf.")
        return 2
    try:
        sc = build_scenario(scenario, max_steps=steps)
    except ValueError as e:
        console.print(f"[red]error:[/] {e}")
        return 2

    import torch

    out = Path(out_dir)
    ckpt_dir, run_dir = out / "ckpt", out / "stability"
    for d in (ckpt_dir, run_dir):     # the run log appends: a rerun must not mix with the last one
        shutil.rmtree(d, ignore_errors=True)
    _intro(console, sc, framework)
    outcome = DemoOutcome(scenario=scenario, framework=framework, max_steps=sc.max_steps,
                          fault_steps=tuple(sc.fault_steps), expected=dict(sc.expected))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)       # a 100k-parameter model: more threads only add contention
    try:
        display = LiveDisplay(console, outcome)
        with LocalSlackInbox(on_message=display.alert) as inbox, display:
            runner(sc, demo_config(inbox.url), ckpt_dir, run_dir, display)
    finally:
        torch.set_num_threads(threads)

    _read_back(outcome, run_dir)
    outcome.report_html, outcome.report_png = _write_reports(outcome, out)
    outcome.exit_code = _summary(console, outcome)
    return outcome


def _intro(console, sc, framework: str) -> None:
    fault = ""
    if sc.fault_steps:
        what = "a batch with a corrupted embedding row (NaN)" if sc.name == "nan" else \
            "a pocket of corrupted batches (uniform random tokens)"
        fault = f" Planted: {what} at steps {sc.fault_steps[0]}-{sc.fault_steps[-1]}."
    console.rule(f"[bold]stability-callbacks demo: {sc.name} ({framework})")
    console.print(f"A {sc.n_layer}-layer GPT-2 ({sc.n_embd}-d, built from a config) trains for "
                  f"{sc.max_steps} steps with {_FRAMEWORK_NAMES[framework]} at peak LR {sc.lr:g}, warmup "
                  f"{sc.warmup_steps} steps, checkpoints every {USER_SAVE_STEPS} steps.{fault} "
                  f"{_MONITOR_NAMES[framework]} watches loss, grad norm, LR and Adam's exp_avg_sq; alerts "
                  f"go to a local Slack-style inbox; policy.halt_on = critical.", highlight=False)


def _read_back(outcome: DemoOutcome, run_dir: Path) -> None:
    """The run log, as ``replay`` reads it: records and findings."""
    from ..replay.readers import read_records
    from ..runlog import RUNLOG_NAME

    path = run_dir / RUNLOG_NAME
    outcome.records = list(read_records(path, "jsonl"))
    with open(path, encoding="utf-8") as fh:
        lines = [json.loads(line) for line in fh if line.strip()]
    outcome.findings = [Finding.from_json(x) for x in lines if x.get("type") == "finding"]


def _write_reports(outcome: DemoOutcome, out: Path) -> tuple[Path, Path]:
    from ..replay.report import write_report

    title = (f"stability-callbacks demo: {outcome.scenario} ({outcome.framework}), "
             f"tiny GPT-2, {outcome.last_step} of {outcome.max_steps} steps"
             + (f", halted at step {outcome.halted_at}" if outcome.halted_at is not None else ""))
    return tuple(write_report(out / name, outcome.records, outcome.findings, title=title)
                 for name in ("report.html", "report.png"))


def _loss_peak(records: list[StepRecord]) -> tuple[int, float] | None:
    """(step, loss) of the highest loss; the first non-finite loss wins outright."""
    best = None
    for r in records:
        v = r.metrics.get("loss")
        if v is None:
            continue
        if not math.isfinite(v):
            return r.step, v
        if best is None or v > best[1]:
            best = (r.step, v)
    return best


def _summary(console, o: DemoOutcome) -> int:
    from rich.table import Table

    from ..policy import EVENT_KINDS

    console.rule("[bold]summary")
    serious = [f for f in o.findings if severity_rank(f.severity) >= severity_rank("warning")]
    table = Table(title="warning and critical findings", show_lines=False)
    for col in ("step", "severity", "kind", "onset", "signal = value (baseline)"):
        table.add_column(col)
    for f in serious:
        sig = ""
        if f.signal and f.value is not None:
            sig = f"{f.signal} = {f.value:.4g}" + (f" ({f.baseline:.4g})" if f.baseline is not None else "")
        table.add_row(str(f.step), f"[{_STYLE[f.severity]}]{f.severity}[/]", f.kind,
                      "" if f.onset_step is None else str(f.onset_step), sig)
    if serious:
        console.print(table)
    else:
        console.print("[green]No warning or critical finding: a healthy run stays quiet.[/]")

    first = next((f for f in serious if f.kind not in EVENT_KINDS), None)
    peak = _loss_peak(o.records)
    if first is not None and peak is not None:
        lead = peak[0] - first.step
        when = (f"{_steps(lead)} before the loss peak at step {peak[0]} ({peak[1]:.4g})" if lead > 0
                else f"at the loss peak itself (step {peak[0]}, {peak[1]:.4g}): the first step it "
                     f"was visible" if lead == 0
                else f"{_steps(-lead)} after the loss peak at step {peak[0]} ({peak[1]:.4g})")
        console.print(f"Caught [bold]{first.kind}[/] at step {first.step}, {when}.", highlight=False)
    if o.fault_steps:
        a, b = o.fault_steps[0], o.fault_steps[-1]
        line = f"The planted fault covers steps {a}-{b}"
        if o.halted_at is not None:
            trained = sum(1 for s in o.fault_steps if s <= o.halted_at)
            line += (f"; training halted at step {o.halted_at}, after {trained} of its "
                     f"{len(o.fault_steps)} bad batch(es)")
        console.print(line + ".", highlight=False)
    for step, old, new in o.interval_changes:
        console.print(f"Save interval {old} → {new} at step {step}.", highlight=False)
    if o.checkpoints:
        console.print("Checkpoints: " + ", ".join(f"{Path(p).name} ({r.split(':')[0]})"
                                                  for _, p, r in o.checkpoints), highlight=False)
    console.print(f"Alerts delivered to the local Slack inbox: {len(o.alerts)}.", highlight=False)
    if o.rollback is not None:
        d = o.rollback.details
        target = d.get("checkpoint_path") or "the last checkpoint before the onset"
        console.print(f"Rollback: resume from {target}, skip steps {d['skip_steps'][0]}-"
                      f"{d['skip_steps'][1]}.", highlight=False)
    console.print(f"Report: {o.report_html}  and  {o.report_png}", highlight=False)

    ok = _met_expectations(console, o, serious)
    return 0 if ok else 1


def _steps(n: int) -> str:
    return f"{n} step" if n == 1 else f"{n} steps"


def _met_expectations(console, o: DemoOutcome, serious: list[Finding]) -> bool:
    """Did the run catch what the scenario planted (within its expected steps)?"""
    if not o.expected:
        ok = not serious
        if not ok:
            console.print("[red]Unexpected: the healthy run raised warnings.[/]")
        return ok
    ok = True
    for kind, (lo, hi) in o.expected.items():
        if lo > o.last_step:
            continue     # not reached: the run halted before the step it could appear
        f = next((f for f in o.findings if f.kind == kind), None)
        if f is None or not lo <= f.step <= hi:
            ok = False
            got = "none" if f is None else f"step {f.step}"
            console.print(f"[red]Expected {kind} at steps {lo}-{hi}, got {got}.[/]")
    return ok
