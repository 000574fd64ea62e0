"""Run a selection of scenarios in worker processes, judge each from its run log, print the table.

Each worker is a fresh ``python -m live_suite.matrix --worker OUT NAME...`` running the
scenarios of ONE framework in order (DeepSpeed initialises torch.distributed in its process;
the HF Trainer and Lightning must not inherit that), writing ``OUT/NAME/result.json`` next to
the run log ``OUT/NAME/runlog.jsonl``. Up to ``jobs`` workers run at once.

The summary line: ``healthy runs with warn+ A/B, faults caught C/D, median delay E steps``.
"""
from __future__ import annotations

import argparse
import importlib
import json
import logging
import os
import shutil
import statistics
import subprocess
import sys
import time
import traceback
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from .runners import CONFIG_ENV
from .scenarios import FRAMEWORKS, MODELS, QUICK, SCENARIOS, Scenario
from .verdict import judge

TESTS = Path(__file__).resolve().parent.parent
ROOT = TESTS.parent
#: Rough cost of one optimizer step (ms) per framework, measured on this project's 2-core box;
#: only used to share scenarios out among workers. A worker's imports cost ~5-15 s, so a
#: framework gets a second worker only for more than ``_WORKER_MIN_S`` of training.
_STEP_MS = {"hf": 10.0, "lightning": 15.0, "deepspeed": 16.0}
_IMPORTS_TRL = ("trl",)
_WORKER_MIN_S = 60.0
_IMPORTS = {"hf": ("transformers", "stability_callbacks.integrations.hf"),
            "lightning": ("lightning.pytorch", "stability_callbacks.integrations.lightning"),
            "deepspeed": ("deepspeed", "stability_callbacks.integrations.deepspeed")}
_WORKER_TIMEOUT_S = 3600


