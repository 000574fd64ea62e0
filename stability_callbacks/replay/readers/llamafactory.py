"""LLaMA-Factory ``trainer_log.jsonl``.

    {"current_steps": 10, "total_steps": 100, "loss": 1.2345, "lr": 4.5e-05, "epoch": 0.1,
     "percentage": 10.0, "elapsed_time": "0:01:23", "remaining_time": "0:12:30"}

Older versions write ``learning_rate``; evaluation lines (``eval_loss`` only) are not steps.
"""
from __future__ import annotations

from typing import Iterator

from ...record import StepRecord
from .jsonl import json_objects
from .source import SkipReport, to_float
from .tags import metric_key

_IGNORED = ("current_steps", "total_steps", "epoch", "percentage", "elapsed_time",
            "remaining_time", "throughput", "total_tokens")


def read(path, *, on_skip: SkipReport, progress: bool = False, tag_map=None, **_
         ) -> Iterator[StepRecord]:
    for line_no, text, obj in json_objects(path, on_skip=on_skip, progress=progress):
        try:
            step = int(obj["current_steps"])
            metrics = {}
            for name, value in obj.items():
                if name in _IGNORED or value is None:
                    continue
                key = metric_key(name, tag_map)
                if key is not None:
                    metrics[key] = to_float(value) if isinstance(value, str) else float(value)
        except (ValueError, KeyError, TypeError) as e:
            on_skip(line_no, text, f"not a trainer_log.jsonl line: {e!r}")
            continue
        if "loss" in metrics or "lr" in metrics:
            yield StepRecord(step, metrics)
