"""``stability-callbacks demo`` (``make demo``): a tiny real training run that goes wrong, caught live.

A 2-layer GPT-2 built from a config (:mod:`stability_callbacks.demo.scenarios`: nothing is
downloaded) trains with the HF ``Trainer`` and the :class:`~stability_callbacks.integrations.hf.
StabilityCallback` (``--framework lightning``: the Lightning ``Trainer`` and its callback;
``--framework deepspeed``: a hand-written loop on a one-process CPU DeepSpeed engine with
``attach(engine)``). The default scenario, ``warmup-spike``, is the BigScience tr8-104B story in
miniature: the LR warmup ends at step 18 and three steps later a pocket of corrupted batches
(uniform random tokens: a bad data shard) reaches the model, inside the warmup-end risk window.
Nothing is scripted on the monitoring side: the loss, grad norm and Adam statistics are the
Trainer's own, and every action shown is one the integration carried out and reported (the run
log's ``action`` lines); the terminal (:mod:`.terminal`) is a listener on the run, and the
framework runners (:mod:`.runners`) only build, attach and train.

What the terminal shows, as it happens: a progress bar; every finding (step, kind, sentence);
the save interval bumped inside the risk window (50 → 5 steps); each checkpoint and why it was
made (regular, bumped interval, extra save on a warning, save before the halt); the alerts
arriving at a local Slack-compatible inbox the demo starts on 127.0.0.1 (the real
``actions.slack`` sink posts to it: no network leaves the machine); the halt
(``policy.halt_on: critical``); the rollback advice in each framework's native form. At the end:
``report.html`` and ``report.png`` (the replay report of the run log) and a summary of what was
caught, when, and how that compares with the loss peak and the planted fault.

``--auto-rollback`` turns on ``policy.auto_rollback``: instead of halting, the integration goes
back to the checkpoint the rollback advice names, skips the data of the episode and trains on.
With ``--scenario data-pocket`` the pocket is 12 steps of random tokens from step 25, which the
model does not recover from (``spike_unrecovered`` 10 steps after the onset); the run rolls back to
the checkpoint of step 20, skips the data of steps 25-40 and ends healthy. ``timeline.png``
shows the abandoned branch faded behind the live trajectory.

Exit code: 0 when the run caught what its scenario planted (``healthy``: no warning at all;
``--auto-rollback``: rolled back and finished healthy), 1 when it did not, 2 for a bad option or
a framework whose demo is not available.
"""
from __future__ import annotations

import importlib.util
import json
import math
import os
import shutil
from pathlib import Path

from ..record import Finding, StepRecord, severity_rank
from .terminal import STYLE, DemoOutcome, LiveDisplay, LocalSlackInbox

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
#: The demo model's loss once it knows its pattern is ~0.55 nats; a healthy stretch stays below.
HEALTHY_LOSS = 1.0
_MONITOR_NAMES = {"hf": "StabilityCallback.attach(trainer)",
                  "lightning": "The Lightning StabilityCallback", "deepspeed": "attach(engine)"}


#: ``--auto-rollback``: the pocket of ``data-pocket`` is long enough to do lasting damage, the
#: recovery horizon fits the demo's length, and the skipped range gets a margin past the detection.
POCKET_STEPS_UNRECOVERED = 12
ROLLBACK_HORIZON_STEPS = 10
ROLLBACK_MARGIN_STEPS = 5


def demo_config(webhook_url: str, *, auto_rollback: bool = False) -> dict:
    """The monitor's configuration for the demo: defaults plus an opt-in halt, a save interval
    the demo's length can show, and Slack alerts to the local inbox (``auto_rollback``: rolls
    back instead of halting, with a recovery horizon the demo's length can show)."""
    config = {
        "policy": {"halt_on": "critical", "bump_save_interval_to": BUMPED_SAVE_STEPS},
        # The terminal shows every finding itself; the log sink would print each one twice.
        "actions": {"slack": {"webhook_url": webhook_url, "min_severity": "warning",
                              "rate_limit_s": 0, "timeout_s": 2.0}},
    }
    if auto_rollback:
        config["policy"]["auto_rollback"] = {"skip_extra_steps": ROLLBACK_MARGIN_STEPS}
        config["detectors"] = {"loss_spike": {"horizon_steps": ROLLBACK_HORIZON_STEPS}}
    return config


