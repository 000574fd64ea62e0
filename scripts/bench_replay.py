"""Monitor throughput: steps/s of Monitor.update on a real 20k-step log (records pre-read).

    python scripts/bench_replay.py [LOG] [--repeat N]

Prints the median of N timed passes over the same records (reading excluded; reading is
reported separately), and JSON as the last line.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from stability_callbacks import Monitor, StepRecord
from stability_callbacks.replay.readers import read_records

DEFAULT = Path(__file__).resolve().parent.parent / "tests" / "data" / "real_logs" / "mn_gpt2_1p5B_scaleup_20k.log"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("log", nargs="?", default=str(DEFAULT))
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    t0 = time.perf_counter()
    records = list(read_records(args.log))
    read_s = time.perf_counter() - t0
    rates = []
    for _ in range(args.repeat):
        fresh = [StepRecord(r.step, dict(r.metrics)) for r in records]
        m = Monitor()
        t0 = time.perf_counter()
        for r in fresh:
            m.update(r)
        rates.append(len(fresh) / (time.perf_counter() - t0))
    result = {"log": Path(args.log).name, "steps": len(records), "keys": sorted(records[0].metrics),
              "read_s": round(read_s, 3), "monitor_steps_per_s": round(statistics.median(rates)),
              "min_steps_per_s": round(min(rates)), "max_steps_per_s": round(max(rates))}
    print(f"{result['steps']} steps, Monitor.update median {result['monitor_steps_per_s']:,} steps/s "
          f"(min {result['min_steps_per_s']:,}, max {result['max_steps_per_s']:,}); reading took {read_s:.2f} s")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
