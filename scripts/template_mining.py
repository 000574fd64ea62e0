"""The drain3 template miner beside the reader's own template merging (issue 32).

    pip install drain3
    python scripts/template_mining.py [--field DIR]

For every text log of the corpora (tests/data/wild_logs, real_logs, formats, and the field
corpus folder given): the templates each method finds, the clusters of drain3 that hold lines the
reader interprets differently (a training record beside an evaluation or another template's
record: roles decided per drain3 cluster would misread those lines), and the time per line of
each (the reader's tokenizer and fold; drain3's ``add_log_message``, with its default settings
and with every number masked first, ``<NUM>``, as drain3's documentation advises for numbers
glued to words). Prints one line per corpus and configuration and a JSON summary last.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from stability_callbacks.replay.readers import tokens
from stability_callbacks.replay.readers.generic import LineReader, _fold
from stability_callbacks.replay.readers.source import Source, segments, strip_prefix

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "tests" / "data"


def lines_of(path: Path) -> list[str]:
    out = []
    for _, text in Source(path).lines():
        for seg in segments(strip_prefix(text)):
            seg = strip_prefix(seg)
            if tokens.split(seg)[1]:
                out.append(seg)
    return out


def miner(masked: bool):
    from drain3 import TemplateMiner
    from drain3.masking import MaskingInstruction
    from drain3.template_miner_config import TemplateMinerConfig
    config = TemplateMinerConfig()
    if masked:
        config.masking_instructions = [MaskingInstruction(tokens.NUM, "NUM")]
    return TemplateMiner(config=config)


def one_log(path: Path, masked: bool) -> dict:
    lines = lines_of(path)
    reader = LineReader()
    t0 = time.perf_counter()
    ours = []
    for seg in lines:
        texts, nums = tokens.split(seg)
        ours.append(_fold(texts))
    ours_s = time.perf_counter() - t0
    kinds = []
    for seg in lines:
        got = reader.parse(seg)
        kinds.append(got[1].kind if got is not None else "none")
    mine = miner(masked)
    t0 = time.perf_counter()
    clusters = [mine.add_log_message(seg)["cluster_id"] for seg in lines]
    drain_s = time.perf_counter() - t0
    members: dict[int, set] = {}
    for c, ours_key, kind in zip(clusters, ours, kinds):
        members.setdefault(c, set()).add((ours_key, kind))
    mixed_lines = 0
    mixed = 0
    for c, held in members.items():
        record_templates = {k for k, kind in held if kind == "record"}
        other_kinds = {kind for _, kind in held if kind != "record"}
        if record_templates and (other_kinds or len(record_templates) > 1):
            mixed += 1
            mixed_lines += sum(1 for x in clusters if x == c)
    return {"lines": len(lines), "ours": len(set(ours)), "drain3": len(members),
            "mixed_clusters": mixed, "lines_in_mixed": mixed_lines, "ours_s": ours_s, "drain3_s": drain_s}


def corpus(name: str, paths: list[Path], masked: bool) -> dict:
    rows = [one_log(p, masked) for p in paths]
    total = {k: sum(r[k] for r in rows) for k in rows[0]} if rows else {}
    total["logs"] = len(rows)
    total["logs_with_mixed"] = sum(1 for r in rows if r["mixed_clusters"])
    n = max(total.get("lines", 0), 1)
    print(f"{name:12s} {'masked' if masked else 'default':7s} {total['logs']:3d} logs {total['lines']:7,d} lines | templates: ours "
          f"{total['ours']:5d}, drain3 {total['drain3']:5d} | drain3 clusters mixing a record with "
          f"other lines: {total['mixed_clusters']} in {total['logs_with_mixed']} logs "
          f"({total['lines_in_mixed']:,} lines) | per line: ours {1e6 * total['ours_s'] / n:.1f} us, "
          f"drain3 {1e6 * total['drain3_s'] / n:.1f} us")
    return total


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--field", default="tests/data/field_logs")
    args = ap.parse_args()
    text = (".log", ".txt")
    sets = {
        "wild_logs": sorted(p for p in (DATA / "wild_logs").iterdir() if p.suffix in text),
        "real_logs": sorted((DATA / "real_logs").glob("*.log")),
        "formats": sorted((DATA / "formats").glob("*.log")),
        "field_logs": sorted(p for p in Path(args.field).glob("*") if p.suffix in text),
    }
    print(json.dumps({f"{name} {'masked' if masked else 'default'}": corpus(name, paths, masked)
                      for masked in (False, True) for name, paths in sets.items() if paths}))


if __name__ == "__main__":
    main()
