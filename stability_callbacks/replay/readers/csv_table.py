"""Tables: CSV / TSV with a header row (ours, Lightning's ``metrics.csv``, any) and W&B exports.

Our CSV (docs/replay.md, Formats): header ``step,loss,grad_norm,lr,loss_scale,skipped`` (any subset, commas or
tabs; other metric-key columns such as ``adam/exp_avg_sq_max`` or ``loss/<name>`` kept); an empty
cell is a missing value, ``nan`` is NaN, and a row is a step even when every cell is empty.
Other tables name their columns as their logger does; the columns map through :mod:`.tags`
(Lightning's CSVLogger: ``train_loss_step`` is the loss at ``step``; ``train_loss_epoch`` and
``val_loss`` are not). A row of such a table is a record only where it holds one of our metrics
(Lightning and W&B write a row per ``log`` call).

W&B: a run-history export (``_step,_runtime,_timestamp,train/loss,...``; HF runs also carry
``train/global_step``, which is the optimizer step and wins over ``_step``; the rows of our W&B sink
carry ``stability/step``, which wins over both) or a chart-panel export
(``Step,<run> - train/loss,<run> - train/loss__MIN,<run> - train/loss__MAX``: the ``__MIN``/``__MAX``
envelopes are dropped, the ``<run> - `` prefix is stripped, the first run of the panel is read).
"""
from __future__ import annotations

import csv
import itertools
import re
from pathlib import Path
from typing import Generator, Iterator

from ... import keys
from ...record import StepRecord
from .account import ReadAccount
from .generic import Reading
from .source import LogFormatError, to_float
from .tags import metric_key, rank
from .vocabulary import EVAL_SPLITS, TRAIN_SPLITS, classify

# A cell that is a number: its sign (kept in the template, as the tokenizer does) and digits.
_CELL_NUMBER = re.compile(r"([-+]?)((?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|nan|NaN|NAN|inf|Inf|INF|"
                          r"[Ii]nfinity)")
# Our W&B sink's rows carry `stability/step` first: HF's WandbCallback syncs `train/global_step`
# into every row of the run (define_metric step_sync), ours included, with the reporter's step.
_TB_EXPORT = ["wall time", "step", "value"]
#: A cell that names a split (`100,val,2.4`): it labels its row, as a text line's `val |` does.
_SPLITS = TRAIN_SPLITS | EVAL_SPLITS
_WANDB_STEP_COLUMNS = (keys.STEP_AXIS, "train/global_step", "trainer/global_step", "global_step",
                       "Step", "_step")


def read_csv(path, *, account: ReadAccount, lines, tag_map=None, user_keys=None, **_
             ) -> Iterator[StepRecord]:
    yield from _read(path, account, lines, tag_map, user_keys, wandb=False)


def read_wandb(path, *, account: ReadAccount, lines, tag_map=None, user_keys=None, **_
               ) -> Iterator[StepRecord]:
    yield from _read(path, account, lines, tag_map, user_keys, wandb=True)


def _step_columns(names: list[str], wandb: bool, user) -> list[int]:
    """The step column(s), best first: W&B's own order; else the best-ranked counter."""
    if wandb:
        return [names.index(s) for s in _WANDB_STEP_COLUMNS if s in names]
    ranked = []
    for i, name in enumerate(names):
        role, _, r = classify(name, user)
        if role == "step":
            ranked.append((r, i))
        elif role == "epoch":
            ranked.append((10, i))         # only where nothing finer is printed
    return [i for _, i in sorted(ranked)]


def _columns(header: list[str], tag_map, wandb: bool, user):
    """(index of the step column(s) in priority order, [(index, metric key)], our own table)."""
    names = [h.strip() for h in header]
    steps = _step_columns(names, wandb, user)
    run = None
    metrics = []
    own = True
    for i, name in enumerate(names):
        if i in steps or name.endswith("__MIN") or name.endswith("__MAX"):
            continue
        if wandb and " - " in name:
            prefix, name = name.split(" - ", 1)
            if run is None:
                run = prefix
            elif prefix != run:
                continue
        key = metric_key(name, tag_map, user)
        own = own and keys.is_known(name)
        if key is not None:
            metrics.append((rank(name), i, key, name))
    chosen: dict[str, tuple[int, str]] = {}
    for _, i, key, name in sorted(metrics):
        chosen.setdefault(key, (i, name))
    return steps, sorted((i, key, name) for key, (i, name) in chosen.items()), own and not wandb


