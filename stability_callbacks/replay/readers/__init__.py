"""Readers: each a generator of :class:`~stability_callbacks.record.StepRecord`.

>>> from stability_callbacks.replay.readers import read_records, detect_format
>>> detect_format("tests/data/real_logs/bs_tr11_176B_spike31216.log")           # doctest: +SKIP
'megatron'
>>> [r.step for r in read_records("run.log")][:3]                                # doctest: +SKIP
[31214, 31215, 31216]

Text logs are read by the generic metric-line reader (:mod:`.generic`: any line that prints a
step and training metrics, in any common syntax) unless a format with semantics of its own is
recognised first: Megatron iteration lines (a vanished loss field is a NaN, hand-wrapped lines),
fairseq progress (epoch summaries only where no per-update line exists) and Caffe solver logs
(the loss is the train net output that enters the objective, not the header's average). JSON lines (our
run log and plain metric objects), CSV tables, W&B exports, ``trainer_state.json`` and
TensorBoard runs have their own readers. Auto-detection reads the text, not the file name: the
first decisive line wins. Readers stream (no whole-file loads; ``trainer_state.json`` and
TensorBoard runs excepted, see their modules) and cost O(1) memory per line.
"""
from __future__ import annotations

import csv
import json
import os
import re
import time
from itertools import chain
from typing import Callable, Iterable, Iterator, Mapping

from ... import keys
from ...record import StepRecord
from . import caffe, csv_table, fairseq, generic, hf, jsonl, megatron, tensorboard_events
from .source import LogFormatError, SkipReport, numbered_lines, segments, strip_prefix

__all__ = ["FORMATS", "LogFormatError", "detect_format", "read_records"]

FORMATS = ("generic", "megatron", "fairseq", "caffe", "hf-state", "jsonl", "csv", "tensorboard",
           "wandb-csv")

_READERS: dict[str, Callable[..., Iterator[StepRecord]]] = {
    "generic": generic.read, "megatron": megatron.read, "fairseq": fairseq.read, "caffe": caffe.read,
    "hf-state": hf.read_state, "jsonl": jsonl.read, "csv": csv_table.read_csv,
    "tensorboard": tensorboard_events.read, "wandb-csv": csv_table.read_wandb,
}
# Readers that take a ``lines`` iterator (a followed file); a ``None`` line is an idle tick.
LINE_READERS = ("generic", "megatron", "fairseq", "caffe", "jsonl", "csv")

# Other names for the same readers: the formats the generic reader reads without semantics of
# their own (DESIGN 2.4 names them), and the names people use.
ALIASES = {
    "hf": "generic", "hf-trainer": "generic", "nanogpt": "generic", "nanogpt-speedrun": "generic",
    "modded-nanogpt": "generic", "llmc": "generic", "llm.c": "generic", "deepspeed": "generic",
    "deepspeed-chat": "generic", "litgpt": "generic", "lit-gpt": "generic", "mlx": "generic",
    "mlx-lm": "generic", "torchtitan": "generic", "nanotron": "generic", "torchtune": "generic",
    "keras": "generic", "lightning": "generic", "text": "generic",
    "llamafactory": "jsonl", "llama-factory": "jsonl", "runlog": "jsonl",
    "megatron-lm": "megatron", "megatron-deepspeed": "megatron", "gpt-neox": "megatron",
    "neox": "megatron", "trainer_state": "hf-state", "trainer-state": "hf-state",
    "tb": "tensorboard", "wandb": "wandb-csv",
}

# Formats with semantics of their own, recognised line by line before the generic reader, each
# with a substring every decisive line contains (a cheap filter before the regular expression).
_SIGNATURES = (("megatron", "iteration", (megatron.SIGNATURE,)),
               ("fairseq", "num_updates", fairseq.SIGNATURES),
               ("caffe", "] ", caffe.SIGNATURES))
# Megatron-DeepSpeed logs also carry DeepSpeed's own `step=N, skipped=K` and OVERFLOW lines (which
# the generic reader reads), sometimes hundreds of lines before the first iteration line: a
# record line without a loss or a grad norm, or an overflow line, waits for the whole detection
# window (or a followed file's first idle moment) to rule Megatron out.
# A Megatron log may print 10k lines of arguments and start-up before its first iteration.
DETECT_MAX_LINES = 200_000
_JSON_STATE_MAX_BYTES = 512 * 1024 * 1024

LOOKED_FOR = (
    "a step (step, iter, iteration, global_step, num_updates, Step N/M, epoch + batch) with a\n"
    "    training loss, grad norm, LR or loss scale (loss, lm loss, train_loss, grad_norm, gnorm,\n"
    "    lr, learning_rate, loss_scale, ...) as key: v, key=v, key v, | fields, dicts or JSON;\n"
    "    or Megatron, fairseq, Caffe, JSON lines, CSV, W&B CSV, trainer_state.json, TensorBoard")


