"""HF Trainer ``trainer_state.json``: ``log_history`` entries with a ``step`` and a training metric.

Loaded whole (JSON has no streaming reader in the standard library, and the file is small).
Evaluation entries (``eval_loss``) and the final summary (``train_runtime``) are not steps.
The printed log dicts (``{'loss': '2.346', 'grad_norm': '1.234', ...}``) are read by the generic
reader (:mod:`.generic`).
"""
from __future__ import annotations

import json
from typing import Iterator

from ...record import StepRecord
from .source import LogFormatError, SkipReport, to_float
from .tags import metric_key

_NOT_A_STEP = ("train_runtime", "eval_loss", "eval_runtime")


def _metrics(items, tag_map) -> dict[str, float]:
    out = {}
    for name, value in items:
        key = metric_key(name, tag_map)
        if key is None or key in out:
            continue
        out[key] = to_float(value) if isinstance(value, str) else float(value)
    return out


def read_state(path, *, on_skip: SkipReport, tag_map=None, **_) -> Iterator[StepRecord]:
    try:
        with open(path, encoding="utf-8") as f:
            state = json.load(f)
    except OSError as e:
        raise LogFormatError(path, None, f"cannot open: {e.strerror or e}") from e
    except json.JSONDecodeError as e:
        raise LogFormatError(path, e.lineno, f"not valid JSON: {e.msg}") from e
    history = state.get("log_history") if isinstance(state, dict) else None
    if not isinstance(history, list):
        raise LogFormatError(path, None, "no log_history list (not a trainer_state.json)")
    for i, entry in enumerate(history):
        if not isinstance(entry, dict) or "step" not in entry:
            on_skip(i + 1, repr(entry)[:200], "log_history entry without a step")
            continue
        if any(k in entry for k in _NOT_A_STEP):
            continue
        try:
            metrics = _metrics(((k, v) for k, v in entry.items() if k not in ("step", "epoch")),
                               tag_map)
            step = int(entry["step"])
        except (TypeError, ValueError) as e:
            on_skip(i + 1, repr(entry)[:200], f"unreadable value: {e}")
            continue
        if metrics:
            yield StepRecord(step, metrics)
