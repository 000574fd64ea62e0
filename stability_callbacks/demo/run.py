"""``stability-callbacks demo`` (``make demo``; the story is in the README's demo section): a tiny
real training run that goes wrong, caught live.

A tiny GPT-2 (:mod:`.scenarios`) trains with the HF Trainer (``--framework lightning``: the
Lightning Trainer; ``deepspeed``: a hand-written loop on a CPU DeepSpeed engine) under the
integration's default wiring plus :func:`demo_config`: a halt on critical findings (or
``--auto-rollback``), a save interval the demo's length can show, and the real Slack sink posting
to a local inbox. The runners (:mod:`.runners`) only build, attach and train; the terminal
(:mod:`.terminal`) is a listener on the run; the end is the run log read back as ``replay`` and
``timeline`` read it (report, timeline plot, summary).

Exit code: 0 when the run caught what its scenario planted (``healthy``: no warning at all;
``--auto-rollback``: rolled back and finished healthy), 1 when it did not, 2 for a bad option or
a framework whose packages are missing.
"""
from __future__ import annotations

import importlib.util
import math
import os
import shutil
from pathlib import Path

from ..detectors.base import count
from ..record import severity_rank
from .terminal import DemoOutcome, LiveDisplay, LocalSlackInbox

DEFAULT_SCENARIO = "warmup-spike"
#: The "user's" save interval, and the one the policy switches to inside the risk window and
#: after a warning (BigScience went from 1500 to 300 steps; scaled down to the demo's length).
USER_SAVE_STEPS = 50
BUMPED_SAVE_STEPS = 5
#: framework: (how the intro names it, what watches it, the package it needs besides the HF ones)
FRAMEWORKS = {"hf": ("the HF Trainer", "StabilityCallback.attach(trainer)", None),
               "lightning": ("the Lightning Trainer", "The Lightning StabilityCallback", "lightning"),
               "deepspeed": ("a DeepSpeed engine", "attach(engine)", "deepspeed")}
#: The demo model's loss once it knows its pattern is ~0.55 nats; a healthy stretch stays below.
HEALTHY_LOSS = 1.0
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


def main(**options) -> int:
    """Run the demo (see :func:`run_demo`) and return its exit code."""
    outcome = run_demo(**options)
    return outcome if isinstance(outcome, int) else outcome.exit_code