def canonical_format(name: str) -> str:
    """``FORMATS`` member for a format name or alias; ``ValueError`` names an unknown one."""
    n = name.strip().lower()
    n = ALIASES.get(n, n)
    if n not in FORMATS and n != "auto":
        raise ValueError(f"format: unknown {name!r}; one of auto, {', '.join(FORMATS)} "
                         f"(also {', '.join(sorted(ALIASES))})")
    return n


class NoRecords(LogFormatError):
    """No per-step training metric anywhere: what was looked for, the closest lines, the way out."""

    def __init__(self, path, num_lines: int, closest: list[tuple[int, str, tuple]]):
        self.closest = closest
        lines = [f"unknown log format: no per-step training metrics in {num_lines} line(s).",
                 f"  looked for: {LOOKED_FOR}."]
        if closest:
            lines.append("  closest lines:")
            lines += [f"    line {n}: {text}" for n, text, _ in closest]
        lines += suggestion(closest)
        super().__init__(path, None, "\n".join(lines))


def suggestion(closest) -> list[str]:
    """How to say it explicitly, built from the closest line's names where it has two."""
    names = list(closest[0][2]) if closest else []
    step = next((n for n in names if re.search(r"^(?:ep|it|s)$|step|iter|epoch|batch", n, re.I)),
                None)
    value = next((n for n in names if n != step), None)
    if step and value:
        keys_flag = f"--keys step={step},loss={value}"
        pattern = (f"{re.escape(step)}\\W*(?P<step>\\d+).*?{re.escape(value)}\\W*"
                   "(?P<loss>[^\\s,;|]+)")
    else:
        keys_flag = "--keys step=NAME,loss=NAME"
        pattern = "step (?P<step>\\d+) .*? loss (?P<loss>\\S+)"
    return [f"  say it explicitly: {keys_flag}   (our key=the name the log prints)",
            f"    or --pattern '{pattern}'   (named groups: step, loss, grad_norm, lr, "
            "loss_scale, skipped)"]


