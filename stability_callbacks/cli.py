"""``stability-callbacks`` (also ``python -m stability_callbacks``): replay, timeline, preflight, demo,
forensics.

Exit codes: 0 no critical finding; 1 a critical finding (or, for preflight, a warning);
2 unreadable input, a bad config (the message names the file and line, or the key) or a missing
extra (named, with the pip command); 3 ``replay --follow`` halted the run (a halt-level finding).
``--json [OUT]`` means the same in every command: the findings as JSON lines, to OUT or stdout.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import sys

from . import __version__
from .config import Config, ConfigError, parse_overrides
from .preflight import PRECISIONS


#: What a subcommand's --help says of its exit codes.
EXIT_CODES = {
    "replay": "exit codes: 0 no critical finding, 1 a critical finding, 2 the input cannot be read (not "
              "text, no known format, nothing to judge: no training loss, loss scale, overflow or grad norm read), "
              "a bad config, a missing extra or an output (--json, --report) that cannot be written, "
              "3 --follow halted the run",
    "timeline": "exit codes: 0 stitched, 2 unreadable run log or a missing extra",
    "preflight": "exit codes: 0 nothing worse than info, 1 a warning, 2 unreadable input, a bad config "
                 "or a missing extra",
    "demo": "exit codes: 0 the run caught what its scenario planted (healthy: no warning), 1 it did "
            "not, 2 a bad option or a missing extra",
    "forensics": "exit codes: 0 listed, 1 nothing to list (no finding named samples, no batch was "
                 "ranked), 2 no such run directory or an unreadable forensics file",
}
#: Optional modules → the extra that installs them (a missing one is exit 2, named).
EXTRAS = {"matplotlib": "report", "tensorboard": "tensorboard", "wandb": "wandb", "apprise": "apprise",
          "transformers": "hf", "accelerate": "hf", "lightning": "lightning", "deepspeed": "deepspeed",
          "trackio": "trackio"}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else list(argv))
    run = {"replay": replay, "timeline": timeline, "preflight": preflight, "demo": demo,
           "forensics": forensics}[args.command]
    # A plot is asked for up front: find out before the work, not after it.
    if getattr(args, "report", None) or getattr(args, "png", None):
        if importlib.util.find_spec("matplotlib") is None:
            return _missing(args.command, "matplotlib")
    try:
        return run(args)
    except ModuleNotFoundError as e:
        root = (e.name or "").split(".")[0]
        if root != "torch" and root not in EXTRAS:
            raise
        return _missing(args.command, root)


def _missing(command: str, module: str) -> int:
    """Exit 2, naming the missing module and what installs it."""
    if module == "torch":
        print(f"error: {command} needs torch here, which the package never installs: pip install "
              f"torch (or your own build) first", file=sys.stderr)
    else:
        print(f"error: {command} needs {module} here: pip install 'stability-callbacks[{EXTRAS[module]}]'",
              file=sys.stderr)
    return 2


def build_parser() -> argparse.ArgumentParser:
    """Every subcommand in one tree (``main`` calls the function of the same name)."""
    from .demo import SCENARIOS
    from .demo.run import FRAMEWORKS

    parser = argparse.ArgumentParser(prog="stability-callbacks",
                                     description="Catch training instabilities; replay real logs offline.",
                                     epilog="Each command's --help says what it does and its exit codes.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)

    def command(name: str, help: str, description: str) -> argparse.ArgumentParser:
        return sub.add_parser(name, help=help, description=description, epilog=EXIT_CODES[name])

    set_help = ("override one config key: SECTION.KEY=VALUE, the value read as YAML (repeatable; e.g. "
                "--set policy.halt_on=critical --set detectors.loss_spike.z_threshold=7 "
                "--set detectors.not_learning=false)")
    json_help = "write the findings as JSON lines to OUT (- or no value: standard output)"
    p = command("replay", "run the live detector over a training log",
                "Replay a training log (a text log of any common printer, Megatron, fairseq, Caffe, "
                "JSON lines, CSV, W&B CSV, trainer_state.json, a TensorBoard directory; gzip read as "
                "is; - for stdin) through the live detector, offline or, with --follow, as the job "
                "writes it. It first says what it read: the steps, which printed name became each "
                "key, how steps were numbered, the lines it ignored.")
    p.add_argument("path", help="the log file, a TensorBoard directory, or - for standard input")
    p.add_argument("--format", default="auto",
                   help="auto|generic|megatron|fairseq|hf-state|jsonl|csv|tensorboard|wandb-csv "
                        "(also hf, nanogpt, llmc, deepspeed, litgpt, mlx, llamafactory, ...: "
                        "read by the generic reader)")
    p.add_argument("--config", help="YAML config or preset name (default, pretrain-fp16, ...)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help=set_help)
    p.add_argument("--json", dest="json_out", nargs="?", const="-", metavar="OUT",
                   help="write what was read (the first record, type \"read\") and the findings as "
                        "JSON lines to OUT (- or no value: standard output)")
    p.add_argument("--report", help="write a report: OUT.html (self-contained) or OUT.png (--follow: the "
                                    "run's report goes there, not next to its run log)")
    p.add_argument("--warmup-steps", type=int, help="declare the LR warmup length (else inferred from the LR)")
    p.add_argument("--keys", help="say which names the log prints: OURS=THEIRS,... with OURS = step, loss, "
                                  "grad_norm, lr, loss_scale, skipped and THEIRS a printed name or the "
                                  "number's position on the line or CSV row, from 1 (e.g. --keys "
                                  "step=iter,loss=train_loss; --keys step=1,loss=2); overrides every rule")
    p.add_argument("--pattern", help="a regular expression whose named groups (step, epoch, loss, grad_norm, "
                                     "lr, loss_scale, skipped) read each line, e.g. 'ep (?P<step>\\d+) err (?P<loss>\\S+)'")
    p.add_argument("--follow", action="store_true",
                   help="tail the log as it grows (sidecar mode): run log, alerts and halts as live; ends when "
                        "--pid ends, after --idle-exit-s, on a halt (exit 3), on SIGTERM or Ctrl-C, with a "
                        "summary and a report next to the run log, as a live run")
    p.add_argument("--advice", default="auto", choices=("auto", "all", "hf", "lightning", "megatron", "deepspeed"),
                   help="rollback advice in which framework's terms: auto (the log's own format), all, or one")
    p.add_argument("--run-dir", help="--follow: where the run log goes (runlog.jsonl; default: a folder named stability next to the log)")
    p.add_argument("--wandb-project", help="--follow: the job's W&B project (default: WANDB_PROJECT)")
    p.add_argument("--wandb-run-id", help="--follow: write the scalars and alerts into this W&B run "
                                          "(default: WANDB_RUN_ID; actions.wandb is off without one)")
    p.add_argument("--pid", type=int, help="--follow: stop when this process (the training job) ends")
    p.add_argument("--idle-exit-s", type=float, help="--follow: stop after this many seconds without a new line "
                   "(a file not there yet, a FIFO without a writer: exit 2); without --follow: how long "
                   "a FIFO waits for a writer (default 10)")
    p.add_argument("--poll-s", type=float, default=1.0, help="--follow: seconds between looks at the file")
    p.add_argument("--stop-file", help="--follow: on a halt, write this file (the finding as JSON) for the job")
    p.add_argument("--on-halt", help="--follow: on a halt, run this shell command (STABILITY_STEP, STABILITY_KIND, "
                                     "STABILITY_MESSAGE set), e.g. 'scancel $SLURM_JOB_ID'")
    p = command("timeline", "stitch a run log's segments after rollbacks",
                "Stitch a run log (runlog.jsonl) across resumes and rollbacks into the trajectory the "
                "model really took; the abandoned points are kept apart (and shown faded with --png).")
    p.add_argument("runlog")
    p.add_argument("--png", help="write the stitched trajectory as a PNG")
    p = command("preflight", "audit a transformers config.json for known causes of instability",
                "Audit a transformers config.json for known causes of instability (init std against "
                "the width, fp16 against bf16, Adam beta2, the warmup). Training settings a "
                "config.json does not hold come from flags.")
    p.add_argument("model_config", metavar="CONFIG_OR_DIR",
                   help="config.json path, or a directory holding config.json")
    p.add_argument("--config", help="stability config (YAML or preset name) whose `preflight` section "
                                    "sets the thresholds")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help=set_help)
    p.add_argument("--precision", choices=PRECISIONS, help="training precision (default: the config's dtype)")
    p.add_argument("--bf16-available", choices=("yes", "no"), help="whether the GPUs support bf16")
    p.add_argument("--optimizer", help="optimizer class name, e.g. AdamW")
    p.add_argument("--beta2", type=float, help="Adam beta2")
    p.add_argument("--weight-decay", type=float)
    p.add_argument("--warmup-steps", type=int)
    p.add_argument("--total-steps", type=int)
    p.add_argument("--json", dest="json_out", nargs="?", const="-", metavar="OUT", help=json_help)
    p = command("demo", "a tiny real training run that goes wrong, caught live",
                "Train a tiny GPT-2 (built from a config, nothing downloaded) on the CPU with a planted "
                "instability, and watch it caught live: findings, saves, alerts to a local inbox, the "
                "halt or the rollback, a report.")
    p.add_argument("--scenario", default="warmup-spike", choices=SCENARIOS,
                   help="the planted fault (default: %(default)s)")
    p.add_argument("--framework", default="hf", choices=tuple(FRAMEWORKS),
                   help="what trains the model (default: %(default)s)")
    p.add_argument("--out", default="out/demo", help="where the run log, checkpoints and report go")
    p.add_argument("--steps", type=int, default=None, help="the run's length (default: the scenario's)")
    p.add_argument("--auto-rollback", action="store_true",
                   help="roll back to the last good checkpoint and skip the bad data instead of halting")
    p = command("forensics", "list the samples behind a run's spikes",
                "List the data behind a live run's spikes: each finding that named the dataset indices "
                "of its step and its neighbours (in the run log), and each batch ranked by per-sample "
                "loss (forensics/step-N.jsonl, written with forensics.dump_batches), highest loss first.")
    p.add_argument("run_dir", metavar="RUN_DIR", help="the run directory (holding runlog.jsonl and forensics/)")
    p.add_argument("--top", type=int, default=10, help="samples shown of each ranked batch (default: %(default)s)")
    p.add_argument("--json", dest="json_out", nargs="?", const="-", metavar="OUT",
                   help="write each entry as a JSON line (type samples or ranked) to OUT (- or no value: "
                        "standard output)")
    return parser


def _config(args) -> Config:
    """``--config`` and ``--set``, read once into the config tree (a bad one: ``ConfigError``)."""
    return Config.load(args.config, parse_overrides(args.overrides))


def replay(args) -> int:
    """The config and the typed options from the arguments (nothing of argparse goes further),
    then :func:`~.replay.command.run`."""
    from .replay.command import FollowOptions, ReplayOptions, run

    try:
        if args.poll_s <= 0:
            raise ValueError("--poll-s and --idle-exit-s must be > 0")
        follow = FollowOptions(run_dir=args.run_dir, wandb_project=args.wandb_project,
                               wandb_run_id=args.wandb_run_id, pid=args.pid, poll_s=args.poll_s,
                               stop_file=args.stop_file, on_halt=args.on_halt) if args.follow else None
        options = ReplayOptions(path=args.path, format=args.format, json_out=args.json_out, report=args.report,
                                warmup_steps=args.warmup_steps, keys=args.keys, pattern=args.pattern,
                                advice=args.advice, idle_exit_s=args.idle_exit_s, follow=follow)
        config = _config(args)
    except (ConfigError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return run(options, config)


def preflight(args) -> int:
    """The preflight audit of a config.json, with the thresholds of ``--config``'s section."""
    from .preflight import format_finding, load_config_facts, weight_decay_is_decoupled

    try:
        rules = _config(args).preflight.build()
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        facts = load_config_facts(args.model_config)
    except (OSError, ValueError) as exc:
        print(f"stability-callbacks preflight: cannot read {args.model_config}: {exc}", file=sys.stderr)
        return 2
    if args.precision:
        facts.precision = args.precision
    if args.bf16_available:
        facts.bf16_available = args.bf16_available == "yes"
    if args.optimizer:
        facts.optimizer = args.optimizer
        facts.weight_decay_decoupled = weight_decay_is_decoupled(args.optimizer)
    if args.beta2 is not None:
        facts.betas = (0.9, args.beta2)
    if args.weight_decay is not None:
        facts.weight_decay = args.weight_decay
    facts.warmup_steps = args.warmup_steps
    facts.total_steps = args.total_steps
    findings = rules.audit(facts)
    if args.json_out is not None:
        with _json_out(args.json_out) as out:
            for f in findings:
                out.write(json.dumps({"type": "finding", **f.to_json()}) + "\n")
    if args.json_out != "-":
        for f in findings:
            print(format_finding(f))
        if not findings:
            print(f"preflight: no known cause of instability in {facts.source}")
    return 1 if any(f.at_least("warning") for f in findings) else 0


