"""``stability-callbacks`` (also ``python -m stability_callbacks``): replay, timeline, preflight, demo.

Exit codes: 0 no critical finding; 1 a critical finding (or, for preflight, a warning);
2 unreadable input or a bad config (the message names the file and line, or the key);
3 ``replay --follow`` halted the run (a halt-level finding).
"""
from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["preflight"]:   # its own parser, flags included
        from . import preflight
        return preflight.main(argv[1:])
    parser = argparse.ArgumentParser(prog="stability-callbacks",
                                     description="Catch training instabilities; replay real logs offline.")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("replay", help="run the live detector over a training log")
    p.add_argument("path")
    p.add_argument("--format", default="auto",
                   help="auto|generic|megatron|fairseq|hf-state|jsonl|csv|tensorboard|wandb-csv "
                        "(also hf, nanogpt, llmc, deepspeed, litgpt, mlx, llamafactory, ...: "
                        "read by the generic reader)")
    p.add_argument("--config", help="YAML config or preset name (default, pretrain-fp16, ...)")
    p.add_argument("--json", dest="json_out", help="write findings as JSON lines to this file (- = stdout)")
    p.add_argument("--report", help="write a report: OUT.html (self-contained) or OUT.png")
    p.add_argument("--warmup-steps", type=int, help="declare the LR warmup length (else inferred from the LR)")
    p.add_argument("--keys", help="say which names the log prints: OURS=THEIRS,... with OURS = step, loss, "
                                  "grad_norm, lr, loss_scale, skipped (e.g. --keys step=iter,loss=train_loss)")
    p.add_argument("--pattern", help="a regular expression whose named groups (step, loss, grad_norm, lr, "
                                     "loss_scale, skipped) read each line, e.g. 'ep (?P<step>\\d+) err (?P<loss>\\S+)'")
    p.add_argument("--follow", action="store_true",
                   help="tail the log as it grows (sidecar mode): run log, alerts and halts as live; ends when "
                        "--pid ends, after --idle-exit-s, on a halt (exit 3) or on Ctrl-C")
    p.add_argument("--run-dir", default="out/stability", help="--follow: where the run log goes (runlog.jsonl)")
    p.add_argument("--pid", type=int, help="--follow: stop when this process (the training job) ends")
    p.add_argument("--idle-exit-s", type=float, help="--follow: stop after this many seconds without a new line")
    p.add_argument("--poll-s", type=float, default=1.0, help="--follow: seconds between looks at the file")
    p.add_argument("--stop-file", help="--follow: on a halt, write this file (the finding as JSON) for the job")
    p.add_argument("--on-halt", help="--follow: on a halt, run this shell command (STABILITY_STEP, STABILITY_KIND, "
                                     "STABILITY_MESSAGE set), e.g. 'scancel $SLURM_JOB_ID'")
    p = sub.add_parser("timeline", help="stitch a run log's segments after rollbacks")
    p.add_argument("runlog")
    p.add_argument("--png", help="write the stitched trajectory as a PNG")
    sub.add_parser("preflight", help="audit a transformers config.json for known causes of instability "
                                     "(stability-callbacks preflight --help)")
    p = sub.add_parser("demo", help="a tiny real training run that goes wrong, caught live")
    p.add_argument("--scenario", default="warmup-spike")
    p.add_argument("--framework", default="hf")
    p.add_argument("--out", default="out/demo")
    p.add_argument("--steps", type=int, default=None)
    args = parser.parse_args(argv)
    if args.command == "replay":
        return replay(args)
    if args.command == "timeline":
        return timeline(args)
    from .demo.run import main as demo_main
    return demo_main(scenario=args.scenario, framework=args.framework, out_dir=args.out, steps=args.steps)


def replay(args) -> int:
    from .replay.command import run
    return run(args)


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