def detect_format(path) -> str:
    """The format of the log at ``path`` (one of ``FORMATS``), from its content.

    Raises :class:`LogFormatError` for a missing file, and :class:`NoRecords` (a
    ``LogFormatError``) for text with no per-step training metric in the detection window.
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
    return detect_lines(p, numbered_lines(p, max_lines=DETECT_MAX_LINES))[0]


# A followed file: how long a tentative answer (DeepSpeed or overflow lines so far) waits for a
# decisive line (Megatron's first iteration line comes within a few steps of DeepSpeed's).
SETTLE_S = 30.0


def detect_lines(path, lines: Iterable, *, user_keys=None, pattern=None
                 ) -> tuple[str, list]:
    """The format of a log from its ``(line_no, text)`` lines, and the lines consumed.

    A ``None`` text (a followed file went idle) settles a tentative answer held ``SETTLE_S``;
    otherwise detection waits for a decisive line. :class:`NoRecords` when the lines end
    undecided.
    """
    consumed: list = []
    first = True
    tentative = None
    tentative_since = 0.0
    reader = generic.LineReader(user_keys, pattern)
    closest = generic.ClosestLines()
    for item in lines:
        line_no, text = item
        if text is None:
            if tentative is not None and time.monotonic() - tentative_since >= SETTLE_S:
                return tentative, consumed
            continue
        consumed.append(item)
        if first:
            if not text.strip():
                continue
            first = False
            kind = _structured_kind(path, text)
            if kind is not None:
                return kind, consumed
        if user_keys or pattern:
            continue_generic = True
        else:
            continue_generic = False
            for name, needle, signatures in _SIGNATURES:
                if needle in text and any(sig.search(text) for sig in signatures):
                    return name, consumed
        for seg in segments(text):
            seg = strip_prefix(seg)
            got = reader.parse(seg)
            if got is None:
                continue
            plan = got[1]
            parts = [p for _, _, p in plan.parts] if plan.kind == "multi" else [plan]
            if any(p.kind == "record" and (continue_generic or any(
                    k in (keys.LOSS, keys.GRAD_NORM) for _, k, _ in p.metrics)) for p in parts):
                return "generic", consumed
            if plan.kind in ("record", "overflow") and tentative is None:
                tentative = "generic"     # an LR, a skip count, an overflow: maybe Megatron's
                tentative_since = time.monotonic()
            elif plan.score:
                closest.offer(line_no, seg, plan)
    if tentative is not None:
        return tentative, consumed
    raise NoRecords(path, len(consumed), closest.lines())


def _structured_kind(path: str, first_line: str) -> str | None:
    """JSON / JSONL / CSV kinds, told apart by the first non-blank line."""
    s = first_line.strip()
    if s.startswith("{"):
        try:
            obj = json.loads(s)
        except ValueError:
            obj = None
        if isinstance(obj, dict):
            return "hf-state" if "log_history" in obj else "jsonl"
        if "'" not in s[:3] and os.path.isfile(path) \
                and os.path.getsize(path) <= _JSON_STATE_MAX_BYTES:
            try:
                with open(path, encoding="utf-8") as f:
                    obj = json.load(f)
                if isinstance(obj, dict) and "log_history" in obj:
                    return "hf-state"
            except (ValueError, OSError):
                pass
        return None
    if "\t" in s and "," not in s and "step" in [c.strip() for c in s.split("\t")]:
        return "csv"                   # a tab-separated table: `step<TAB>loss`
    if "," in s and ":" not in s.split(",", 1)[0]:
        cells = [c.strip() for c in next(csv.reader([s]))]
        if ("_step" in cells or "Step" in cells or "train/global_step" in cells
                or any(" - " in c or c.endswith("__MIN") for c in cells)):
            return "wandb-csv"
        if "step" in cells:
            return "csv"
    return None


def parse_keys(spec: str) -> dict[str, str]:
    """``"step=iter,loss=train_loss"`` -> ``{"iter": "step", "train_loss": "loss"}`` (the
    name printed in the log -> our key); ``ValueError`` names a bad item.

    >>> parse_keys("step=it, loss=Train Loss")
    {'it': 'step', 'Train Loss': 'loss'}
    """
    out: dict[str, str] = {}
    for item in spec.split(","):
        ours, sep, theirs = item.partition("=")
        ours, theirs = ours.strip(), theirs.strip()
        if not sep or not ours or not theirs:
            raise ValueError(f"--keys: {item.strip()!r} is not OURS=THEIRS "
                             f"(e.g. step=iter,loss=train_loss)")
        if ours != "step" and not keys.is_known(ours):
            raise ValueError(f"--keys: {ours!r} is not step or a metric key "
                             f"({', '.join(keys.ALL)} or loss/<name>)")
        out[theirs] = ours
    return out


def compile_pattern(text: str) -> re.Pattern:
    """The ``--pattern`` regular expression; ``ValueError`` for a bad one or unknown groups."""
    try:
        pat = re.compile(text)
    except re.error as e:
        raise ValueError(f"--pattern: not a regular expression: {e}") from e
    names = set(pat.groupindex)
    bad = sorted(n for n in names if n != "step" and not keys.is_known(n))
    if bad or not names - {"step"}:
        raise ValueError(f"--pattern: named groups must be step and metric keys "
                         f"({', '.join(keys.ALL)}); got {sorted(names) or 'none'}")
    return pat


def read_records(path, format: str = "auto", tag_map: Mapping[str, str | None] | None = None,
                 on_skip: Callable[[int, str, str], None] | None = None,
                 progress: bool = False, user_keys: Mapping[str, str] | None = None,
                 pattern: re.Pattern | None = None, lines: Iterable | None = None
                 ) -> Iterator[StepRecord]:
    """Records of the log at ``path`` in file order.

    ``format``: ``"auto"`` or one of ``FORMATS`` (aliases such as ``nanogpt-speedrun`` accepted).
    ``tag_map``: {source name: metric key or None} for named sources (TensorBoard, CSV, JSON).
    ``user_keys`` ({name in the log: ``"step"`` or a metric key}, see :func:`parse_keys`) and
    ``pattern`` (see :func:`compile_pattern`) tell the generic reader what a line says.
    ``lines``: ``(line_no, text)`` pairs to read instead of the file (``replay --follow``).
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
    if (user_keys or pattern) and fmt in ("auto", "generic"):
        fmt = "generic"
    elif fmt == "auto" and lines is not None:
        fmt, consumed = detect_lines(path, lines)
        lines = chain(consumed, lines)
    elif fmt == "auto":
        fmt = detect_format(path)
    elif lines is None and not os.path.exists(str(path)):
        raise LogFormatError(path, None, "no such file")
    if lines is not None and fmt not in LINE_READERS:
        raise ValueError(f"format {fmt} cannot be followed (one of {', '.join(LINE_READERS)})")
    return _records(path, fmt, tag_map, SkipReport(path, on_skip), progress, user_keys, pattern,
                    lines)


def _records(path, fmt, tag_map, report, progress, user_keys, pattern, lines
             ) -> Iterator[StepRecord]:
    n = 0
    extra = {"lines": lines} if lines is not None else {}
    if fmt == "generic":
        extra.update(user_keys=user_keys, pattern=pattern)
    for rec in _READERS[fmt](path, on_skip=report, progress=progress, tag_map=tag_map, **extra):
        n += 1
        yield rec
    report.finish()
    if n == 0:
        if fmt == "generic" and lines is None:
            # Say what was looked for and what came closest (detection would have, had the
            # format not been forced).
            detect_lines(path, numbered_lines(path, max_lines=DETECT_MAX_LINES),
                         user_keys=user_keys, pattern=pattern)
        skipped = f"; {report.count} unreadable line(s) skipped" if report.count else ""
        raise LogFormatError(path, None, f"no {fmt} records found{skipped}")
