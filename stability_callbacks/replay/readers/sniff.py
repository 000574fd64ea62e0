"""Format detection from a log's text: the first decisive line wins.

JSON objects (our run log, metric dicts; ``trainer_state.json``), CSV tables (a header row of
names and a row of as many cells: our CSV, Lightning's ``metrics.csv``, W&B exports) are told
by their first lines; Megatron, fairseq and Caffe by a line only they print; anything else that
prints a step and a training metric is the generic reader's. Detection reads a bounded prefix
(``DETECT_MAX_LINES``, ``JSON_DOCUMENT_LINES``), never a whole file, and never throws on what it
reads: a line it cannot interpret is no evidence either way.
"""
from __future__ import annotations

import csv
import json
import re
import time
from typing import Iterable

from ... import keys
from . import caffe, fairseq, generic, jsonl, megatron, suggest
from .history import Histories
from .source import LogFormatError, segments, strip_prefix

# A Megatron log may print 10k lines of arguments and start-up before its first iteration.
DETECT_MAX_LINES = 200_000
# `{` on a line of its own: a JSON document, held until it closes (at its first column), up to
# this many lines: a `log_history` key makes it trainer_state.json, a list of records (a results
# file, `json.dump(..., indent=2)`) our JSON reader's.
JSON_DOCUMENT_LINES = 100_000
JSON_LINE_MAX_CHARS = 1 << 20
# A followed file: how long a tentative answer (DeepSpeed or overflow lines so far) waits for a
# decisive line (Megatron's first iteration line comes within a few steps of DeepSpeed's).
SETTLE_S = 30.0

# Formats with semantics of their own, recognised line by line before the generic reader, each
# with a substring every decisive line contains (a cheap filter before the regular expression).
# Megatron-DeepSpeed logs also carry DeepSpeed's `step=N, skipped=K` and OVERFLOW lines (which
# the generic reader reads), sometimes hundreds of lines before the first iteration line: a
# record without a loss or a grad norm, or an overflow line, waits for a decisive line.
_SIGNATURES = (("megatron", "iteration", (megatron.SIGNATURE,)),
               ("fairseq", "num_updates", fairseq.SIGNATURES),
               ("caffe", "] ", caffe.SIGNATURES))
_CELL = re.compile(r"^[\w./ ()\[\]%:@-]{1,80}$")   # (YOLOv5's `metrics/mAP_0.5:0.95`, `acc@1`)
_NUMBER = re.compile(r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|inf|infinity)", re.I)

LOOKED_FOR = (
    "a step (step, iter, iteration, global_step, num_updates, Step N/M, epoch + batch) with a\n"
    "    training loss, grad norm, LR or loss scale (loss, lm loss, train_loss, grad_norm, gnorm,\n"
    "    lr, learning_rate, loss_scale, ...) as key: v, key=v, key v, | fields, tables, dicts or\n"
    "    JSON; or Megatron, fairseq, Caffe, JSON lines, CSV, W&B CSV, trainer_state.json, TensorBoard")


class NoRecords(LogFormatError):
    """No per-step training metric anywhere: what was looked for, the closest lines, the way out
    (:mod:`.suggest`: commands to paste, each checked to read those lines). ``guess``: where the
    closest lines are progress lines whose loss has no name, what may be the loss
    (:func:`.suggest.guess`; the reader reads it so, and says it is a guess), with the lines
    detection ``consumed``."""

    def __init__(self, path, num_lines: int, closest: suggest.ClosestLines, consumed: list | None = None,
                 guess: suggest.Guess | None = None):
        self.consumed = consumed or []
        self.guess = guess
        self.closest = closest.lines()
        lines = [f"unknown log format: no per-step training metrics in {num_lines} line(s).",
                 f"  looked for: {LOOKED_FOR}."]
        if self.closest:
            lines.append("  closest lines:")
            lines += [f"    line {n}: {text}" for n, text, _ in self.closest]
        best = closest.best()
        pasted = [c for c in (suggest.commands(path, *best) if best is not None else []) if _reads(c, self.consumed)]
        if pasted:
            lines.append("  say it explicitly (paste one; --keys OURS=THEIRS names what the log prints "
                         "as step, loss, ..., by name or by position on the line from 1):")
            lines += [f"    {c}" for c in pasted]
        else:
            lines.append("  no number on these lines can be told to be a loss: name it with --keys "
                         "(OURS=THEIRS: loss=its name, or its position on the line from 1)")
        super().__init__(path, None, "\n".join(lines))


