"""Healthy noisy losses through the detectors: how many seeded runs of each family get a warning
or a critical (none should), side by side for one or more checkouts.

    python scripts/noise_scan.py                       # this checkout
    python scripts/noise_scan.py --code /path/to/other/checkout --code .   # side by side
    python scripts/noise_scan.py --seeds 10            # quicker

Each family is a healthy loss as a field prints it, 300 points, seeds 0..N-1, printed every 1 or
10 steps (every 10: the first 20 points lie past the start-up, where the detectors speak):

==================  ========================================================================
flat σ              flat at 0.1, lognormal draws of σ 0.3 / 0.5 / 0.8 in log(loss) (a diffusion
                    loss over random timesteps, a small batch's)
diffusion           from scratch: 1.0 falling to 0.08, lognormal σ 0.5
falling             2.5 falling to 0.5, lognormal σ 0.25
classifier          to near zero, small-batch noise
==================  ========================================================================

Prints one row per family and print interval: runs warned / runs, and the finding kinds. Each
checkout runs in a process of its own (its ``stability_callbacks`` imported from there).
"""
from __future__ import annotations

import argparse
import json
import math
import random
import subprocess
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
FAMILIES = ("flat 0.3", "flat 0.5", "flat 0.8", "diffusion", "falling", "classifier")
EVERY = (1, 10)


def loss(family: str, i: int, rng: random.Random) -> float:
    """The family's loss at its ``i``-th point (1-based)."""
    if family.startswith("flat"):
        return 0.1 * math.exp(rng.gauss(0, float(family.split()[1])))
    if family == "diffusion":
        return (0.08 + 0.9 * math.exp(-i / 20)) * math.exp(rng.gauss(0, 0.5))
    if family == "falling":
        return (0.5 + 2 * math.exp(-i / 50)) * math.exp(rng.gauss(0, 0.25))
    return 2.3 * math.exp(-i / 30) + 0.002 + abs(rng.gauss(0, 0.02)) * math.exp(-i / 60)


def scan(seeds: int) -> dict:
    """{"family every": [runs warned, {kind: count}]} on the ``stability_callbacks`` importable here."""
    from stability_callbacks import Monitor, StepRecord

    out = {}
    for family in FAMILIES:
        for every in EVERY:
            warned, kinds = 0, Counter()
            for seed in range(seeds):
                rng, m, found = random.Random(seed), Monitor(), []
                for i in range(1, 301):
                    found += m.update(StepRecord(every * i, {"loss": loss(family, i, rng)}))
                    m.control.step_done()
                bad = [f.kind for f in found if f.severity != "info"]
                warned += bool(bad)
                kinds.update(bad)
            out[f"{family} every {every}"] = [warned, dict(kinds)]
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--code", action="append", default=None, help="a checkout to scan (repeatable; default: this one)")
    ap.add_argument("--seeds", type=int, default=30, help="seeded runs per family and interval (default 30)")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(scan(args.seeds)))
        return 0
    codes = [Path(c).resolve() for c in (args.code or [str(ROOT)])]
    results = []
    for code in codes:
        proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", "--seeds", str(args.seeds)],
                              env={"PYTHONPATH": str(code), "PATH": "/usr/bin:/bin"}, capture_output=True, text=True)
        if proc.returncode:
            print(f"{code}: the scan failed:\n{proc.stderr[-2000:]}", file=sys.stderr)
            return 1
        results.append(json.loads(proc.stdout.splitlines()[-1]))
    width = max(len(str(c)) for c in codes)
    print(f"{'family':18s} " + " ".join(f"{str(c)[-width:]:>{width}s}" for c in codes))
    for row in results[0]:
        cells = [f"{r[row][0]}/{args.seeds} {r[row][1] or ''}" for r in results]
        print(f"{row:18s} " + " | ".join(cells))
    totals = [sum(r[row][0] for row in r) for r in results]
    print(f"{'runs warned':18s} " + " | ".join(f"{t}/{args.seeds * len(results[0])}" for t in totals))
    return 0


if __name__ == "__main__":
    sys.exit(main())