def _tensorboard_export(path, header: list[str], line_no: int, tag_map, user) -> list[tuple[int, str, str]]:
    """TensorBoard's scalar download (`Wall time,Step,Value`): one tag per file, named only by the
    file, `run-<run>-tag-<tag>.csv` as TensorBoard names it (`/` in the tag as `_`). The value
    column is the metric its tag names; a file whose name names none is refused, saying so."""
    stem = Path(str(path)).name.removesuffix(".csv")
    tag = stem.split("-tag-", 1)[1] if "-tag-" in stem else stem
    key = metric_key(tag, tag_map, user) or metric_key(tag.replace("_", "/", 1), tag_map, user)
    if key is None:
        raise LogFormatError(path, line_no, f"a TensorBoard scalar export (header {header!r}): its one value "
                             f"column is named by the file's name, and {tag!r} names no training loss, grad "
                             "norm, LR or loss scale; say which it is: --keys loss=Value")
    return [(header.index(next(h for h in header if h.strip().lower() == "value")), key,
             f"Value (the tag {tag!r} in the file's name)")]


def _readable(rows, numbers: list[int], account: ReadAccount) -> Iterator[list[str]]:
    """The CSV rows; one the csv module cannot read is counted in the account at its line
    (``numbers[-1]``) and skipped."""
    while True:
        try:
            yield from rows
            return
        except csv.Error as e:   # (the reader goes on with the next row)
            account(numbers[-1], "", f"unreadable CSV row: {e}")


def _said(path, header: list[str], line_no: int, steps: list[int], metrics, account: ReadAccount,
          tag_map, user, wandb: bool) -> list[tuple[int, str, str]]:
    """The metric columns of a table of named columns, told to the account with its step column;
    a TensorBoard download's one value column named by its file (:func:`_tensorboard_export`)."""
    if not steps:
        raise LogFormatError(path, line_no, f"no step column in header {header!r}")
    if [h.strip().lower() for h in header] == _TB_EXPORT:
        account.format = "tensorboard-csv"
        if not metrics:
            metrics = _tensorboard_export(path, header, line_no, tag_map, user)
    if not metrics:
        raise LogFormatError(path, line_no, f"no metric column in header {header!r}")
    for _, key, name in metrics:
        account.saw(key, name)
    account.numbered("epoch" if classify(header[steps[0]].strip())[0] == "epoch" and not wandb
                     else "counter", header[steps[0]].strip())
    return metrics


def _read(path, account: ReadAccount, lines, tag_map, user, wandb):
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
    try:
        header = next(rows, None)
        while header is not None and not any(c.strip() for c in header):
            header = next(rows, None)
    except csv.Error as e:
        raise LogFormatError(path, numbers[-1], f"not a CSV header: {e}") from e
    if header is None:
        raise LogFormatError(path, None, "empty file (no CSV header)")
    steps, metrics, own = _columns(header, tag_map, wandb, user)
    if not own and not wandb:
        header_line = numbers[-1]
        if not (yield from _by_the_rules(header, rows, numbers, account, tag_map, user)):
            raise LogFormatError(path, header_line, f"no metric column in header {header!r} "
                                 "(no training loss, grad norm, LR or loss scale in any row)")
        return
    metrics = _said(path, header, numbers[-1], steps, metrics, account, tag_map, user, wandb)
    last_step: int | None = None                     # the step and values of the row before
    last_values: dict = {}
    first_step = steps[0]
    # an epoch column beside a finer step (Lightning's CSVLogger): each record's epoch, as printed
    epoch_at = next((i for i, h in enumerate(header) if i != first_step and classify(h.strip(), user)[0] == "epoch"), None)
    for row in _readable(rows, numbers, account):
        line_no = numbers[-1]
        # (the common row first, each shortcut the same answer: its first cell and its first step
        # column filled, each value a plain float)
        if not row or not (row[0].strip() or any(c.strip() for c in row)):
            continue
        try:
            step_cell = row[first_step] if first_step < len(row) and row[first_step].strip() else next(
                (row[i] for i in steps if i < len(row) and row[i].strip()), None)
            if step_cell is None:
                raise ValueError("no step")
            step = int(to_float(step_cell))
            values = {}
            n = len(row)
            for i, key, _ in metrics:
                if i < n:
                    try:   # (float() strips the white space strip() would; what it leaves, below)
                        values[key] = float(row[i])
                    except ValueError:
                        cell = row[i].strip()
                        if cell:
                            values[key] = to_float(cell)   # NaN, Infinity and their spellings
        except (ValueError, OverflowError) as e:
            account(line_no, ",".join(row), f"unreadable CSV row: {e}")
            continue
        if values or own:
            if step == last_step:
                _relogged(account, step, line_no, last_values.get(keys.LOSS), values.get(keys.LOSS))
            last_step, last_values = step, values
            yield StepRecord(step, values, epoch=_epoch_cell(row, epoch_at) if epoch_at is not None else None)
        else:
            account.ignore(line_no, ",".join(row), "row without a training metric")


