"""DeepSpeed engine progress lines (DeepSpeed-Chat and any ``steps_per_print`` run).

    [Rank 0] step=510, skipped=8, lr=[9.539654016684232e-06, ...], mom=[...]
    [deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 32768

The engine prints no loss. ``skipped`` is the engine's cumulative count, so a record carries the
skips since the previous record (what happened in *this* interval); ``loss_scale`` is the scale
the last overflow of the interval reduced to, absent when the interval had no overflow (the
engine does not print it otherwise).
"""
from __future__ import annotations

import re
from typing import Iterator

from ...record import StepRecord
from .source import SkipReport, numbered_lines, to_float

STEP = re.compile(r"\bstep=(\d+), skipped=(\d+)(?:, lr=\[([^,\]]+))?")
SIGNATURES = (STEP,)
_OVERFLOW = re.compile(r"OVERFLOW!.*?Skipping step\.\s*Attempted loss scale:\s*([0-9.eE+-]+)"
                       r"(?:, reducing to\s*([0-9.eE+-]+))?")


def read(path, *, on_skip: SkipReport, progress: bool = False, **_) -> Iterator[StepRecord]:
    last_skipped = 0
    scale = None
    for line_no, text in numbered_lines(path, progress=progress):
        if "OVERFLOW!" in text:
            m = _OVERFLOW.search(text)
            if m:
                # Hysteresis consumed without a reduction: the attempted scale stays.
                scale = to_float(m.group(2) or m.group(1))
            continue
        if "step=" not in text:
            continue
        m = STEP.search(text)
        if not m:
            continue
        try:
            skipped = int(m.group(2))
            metrics = {}
            if m.group(3):
                metrics["lr"] = to_float(m.group(3))
            if scale is not None:
                metrics["loss_scale"] = scale
            metrics["skipped"] = float(skipped - last_skipped if skipped >= last_skipped else skipped)
        except ValueError as e:
            on_skip(line_no, text, f"unreadable number: {e}")
            continue
        last_skipped, scale = skipped, None
        yield StepRecord(int(m.group(1)), metrics)
