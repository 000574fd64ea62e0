"""``stability-callbacks`` (also ``python -m stability_callbacks``): replay, timeline, preflight, demo.

Exit codes: 0 no critical finding; 1 a critical finding (or, for preflight, a warning);
2 unreadable input or a bad config (the message names the file and line, or the key).
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

from . import __version__
from .config import ConfigError
from .preflight import PRECISIONS
from .record import Finding, severity_rank


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else list(argv))
    run = {"replay": replay, "timeline": timeline, "preflight": preflight, "demo": demo}[args.command]
    return run(args)


def build_parser() -> argparse.ArgumentParser:
    """Every subcommand in one tree (``main`` calls the function of the same name)."""
    parser = argparse.ArgumentParser(prog="stability-callbacks",
                                     description="Catch training instabilities; replay real logs offline.")
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("replay", help="run the live detector over a training log")
    p.add_argument("path")
    p.add_argument("--format", default="auto",
                   help="auto|megatron|hf|hf-state|nanogpt|llmc|deepspeed|litgpt|mlx|fairseq|llamafactory|"
                        "jsonl|csv|tensorboard|wandb-csv")
    p.add_argument("--config", help="YAML config or preset name (default, pretrain-fp16, ...)")
    p.add_argument("--json", dest="json_out", help="write findings as JSON lines to this file (- = stdout)")
    p.add_argument("--report", help="write a report: OUT.html (self-contained) or OUT.png")
    p.add_argument("--warmup-steps", type=int, help="declare the LR warmup length (else inferred from the LR)")
    p = sub.add_parser("timeline", help="stitch a run log's segments after rollbacks")
    p.add_argument("runlog")
    p.add_argument("--png", help="write the stitched trajectory as a PNG")
    p = sub.add_parser("preflight", help="audit a transformers config.json for known causes of instability",
                       description="Audit a transformers config.json for known causes of instability. "
                                   "Exit 1 on a warning, 0 otherwise, 2 when the input cannot be read. "
                                   "Training settings a config.json does not hold come from flags.")
    p.add_argument("model_config", metavar="CONFIG_OR_DIR",
                   help="config.json path, or a directory holding config.json")
    p.add_argument("--config", help="stability config (YAML or preset name) whose `preflight` section "
                                    "sets the thresholds")
    p.add_argument("--precision", choices=PRECISIONS, help="training precision (default: the config's dtype)")
    p.add_argument("--bf16-available", choices=("yes", "no"), help="whether the GPUs support bf16")
    p.add_argument("--optimizer", help="optimizer class name, e.g. AdamW")
    p.add_argument("--beta2", type=float, help="Adam beta2")
    p.add_argument("--weight-decay", type=float)
    p.add_argument("--warmup-steps", type=int)
    p.add_argument("--total-steps", type=int)
    p.add_argument("--json", action="store_true", help="one JSON finding per line")
    p = sub.add_parser("demo", help="a tiny real training run that goes wrong, caught live")
    p.add_argument("--scenario", default="warmup-spike")
    p.add_argument("--framework", default="hf")
    p.add_argument("--out", default="out/demo")
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--auto-rollback", action="store_true",
                   help="roll back to the last good checkpoint and skip the bad data instead of halting")
    return parser


def replay(args) -> int:
    from .monitor import Monitor
    from .replay.readers import LogFormatError, read_records

    err = sys.stderr
    try:
        config = None
        if args.config:
            config = args.config
        monitor = Monitor(config)
        if args.warmup_steps:
            monitor.set_warmup_steps(args.warmup_steps)
    except ConfigError as e:
        print(f"error: {e}", file=err)
        return 2
    skipped: list[tuple[int, str, str]] = []
    keep = bool(args.report)
    records, phases, findings = [], [], []
    n = 0
    try:
        stream = read_records(args.path, args.format, on_skip=lambda *s: skipped.append(s),
                              progress=err.isatty())
        for rec in stream:
            n += 1
            findings += monitor.update(rec)
            if keep:
                records.append(rec)
                phases.append((rec.step, monitor.phase_at_last_step))
    except (LogFormatError, OSError, ValueError) as e:
        print(f"error: {e}", file=err)
        return 2
    if skipped:
        first = skipped[0]
        print(f"note: skipped {len(skipped)} unreadable line(s) of {args.path} (first: line {first[0]}: "
              f"{first[2]})", file=err)
    if args.json_out:
        out = sys.stdout if args.json_out == "-" else open(args.json_out, "w", encoding="utf-8")
        for f in findings:
            out.write(json.dumps(f.to_json()) + "\n")
        if out is not sys.stdout:
            out.close()
    summary_to = err if args.json_out == "-" else sys.stdout
    print_summary(findings, n, Path(args.path).name, file=summary_to)
    if args.report:
        from .replay.report import write_report
        path = write_report(args.report, records, findings, title=Path(args.path).name, phases=phases)
        print(f"report: {path}", file=summary_to)
    return 1 if any(f.severity == "critical" for f in findings) else 0


def print_summary(findings: list[Finding], num_records: int, name: str, *, file=None) -> None:
    """A table of finding kinds, then every warning-or-worse finding with its sentence."""
    from rich.console import Console
    from rich.table import Table

    console = Console(file=file or sys.stdout, width=120, highlight=False, soft_wrap=False)
    table = Table(title=f"{name}: {num_records} steps, {len(findings)} findings")
    for col in ("kind", "severity", "count", "first step", "last step"):
        table.add_column(col)
    groups: dict[tuple[str, str], list[Finding]] = {}
    for f in findings:
        groups.setdefault((f.kind, f.severity), []).append(f)
    for (kind, sev), fs in sorted(groups.items(), key=lambda kv: (-severity_rank(kv[0][1]), kv[1][0].step)):
        table.add_row(kind, sev, str(len(fs)), str(fs[0].step), str(fs[-1].step))
    console.print(table)
    serious = [f for f in findings if severity_rank(f.severity) >= 1]
    for f in serious[:50]:
        console.print(f"[{f.severity}] step {f.step} {f.kind}: {f.message}", markup=False)
        if f.kind == "rollback_advice":
            from .actions.rollback import native_forms
            for fw, text in native_forms(f.details).items():
                console.print(f"    {fw}: {text}", markup=False)
    if len(serious) > 50:
        console.print(f"... and {len(serious) - 50} more warning-or-worse findings (see --json)")
    counts = Counter(f.severity for f in findings)
    console.print(f"critical: {counts['critical']}  warning: {counts['warning']}  info: {counts['info']}")


def preflight(args) -> int:
    """The preflight audit of a config.json, with the thresholds of ``--config``'s section."""
    from .config import load_config
    from .preflight import Preflight, format_finding, load_config_facts, weight_decay_is_decoupled

    try:
        rules = Preflight(**load_config(args.config)["preflight"])
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
    for f in findings:
        print(json.dumps({"type": "finding", **f.to_json()}) if args.json else format_finding(f))
    if not findings and not args.json:
        print(f"preflight: no known cause of instability in {facts.source}")
    return 1 if any(f.at_least("warning") for f in findings) else 0


def demo(args) -> int:
    from .demo.run import main as demo_main
    return demo_main(scenario=args.scenario, framework=args.framework, out_dir=args.out, steps=args.steps,
                     auto_rollback=args.auto_rollback)


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
