"""Readers: one per log format, each a generator of :class:`~stability_callbacks.record.StepRecord`.

>>> from stability_callbacks.replay.readers import read_records, detect_format
>>> detect_format("tests/data/real_logs/bs_tr11_176B_spike31216.log")           # doctest: +SKIP
'megatron'
>>> [r.step for r in read_records("run.log")][:3]                                # doctest: +SKIP
[31214, 31215, 31216]

Auto-detection reads the text, not the file name: the first decisive line wins (a Megatron
iteration line, a DeepSpeed ``step=N, skipped=K`` line, an HF log dict, ...); JSON, JSONL and CSV
are told apart by their first line. Readers stream (no whole-file loads; ``trainer_state.json``
and TensorBoard runs excepted, see their modules) and cost O(1) memory per line.
"""
from __future__ import annotations

import csv
import json
import os
from typing import Callable, Iterator, Mapping

from ... import keys
from ...record import StepRecord
from . import (csv_table, deepspeed, fairseq, hf, jsonl, litgpt, llamafactory, llmc, megatron,
               mlx, nanogpt, tensorboard_events)
from .source import LogFormatError, SkipReport, numbered_lines

__all__ = ["FORMATS", "LogFormatError", "detect_format", "read_records"]

FORMATS = ("megatron", "hf", "hf-state", "nanogpt", "llmc", "deepspeed", "litgpt", "mlx",
           "fairseq", "llamafactory", "jsonl", "csv", "tensorboard", "wandb-csv")

_READERS: dict[str, Callable[..., Iterator[StepRecord]]] = {
    "megatron": megatron.read, "hf": hf.read, "hf-state": hf.read_state, "nanogpt": nanogpt.read,
    "llmc": llmc.read, "deepspeed": deepspeed.read, "litgpt": litgpt.read, "mlx": mlx.read,
    "fairseq": fairseq.read, "llamafactory": llamafactory.read, "jsonl": jsonl.read,
    "csv": csv_table.read_csv, "tensorboard": tensorboard_events.read,
    "wandb-csv": csv_table.read_wandb,
}

# Other names people use for the same formats.
ALIASES = {
    "megatron-lm": "megatron", "megatron-deepspeed": "megatron", "gpt-neox": "megatron",
    "neox": "megatron", "nanogpt-speedrun": "nanogpt", "modded-nanogpt": "nanogpt",
    "llm.c": "llmc", "deepspeed-chat": "deepspeed", "hf-trainer": "hf",
    "trainer_state": "hf-state", "trainer-state": "hf-state", "mlx-lm": "mlx",
    "llama-factory": "llamafactory", "tb": "tensorboard", "wandb": "wandb-csv",
    "runlog": "jsonl",
}

# Text formats in the order their decisive lines are tried on each line, each with a substring
# every decisive line contains (a cheap filter before the regular expressions).
_TEXT_SIGNATURES = (
    ("megatron", "iteration", (megatron.SIGNATURE,)),
    ("deepspeed", "step=", deepspeed.SIGNATURES),
    ("llmc", "tr", llmc.SIGNATURES), ("fairseq", "num_updates", fairseq.SIGNATURES),
    ("litgpt", "iter ", litgpt.SIGNATURES), ("mlx", "Train loss", mlx.SIGNATURES),
    ("nanogpt", "loss", nanogpt.SIGNATURES), ("hf", "{", hf.SIGNATURES),
)
# Megatron-DeepSpeed logs also carry DeepSpeed's own `step=N, skipped=K` lines, sometimes
# hundreds of lines before the first iteration line: a DeepSpeed hit waits for the whole
# detection window to rule Megatron out.
_OUTRANKED_BY_MEGATRON = ("deepspeed",)
# A Megatron log may print 10k lines of arguments and start-up before its first iteration.
DETECT_MAX_LINES = 200_000
_JSON_STATE_MAX_BYTES = 512 * 1024 * 1024


def canonical_format(name: str) -> str:
    """``FORMATS`` member for a format name or alias; ``ValueError`` names an unknown one."""
    n = name.strip().lower()
    n = ALIASES.get(n, n)
    if n not in FORMATS and n != "auto":
        raise ValueError(f"format: unknown {name!r}; one of auto, {', '.join(FORMATS)}")
    return n


