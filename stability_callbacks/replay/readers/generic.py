"""The generic metric-line reader: any text log whose lines print a step and training metrics.

A small grammar (docs/replay.md, The reader grammar): each line is cut into numbers and its
template (:mod:`.tokens`); a template is interpreted once — which number is the step, which the
loss, what kind of line — from the vocabulary (:mod:`.vocabulary`, data) and the line's
structure (:mod:`.plan`), and the plan is cached, so an ordinary line costs one
regular-expression match and a few ``float()`` calls. The assembler (:mod:`.assemble`) turns
the lines into records. Tables (a header row of names, rows of values: HF notebook tables,
ultralytics' epoch table) are read as their rows' ``name: value`` pairs.

``--keys`` adds the user's names to the vocabulary; ``--pattern`` replaces the grammar by one
regular expression.

Memory is O(1) per line (plus at most ``MAX_TEMPLATES`` cached plans); cost is linear in the
line's length, however many numbers it holds.
"""
from __future__ import annotations

import heapq
import re
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Mapping

from ...record import StepRecord
from . import tokens
from .account import ReadAccount
from .assemble import Assembler
from .plan import Plan, make_plan
from .source import segments, strip_prefix
from .vocabulary import classify, normalise_key

MAX_TEMPLATES = 4096
# Plans are pure functions of a template and the user's keys: shared by every reader of the
# process (detection and reading of one log interpret each template once).
_PLANS: dict[tuple, Plan] = {}
# A learned record template as one regular expression: the next line of the same shape is read
# by a single match (about twice as fast as splitting it), whitespace runs of any width. Only
# templates of ordinary lines are compiled (a regular expression per number costs to build).
_COMPILE_MAX_NUMBERS = 64
_TEMPLATE_NUMBER = f"({tokens.NUM})"
_SPACES = re.compile(r"(?:\\[ \t])+")
_RULE_CELL = re.compile(r"^:?-{2,}:?$")
_NAME_CELL = re.compile(r"^[A-Za-z][\w ()./%-]*$")
_REASONS = {"eval": "evaluation", "summary": "run summary", "ignore": "no training metric",
            "overflow": "overflow (folded into the next record)", "epoch": "epoch header",
            "header": "step header", "nan": "NaN warning (marks the step before it)"}


class LineReader:
    """Interpretation of single lines: ``(numbers, plan)`` or ``None`` for a line without
    numbers. Plans are cached per template; the last record template is tried first."""

    def __init__(self, user_keys: Mapping[str, str] | None = None,
                 pattern: re.Pattern | None = None):
        self.user = {normalise_key(k): v for k, v in (user_keys or {}).items()}
        self._user_key = tuple(sorted(self.user.items()))
        self.pattern = pattern
        self.last: Plan | None = None
        self.table: tuple[list[str], list[int], bool] | None = None   # header, key columns, pipes

    def parse(self, seg: str) -> tuple[tuple | list, Plan] | None:
        last = self.last
        if last is not None and last.match is not None:   # a record plan: compiled
            m = last.match(seg)
            if m is not None:
                return m.groups(), last
        if self.pattern is not None:
            return self._parse_pattern(seg)
        texts, nums = tokens.split(seg)
        if not nums:
            self._table_header(seg)
            return None
        if self.table is not None:
            row = self._table_row(seg)
            if row is not None:
                texts, nums = tokens.split(row)
        tkey = ("\x00".join(texts), self._user_key)
        plan = _PLANS.get(tkey)
        if plan is None:
            if len(_PLANS) >= MAX_TEMPLATES:
                _PLANS.clear()
            plan = _PLANS[tkey] = make_plan(texts, nums, self.user)
        if plan.kind == "record":
            if plan.match is None and len(nums) <= _COMPILE_MAX_NUMBERS:
                plan.match = re.compile(_TEMPLATE_NUMBER.join(
                    _SPACES.sub(r"[ \\t]+", re.escape(t)) for t in texts)).fullmatch
            self.last = plan
        return nums, plan

    def _table_header(self, line: str) -> None:
        """A row of names with a step or epoch column and a loss column starts a table; rule
        rows (``-- | --``) keep it."""
        cells = tokens.cells(line)
        if len(cells) < 2 or all(_RULE_CELL.match(c) for c in cells if c):
            return
        if not all(_NAME_CELL.match(c) for c in cells):
            return
        roles = [classify(c, self.user)[:2] for c in cells]
        counters = [i for i, (r, _) in enumerate(roles) if r in ("step", "epoch")]
        losses = [i for i, (r, k) in enumerate(roles) if k == "loss" and r in ("metric", "component")]
        if counters and losses:
            self.table = (cells, counters + losses, "|" in line)

    def _table_row(self, line: str) -> str | None:
        """A table row as ``name: value | ...``, or None when the line is no row of it."""
        assert self.table is not None
        names, key_cols, pipes = self.table
        cells = tokens.cells(line, pipes)
        if not len(names) <= len(cells) <= len(names) + 8:
            return None
        if any(not cells[i][:1].isdigit() and cells[i][:2] != "-0" and cells[i][:1] != "-"
               and cells[i].lower() != "nan" for i in key_cols):
            return None
        return " | ".join(f"{name}: {cell.rstrip(':')}" for name, cell in zip(names, cells)
                          if cell[:1].isdigit() or cell[:1] == "-" or cell.lower() == "nan")

    def _parse_pattern(self, seg: str):
        m = self.pattern.search(seg) if self.pattern is not None else None
        if m is None:
            return None
        nums: list[str] = []
        metrics: list[tuple[int, str, bool]] = []
        step = None
        for name, value in m.groupdict().items():
            if value is None:
                continue
            if name == "step":
                step = len(nums)
            else:
                metrics.append((len(nums), name, False))
            nums.append(value.strip())
        loss_at = next((i for i, k, _ in metrics if k == "loss"), None)
        printed = tuple((k, f"(?P<{k}>)") for _, k, _ in metrics) + (
            (("step", "(?P<step>)"),) if step is not None else ())
        return nums, Plan(metrics=tuple(metrics), step=step, loss_at=loss_at, printed=printed)


