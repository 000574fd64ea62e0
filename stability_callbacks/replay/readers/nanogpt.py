"""nanoGPT-family training lines.

- modded-nanogpt / parameter-golf: ``step:12/1530 train_loss:6.3387 [lr_mul:0.0999] train_time:...``
  (``val_loss`` lines are evaluation, ignored; ``lr_mul`` is the LR multiplier and is read as ``lr``);
- karpathy/nanoGPT: ``iter 100: loss 3.1234, time 123.45ms, mfu 12.34%``;
- build-nanogpt: ``step    10 | loss: 9.123456 | lr 6.0000e-04 | norm: 1.2345 | dt: ...``.
"""
from __future__ import annotations

import re
from typing import Iterator

from ...record import StepRecord
from .source import SkipReport, numbered_lines, to_float

SPEEDRUN = re.compile(r"(?:^|\s)step:(\d+)/\d+\s+train_loss:(\S+)")
_SPEEDRUN_FIELDS = re.compile(r"\b(lr_mul|lr|grad_norm|norm):(\S+)")
KARPATHY = re.compile(r"^\s*iter (\d+): loss (\S+?),")
BUILD = re.compile(r"^\s*step\s+(\d+)\s*\|\s*loss:\s*(\S+)\s*\|\s*lr\s+(\S+)\s*\|\s*norm:\s*(\S+)")
SIGNATURES = (SPEEDRUN, KARPATHY, BUILD)
_KEY = {"lr_mul": "lr", "lr": "lr", "grad_norm": "grad_norm", "norm": "grad_norm"}


def read(path, *, on_skip: SkipReport, progress: bool = False, **_) -> Iterator[StepRecord]:
    for line_no, text in numbered_lines(path, progress=progress):
        if "loss" not in text:
            continue
        try:
            m = SPEEDRUN.search(text)
            if m:
                metrics = {"loss": to_float(m.group(2))}
                for name, value in _SPEEDRUN_FIELDS.findall(text, m.end()):
                    metrics[_KEY[name]] = to_float(value)
                yield StepRecord(int(m.group(1)), metrics)
                continue
            m = KARPATHY.match(text)
            if m:
                yield StepRecord(int(m.group(1)), {"loss": to_float(m.group(2))})
                continue
            m = BUILD.match(text)
            if m:
                yield StepRecord(int(m.group(1)), {"loss": to_float(m.group(2)),
                                                   "lr": to_float(m.group(3)),
                                                   "grad_norm": to_float(m.group(4))})
        except ValueError as e:
            on_skip(line_no, text, f"unreadable number: {e}")