def detect_lines(path, lines: Iterable, *, user_keys=None, pattern=None) -> tuple[str, list]:
    """The format of a log from its ``(line_no, text)`` lines, and the lines consumed.

    A ``None`` text (a followed file went idle) settles a tentative answer held ``SETTLE_S``;
    otherwise detection waits for a decisive line. :class:`NoRecords` when the lines end (or
    ``DETECT_MAX_LINES`` pass) undecided.
    """
    consumed: list = []
    structured = _Structured()
    tentative = None
    tentative_since = 0.0
    reader = generic.LineReader(user_keys, pattern)
    closest = suggest.ClosestLines()
    histories = Histories()
    explicit = user_keys or pattern

    def kind(items: list) -> str | None:
        """The format the first decisive of these lines decides (a history: its epochs' lines)."""
        nonlocal tentative, tentative_since
        for item in items:
            texts = [(item[0], item[1])] if isinstance(item, tuple) else [(item.line_no, t) for t in item.epochs]
            for held_no, held in texts:
                got = _line_kind(held, reader, closest, held_no, explicit)
                if got == "tentative":
                    if tentative is None:
                        tentative, tentative_since = "generic", time.monotonic()
                elif got is not None:
                    return got
        return None

    for item in lines:
        line_no, text = item
        if text is None:
            if tentative is not None and time.monotonic() - tentative_since >= SETTLE_S:
                return tentative, consumed
            continue
        consumed.append(item)
        if len(consumed) > DETECT_MAX_LINES:
            break
        if structured.open:
            got = structured.offer(text)
            if got is not None:
                return got, consumed
            if structured.open:
                continue
            got = kind([x for held in structured.release() for x in histories.offer(*held)])
        else:
            got = kind(histories.offer(line_no, text))
        if got is not None:
            return got, consumed
    held = [x for held in structured.release() for x in histories.offer(*held)] if structured.open else []
    got = kind(held + histories.end())
    if got is not None:
        return got, consumed
    if tentative is not None:
        return tentative, consumed
    raise NoRecords(path, len(consumed), closest, consumed, None if explicit else closest.guess())


def _line_kind(text, reader, closest, line_no, explicit) -> str | None:
    """The format one line decides, ``"tentative"`` for a record that may be Megatron's, or None."""
    if not explicit:
        for name, needle, signatures in _SIGNATURES:
            if needle in text and any(sig.search(text) for sig in signatures):
                return name
    tentative = False
    for seg in segments(text):
        got = reader.parse(strip_prefix(seg))
        if got is None:
            continue
        plan = got[1]
        parts = [p for _, _, p in plan.parts] if plan.kind == "multi" else [plan]
        if any(p.kind == "record" and (explicit or p.components or any(
                k in (keys.LOSS, keys.GRAD_NORM) for _, k, _ in p.metrics)) for p in parts) \
                or (plan.kind == "eval" and plan.eval_at is not None and reader.row):
            return "generic"          # (a results table's rows of evaluations: read, judged on them)
        if plan.kind in ("record", "overflow"):
            tentative = True          # an LR, a skip count, an overflow: maybe Megatron's
        elif plan.kind not in ("overflow", "summary", "eval"):
            closest.offer(line_no, seg, plan)
    if reader.table is not None:
        return None
    return "tentative" if tentative else None


