"""Megatron-LM / Megatron-DeepSpeed / gpt-neox iteration lines.

    iteration  31219/ 115311 | consumed samples: ... | learning rate: 5.279E-05 |
      lm loss: 5.098124E+00 | loss scale: 65536.0 | grad norm: 960.351 |
      number of skipped iterations:   0 | number of nan iterations:   0 |

Rules taken from the real logs (tests/data/real_logs, CSVs are the ground truth):
- ``lm loss``, ``lm-loss`` (Megatron-DeepSpeed) and ``lm_loss`` (gpt-neox) are the loss.
- A line without a loss field: Megatron drops the field when every iteration of the interval was
  skipped or NaN. With ``number of skipped iterations`` > 0 and no NaN iteration it is the fp16
  start-up loss-scale search (loss absent); otherwise the loss went NaN (``loss = nan``).
- ``skipped`` is the printed skipped count, raised to the number of DeepSpeed
  ``OVERFLOW! ... Skipping step`` lines seen since the previous iteration (ZeRO prints those and
  may still count 0); their ``reducing to S`` gives ``loss_scale`` when the line has none.
- Print artefacts (``grad norm: 0.000``, ``loss scale: -1.0``) are kept verbatim: they are what
  the log says, and the CSVs keep them.
- Hand-wrapped lines (a line that does not end in ``|``) are joined with the following lines;
  fields are matched with all whitespace removed, so ``learning\\n rate`` and
  ``iteratio\\nns`` read the same.
- ``validation loss at iteration N`` lines are ignored (no ``N/M``).
"""
from __future__ import annotations

import re
from typing import Iterator

from ...record import StepRecord
from ... import keys
from .generic import overflow_scale
from .account import ReadAccount
from .checkpoints import saved
from .source import to_float

_ITERATION = re.compile(r"iteration\s*\d+\s*/\s*\d+\s*\|")
# Detection wants Megatron's own field names too: NeMo, CPM and others print `iteration N/M |`
# with fields of their own, which the generic reader reads (a missing `lm loss` means nothing
# there).
SIGNATURE = re.compile(r"iteration\s*\d+\s*/\s*\d+\s*\|.*?(?:lm[ _-]loss|skipped iterations|"
                       r"nan iterations|consumed samples|learning rate)\s*:")
_ITER = re.compile(r"iteration(\d+)/(\d+)")
_MAX_JOINED_LINES = 6

# Whitespace-free field names -> metric keys.
_FIELDS = {
    "lmloss": keys.LOSS, "lm-loss": keys.LOSS, "lm_loss": keys.LOSS,
    "learningrate": keys.LR, "gradnorm": keys.GRAD_NORM, "lossscale": keys.LOSS_SCALE,
    "consumedsamples": keys.CONSUMED_SAMPLES,
}


def read(path, *, account: ReadAccount, lines, **_) -> Iterator[StepRecord]:
    for key, name in ((keys.LOSS, "lm loss"), (keys.GRAD_NORM, "grad norm"), (keys.LR, "learning rate"),
                      (keys.LOSS_SCALE, "loss scale"), (keys.OVERFLOW_SKIPPED, "number of skipped iterations")):
        account.saw(key, name)
    account.numbered("counter", "iteration")
    pending: list[str] = []          # a wrapped iteration line being joined
    pending_line = 0
    overflows = 0
    scale: float | None = None
    saves: list[tuple[int, str]] = []   # `saving checkpoint at iteration N to PATH` since the last record
    for line_no, text in lines:
        if text is None:             # a followed file went idle: a wrapped line may go on
            continue
        if pending:
            if _ITERATION.search(text) or "OVERFLOW!" in text:
                rec = _finish(pending, pending_line, account, overflows, scale)
                pending = []
                if rec is not None:
                    overflows, scale = 0, None
                    yield _carrying(rec, saves)
            else:
                pending.append(text)
                if text.rstrip().endswith("|") or len(pending) >= _MAX_JOINED_LINES:
                    rec = _finish(pending, pending_line, account, overflows, scale)
                    pending = []
                    if rec is not None:
                        overflows, scale = 0, None
                        yield _carrying(rec, saves)
                continue
        if "OVERFLOW" in text:
            is_overflow, reduced_to = overflow_scale(text)
            if is_overflow:
                overflows += 1
                scale = reduced_to if reduced_to is not None else scale
            continue
        m = _ITERATION.search(text)
        if not m:
            save = saved(text) if "heckpoint" in text else None
            if save is not None and save[0] is not None:
                saves.append((save[0], save[1]))
            continue
        body = text[m.start():]
        if body.rstrip().endswith("|"):
            rec = _finish([body], line_no, account, overflows, scale)
            if rec is not None:
                overflows, scale = 0, None
                yield _carrying(rec, saves)
        else:
            pending, pending_line = [body], line_no
    if pending:
        rec = _finish(pending, pending_line, account, overflows, scale)
        if rec is not None:
            yield _carrying(rec, saves)


def _carrying(rec: StepRecord, saves: list[tuple[int, str]]) -> StepRecord:
    """``rec``, carrying the checkpoints saved before it (:attr:`StepRecord.checkpoints`)."""
    if saves:
        rec.checkpoints = tuple(saves)
        saves.clear()
    return rec


def _finish(parts: list[str], line_no: int, account: ReadAccount, overflows: int,
            overflow_scale: float | None) -> StepRecord | None:
    flat = "".join("".join(parts).split())
    m = _ITER.search(flat)
    if m is None:
        account(line_no, " ".join(parts), "iteration line without an iteration number")
        return None
    metrics: dict[str, float] = {}
    skipped_count = 0.0
    nan_count = 0.0
    try:
        for field in flat[m.end():].split("|"):
            name, sep, value = field.rpartition(":")
            if not sep or not value:
                continue
            if name in _FIELDS:
                metrics[_FIELDS[name]] = to_float(value)
            elif name == "numberofskippediterations":
                skipped_count = to_float(value)
            elif name == "numberofnaniterations":
                nan_count = to_float(value)
        # The skipped count is only known when printed; keep "absent" apart from 0.
        printed_skip = "numberofskippediterations:" in flat
    except ValueError as e:
        account(line_no, " ".join(parts), f"unreadable number in iteration line: {e}")
        return None
    if keys.LOSS not in metrics and (nan_count > 0 or skipped_count == 0):
        metrics[keys.LOSS] = float("nan")
    if printed_skip or overflows:
        metrics[keys.OVERFLOW_SKIPPED] = max(skipped_count, float(overflows))
    if keys.LOSS_SCALE not in metrics and overflow_scale is not None:
        metrics[keys.LOSS_SCALE] = overflow_scale
    return StepRecord(int(m.group(1)), metrics)
