"""Tables: our CSV (DESIGN 2.4) and W&B CSV exports.

Our CSV: header ``step,loss,grad_norm,lr,loss_scale,skipped`` (any subset, commas or tabs; other metric-key
columns such as ``adam/exp_avg_sq_max`` or ``loss/<name>`` kept); an empty cell is a missing value,
``nan`` is NaN.

W&B: a run-history export (``_step,_runtime,_timestamp,train/loss,...``; HF runs also carry
``train/global_step``, which is the optimizer step and wins over ``_step``; the rows of our W&B sink
carry ``stability/step``, which wins over both) or a chart-panel export
(``Step,<run> - train/loss,<run> - train/loss__MIN,<run> - train/loss__MAX``: the ``__MIN``/``__MAX``
envelopes are dropped, the ``<run> - `` prefix is stripped, the first run of the panel is read).
W&B rows without one of our metrics are not steps (W&B writes a row per ``log`` call); a row
of our CSV is a step even when every cell is empty (the step happened, nothing was printed).
"""
from __future__ import annotations

import csv
import itertools
from typing import Iterator

from ... import keys
from ...record import StepRecord
from .source import LogFormatError, SkipReport, numbered_lines, to_float
from .tags import is_ours, metric_key

# Our W&B sink's rows carry `stability/step` first: HF's WandbCallback syncs `train/global_step`
# into every row of the run (define_metric step_sync), ours included, with the reporter's step.
_WANDB_STEP_COLUMNS = (keys.STEP_AXIS, "train/global_step", "trainer/global_step", "global_step", "Step",
                       "_step")
_OUR_STEP_COLUMNS = ("step", "Step", "iteration", "iter", "global_step", "_step")


def read_csv(path, *, on_skip: SkipReport, progress: bool = False, tag_map=None, lines=None, **_
             ) -> Iterator[StepRecord]:
    yield from _read(path, on_skip, progress, tag_map, wandb=False, lines=lines)


def read_wandb(path, *, on_skip: SkipReport, progress: bool = False, tag_map=None, **_
               ) -> Iterator[StepRecord]:
    yield from _read(path, on_skip, progress, tag_map, wandb=True)


def _columns(header: list[str], tag_map, wandb: bool):
    """(index of the step column(s) in priority order, [(index, metric key)])."""
    names = [h.strip() for h in header]
    step_names = _WANDB_STEP_COLUMNS if wandb else _OUR_STEP_COLUMNS
    steps = [names.index(s) for s in step_names if s in names]
    run = None
    metrics = []
    for i, name in enumerate(names):
        if i in steps or name.endswith("__MIN") or name.endswith("__MAX"):
            continue
        if wandb and " - " in name:
            prefix, name = name.split(" - ", 1)
            if run is None:
                run = prefix
            elif prefix != run:
                continue
        key = metric_key(name, tag_map)
        if key is not None:
            metrics.append((not is_ours(name), i, key))
    # one column per key: ours (`train/stability/loss`) over a framework's alias (`train/loss`)
    chosen: dict[str, int] = {}
    for _, i, key in sorted(metrics):
        chosen.setdefault(key, i)
    return steps, sorted((i, key) for key, i in chosen.items())


def _read(path, on_skip, progress, tag_map, wandb, lines=None):
    if lines is None:
        lines = numbered_lines(path, progress=progress)
    numbers = [0]    # the line the csv module last consumed (rows may span lines)
    lines = iter(lines)
    first = []
    for line_no, text in lines:          # the header decides the delimiter: `,` or a tab
        if text is not None and text.strip():
            first.append((line_no, text))
            break

    def text_lines():
        for line_no, text in itertools.chain(first, lines):
            if text is None:     # a followed file went idle: nothing is held back here
                continue
            numbers[-1] = line_no
            yield text

    tabs = bool(first) and "\t" in first[0][1] and "," not in first[0][1]
    rows = csv.reader(text_lines(), delimiter="\t" if tabs else ",")
    header = next(rows, None)
    while header is not None and not any(c.strip() for c in header):
        header = next(rows, None)
    if header is None:
        raise LogFormatError(path, None, "empty file (no CSV header)")
    steps, metrics = _columns(header, tag_map, wandb)
    if not steps:
        raise LogFormatError(path, numbers[-1], f"no step column in header {header!r}")
    if not metrics:
        raise LogFormatError(path, numbers[-1], f"no metric column in header {header!r}")
    for row in rows:
        line_no = numbers[-1]
        if not row or not any(c.strip() for c in row):
            continue
        try:
            step_cell = next((row[i] for i in steps if i < len(row) and row[i].strip()), None)
            if step_cell is None:
                raise ValueError("no step")
            step = int(to_float(step_cell))
            values = {}
            for i, key in metrics:
                cell = row[i].strip() if i < len(row) else ""
                if cell:
                    values[key] = to_float(cell)
        except (ValueError, OverflowError) as e:
            on_skip(line_no, ",".join(row), f"unreadable CSV row: {e}")
            continue
        if values or not wandb:
            yield StepRecord(step, values)
