"""A snapshot of what ``replay`` says on every log under tests/data, to prove a change kept behaviour.

    python scripts/replay_snapshot.py /tmp/before.json      # on the tree before the change
    python scripts/replay_snapshot.py /tmp/after.json       # on the tree after it
    python scripts/replay_snapshot.py --diff /tmp/before.json /tmp/after.json

Every log (``.log``, ``.txt``, ``.jsonl``, ``.json``, ``.gz``, and each corpus's ``.csv`` files, which
are logs or the numbers a log holds) is replayed in this process through the CLI (``--format auto``,
``--json``), and the snapshot keeps per file the exit code, the read account and every
finding (kind, step, severity, value, baseline, message, details) as ``--json`` writes them.
``--diff`` prints the files whose output differs and the first differing lines; exit 1 when any do.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOG_SUFFIXES = (".log", ".txt", ".jsonl", ".json", ".gz", ".csv")
NOT_LOGS = {"README.md", "SOURCE", "LABELS"}


def logs(data: Path) -> list[Path]:
    """Every file under ``data`` a user might replay (the expected-numbers CSVs of the field corpus
    included: they are CSV logs too; the corpora's label and split files are not logs)."""
    return sorted(p for p in data.rglob("*") if p.is_file() and p.name.endswith(LOG_SUFFIXES)
                  and p.name not in NOT_LOGS and not p.name.startswith(("labels", "split."))
                  and "preflight" not in p.parts)


def replay_one(path: Path) -> dict:
    from stability_callbacks.cli import main

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out.jsonl"
        argv = ["replay", str(path), "--json", str(out)]
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            try:
                code = main(argv)
            except SystemExit as e:   # argparse and the CLI's own exits
                code = e.code if isinstance(e.code, int) else 2
            except Exception as e:  # noqa: BLE001 - the snapshot records a crash as an outcome
                return {"exit": "crash", "error": f"{type(e).__name__}: {e}"}
        lines = out.read_text(encoding="utf-8").splitlines() if out.exists() else []
    # the tree's own path is not behaviour: two checkouts must compare equal
    return {"exit": code, "json": [json.loads(line.replace(str(ROOT), "<tree>")) for line in lines]}


def snapshot(out: Path) -> None:
    data = ROOT / "tests" / "data"
    result = {}
    for path in logs(data):
        result[str(path.relative_to(data))] = replay_one(path)
    out.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    findings = sum(len(v.get("json", [])) for v in result.values())
    print(f"{len(result)} logs, {findings} json lines -> {out}")


def diff(a: Path, b: Path) -> int:
    before, after = json.loads(a.read_text()), json.loads(b.read_text())
    changed = 0
    for name in sorted(set(before) | set(after)):
        x, y = before.get(name), after.get(name)
        if x == y:
            continue
        changed += 1
        print(f"== {name}")
        if x is None or y is None:
            print("   only in", a if y is None else b)
            continue
        if x.get("exit") != y.get("exit"):
            print(f"   exit {x.get('exit')} -> {y.get('exit')}")
        xs = [json.dumps(r, sort_keys=True) for r in x.get("json", [])]
        ys = [json.dumps(r, sort_keys=True) for r in y.get("json", [])]
        for i, (p, q) in enumerate(zip(xs, ys)):
            if p != q:
                print(f"   line {i + 1}:\n   - {p[:400]}\n   + {q[:400]}")
                break
        if len(xs) != len(ys):
            print(f"   {len(xs)} -> {len(ys)} json lines")
    print(f"{changed} of {len(set(before) | set(after))} logs differ")
    return 1 if changed else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", nargs="?", help="where to write the snapshot (JSON)")
    ap.add_argument("--diff", nargs=2, metavar=("A", "B"), help="compare two snapshots")
    args = ap.parse_args()
    if args.diff:
        return diff(Path(args.diff[0]), Path(args.diff[1]))
    if not args.out:
        ap.error("give a path to write the snapshot to, or --diff A B")
    sys.path.insert(0, str(ROOT))
    snapshot(Path(args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