# ----------------------------------------------------------------------------- one scenario
class _Captured(logging.Handler):
    """Warnings the library logs (not its findings, which the log sink also prints)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if not record.name.startswith("stability_callbacks.findings"):
            self.lines.append(f"{record.levelname}: {record.getMessage()}"[:300])


def run_one(sc: Scenario, out: Path) -> dict:
    """Train ``sc`` in this process, into ``out/<name>/``; judge it; write ``result.json``."""
    import torch

    from .runners import RUNNERS

    run_dir = out / sc.name
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    torch.set_num_threads(1)
    captured = _Captured()
    lib_log = logging.getLogger("stability_callbacks")
    lib_log.addHandler(captured)
    t0 = time.perf_counter()
    error, notes = None, {}
    try:
        notes = RUNNERS[sc.framework](sc, run_dir) or {}
    except Exception as e:
        if sc.fault is not None and sc.fault.kind == "bn-batch1":   # the crash is the fault
            notes = {"crash": f"{type(e).__name__}: {e}"[:300]}
        else:
            error = traceback.format_exc()[-3000:]
    finally:
        lib_log.removeHandler(captured)
    res = judge(sc, run_dir, log_warnings=captured.lines, error=error,
                seconds=time.perf_counter() - t0, notes=notes)
    shutil.rmtree(run_dir / "ckpt", ignore_errors=True)   # run logs are kept; weights are not
    (run_dir / "result.json").write_text(json.dumps(res, indent=1))
    return res


def _worker(out: Path, names: list[str]) -> None:
    import warnings

    warnings.filterwarnings("ignore")
    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "DeepSpeed", "deepspeed"):
        logging.getLogger(name).setLevel(logging.ERROR)
    # Imports first, so that a scenario's seconds are its own.
    for fw in dict.fromkeys(SCENARIOS[n].framework for n in names):
        for module in _IMPORTS[fw]:
            importlib.import_module(module)
    if any(SCENARIOS[n].trainer == "trl" for n in names):
        for module in _IMPORTS_TRL:
            importlib.import_module(module)
    if "transformers" in sys.modules:
        from transformers.utils import logging as hf_logging
        hf_logging.set_verbosity_error()
    for name in names:
        res = run_one(SCENARIOS[name], out)
        print(f"{name}: {'ok' if res['ok'] else 'NOT OK'} ({res['seconds']} s)", flush=True)


# ------------------------------------------------------------------------------ many at once
def _cost_s(sc: Scenario) -> float:
    return sc.steps * _STEP_MS[sc.framework] / 1000


def _chunks(scenarios: list[Scenario], jobs: int) -> list[list[Scenario]]:
    """Per framework, at most ``jobs`` workers, balanced by estimated cost (largest first)."""
    out = []
    for fw in FRAMEWORKS:
        mine = sorted((s for s in scenarios if s.framework == fw), key=_cost_s, reverse=True)
        if not mine:
            continue
        n = min(jobs, len(mine), max(1, round(sum(map(_cost_s, mine)) / _WORKER_MIN_S)))
        bins: list[list[Scenario]] = [[] for _ in range(n)]
        for sc in mine:
            min(bins, key=lambda b: sum(map(_cost_s, b))).append(sc)
        out += bins
    return sorted(out, key=lambda b: -sum(map(_cost_s, b)))


def run_scenarios(scenarios: list[Scenario], out: Path, *, jobs: int = 2) -> list[dict]:
    """Run ``scenarios`` in worker processes (``jobs`` at once); their results, in table order."""
    out = Path(out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu", TOKENIZERS_PARALLELISM="false",
               PYTHONPATH=os.pathsep.join([str(ROOT), str(TESTS), str(TESTS / "dist"),
                                           os.environ.get("PYTHONPATH", "")]))
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)      # a worker is a single process, whatever launched us
    logs = out / "_workers"
    shutil.rmtree(logs, ignore_errors=True)
    logs.mkdir()
    log_of: dict[str, Path] = {}

    def launch(i_chunk):
        i, chunk = i_chunk
        names = [s.name for s in chunk]
        log = logs / f"worker{i}-{chunk[0].framework}.log"
        for n in names:
            (out / n / "result.json").unlink(missing_ok=True)
            log_of[n] = log
        with open(log, "w") as fh:
            try:
                subprocess.run([sys.executable, "-m", "live_suite.matrix", "--worker", str(out), *names],
                               env=env, cwd=ROOT, stdout=fh, stderr=subprocess.STDOUT,
                               timeout=_WORKER_TIMEOUT_S, check=False)
            except subprocess.TimeoutExpired:
                pass

    chunks = _chunks(scenarios, max(1, jobs))
    with ThreadPoolExecutor(max(1, jobs)) as pool:
        list(pool.map(launch, enumerate(chunks)))
    results = []
    for sc in scenarios:
        path = out / sc.name / "result.json"
        if path.exists():
            results.append(json.loads(path.read_text()))
        else:
            results.append({"name": sc.name, "framework": sc.framework, "healthy": sc.healthy,
                            "fault": None if sc.fault is None else sc.fault.kind, "ok": False,
                            "error": f"the worker died before writing a result; see {log_of[sc.name]}",
                            "warnings": [], "seconds": 0.0})
    return results


def compact_runlog(src: Path, dst: Path, *, up_to_step: int | None = None, digits: int = 5) -> int:
    """A smaller, still replayable copy of a run log (for ``tests/data/live_runs/``): the lines
    up to step ``up_to_step``, step metrics rounded to ``digits`` significant digits (the LR
    exact: the phase tracker reads its stairs), without the batch fingerprint and the
    consumed-samples count (only a resume audit reads them). Returns the number of bytes
    written."""
    drop = {"batch_fingerprint", "consumed_samples"}
    out = []
    for line in Path(src).read_text().splitlines():
        obj = json.loads(line)
        if up_to_step is not None and obj.get("step", 0) > up_to_step:
            continue
        if obj["type"] == "step":
            obj["metrics"] = {k: (float(f"{v:.{digits}g}") if isinstance(v, float) and k != "lr" else v)
                              for k, v in obj["metrics"].items() if k not in drop}
        out.append(json.dumps(obj, separators=(",", ":")))
    text = "\n".join(out) + "\n"
    Path(dst).write_text(text)
    return len(text)


# ---------------------------------------------------------------------------------- output
def _f(x) -> str:
    return "-" if not x else ", ".join(f"{k}@{s} {sev}" for s, k, sev, *_ in x[:3]) + (
        f" (+{len(x) - 3})" if len(x) > 3 else "")


def format_table(results: list[dict]) -> str:
    rows = [("scenario", "setup", "run", "verdict", "findings at warning+")]
    for r in results:
        sc = SCENARIOS[r["name"]]
        run = r.get("evidence", "") + f"; {r['seconds']:.0f} s"
        if r.get("error"):
            verdict = "ERROR"
        elif sc.healthy:
            verdict = "quiet" if not r["warnings"] else "WARNS"
            if r.get("log_warnings"):
                verdict += f", {len(r['log_warnings'])} log warning(s)"
        else:
            c, d = r.get("catch"), r.get("delay")
            verdict = (f"caught +{d} ({c[1]})" if r.get("caught") else "MISSED" if c is None else
                       f"LATE +{d} ({c[1]})" if d > sc.fault.within else
                       f"+{d} ({c[1]}) but no {sc.fault.expect}")
            if r["warnings"]:
                verdict += ", warns before"
            if r.get("overreach"):
                verdict += f", OVERREACH ({r['overreach'][0][1]}@{r['overreach'][0][0]})"
        if r.get("evidence_ok") is False:
            verdict += ", NOT A REAL RUN" if sc.healthy else ", FAULT NOT REAL"
        if r.get("dishonest"):
            verdict += ", DISHONEST"
        setup = sc.describe() + (f"; {sc.fault.kind}@{sc.fault.step} (<= +{sc.fault.within})" if sc.fault else "")
        rows.append((sc.name, setup, run, verdict, _f(r.get("warnings"))))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(row[:4], widths)) + "  " + row[4] for row in rows]
    lines.insert(1, "-" * len(lines[0]))
    return "\n".join(lines)


def summary(results: list[dict]) -> str:
    healthy = [r for r in results if r["healthy"]]
    faults = [r for r in results if not r["healthy"]]
    # A warning the library logs (not a finding) is a warning the user sees all the same.
    warned = sum(bool(r["warnings"]) or bool(r.get("log_warnings")) for r in healthy)
    caught = [r for r in faults if r.get("caught")]
    delays = [r["delay"] for r in caught]
    med = f"{statistics.median(delays):g}" if delays else "n/a"
    return (f"healthy runs with warn+ {warned}/{len(healthy)}, faults caught {len(caught)}/{len(faults)}, "
            f"median delay {med} steps")


def select(*, only=(), frameworks=(), models=(), quick=False) -> list[Scenario]:
    picked = list(SCENARIOS.values())
    if quick:
        picked = [s for s in picked if s.name in QUICK]
    if frameworks:
        picked = [s for s in picked if s.framework in frameworks]
    if models:
        picked = [s for s in picked if s.model in models]
    if only:
        unknown = [n for n in only if n not in SCENARIOS]
        if unknown:
            raise SystemExit(f"--only: unknown scenario(s) {unknown}; known: {', '.join(SCENARIOS)}")
        picked = [s for s in picked if s.name in only]
    return picked


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="live_matrix.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--only", action="append", default=[], metavar="NAME",
                   help="run this scenario (repeatable, or comma-separated)")
    p.add_argument("--framework", action="append", default=[], choices=FRAMEWORKS,
                   help="only this framework's scenarios (repeatable)")
    p.add_argument("--model", action="append", default=[], choices=MODELS,
                   help="only this model's scenarios (repeatable; the other fields: --model cnn "
                        "--model ddpm --model nll --model vae --model bandit)")
    p.add_argument("--quick", action="store_true", help="the quick subset that make test runs")
    p.add_argument("--out", default=str(ROOT / "out" / "live_matrix"), help="run logs and results")
    p.add_argument("--jobs", type=int, default=2, help="worker processes at once (default 2)")
    p.add_argument("--list", action="store_true", help="print the scenario table and exit")
    p.add_argument("--healthy", action="store_true", help="only the healthy scenarios")
    p.add_argument("--config", help="a monitoring config (JSON) every runner uses instead of the "
                                    "defaults, e.g. '{\"policy\": {\"skip_step_on\": \"grad_outlier\"}}'")
    p.add_argument("--compact", nargs=2, metavar=("RUNLOG", "OUT"),
                   help="write a smaller replayable copy of a run log and exit")
    p.add_argument("--up-to-step", type=int, metavar="N", help="with --compact: keep steps 1..N")
    p.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.worker:
        _worker(Path(a.worker[0]), a.worker[1:])
        return 0
    if a.compact:
        size = compact_runlog(Path(a.compact[0]), Path(a.compact[1]), up_to_step=a.up_to_step)
        print(f"{a.compact[1]}: {size} bytes")
        return 0
    only = [n for item in a.only for n in item.split(",") if n]
    scenarios = select(only=only, frameworks=a.framework, models=a.model, quick=a.quick)
    if a.healthy:
        scenarios = [sc for sc in scenarios if sc.healthy]
    if a.config:
        json.loads(a.config)   # a bad config fails here, not in every worker
        os.environ[CONFIG_ENV] = a.config
    if a.list:
        for sc in scenarios:
            what = "healthy" if sc.healthy else f"{sc.fault.kind}@{sc.fault.step} (<= +{sc.fault.within})"
            print(f"{sc.name:24s} {sc.framework:9s} {sc.steps:5d}  {sc.describe()}; {what}")
        return 0
    t0 = time.perf_counter()
    results = run_scenarios(scenarios, Path(a.out), jobs=a.jobs)
    wall = time.perf_counter() - t0
    print(format_table(results))
    for r in results:
        if r.get("error"):
            print(f"\n{r['name']}: {r['error'].strip().splitlines()[-1]}")
        for w in r.get("log_warnings") or []:
            print(f"{r['name']}: logged {w}")
        for d in r.get("dishonest") or []:
            print(f"{r['name']}: dishonest {d}")
    (Path(a.out) / "results.json").write_text(json.dumps(results, indent=1))
    print(f"\n{summary(results)}  [{len(results)} runs, {wall:.0f} s wall, --jobs {a.jobs}]")
    bad = [r["name"] for r in results if not r["ok"]]
    if bad:
        print(f"not as expected: {', '.join(bad)}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
