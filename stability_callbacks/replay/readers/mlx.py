"""mlx-lm (``mlx_lm.lora`` / fine-tuning) report lines.

    Iter 10: Train loss 2.345, Learning Rate 1.000e-05, It/sec 0.532, Tokens/sec 412.3, ...

``Iter N: Val loss ...`` lines are evaluation and ignored; older builds print no learning rate.
"""
from __future__ import annotations

import re
from typing import Iterator

from ...record import StepRecord
from .source import SkipReport, numbered_lines, to_float

LINE = re.compile(r"\bIter (\d+): Train loss ([^,\s]+)(?:, Learning Rate ([^,\s]+))?")
SIGNATURES = (LINE,)


def read(path, *, on_skip: SkipReport, progress: bool = False, **_) -> Iterator[StepRecord]:
    for line_no, text in numbered_lines(path, progress=progress):
        if "Train loss" not in text:
            continue
        m = LINE.search(text)
        if not m:
            continue
        try:
            metrics = {"loss": to_float(m.group(2))}
            if m.group(3):
                metrics["lr"] = to_float(m.group(3))
        except ValueError as e:
            on_skip(line_no, text, f"unreadable number: {e}")
            continue
        yield StepRecord(int(m.group(1)), metrics)
