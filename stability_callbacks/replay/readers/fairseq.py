"""fairseq training progress.

- ``simple``/``json``-less progress lines of ``train_inner``:
  ``... | train_inner | epoch 001:    100 / 1563 loss=9.123, ..., num_updates=100, lr=0.0001,
  gnorm=1.234, loss_scale=128, ...``;
- the pipe-separated summaries: ``| epoch 001 | loss 7.234 | ... | num_updates 1000 | lr 0.0005 |
  gnorm 1.2 | loss_scale 64 | ...`` (older builds) or ``... | train | epoch 001 | loss ...``.

The step is ``num_updates``. ``valid`` summaries are ignored; epoch summaries are epoch means, so
they make records only in a log that has no ``train_inner`` lines. ``NOTE: overflow detected, setting loss scale
to: S`` counts as a skipped update of the next record.
"""
from __future__ import annotations

import re
from typing import Iterator

from ...record import StepRecord
from .generic import overflow_scale
from .source import SkipReport, numbered_lines, to_float

INNER = re.compile(r"\bepoch \d+:\s+\d+\s*/\s*\d+\s+(.*\bnum_updates=\d+.*)$")
SUMMARY = re.compile(r"\|\s*epoch \d+\s*\|\s*(loss .*\|\s*num_updates \d+.*)$")
SIGNATURES = (INNER, SUMMARY)
_KEY = {"loss": "loss", "lr": "lr", "gnorm": "grad_norm", "loss_scale": "loss_scale"}


def read(path, *, on_skip: SkipReport, progress: bool = False, lines=None, **_
         ) -> Iterator[StepRecord]:
    seen_inner = False
    overflows = 0
    for line_no, text in (lines if lines is not None else numbered_lines(path, progress=progress)):
        if text is None:
            continue
        if "overflow" in text:
            overflows += overflow_scale(text)[0]
            continue
        if "num_updates" not in text or "valid" in text:
            continue
        m = INNER.search(text)
        if m:
            seen_inner = True
            pairs = [p.split("=", 1) for p in m.group(1).split(",") if "=" in p]
        else:
            m = SUMMARY.search(text)
            if not m or seen_inner:
                continue
            pairs = [p.strip().split(None, 1) for p in m.group(1).split("|")]
        fields = {p[0].strip(): p[1].strip() for p in pairs if len(p) == 2}
        try:
            step = int(to_float(fields["num_updates"]))
            metrics = {_KEY[k]: to_float(v) for k, v in fields.items() if k in _KEY}
        except (KeyError, ValueError) as e:
            on_skip(line_no, text, f"unreadable fairseq progress line: {e!r}")
            continue
        if overflows:
            metrics["skipped"] = float(overflows)
            overflows = 0
        yield StepRecord(step, metrics)