@contextlib.contextmanager
def _json_out(dest: str):
    """``--json OUT``: a file, or standard output for ``-``."""
    if dest == "-":
        yield sys.stdout
    else:
        with open(dest, "w", encoding="utf-8") as fh:
            yield fh


def demo(args) -> int:
    from .demo.run import main as demo_main
    return demo_main(scenario=args.scenario, framework=args.framework, out_dir=args.out, steps=args.steps,
                     auto_rollback=args.auto_rollback)


def forensics(args) -> int:
    """The samples a run's findings named and the batches it ranked (docs/design.md, Forensics)."""
    from .forensics import listing

    try:
        entries, bad = listing(args.run_dir)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.json_out is not None:
        with _json_out(args.json_out) as out:
            for entry in entries:
                out.write(json.dumps(entry) + "\n")
    if args.json_out != "-":
        for entry in entries:
            print("\n".join(_forensics_lines(entry, args.top)))
        if bad:
            print(f"({len(bad)} unreadable run-log line(s) skipped, the first: line {bad[0]})")
        if not entries:
            print(f"{args.run_dir}: no finding named samples and no batch was ranked")
    return 0 if entries else 1


def _forensics_lines(e: dict, top: int) -> list[str]:
    from .forensics import compact

    if e["type"] == "samples":
        if e.get("indices") is None:
            what = f"samples unknown: {e.get('unknown')}"
        else:
            what = f"dataset indices {compact(e['indices'])}" + (
                f" (every rank's of {e['ranks']})" if e.get("ranks", 1) > 1 else "")
        out = [f"step {e['step']}: {what}  [{e['kind']} ({e['severity']}) at step {e['finding_step']}]"]
        out += [f"  step {s}: {compact(idx)}" for s, idx in (e.get("neighbours") or {}).items()]
        if (e.get("ranked") or {}).get("unknown"):
            out.append(f"  not ranked: {e['ranked']['unknown']}")
        return out
    rows = e["rows"]
    out = [f"step {e['step']}: {len(rows)} samples ranked by their own loss ({e['path']})"]
    for n, r in enumerate(rows[:max(0, top)], 1):
        loss, tokens = r.get("loss"), r.get("tokens") or []
        shown = f"{loss:.4g}" if isinstance(loss, float) else str(loss)
        more = " ..." if len(tokens) > 12 else ""
        out.append(f"  {n:>3}. index {r.get('index')!s:>8}  loss {shown:>9}  rank {r.get('rank')}  "
                   f"tokens {' '.join(str(t) for t in tokens[:12])}{more}")
    if len(rows) > top:
        out.append(f"  ... {len(rows) - top} more")
    return out


def timeline(args) -> int:
    from .replay.timeline import stitch, write_timeline_png

    try:
        result = stitch(args.runlog)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    live, superseded = result[0], result[1]
    print(f"{args.runlog}: {len(live)} live steps, {len(superseded)} superseded by later segments")
    if args.png:
        write_timeline_png(args.png, result)
        print(f"timeline: {args.png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