def _relogged(account: ReadAccount, step: int, line_no: int, a: float | None, b: float | None) -> None:
    """A row that prints its step again with another loss: a record of its own (every row is),
    said in a note (docs/replay.md: a re-logged step)."""
    if a is not None and b is not None and a != b and (a == a or b == b):
        account.note(f"step {step:,} was printed again with another loss (line {line_no}): a "
                     "re-logged step (a resumed run, a summary row), kept as a record of its own")


def _by_the_rules(header: list[str], rows, numbers: list[int], account: ReadAccount, tag_map,
                  user) -> Generator[StepRecord, None, int]:
    """A table that is not ours: each row as the line ``name: value | ...`` of its filled cells
    (an empty cell or a word is no value; a split's name labels the row), read by the generic reader's rules, as a text log's
    line is (the step: a counter column by name, or the integer column that increases; the
    loss: the loss column, a lone statistic of it, or the sum of its terms; evaluation columns
    are no training metric). ``--keys`` positions name columns (``step=1``: the first).
    Returns the number of records."""
    names = [h.strip() for h in header]
    said = {}
    for theirs, ours in (user or {}).items():
        col = int(theirs) - 1 if theirs.strip().isdigit() else -1
        said[names[col] if 0 <= col < len(names) else theirs] = ours
    for name, key in (tag_map or {}).items():
        if key is not None:
            said[name] = key
    dropped = {name for name, key in (tag_map or {}).items() if key is None}
    reading = Reading(account, said or None, rows=True)
    read = 0
    templates: dict[tuple, list[str]] = {}
    for row in _readable(rows, numbers, account):
        cols, nums, label = [], [], ""
        for i, cell in enumerate(row[:len(names)]):
            cell = cell.strip()
            if not cell or names[i] in dropped:
                continue
            m = _CELL_NUMBER.fullmatch(cell)
            if m is None:
                if not label and cell.lower() in _SPLITS:
                    label = cell   # (a split's name labels the row: `val | step: 100 | loss: 2.4`)
                continue
            cols.append((i, m.group(1)))
            nums.append(m.group(2))
        if not nums:
            continue
        key = (label, *cols)
        texts = templates.get(key)
        if texts is None:
            texts = templates[key] = [f"{label + ' | ' if label and not j else ' | ' if j else ''}{names[i]}: {sign}"
                                      for j, (i, sign) in enumerate(cols)] + [""]
            if len(templates) > 4096:
                templates.clear()
        got = reading.take(numbers[-1], ",".join(row), texts, nums)
        read += len(got)
        yield from got
    got = reading.finish()
    yield from got
    return read + len(got)


def _epoch_cell(row: list[str], i: int) -> int | None:
    """The row's epoch, a whole number as printed (None where the cell is empty or not one)."""
    try:
        e = float(row[i])
    except (IndexError, ValueError):
        return None
    return int(e) if e.is_integer() else None
