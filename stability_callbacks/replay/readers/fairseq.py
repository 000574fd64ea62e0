"""fairseq training progress: what is fairseq's own, over the generic reader.

- ``train_inner`` progress lines: ``... | train_inner | epoch 001:    100 / 1563 loss=9.123, ...,
  num_updates=100, lr=0.0001, gnorm=1.234, loss_scale=128, ...``;
- the pipe-separated epoch summaries: ``| epoch 001 | loss 7.234 | ... | num_updates 1000 |
  lr 0.0005 | gnorm 1.2 | loss_scale 64 | ...`` (older builds) or ``... | train | epoch 001 | ...``.

Both are read by :mod:`.generic` (the step is ``num_updates``; ``valid`` lines are evaluation;
``NOTE: overflow detected, setting loss scale to: S`` folds into the next record). fairseq's own
rule: an epoch summary is an epoch mean, so it is a record only in a log without ``train_inner``
lines — one that comes before the first of them is held until we know, and dropped then.
"""
from __future__ import annotations

import re
from typing import Iterator

from ...record import StepRecord
from .account import ReadAccount
from .generic import Reading

INNER = re.compile(r"\bepoch \d+:\s+\d+\s*/\s*\d+\s+(.*\bnum_updates=\d+.*)$")
SUMMARY = re.compile(r"\|\s*epoch \d+\s*\|\s*(loss .*\|\s*num_updates \d+.*)$")
SIGNATURES = (INNER, SUMMARY)


def read(path, *, account: ReadAccount, lines, **_) -> Iterator[StepRecord]:
    reading = Reading(account)
    seen_inner = False
    held = None                      # an epoch summary, while no train_inner line has shown
    for line_no, text in lines:
        if text is None:
            yield from reading.flush()
            continue
        if "num_updates" in text and "valid" not in text:
            if INNER.search(text):
                seen_inner, held = True, None
            elif SUMMARY.search(text):
                if seen_inner:
                    account.ignore(line_no, text, "epoch summary (the log prints updates)")
                    continue
                if held is not None:           # two summaries, no update line between
                    yield from reading.line(*held)
                held = (line_no, text)
                continue
        elif held is not None and "overflow" in text:    # it comes after the summary
            yield from reading.line(*held)
            held = None
        yield from reading.line(line_no, text)
    if held is not None:
        yield from reading.line(*held)
    yield from reading.finish()