def read(path, *, account: ReadAccount, lines: Iterable, user_keys: Mapping[str, str] | None = None,
         pattern: re.Pattern | None = None, **_) -> Iterator[StepRecord]:
    """Records of a text log from its ``(line_no, text)`` ``lines`` (a ``None`` text is an idle
    tick that releases the held-back record); ``user_keys``: {name printed in the log: metric
    key or ``"step"``}; ``pattern``: a regular expression whose named groups (``step`` and
    metric keys) replace the grammar."""
    reader = LineReader(user_keys, pattern)
    asm = Assembler(account)
    record = asm.record
    for line_no, text in lines:
        if text is None:
            yield from asm.flush()
            continue
        text = strip_prefix(text)
        # The common case inline (a line of the last record template); feed_line otherwise.
        last = reader.last
        m = last.match(text) if last is not None and last.match is not None \
            and asm.block is None else None
        if m is not None and last is not None:
            try:
                out = record(m.groups(), last)
            except (ValueError, OverflowError) as e:
                account(line_no, text, f"unreadable number: {e}")
                continue
        else:
            out = feed_line(reader, asm, line_no, text, account)
        if out:
            yield from out
    yield from asm.finish()


def feed_line(reader: LineReader, asm: Assembler, line_no: int, text: str,
              account: ReadAccount) -> list[StepRecord]:
    """One physical line through ``reader`` into ``asm``: the records it completes."""
    out: list[StepRecord] = []
    text = strip_prefix(text)
    stripped = text.lstrip(" \t")
    indent = len(text) - len(stripped)
    if asm.block is not None and (indent <= asm.block_indent or not stripped):
        out += asm.close_block()      # the indented block under a step header ended
    asm.indent = indent
    for seg in (segments(text) if ("\r" in text or "\x1b" in text or "\b" in text) else (text,)):
        seg = strip_prefix(seg)       # a coloured prefix shows once the colour codes are gone
        got = reader.parse(seg)
        if got is None:
            if seg.strip():
                account.ignore(line_no, seg, "no numbers")
            continue
        nums, plan = got
        try:
            out += asm.feed(nums, plan)
        except (ValueError, OverflowError) as e:
            account(line_no, seg, f"unreadable number: {e}")
            continue
        if plan.kind != "record" and not (asm.block is not None and plan.metrics):
            account.ignore(line_no, seg, _REASONS.get(plan.kind, "no training metric"))
    return out


_OVERFLOW_LINES = LineReader()


def overflow_scale(text: str) -> tuple[bool, float | None]:
    """Whether a line announces an fp16 overflow skip, and the loss scale it leaves.

    >>> overflow_scale("[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 32768")
    (True, 32768.0)
    >>> overflow_scale("Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 1024.0")
    (True, 1024.0)
    """
    got = _OVERFLOW_LINES.parse(text)
    if got is None or got[1].kind != "overflow":
        return bool("overflow" in text.lower() and "skip" in text.lower()), None
    nums, plan = got
    idx = plan.overflow_scale if plan.overflow_scale is not None else plan.overflow_attempted
    return True, (float(nums[idx]) if idx is not None else None)


@dataclass(order=True)
class _Near:
    score: int
    line_no: int = field(compare=False)
    text: str = field(compare=False)
    named: tuple = field(compare=False, default=())


class ClosestLines:
    """The lines that came closest to a record (most keyed numbers), for the error message."""

    def __init__(self, size: int = 3):
        self.size = size
        self.heap: list[_Near] = []

    def offer(self, line_no: int, text: str, plan: Plan) -> None:
        near = _Near(plan.score, -line_no, text.strip()[:200], plan.named)
        if len(self.heap) < self.size:
            heapq.heappush(self.heap, near)
        elif near > self.heap[0]:
            heapq.heapreplace(self.heap, near)

    def lines(self) -> list[tuple[int, str, tuple]]:
        return [(-n.line_no, n.text, n.named) for n in sorted(self.heap, reverse=True)]
