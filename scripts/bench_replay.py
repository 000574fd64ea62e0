"""Replay throughput.

    python scripts/bench_replay.py [LOG] [--repeat N]
        Monitor.update steps/s on a real 20k-step log (records pre-read; reading timed apart).

    python scripts/bench_replay.py [LOG] --code DIR [--code DIR ...] [--rounds N] [--records N] [--one-at-a-time]
        The same, µs per update in CPU seconds of a subprocess per checkout and round,
        interleaved (this checkout first): the median per checkout and its ratio to the first.
        LOG may be a generated one (`--cli` writes them; `--records` reads its first N). The
        records go in as replay feeds them (`Monitor.update_many`, 256 at a time, where the
        checkout has it), or one at a time as a live run does (`--one-at-a-time`: `update`).

    python scripts/bench_replay.py --cli [--steps 1000000] [--formats megatron,generic,csv]
                                   [--code DIR ...] [--rounds 2] [--out DIR]
        The full CLI path (`stability-callbacks replay FILE`, a subprocess: reading, the
        Monitor, the summary; wall and CPU seconds) on a generated log of N steps and 6
        columns (step, loss, grad_norm, lr, loss_scale, skipped: the same numbers as Megatron
        iteration lines, as generic `step N | loss X | ...` lines, as our CSV; `nanogpt`:
        build-nanogpt's 4-column line, which the generic reader reads and a dedicated reader
        used to). `--code DIR`
        times other checkouts of the package on the same files, interleaved round by round
        (compare code on a loaded machine by the ratio, not the absolute figure). Prints
        steps/s per format and code, and JSON as the last line.

    python scripts/bench_replay.py --read [--steps 1000000] [--formats ...] [--code DIR ...]
                                   [--rounds 5] [--out DIR]
        Reading alone (`read_records`, no Monitor) on the same generated logs, in CPU seconds
        of a subprocess per code and round, interleaved (CPU time: less skewed than wall time on
        a shared machine); prints the median per format and code and the ratio to the first.

    python scripts/bench_replay.py --follow [--rate 10000] [--seconds 20] [--code DIR ...] [--out DIR]
        `replay --follow` keeping up with a job: generic lines appended at --rate lines/s for
        --seconds (in batches every 10 ms) while the follower (a subprocess per code, one after
        the other) tails the file. Prints, per code, the follower's largest lag behind the
        writer (lines written minus steps in its run log, sampled every 0.2 s), how long after
        the last line it had the last step, and its CPU seconds per 100k lines (the rate it
        could sustain on one core: lines / CPU s). The report at its end is off
        (`report.enabled: false`, a key older checkouts refuse).

    python scripts/bench_replay.py --linear [--code DIR ...] [--out DIR]
        Reading cost where it used to grow faster than the input (issue 26): lines that repeat
        one step number (10k, 20k, 40k lines) and one giant line of glued records (256 KB,
        512 KB, 1 MB). Prints seconds per size and the ratio per doubling (linear: ~2) for this
        checkout and each --code checkout (a subprocess each; a run over 120 s is cut off).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT = REPO / "tests" / "data" / "real_logs" / "mn_gpt2_1p5B_scaleup_20k.log"


def monitor_only(log: str, repeat: int) -> dict:
    from stability_callbacks import Monitor, StepRecord
    from stability_callbacks.replay.readers import read_records

    t0 = time.perf_counter()
    records = list(read_records(log))
    read_s = time.perf_counter() - t0
    rates = []
    for _ in range(repeat):
        fresh = [StepRecord(r.step, dict(r.metrics)) for r in records]
        m = Monitor()
        t0 = time.perf_counter()
        for r in fresh:
            m.update(r)
        rates.append(len(fresh) / (time.perf_counter() - t0))
    result = {"log": Path(log).name, "steps": len(records), "keys": sorted(records[0].metrics),
              "read_s": round(read_s, 3), "monitor_steps_per_s": round(statistics.median(rates)),
              "min_steps_per_s": round(min(rates)), "max_steps_per_s": round(max(rates))}
    print(f"{result['steps']} steps, Monitor.update median {result['monitor_steps_per_s']:,} steps/s "
          f"(min {result['min_steps_per_s']:,}, max {result['max_steps_per_s']:,}); reading took {read_s:.2f} s")
    return result


_MONITOR_CPU = ("import itertools, sys, time; from stability_callbacks import Monitor; "
                "from stability_callbacks.replay.readers import read_records; "
                "n = int(sys.argv[2]) or None; recs = list(itertools.islice(read_records(sys.argv[1]), n)); "
                "m = Monitor(); many = getattr(m, 'update_many', None) if sys.argv[3] == 'batches' else None; "
                "t = time.process_time(); "
                "[m.update(r) for r in recs] if many is None else [many(recs[i:i + 256]) for i in range(0, len(recs), 256)]; "
                "print((time.process_time() - t) / len(recs) * 1e6, len(recs))")


def monitor_side_by_side(args) -> dict:
    """The Monitor alone, µs per update (CPU time), per checkout, interleaved round by round."""
    codes = [REPO] + [Path(c).resolve() for c in args.code]
    us: dict[str, list[float]] = {}
    steps = 0
    for _ in range(args.rounds):
        for code in codes:
            how = "one" if args.one_at_a_time else "batches"
            r = subprocess.run([sys.executable, "-c", _MONITOR_CPU, str(Path(args.log).resolve()), str(args.records), how],
                               cwd=code, env=dict(os.environ, PYTHONPATH=str(code)), capture_output=True, text=True)
            if r.returncode:
                raise SystemExit(f"{code}: {r.stderr.strip().splitlines()[-1]}")
            per_update, steps = float(r.stdout.split()[0]), int(r.stdout.split()[1])
            us.setdefault(str(code), []).append(per_update)
    first = statistics.median(us[str(codes[0])])
    rows = []
    for code in codes:
        med = statistics.median(us[str(code)])
        rows.append({"code": str(code), "median_us_per_update": round(med, 2), "ratio_to_first": round(med / first, 3)})
        print(f"{code}: median {med:.2f} µs per update (CPU) of {len(us[str(code)])}, x{med / first:.2f}")
    return {"log": Path(args.log).name, "steps": steps, "fed": "one at a time" if args.one_at_a_time else "in batches",
            "monitor": rows, "load_1min": os.getloadavg()[0]}


def write_logs(out: Path, steps: int, formats: list[str]) -> dict[str, Path]:
    """The same 6-column run (a falling loss with noise, warmup LR, a steady fp16 scale) in each
    format; files are reused when present."""
    paths = {"megatron": out / f"megatron_{steps}.log", "generic": out / f"generic_{steps}.log",
             "csv": out / f"table_{steps}.csv", "nanogpt": out / f"nanogpt_{steps}.log"}
    todo = [f for f in formats if not paths[f].exists()]
    if todo:
        out.mkdir(parents=True, exist_ok=True)
        rng = random.Random(0)
        files = {f: open(paths[f], "w") for f in todo}
        if "csv" in files:
            files["csv"].write("step,loss,grad_norm,lr,loss_scale,skipped\n")
        for s in range(1, steps + 1):
            loss = 2.0 + 8.0 / math.sqrt(s) + rng.gauss(0, 0.02)
            gn = 0.3 + abs(rng.gauss(0, 0.05))
            lr = 3e-4 * min(1.0, s / 2000)
            if "megatron" in files:
                files["megatron"].write(
                    f" iteration {s:8d}/ {steps:8d} | consumed samples: {s * 512:12d} | elapsed time "
                    f"per iteration (ms): 1234.5 | learning rate: {lr:.3E} | global batch size:   512 | "
                    f"lm loss: {loss:.6E} | loss scale: 65536.0 | grad norm: {gn:.3f} | num zeros: 0.0 "
                    f"| number of skipped iterations:   0 | number of nan iterations:   0 |\n")
            if "generic" in files:
                files["generic"].write(f"step {s} | loss {loss:.6f} | grad_norm {gn:.4f} | lr {lr:.4e} "
                                       f"| loss_scale 65536.0 | skipped 0\n")
            if "csv" in files:
                files["csv"].write(f"{s},{loss:.6f},{gn:.4f},{lr:.4e},65536.0,0\n")
            if "nanogpt" in files:    # build-nanogpt's line: 4 columns, a dedicated reader once
                files["nanogpt"].write(f"step {s:5d} | loss: {loss:.6f} | lr {lr:.4e} | norm: {gn:.4f} "
                                       f"| dt: 321.00ms | tok/sec: 1633283.00\n")
        for f in files.values():
            f.close()
    return {f: paths[f] for f in formats}


def cli_seconds(code: Path, log: Path) -> tuple[float, float]:
    """Wall and CPU seconds (user + system) of one `replay LOG` subprocess."""
    env = dict(os.environ, PYTHONPATH=str(code))
    t0, c0 = time.perf_counter(), _children_cpu_s()
    # cwd too: `python -m` puts the working directory ahead of PYTHONPATH.
    r = subprocess.run([sys.executable, "-m", "stability_callbacks", "replay", str(log.resolve())],
                       env=env, cwd=code, capture_output=True, text=True)
    seconds, cpu = time.perf_counter() - t0, _children_cpu_s() - c0
    if r.returncode not in (0, 1):
        print(f"replay {log.name} with {code} failed ({r.returncode}): {r.stderr.splitlines()[0]}")
        return math.inf, math.inf
    return seconds, cpu


def _children_cpu_s() -> float:
    import resource
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def full_cli(args) -> dict:
    logs = write_logs(Path(args.out), args.steps, args.formats.split(","))
    codes = [REPO] + [Path(c).resolve() for c in args.code]
    times: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for _ in range(args.rounds):
        for fmt, log in logs.items():
            for code in codes:
                times.setdefault((str(code), fmt), []).append(cli_seconds(code, log))
    load = os.getloadavg()[0]
    rows = []
    for (code, fmt), runs in times.items():
        best, cpu = min(wall for wall, _ in runs), min(c for _, c in runs)
        if best == math.inf:
            continue
        rows.append({"code": code, "format": fmt, "steps": args.steps, "best_s": round(best, 2),
                     "steps_per_s": round(args.steps / best), "best_cpu_s": round(cpu, 2)})
        print(f"{fmt:9s} {code}: best of {len(runs)} {best:6.1f} s = {args.steps / best:,.0f} steps/s, "
              f"CPU {cpu:.1f} s (all: {', '.join(f'{w:.1f}/{c:.1f}' for w, c in runs)})")
    print(f"load average at the end: {load:.1f} on {os.cpu_count()} cores")
    return {"steps": args.steps, "rows": rows, "load_1min": load}


_READ_ONLY = ("import sys, time; from stability_callbacks.replay.readers import read_records; "
              "t = time.perf_counter(); n = sum(1 for _ in read_records(sys.argv[1])); "
              "print(time.perf_counter() - t, n)")


_READ_CPU = ("import sys, time; from stability_callbacks.replay.readers import read_records; "
             "t = time.process_time(); n = sum(1 for _ in read_records(sys.argv[1])); "
             "print(time.process_time() - t, n)")


def read_only(args) -> dict:
    logs = write_logs(Path(args.out), args.steps, args.formats.split(","))
    codes = [REPO] + [Path(c).resolve() for c in args.code]
    secs: dict[tuple[str, str], list[float]] = {}
    for _ in range(args.rounds):
        for fmt, log in logs.items():
            for code in codes:
                r = subprocess.run([sys.executable, "-c", _READ_CPU, str(log.resolve())], cwd=code,
                                   env=dict(os.environ, PYTHONPATH=str(code)), capture_output=True, text=True)
                secs.setdefault((fmt, str(code)), []).append(float(r.stdout.split()[0]) if r.returncode == 0
                                                             else math.inf)
    rows = []
    for fmt in logs:
        first = statistics.median(secs[(fmt, str(codes[0]))])
        for code in codes:
            med = statistics.median(secs[(fmt, str(code))])
            rows.append({"format": fmt, "code": str(code), "median_cpu_s": round(med, 3),
                         "ratio_to_first": round(med / first, 3) if first else math.inf})
            print(f"{fmt:9s} {code}: median {med:.2f} CPU s of {len(secs[(fmt, str(code))])} "
                  f"({args.steps / med:,.0f} lines/s), x{med / first:.2f}")
    return {"steps": args.steps, "read": rows, "load_1min": os.getloadavg()[0]}


def linear_inputs(out: Path) -> dict[str, list[Path]]:
    """The inputs of ``--linear``: repeated steps and one giant line, each at three sizes."""
    out.mkdir(parents=True, exist_ok=True)
    made: dict[str, list[Path]] = {"repeated_step_lines": [], "one_giant_line": []}
    for n in (10_000, 20_000, 40_000):
        p = out / f"repeated_{n}.log"
        if not p.exists():
            p.write_text("".join(f"step 7 loss {1.0 + (i % 7) / 10}\n" for i in range(n)))
        made["repeated_step_lines"].append(p)
    for kb in (256, 512, 1024):
        p = out / f"giant_{kb}k.log"
        if not p.exists():
            records, size, s = [], 0, 0
            while size < kb * 1024:
                rec = f"step {s // 50} loss {2.0 + s % 3}"
                records.append(rec)
                size += len(rec) + 1
                s += 1
            p.write_text(" ".join(records) + "\n")
        made["one_giant_line"].append(p)
    return made


def linear(args) -> dict:
    inputs = linear_inputs(Path(args.out))
    codes = [REPO] + [Path(c).resolve() for c in args.code]
    rows = []
    for kind, paths in inputs.items():
        for code in codes:
            secs = []
            for p in paths:
                env = dict(os.environ, PYTHONPATH=str(code))
                try:
                    r = subprocess.run([sys.executable, "-c", _READ_ONLY, str(p.resolve())], env=env,
                                       cwd=code, capture_output=True, text=True, timeout=120)
                    secs.append(float(r.stdout.split()[0]) if r.returncode == 0 else math.inf)
                except subprocess.TimeoutExpired:
                    secs.append(math.inf)
            ratios = [b / a if a else math.inf for a, b in zip(secs, secs[1:])]
            rows.append({"input": kind, "code": str(code), "sizes": [p.name for p in paths],
                         "seconds": [round(x, 3) for x in secs], "ratio_per_doubling": [round(x, 2) for x in ratios]})
            print(f"{kind:20s} {code}: " + ", ".join(f"{p.name} {x:.2f} s" for p, x in zip(paths, secs))
                  + f"   (x{', x'.join(f'{r:.1f}' for r in ratios)} per doubling)")
    return {"linear": rows, "load_1min": os.getloadavg()[0]}


def _follow_line(s: int, rng: random.Random) -> str:
    loss = 2.0 + 8.0 / math.sqrt(s) + rng.gauss(0, 0.02)
    return (f"step {s} | loss {loss:.6f} | grad_norm {0.3 + abs(rng.gauss(0, 0.05)):.4f} | lr 3.0000e-04 "
            f"| loss_scale 65536.0 | skipped 0\n")


def _steps_logged(runlog: Path, seen: list[int]) -> int:
    """Steps in the run log so far (``seen``: [bytes read, steps counted], read on from there)."""
    if runlog.exists():
        with open(runlog, "rb") as f:
            f.seek(seen[0])
            new = f.read()
        seen[0] += len(new)
        seen[1] += new.count(b'"type":"step"')
    return seen[1]


def follow_one(code: Path, out: Path, rate: int, seconds: float) -> dict:
    """One follower (``code``) behind one writer: lag, catch-up, CPU (see the module docstring)."""
    out.mkdir(parents=True, exist_ok=True)
    log, runlog = out / "train.log", out / "run" / "runlog.jsonl"
    for p in (log, runlog):
        p.unlink(missing_ok=True)
    log.touch()
    # The report at the end (3 CPU s, 0.4 GB for 200k steps) is not following: off here.
    config = out / "no_report.yaml"
    config.write_text("report: {enabled: false}\n")
    follower = subprocess.Popen([sys.executable, "-m", "stability_callbacks", "replay", str(log), "--follow",
                                 "--poll-s", "0.1", "--idle-exit-s", "5", "--run-dir", str(out / "run"),
                                 "--config", str(config)],
                                cwd=code, env=dict(os.environ, PYTHONPATH=str(code)),
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(3.0)                                  # its start-up (imports) before the first line
    rng, total, seen, lag = random.Random(0), int(rate * seconds), [0, 0], 0
    batch = max(1, rate // 100)
    t0 = next_sample = time.monotonic()
    with open(log, "a") as f:
        for first in range(1, total + 1, batch):
            wait = t0 + (first - 1) / rate - time.monotonic()
            if wait > 0:
                time.sleep(wait)
            f.write("".join(_follow_line(s, rng) for s in range(first, min(first + batch, total + 1))))
            f.flush()
            if time.monotonic() >= next_sample:
                lag, next_sample = max(lag, first - 1 - _steps_logged(runlog, seen)), next_sample + 0.2
    wrote_s = time.monotonic() - t0
    # The run log flushes every 50 steps: the last few wait for the idle tick that settles them.
    while _steps_logged(runlog, seen) < total - 50 and time.monotonic() - t0 < wrote_s + 120:
        time.sleep(0.02)
    caught_up_s = time.monotonic() - t0 - wrote_s
    _, status, usage = os.wait4(follower.pid, 0)
    cpu_s = usage.ru_utime + usage.ru_stime
    row = {"code": str(code), "lines": total, "written_lines_per_s": round(total / wrote_s),
           "max_lag_lines": lag, "caught_up_s_after_last_line": round(caught_up_s, 2),
           "steps_in_runlog": _steps_logged(runlog, seen), "cpu_s": round(cpu_s, 2),
           "cpu_s_per_100k_lines": round(cpu_s * 100_000 / total, 2),
           "lines_per_cpu_s": round(total / cpu_s), "exit": os.waitstatus_to_exitcode(status)}
    print(f"{code}: wrote {total:,} lines at {row['written_lines_per_s']:,}/s; largest lag {lag:,} lines; "
          f"last step {caught_up_s:.2f} s after the last line; {cpu_s:.1f} CPU s "
          f"({row['lines_per_cpu_s']:,} lines per CPU s, start-up included)")
    return row


def follow(args) -> dict:
    codes = [REPO] + [Path(c).resolve() for c in args.code]
    rows = [follow_one(code, Path(args.out) / f"follow_{i}", args.rate, args.seconds)
            for i, code in enumerate(codes)]
    return {"follow": rows, "load_1min": os.getloadavg()[0]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("log", nargs="?", default=str(DEFAULT))
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--cli", action="store_true", help="time the full CLI path on a generated log")
    ap.add_argument("--linear", action="store_true", help="reading cost on repeated steps and one giant line")
    ap.add_argument("--read", action="store_true", help="reading alone, CPU seconds, side by side with --code")
    ap.add_argument("--follow", action="store_true", help="replay --follow behind a writer at --rate lines/s")
    ap.add_argument("--rate", type=int, default=10_000)
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--steps", type=int, default=1_000_000)
    ap.add_argument("--formats", default="megatron,generic,csv")
    ap.add_argument("--code", action="append", default=[],
                    help="another checkout (its repository root) to time side by side")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--records", type=int, default=0, help="Monitor with --code: the log's first N records (0: all)")
    ap.add_argument("--one-at-a-time", action="store_true",
                    help="Monitor with --code: Monitor.update per record (a live run's way), not replay's batches")
    ap.add_argument("--out", default="out/bench_replay")
    args = ap.parse_args()
    result = (full_cli(args) if args.cli else linear(args) if args.linear else read_only(args)
              if args.read else follow(args) if args.follow else monitor_side_by_side(args) if args.code
              else monitor_only(args.log, args.repeat))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