def run_demo(*, scenario: str = DEFAULT_SCENARIO, framework: str = "hf",
             out_dir: str | os.PathLike = "out/demo", steps: int | None = None,
             auto_rollback: bool = False, console=None) -> "DemoOutcome | int":
    """The demo; returns its :class:`DemoOutcome`, or the exit code 2 for a bad option.

    ``steps`` overrides the scenario's length; ``console``: a ``rich.console.Console``."""
    from rich.console import Console

    console = console or Console(highlight=False)
    if framework not in FRAMEWORKS:
        console.print(f"[red]error:[/] --framework: {framework!r} is not one of {', '.join(FRAMEWORKS)}")
        return 2
    needs = ("torch", "transformers", "matplotlib") + (FRAMEWORKS[framework][2] or "",)
    missing = [m for m in needs if m and importlib.util.find_spec(m) is None]
    if missing:
        extras = ",".join(["hf", "report"] + [m for m in needs[3:] if m])
        console.print(f"[yellow]The {framework} demo is not available:[/] it needs {', '.join(missing)} "
                      f"(torch==2.13.0 first, then pip install 'stability-callbacks[{extras}]'). "
                      f"Run it with --framework hf.")
        return 2
    import torch

    from ..replay.report import write_report
    from ..replay.timeline import stitch, write_timeline_png
    from ..runlog import RUNLOG_NAME
    from .runners import RUNNERS
    from .scenarios import build_scenario

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

    out = Path(out_dir)
    ckpt_dir, run_dir = out / "ckpt", out / "stability"
    for d in (ckpt_dir, run_dir):     # the run log appends: a rerun must not mix with the last one
        shutil.rmtree(d, ignore_errors=True)
    _intro(console, sc, framework, auto_rollback)
    expected = dict(sc.expected)
    if auto_rollback and sc.fault_steps:   # what halted before is now rolled back
        expected.pop("spike_recovered", None)
        expected["auto_rollback"] = (sc.fault_steps[0], sc.fault_steps[0] + ROLLBACK_HORIZON_STEPS)
    o = DemoOutcome(scenario=scenario, framework=framework, max_steps=sc.max_steps,
                    fault_steps=tuple(sc.fault_steps), expected=expected, auto_rollback=auto_rollback)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)       # a 100k-parameter model: more threads only add contention
    try:
        display = LiveDisplay(console, o, user_save_steps=USER_SAVE_STEPS)
        with LocalSlackInbox(on_message=display.alert) as inbox, display:
            RUNNERS[framework](sc, demo_config(inbox.url, auto_rollback=auto_rollback), ckpt_dir, run_dir,
                               display)
    finally:
        torch.set_num_threads(threads)

    # The run log as replay and timeline read it: after a rollback, the live trajectory is the
    # run's record and the abandoned branch stays apart.
    o.timeline = stitch(run_dir / RUNLOG_NAME)
    title = (f"stability-callbacks demo: {scenario} ({framework}), tiny GPT-2, {o.last_step} of "
             f"{o.max_steps} steps" + (f", halted at step {o.halted_at}" if o.halted_at is not None else ""))
    o.report_html, o.report_png = (write_report(out / name, o.timeline.live, o.timeline.findings, title=title)
                                   for name in ("report.html", "report.png"))
    if o.rollbacks:
        o.timeline_png = write_timeline_png(out / "timeline.png", o.timeline, title=f"stability-callbacks "
                                            f"demo: {scenario} ({framework}) with --auto-rollback")
    o.exit_code = _summary(console, o)
    return o


def _intro(console, sc, framework: str, auto_rollback: bool = False) -> None:
    fault = ""
    if sc.fault_steps:
        what = "a batch with a corrupted embedding row (NaN)" if sc.name == "nan" else \
            "a pocket of corrupted batches (uniform random tokens)"
        fault = f" Planted: {what} at steps {sc.fault_steps[0]}-{sc.fault_steps[-1]}."
    name, watcher, _ = FRAMEWORKS[framework]
    console.rule(f"[bold]stability-callbacks demo: {sc.name} ({framework})")
    console.print(f"A {sc.n_layer}-layer GPT-2 ({sc.n_embd}-d, built from a config) trains for "
                  f"{sc.max_steps} steps with {name} at peak LR {sc.lr:g}, warmup "
                  f"{sc.warmup_steps} steps, checkpoints every {USER_SAVE_STEPS} steps.{fault} "
                  f"{watcher} watches loss, grad norm, LR and Adam's exp_avg_sq; alerts "
                  f"go to a local Slack-style inbox; "
                  + ("policy.auto_rollback: a critical finding rolls back to the last good checkpoint "
                     "and skips the data of the episode." if auto_rollback else "policy.halt_on = critical."),
                  highlight=False)


