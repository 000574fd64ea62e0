"""Our run log (DESIGN 2.3) and plain JSON-lines metrics.

Run log: ``{"type": "step", "step": 7, "segment": 0, "metrics": {...}}`` lines become records in
file order (stitching rollback segments is :mod:`stability_callbacks.replay.timeline`'s job);
``finding`` / ``segment`` / ``checkpoint`` / ``phase`` lines are not steps (a ``phase`` line's
declared ``warmup_steps`` rides on the next record, for the Monitor: replay = live). Plain objects:
``{"step": 7, "loss": 2.5, "train/grad_norm": 0.3}`` (names through the tag map; ``"nan"`` and
``NaN`` read as NaN).
"""
from __future__ import annotations

import json
from typing import Iterator

from ...record import StepRecord
from .source import SkipReport, numbered_lines, to_float
from .tags import metric_key

_STEP_NAMES = ("step", "_step", "global_step", "iteration", "iter")


def json_objects(path, *, on_skip: SkipReport, progress: bool = False) -> Iterator[tuple[int, str, dict]]:
    """``(line_no, text, object)`` for every JSON-object line; other lines go to ``on_skip``."""
    for line_no, text in numbered_lines(path, progress=progress):
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
        except ValueError as e:
            on_skip(line_no, text, f"not JSON: {e}")
            continue
        if not isinstance(obj, dict):
            on_skip(line_no, text, "not a JSON object")
            continue
        yield line_no, text, obj


def read(path, *, on_skip: SkipReport, progress: bool = False, tag_map=None, **_
         ) -> Iterator[StepRecord]:
    declared = None   # a segment line's declared warmup, handed to the next step record
    for line_no, text, obj in json_objects(path, on_skip=on_skip, progress=progress):
        kind = obj.get("type")
        try:
            if kind == "step":
                rec = StepRecord.from_json(obj)
                rec.warmup_steps, declared = declared, None
                yield rec
            elif kind == "phase":
                declared = obj.get("warmup_steps") or declared
            elif kind is None:
                plain = _plain(obj, tag_map)
                if plain is not None:
                    yield plain
        except (KeyError, TypeError, ValueError) as e:
            on_skip(line_no, text, f"unreadable step line: {e!r}")


def _plain(obj, tag_map) -> StepRecord | None:
    step_name = next((n for n in _STEP_NAMES if n in obj), None)
    if step_name is None:
        raise KeyError("step")
    metrics = {}
    source = obj["metrics"] if isinstance(obj.get("metrics"), dict) else obj
    for name, value in source.items():
        if name == step_name or value is None or isinstance(value, (dict, list, bool)):
            continue
        key = metric_key(name, tag_map)
        if key is not None and key not in metrics:
            metrics[key] = to_float(value) if isinstance(value, str) else float(value)
    if not metrics:
        return None
    return StepRecord(int(to_float(str(obj[step_name]))), metrics, int(obj.get("segment", 0)))