# ------------------------------------------------------------------------------------ main
def main(*, scenario: str = DEFAULT_SCENARIO, framework: str = "hf", out_dir: str | os.PathLike = "out/demo",
         steps: int | None = None, auto_rollback: bool = False, console=None) -> int:
    """Run the demo (see the module docstring) and return its exit code.

    ``steps`` overrides the scenario's length; ``console``: a ``rich.console.Console``."""
    outcome = run_demo(scenario=scenario, framework=framework, out_dir=out_dir, steps=steps,
                       auto_rollback=auto_rollback, console=console)
    return outcome if isinstance(outcome, int) else outcome.exit_code


def run_demo(*, scenario: str = DEFAULT_SCENARIO, framework: str = "hf",
             out_dir: str | os.PathLike = "out/demo", steps: int | None = None,
             auto_rollback: bool = False, console=None) -> "DemoOutcome | int":
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
    from .runners import RUNNERS

    runner = RUNNERS.get(framework)
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
        extra = {}
        if auto_rollback:   # skipped data must be made up for: twice the data the run needs
            extra["data_steps"] = 2 * (steps or build_scenario(scenario).max_steps)
            if scenario == "data-pocket":
                extra["pocket_steps"] = POCKET_STEPS_UNRECOVERED
        sc = build_scenario(scenario, max_steps=steps, **extra)
    except ValueError as e:
        console.print(f"[red]error:[/] {e}")
        return 2

    import torch

    out = Path(out_dir)
    ckpt_dir, run_dir = out / "ckpt", out / "stability"
    for d in (ckpt_dir, run_dir):     # the run log appends: a rerun must not mix with the last one
        shutil.rmtree(d, ignore_errors=True)
    _intro(console, sc, framework, auto_rollback)
    expected = dict(sc.expected)
    if auto_rollback and sc.fault_steps:   # what halted before is now rolled back
        expected.pop("spike_recovered", None)
        first = sc.fault_steps[0]
        expected["auto_rollback"] = (first, first + ROLLBACK_HORIZON_STEPS)
    outcome = DemoOutcome(scenario=scenario, framework=framework, max_steps=sc.max_steps,
                          fault_steps=tuple(sc.fault_steps), expected=expected,
                          auto_rollback=auto_rollback)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)       # a 100k-parameter model: more threads only add contention
    try:
        display = LiveDisplay(console, outcome, user_save_steps=USER_SAVE_STEPS)
        with LocalSlackInbox(on_message=display.alert) as inbox, display:
            runner(sc, demo_config(inbox.url, auto_rollback=auto_rollback), ckpt_dir, run_dir, display)
    finally:
        torch.set_num_threads(threads)

    _read_back(outcome, run_dir)
    outcome.report_html, outcome.report_png = _write_reports(outcome, out)
    if outcome.rollbacks:
        from ..replay.timeline import write_timeline_png

        outcome.timeline_png = write_timeline_png(
            out / "timeline.png", outcome.timeline,
            title=f"stability-callbacks demo: {scenario} ({framework}) with --auto-rollback")
    outcome.exit_code = _summary(console, outcome)
    return outcome


def _intro(console, sc, framework: str, auto_rollback: bool = False) -> None:
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
                  f"go to a local Slack-style inbox; "
                  + ("policy.auto_rollback: a critical finding rolls back to the last good checkpoint "
                     "and skips the data of the episode." if auto_rollback else "policy.halt_on = critical."),
                  highlight=False)


