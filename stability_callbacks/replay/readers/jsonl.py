"""JSON lines: our run log (docs/design.md, Run log) and plain metric objects.

Run log: ``{"type": "step", "step": 7, "segment": 0, "metrics": {...}}`` lines become records in
file order (stitching rollback segments is :mod:`stability_callbacks.replay.timeline`'s job);
``finding`` / ``segment`` / ``checkpoint`` / ``action`` / ``phase`` / ``model`` lines are not steps (a
``phase`` line's declared ``warmup_steps``, a ``model`` line's ``num_outputs`` and a ``checkpoint``
line's step and path ride on the next step record, for the Monitor: replay = live). Plain
objects (``{"step": 7, "loss": 2.5, "train/grad_norm": 0.3}``, LLaMA-Factory's ``trainer_log.jsonl``
with ``current_steps``, nested ``{"train": {"loss": ...}}``) are read with the generic reader's
keys and rules (:mod:`.generic`: evaluation lines are not steps, no step = numbered in order).
A line that is not a JSON object is reported and skipped.
"""
from __future__ import annotations

import json
from typing import Iterator

from ...record import StepRecord
from .account import ReadAccount
from .generic import Reading


def read(path, *, account: ReadAccount, lines, user_keys=None, **_) -> Iterator[StepRecord]:
    reading = Reading(account, user_keys, rows=True)
    run_log = False
    declared = _Declared()
    document: list[tuple[int, str]] = []   # the lines of a JSON document printed over many, so far
    for line_no, text in lines:
        if text is None:
            yield from reading.flush()
            continue
        s = text.strip()
        if not s:
            continue
        if document or (s in ("{", "[") or s.endswith(("[", "{")) and s[:1] in "{[") and text[:1] in "{[":
            document.append((line_no, text))
            if text[:1] in "}]":   # (a document printed over many lines closes at its first column)
                yield from _document_records(reading, account, document)
                document = []
            continue
        listed = _listed(s)
        if listed is not None:   # one JSON document holding the run's records as a list: each its own line
            yield from _listed_records(reading, account, listed[0], listed[1], [line_no] * len(listed[0]), at=line_no)
            continue
        if not (s.startswith("{") and s.endswith("}")):
            account(line_no, text, "not JSON: not an object on one line")
            continue
        if '"type"' in s:
            try:
                obj = json.loads(s)
            except ValueError as e:
                account(line_no, text, f"not JSON: {e}")
                continue
            kind = obj.get("type")
            if kind == "step":
                try:
                    rec = StepRecord.from_json(obj)
                except (KeyError, TypeError, ValueError) as e:
                    account(line_no, text, f"unreadable step line: {e!r}")
                    continue
                declared.onto(rec)
                if not run_log:
                    run_log = True
                    account.numbered("counter", "step (our run log)")
                    for key in rec.metrics:
                        account.saw(key, key)
                yield from reading.flush()
                yield rec
                continue
            if declared.note(kind, obj):
                continue
            if kind in ("finding", "segment", "checkpoint", "action"):
                account.ignore(line_no, text, f"run-log {kind} line")
                continue
        yield from reading.line(line_no, s)
    yield from reading.finish()


class _Declared:
    """What a run log's lines declare for the next step record, for the Monitor (replay = live): a
    ``phase`` line's warmup, a ``model`` line's output size, ``checkpoint`` lines' saves."""

    def __init__(self):
        self.warmup_steps: int | None = None
        self.num_outputs: int | None = None
        self.saves: list[tuple[int, str | None]] = []

    def note(self, kind, obj: dict) -> bool:
        """Whether the line (its ``type`` ``kind``) declares something, kept."""
        if kind == "phase":
            self.warmup_steps = obj.get("warmup_steps") or self.warmup_steps
        elif kind == "model":
            self.num_outputs = obj.get("num_outputs") or self.num_outputs
        elif kind == "checkpoint" and isinstance(obj.get("step"), int) and isinstance(obj.get("path"), (str, type(None))):
            self.saves.append((obj["step"], obj.get("path")))
        else:
            return False
        return True

    def onto(self, rec: StepRecord) -> None:
        rec.warmup_steps, rec.num_outputs = self.warmup_steps, self.num_outputs
        self.warmup_steps = self.num_outputs = None
        if self.saves:
            rec.checkpoints, self.saves = tuple(self.saves), []


def _document_records(reading, account: ReadAccount, document: list[tuple[int, str]]) -> Iterator[StepRecord]:
    """The records of a document printed over many lines (:func:`records_of_document`), or one
    unreadable line said where it holds no list of records."""
    found = records_of_document(document)
    if found is None:
        account(document[0][0], document[0][1], "not JSON: a document over many lines with no list of records")
    else:
        yield from _listed_records(reading, account, *found, at=document[0][0])


def _listed_records(reading, account: ReadAccount, records: list[dict], beside: bool, line_nos: list[int], *,
                    at: int) -> Iterator[StepRecord]:
    """The records of a document's list, each read as a line of its own (at ``line_nos``); the
    values beside the list are a run summary (the document's, at line ``at``)."""
    if beside:
        account.ignore(at, "", "run summary (the values beside the document's list of records)")
    for line_no, obj in zip(line_nos, records):
        yield from reading.line(line_no, json.dumps(obj))


def records_of_document(lines: list[tuple[int, str]]) -> tuple[list[dict], bool, list[int]] | None:
    """A JSON document printed over many lines (``json.dump(results, f, indent=2)``): its list of
    records as :func:`_records_in` finds it, and the line each record opens on (a pretty-printer
    opens each of a list's objects on a line of its own, at one indent; where they cannot be
    told, the document's first line). None where it is no JSON or holds no such list."""
    try:
        doc = json.loads("\n".join(t for _, t in lines))
    except ValueError:
        return None
    found = _records_in(doc)
    if found is None:
        return None
    records, beside = found
    opens = [(len(t) - len(t.lstrip()), n) for n, t in lines[1:] if t.strip() == "{"]
    indent = min((i for i, _ in opens), default=0)
    line_nos = [n for i, n in opens if i == indent]
    return records, beside, line_nos if len(line_nos) == len(records) else [lines[0][0]] * len(records)


def _listed(s: str) -> tuple[list[dict], bool] | None:
    """A line that is one JSON document holding a run's records as a list of objects (a results
    file written with ``json.dump``), as :func:`_records_in` finds it. None otherwise."""
    if not (s[:1] == "[" or "[{" in s):   # (json.dump writes a list of objects as `[{`)
        return None
    try:
        doc = json.loads(s)
    except ValueError:
        return None
    return _records_in(doc)


def _records_in(doc) -> tuple[list[dict], bool] | None:
    """A document's run records, a list of objects (``{"config": .., "history": [{..}, ..],
    "summary": {..}}``, or a bare ``[{..}, ..]``): the longest such list (at the top or one level
    down), and whether the document holds other values beside it (a summary, a config: no
    records). None where it holds none."""
    lists = [doc] if isinstance(doc, list) else [] if not isinstance(doc, dict) else [
        v for v in doc.values() if isinstance(v, list)] + [
        w for v in doc.values() if isinstance(v, dict) for w in v.values() if isinstance(w, list)]
    lists = [v for v in lists if len(v) >= 2 and all(isinstance(o, dict) for o in v)]
    if not lists:
        return None
    best = max(lists, key=len)
    return best, isinstance(doc, dict) and len(doc) > 1