def detect_format(path) -> str:
    """The format of the log at ``path`` (one of ``FORMATS``), from its content.

    Raises :class:`LogFormatError` for a missing file or text in no known format.
    """
    p = str(path)
    if os.path.isdir(p):
        if tensorboard_events.event_dirs(p):
            return "tensorboard"
        raise LogFormatError(p, None, "a directory without TensorBoard event files")
    if not os.path.exists(p):
        raise LogFormatError(p, None, "no such file")
    if "tfevents" in os.path.basename(p):
        return "tensorboard"
    first = True
    tentative = None
    for _, text in numbered_lines(p, max_lines=DETECT_MAX_LINES):
        if first:
            if not text.strip():
                continue
            first = False
            kind = _structured_kind(p, text)
            if kind is not None:
                return kind
        for name, needle, signatures in _TEXT_SIGNATURES:
            if needle in text and any(sig.search(text) for sig in signatures):
                if name in _OUTRANKED_BY_MEGATRON:
                    tentative = tentative or name
                    break
                if tentative is not None and name != "megatron":
                    return tentative
                return name
    if tentative is not None:
        return tentative
    where = f"the first {DETECT_MAX_LINES} lines" if not first else "the file"
    raise LogFormatError(p, None, f"unknown log format: no line in {where} looks like any of "
                                  f"{', '.join(FORMATS)} (pass --format to force one)")


def _structured_kind(path: str, first_line: str) -> str | None:
    """JSON / JSONL / CSV kinds, told apart by the first non-blank line."""
    s = first_line.strip()
    if s.startswith("{"):
        try:
            obj = json.loads(s)
        except ValueError:
            obj = None
        if isinstance(obj, dict):
            if "log_history" in obj:
                return "hf-state"
            return "llamafactory" if "current_steps" in obj else "jsonl"
        if "'" not in s[:3] and os.path.getsize(path) <= _JSON_STATE_MAX_BYTES:
            try:
                with open(path, encoding="utf-8") as f:
                    obj = json.load(f)
                if isinstance(obj, dict) and "log_history" in obj:
                    return "hf-state"
            except (ValueError, OSError):
                pass
        return None
    if "," in s and ":" not in s.split(",", 1)[0]:
        cells = [c.strip() for c in next(csv.reader([s]))]
        if ("_step" in cells or "Step" in cells or "train/global_step" in cells
                or any(" - " in c or c.endswith("__MIN") for c in cells)):
            return "wandb-csv"
        if "step" in cells:
            return "csv"
    return None


def read_records(path, format: str = "auto", tag_map: Mapping[str, str | None] | None = None,
                 on_skip: Callable[[int, str, str], None] | None = None,
                 progress: bool = False) -> Iterator[StepRecord]:
    """Records of the log at ``path`` in file order.

    ``format``: ``"auto"`` or one of ``FORMATS`` (aliases such as ``nanogpt-speedrun`` accepted).
    ``tag_map``: {source name: metric key or None} for named sources (TensorBoard, CSV, JSON).
    ``on_skip(line_no, text, reason)`` hears of every unreadable line (the rest is replayed);
    without it a one-line summary is logged. ``progress``: a ``rich`` bar for large files.
    Detection and argument errors raise here; a log with no record at all raises
    :class:`LogFormatError` once the generator is exhausted.
    """
    fmt = canonical_format(format)
    if tag_map:
        for name, key in tag_map.items():
            if key is not None and not keys.is_known(key):
                raise ValueError(f"tag_map.{name}: {key!r} is not a metric key "
                                 f"({', '.join(keys.ALL)} or loss/<name>)")
    if fmt == "auto":
        fmt = detect_format(path)
    elif not os.path.exists(str(path)):
        raise LogFormatError(path, None, "no such file")
    return _records(path, fmt, tag_map, SkipReport(path, on_skip), progress)


def _records(path, fmt, tag_map, report, progress) -> Iterator[StepRecord]:
    n = 0
    for rec in _READERS[fmt](path, on_skip=report, progress=progress, tag_map=tag_map):
        n += 1
        yield rec
    report.finish()
    if n == 0:
        skipped = f"; {report.count} unreadable line(s) skipped" if report.count else ""
        raise LogFormatError(path, None, f"no {fmt} records found{skipped}")