def _read_back(outcome: DemoOutcome, run_dir: Path) -> None:
    """The run log, as ``replay`` reads it: records and findings; after a rollback, the stitched
    trajectory (``timeline``) is the run's record and the abandoned branch stays apart."""
    from ..replay.readers import read_records
    from ..replay.timeline import stitch
    from ..runlog import RUNLOG_NAME

    path = run_dir / RUNLOG_NAME
    outcome.records = list(read_records(path, "jsonl"))
    with open(path, encoding="utf-8") as fh:
        lines = [json.loads(line) for line in fh if line.strip()]
    outcome.findings = [Finding.from_json(x) for x in lines if x.get("type") == "finding"]
    outcome.rollbacks = [x for x in lines if x.get("type") == "action" and x.get("action") == "rollback"]
    if outcome.rollbacks:
        outcome.timeline = stitch(path)
        outcome.records = list(outcome.timeline.live)


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
        table.add_row(str(f.step), f"[{STYLE[f.severity]}]{f.severity}[/]", f.kind,
                      "" if f.onset_step is None else str(f.onset_step), sig)
    if serious:
        console.print(table)
    else:
        console.print("[green]No warning or critical finding: a healthy run stays quiet.[/]")

    first = next((f for f in serious if f.kind not in EVENT_KINDS), None)
    peak = _loss_peak(o.records + (list(o.timeline.superseded) if o.timeline is not None else []))
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
        abandoned = {(c["step"], c["path"]) for c in o.timeline.checkpoints if c["superseded"]} \
            if o.timeline is not None else set()
        console.print("Checkpoints: " + ", ".join(
            f"{Path(p).name} ({r.split(':')[0]}{'; abandoned branch, moved to rolled_back/' if (s, p) in abandoned else ''})"
            for s, p, r in o.checkpoints), highlight=False)
    console.print(f"Alerts delivered to the local Slack inbox: {len(o.alerts)}.", highlight=False)
    if o.rollback is not None:
        d = o.rollback.details
        target = d.get("checkpoint_path") or "the last checkpoint before the onset"
        console.print(f"Rollback: resume from {target}, skip steps {d['skip_steps'][0]}-"
                      f"{d['skip_steps'][1]}.", highlight=False)
    for r in o.rollbacks:
        console.print(f"Rolled back automatically at step {r['step']} to the checkpoint of step "
                      f"{r['checkpoint_step']} ({Path(r['path']).name}); the data of steps "
                      f"{r['skip_steps'][0]}-{r['skip_steps'][1]} was skipped.", highlight=False)
    if o.rollbacks and o.timeline is not None:
        seg = o.timeline.segments[-1]
        tail = [r.metrics["loss"] for r in o.timeline.live[-10:] if "loss" in r.metrics]
        console.print(f"The run went on from step {seg['start_step']} and finished at step {o.last_step} "
                      f"(mean loss of the last {len(tail)} steps: {sum(tail) / max(1, len(tail)):.3f}); "
                      f"{len(o.timeline.superseded)} steps of the abandoned branch are kept apart in "
                      f"{o.timeline_png}.", highlight=False)
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
    if o.auto_rollback and o.expected:
        # Rolled back, then trained to the end, healthy: no halt, back at the pre-fault loss.
        tail = [r.metrics["loss"] for r in o.records[-10:] if "loss" in r.metrics]
        healthy = (o.halted_at is None and o.last_step == o.max_steps and bool(tail)
                   and max(tail) < HEALTHY_LOSS)
        if not healthy:
            ok = False
            console.print(f"[red]Expected a rolled-back run to finish healthy at step {o.max_steps}, "
                          f"got step {o.last_step}" + (f", halted at {o.halted_at}" if o.halted_at else "")
                          + ".[/]")
    for kind, (lo, hi) in o.expected.items():
        if lo > o.last_step:
            continue     # not reached: the run halted before the step it could appear
        f = next((f for f in o.findings if f.kind == kind), None)
        if f is None or not lo <= f.step <= hi:
            ok = False
            got = "none" if f is None else f"step {f.step}"
            console.print(f"[red]Expected {kind} at steps {lo}-{hi}, got {got}.[/]")
    return ok