class _Structured:
    """The first non-blank lines of JSON and CSV files: ``offer`` lines until they decide a
    format (returned) or rule the structured formats out (``open`` turns False; ``release``
    gives the lines back to line-by-line detection)."""

    def __init__(self):
        self.open = True
        self.held: list[tuple[int, str]] = []
        self.mode = ""            # "" | "json" (a document) | "table" (a header, awaiting a row)
        self.header: list[str] = []
        self.delimiter = ","
        self.seen = 0

    def release(self) -> list[tuple[int, str]]:
        held, self.held, self.open = self.held, [], False
        return held

    def offer(self, text: str) -> str | None:
        s = text.strip()
        if not s and not self.held:
            return None
        self.seen += 1
        self.held.append((self.seen, text))
        try:
            return self._decide(s, text)
        except (csv.Error, ValueError):
            self.open = False
            return None

    def _decide(self, s: str, text: str) -> str | None:
        if self.mode == "json":
            if '"log_history"' in s:
                return "hf-state"
            if text[:1] in "}]":   # the document closed (at its first column): records in a list are JSON's
                listed = jsonl.records_of_document(list(enumerate((t for _, t in self.held), 1)))
                if listed is not None:
                    return "jsonl"
                self.open = False
            elif self.seen > JSON_DOCUMENT_LINES:
                self.open = False
            return None
        if self.mode == "table":
            if not s:
                return None
            row = next(csv.reader([s], delimiter=self.delimiter))
            if len(row) == len(self.header) and any(_NUMBER.fullmatch(c.strip()) for c in row):
                return self._table_kind()
            self.open = False
            return None
        if s.startswith("{"):
            if len(s) > JSON_LINE_MAX_CHARS:       # one huge object: look, do not load
                return "hf-state" if '"log_history"' in s[:JSON_LINE_MAX_CHARS] else "jsonl"
            try:
                obj = json.loads(s)
            except ValueError:
                obj = None
            if isinstance(obj, dict):
                return "hf-state" if "log_history" in obj else "jsonl"
            if "'" not in s[:3]:
                self.mode = "json"         # a document over many lines
                if '"log_history"' in s:
                    return "hf-state"
                return None
            self.open = False
            return None
        self.delimiter = "\t" if "\t" in s and "," not in s else ","
        if self.delimiter in s:
            cells = [c.strip() for c in next(csv.reader([s], delimiter=self.delimiter))]
            if len(cells) >= 2 and all(_CELL.match(c) and not _NUMBER.fullmatch(c) for c in cells if c) \
                    and any(c[:1].isalpha() or c[:1] == "_" for c in cells):
                self.mode, self.header = "table", cells
                return None
        self.open = False
        return None

    def _table_kind(self) -> str:
        cells = self.header
        if ("_step" in cells or "Step" in cells or "train/global_step" in cells
                or any(" - " in c or c.endswith("__MIN") for c in cells)):
            return "wandb-csv"
        return "csv"


def _reads(command: str, lines: list) -> bool:
    """Whether a suggested command (``--keys SPEC`` or ``--pattern RE``) reads a loss from the lines
    detection consumed, as the log would be read once pasted (a suggestion that reads one line
    may read no record of the whole: before, both of a refusal's suggestions could exit 2 too)."""
    import shlex

    from .account import ReadAccount
    from .user_keys import parse_keys
    args = shlex.split(command)
    kw: dict = {}
    try:
        if "--keys" in args:
            kw["user_keys"] = parse_keys(args[args.index("--keys") + 1])
        if "--pattern" in args:
            kw["pattern"] = re.compile(args[args.index("--pattern") + 1])
        return any(keys.LOSS in r.metrics for r in generic.read(
            "", account=ReadAccount(""), lines=[(n, t) for n, t in lines if t is not None], **kw))
    except (ValueError, re.error, LogFormatError):
        return False