def _summary(console, o: DemoOutcome) -> int:
    """``replay``'s summary of the run log, then what the demo adds: when the first finding came
    against the loss peak and the planted fault, the actions taken; the exit code."""
    from ..advice import advice_forms_for
    from ..policy import EVENT_KINDS
    from ..replay.command import print_summary

    console.rule("[bold]summary")
    t = o.timeline
    serious = [f for f in t.findings if severity_rank(f.severity) >= severity_rank("warning")]
    if serious:
        print_summary(t.findings, len(t.live), f"{o.scenario} ({o.framework})", file=console.file,
                      advice_forms=advice_forms_for(o.framework))
    else:
        console.print("[green]No warning or critical finding: a healthy run stays quiet.[/]")
    say = lambda text: console.print(text, highlight=False)  # noqa: E731

    first = next((f for f in serious if f.kind not in EVENT_KINDS), None)
    losses = [(r.metrics["loss"], r.step) for r in t.live + t.superseded if "loss" in r.metrics]
    # The highest loss; the first non-finite one wins outright.
    peak = next(((v, s) for v, s in losses if not math.isfinite(v)), max(losses, default=None))
    if first is not None and peak is not None:
        lead, at = peak[1] - first.step, f"the loss peak at step {peak[1]} ({peak[0]:.4g})"
        say(f"Caught [bold]{first.kind}[/] at step {first.step}, " + (
            f"{count(lead)} before {at}." if lead > 0 else
            f"at {at} itself: the first step it was visible." if lead == 0 else f"{count(-lead)} after {at}."))
    if o.fault_steps:
        line = f"The planted fault covers steps {o.fault_steps[0]}-{o.fault_steps[-1]}"
        if o.halted_at is not None:
            trained = sum(1 for s in o.fault_steps if s <= o.halted_at)
            line += (f"; training halted at step {o.halted_at}, after {trained} of its "
                     f"{len(o.fault_steps)} bad batch(es)")
        say(line + ".")
    for step, old, new in o.interval_changes:
        say(f"Save interval {old} → {new} at step {step}.")
    if o.checkpoints:
        abandoned = {(c["step"], c["path"]) for c in t.checkpoints if c["superseded"]}
        say("Checkpoints: " + ", ".join(
            f"{Path(p).name} ({r.split(':')[0]}{'; abandoned branch, moved to rolled_back/' if (s, p) in abandoned else ''})"
            for s, p, r in o.checkpoints))
    say(f"Alerts delivered to the local Slack inbox: {len(o.alerts)}.")
    for r in o.rollbacks:
        say(f"Rolled back automatically at step {r['step']} to the checkpoint of step {r['checkpoint_step']} "
            f"({Path(r['path']).name}); the data of steps {r['skip_steps'][0]}-{r['skip_steps'][1]} was skipped.")
    if o.rollbacks:
        tail = [r.metrics["loss"] for r in t.live[-10:] if "loss" in r.metrics]
        say(f"The run went on from step {t.segments[-1]['start_step']} and finished at step {o.last_step} "
            f"(mean loss of the last {len(tail)} steps: {sum(tail) / max(1, len(tail)):.3f}); "
            f"{len(t.superseded)} steps of the abandoned branch are kept apart in {o.timeline_png}.")
    say(f"Report: {o.report_html}  and  {o.report_png}")
    return 0 if _met_expectations(console, o, serious) else 1



def _met_expectations(console, o: DemoOutcome, serious: list) -> bool:
    """Did the run catch what the scenario planted (within its expected steps)?"""
    problems = []
    if not o.expected and serious:
        problems.append("Unexpected: the healthy run raised warnings.")
    if o.auto_rollback and o.expected:
        # Rolled back, then trained to the end, healthy: no halt, back at the pre-fault loss.
        tail = [r.metrics["loss"] for r in o.timeline.live[-10:] if "loss" in r.metrics]
        if not (o.halted_at is None and o.last_step == o.max_steps and tail and max(tail) < HEALTHY_LOSS):
            problems.append(f"Expected a rolled-back run to finish healthy at step {o.max_steps}, got step "
                            f"{o.last_step}" + (f", halted at {o.halted_at}" if o.halted_at else "") + ".")
    for kind, (lo, hi) in o.expected.items():
        f = next((f for f in o.timeline.findings if f.kind == kind), None)
        if lo <= o.last_step and (f is None or not lo <= f.step <= hi):   # lo > last: not reached
            problems.append(f"Expected {kind} at steps {lo}-{hi}, got {'none' if f is None else f'step {f.step}'}.")
    for p in problems:
        console.print(f"[red]{p}[/]")
    return not problems
