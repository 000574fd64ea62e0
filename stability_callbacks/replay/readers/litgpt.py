"""litgpt / lit-gpt iteration lines.

- lit-gpt: ``iter 3 step 0: loss 9.8765, iter time: 160.12ms``; the optimizer-step line ends in
  ``(optimizer.step)`` and carries the new step count;
- litgpt: ``Epoch 1 | iter 16 step 4 | loss train: 10.853, val: n/a | iter time: 403.61 ms (step)``.

Lines are printed per micro-batch (``iter``) while ``step`` counts optimizer steps, and the step
count rises on the micro-batch that steps the optimizer. A record is one optimizer step: the mean
loss of the micro-batches since the previous step, at the new step number (the line marked
``(optimizer.step)`` / ``(step)``, or the first line whose step count rose). Micro-batches after
the last optimizer step of the log make no record. With a logging interval longer than the
accumulation every printed line is its own record.
"""
from __future__ import annotations

import re
from typing import Iterator

from ...record import StepRecord
from .source import SkipReport, numbered_lines, to_float

LINE = re.compile(r"\biter (\d+) step (\d+)(?::| \|) loss(?: train:)? ([^,\s]+)")
SIGNATURES = (LINE,)


def read(path, *, on_skip: SkipReport, progress: bool = False, **_) -> Iterator[StepRecord]:
    losses: list[float] = []
    last_step: int | None = None
    for line_no, text in numbered_lines(path, progress=progress):
        if "iter " not in text:
            continue
        m = LINE.search(text)
        if not m:
            continue
        try:
            loss = to_float(m.group(3))
        except ValueError as e:
            on_skip(line_no, text, f"unreadable loss: {e}")
            continue
        step = int(m.group(2))
        losses.append(loss)
        stepped = "optimizer.step" in text or "(step)" in text
        if stepped or (last_step is not None and step > last_step):
            yield StepRecord(step, {"loss": sum(losses) / len(losses)})
            losses = []
        last_step = step
