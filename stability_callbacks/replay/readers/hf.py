"""HF Trainer: the printed log dicts, and ``trainer_state.json`` ``log_history``.

Printed (``ProgressCallback`` / ``PrinterCallback``): ``{'loss': '2.346', 'grad_norm': '1.234',
'learning_rate': '4.5e-05', 'epoch': '0.01'}`` — transformers 5 prints floats as ``'%.4g'``
strings, older versions bare floats (``nan`` unquoted). The dicts share lines with tqdm bars
(``\\r``) and other noise, and carry no step: records are numbered 1, 2, 3… in order.
Evaluation dicts (``eval_loss``) and the final summary (``train_runtime``) are not steps.

``trainer_state.json``: ``log_history`` entries with a ``step`` and a training metric; loaded
whole (JSON has no streaming reader in the standard library, and the file is small).
"""
from __future__ import annotations

import json
import re
from typing import Iterator

from ...record import StepRecord
from .source import LogFormatError, SkipReport, numbered_lines, to_float
from .tags import metric_key

# A dict that starts with a training key: `{'loss': ...` or `{"loss": ...` (also grad_norm /
# learning_rate first, which some versions and callbacks do).
PRINTED = re.compile(r"""\{\s*['"](?:loss|grad_norm|learning_rate)['"]\s*:[^{}]*\}""")
SIGNATURES = (PRINTED,)
_PAIR = re.compile(r"""['"]([^'"]+)['"]\s*:\s*(?:'([^']*)'|"([^"]*)"|([^,}\s]+))""")
_NOT_A_STEP = ("train_runtime", "eval_loss", "eval_runtime")


def _metrics(items, tag_map) -> dict[str, float]:
    out = {}
    for name, value in items:
        key = metric_key(name, tag_map)
        if key is None or key in out:
            continue
        out[key] = to_float(value) if isinstance(value, str) else float(value)
    return out


def read(path, *, on_skip: SkipReport, progress: bool = False, tag_map=None, **_
         ) -> Iterator[StepRecord]:
    n = 0
    for line_no, text in numbered_lines(path, progress=progress):
        if "{" not in text:
            continue
        for m in PRINTED.finditer(text):
            pairs = [(k, a or b or c) for k, a, b, c in _PAIR.findall(m.group(0))]
            if any(k in _NOT_A_STEP for k, _ in pairs):
                continue
            try:
                metrics = _metrics(pairs, tag_map)
            except (TypeError, ValueError) as e:
                on_skip(line_no, m.group(0), f"unreadable value in log dict: {e}")
                continue
            if metrics:
                n += 1
                yield StepRecord(n, metrics)


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
