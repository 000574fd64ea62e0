"""JSON lines: our run log (DESIGN 2.3) and plain metric objects.

Run log: ``{"type": "step", "step": 7, "segment": 0, "metrics": {...}}`` lines become records in
file order (stitching rollback segments is :mod:`stability_callbacks.replay.timeline`'s job);
``finding`` / ``segment`` / ``checkpoint`` / ``action`` / ``phase`` lines are not steps (a ``phase`` line's
declared ``warmup_steps`` rides on the next step record, for the Monitor: replay = live). Plain
objects (``{"step": 7, "loss": 2.5, "train/grad_norm": 0.3}``, LLaMA-Factory's ``trainer_log.jsonl``
with ``current_steps``, nested ``{"train": {"loss": ...}}``) are read with the generic reader's
keys and rules (:mod:`.generic`: evaluation lines are not steps, no step = numbered in order).
A line that is not a JSON object is reported and skipped.
"""
from __future__ import annotations

import json
from typing import Iterator

from ...record import StepRecord
from .generic import Assembler, LineReader, feed_line
from .source import SkipReport, numbered_lines


def read(path, *, on_skip: SkipReport, progress: bool = False, lines=None, user_keys=None,
         **_) -> Iterator[StepRecord]:
    reader = LineReader(user_keys)
    asm = Assembler()
    declared = None   # a phase line's declared warmup, handed to the next step record
    for line_no, text in (lines if lines is not None else numbered_lines(path, progress=progress)):
        if text is None:
            yield from asm.flush()
            continue
        s = text.strip()
        if not s:
            continue
        if not (s.startswith("{") and s.endswith("}")):
            on_skip(line_no, text, "not JSON: not an object on one line")
            continue
        if '"type"' in s:
            try:
                obj = json.loads(s)
            except ValueError as e:
                on_skip(line_no, text, f"not JSON: {e}")
                continue
            kind = obj.get("type")
            if kind == "step":
                try:
                    rec = StepRecord.from_json(obj)
                except (KeyError, TypeError, ValueError) as e:
                    on_skip(line_no, text, f"unreadable step line: {e!r}")
                    continue
                rec.warmup_steps, declared = declared, None
                yield from asm.flush()
                yield rec
                continue
            if kind == "phase":
                declared = obj.get("warmup_steps") or declared
                continue
            if kind in ("finding", "segment", "checkpoint", "action"):
                continue
        yield from feed_line(reader, asm, line_no, s, on_skip)
    yield from asm.finish()
