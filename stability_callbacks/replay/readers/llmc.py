"""llm.c logs.

- the ``main.log`` file: ``s:12 trl:9.7924 [lr:0.000011 norm:3.01]`` (``tel:`` = eval, ignored);
  older builds print only ``s:N trl:X``;
- stdout: ``step    1/19560 | train loss 11.009160 | norm 15.3696 | lr 8.57e-07 | (...)``.
"""
from __future__ import annotations

import re
from typing import Iterator

from ...record import StepRecord
from .source import SkipReport, numbered_lines, to_float

MAIN_LOG = re.compile(r"^\s*s:(\d+) trl:(\S+)(.*)$")
_FIELDS = re.compile(r"\b(lr|norm):(\S+)")
STDOUT = re.compile(r"^\s*step\s+(\d+)/\d+\s*\|\s*train loss\s+(\S+)\s*\|\s*norm\s+(\S+)\s*\|\s*lr\s+(\S+)")
SIGNATURES = (MAIN_LOG, STDOUT)
_KEY = {"lr": "lr", "norm": "grad_norm"}


def read(path, *, on_skip: SkipReport, progress: bool = False, **_) -> Iterator[StepRecord]:
    for line_no, text in numbered_lines(path, progress=progress):
        try:
            m = MAIN_LOG.match(text)
            if m:
                metrics = {"loss": to_float(m.group(2))}
                for name, value in _FIELDS.findall(m.group(3)):
                    metrics[_KEY[name]] = to_float(value)
                yield StepRecord(int(m.group(1)), metrics)
                continue
            m = STDOUT.match(text)
            if m:
                yield StepRecord(int(m.group(1)), {"loss": to_float(m.group(2)),
                                                   "grad_norm": to_float(m.group(3)),
                                                   "lr": to_float(m.group(4))})
        except ValueError as e:
            on_skip(line_no, text, f"unreadable number: {e}")
