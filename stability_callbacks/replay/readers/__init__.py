"""Readers: each a generator of :class:`~stability_callbacks.record.StepRecord`.

>>> from stability_callbacks.replay.readers import read_records, detect_format
>>> detect_format("tests/data/real_logs/bs_tr11_176B_spike31216.log")           # doctest: +SKIP
'megatron'
>>> [r.step for r in read_records("run.log")][:3]                                # doctest: +SKIP
[31214, 31215, 31216]

Text logs are read by the generic reader (:mod:`.generic`: a tokenizer, a vocabulary as data
and an assembler; any line that prints a step and training metrics, in any common syntax)
unless a format with semantics of its own is recognised first: Megatron iteration lines (a
vanished loss field is a NaN, hand-wrapped lines), fairseq progress (epoch summaries only where
no per-update line exists) and Caffe solver logs (the loss is the train net output that enters
the objective). JSON lines, CSV tables, W&B exports, ``trainer_state.json`` and TensorBoard runs
have their own readers. The input is read once (:class:`.source.Source`: files, gzip, ``-``,
pipes, FIFOs; what is not text is refused with a reason); detection (:mod:`.sniff`) reads a
bounded prefix of it. Every read fills a :class:`.account.ReadAccount`: what was read, how
steps were numbered, what was ignored.
"""
from __future__ import annotations

import os
import re
from itertools import chain, islice
from typing import Callable, Iterable, Iterator, Mapping

from ... import keys
from ...record import StepRecord
from . import caffe, csv_table, fairseq, generic, hf, jsonl, megatron, tensorboard_events
from .account import ReadAccount
from .sniff import DETECT_MAX_LINES, SETTLE_S, NoRecords, detect_lines
from .source import FENCE, FIFO_WAIT_S, LogFormatError, Source, pasted_blocks
from .user_keys import compile_pattern, parse_keys
from .vocabulary import value_term

__all__ = ["FIFO_WAIT_S", "FORMATS", "JUDGED_WITHOUT_LOSS", "LogFormatError", "NoRecords", "ReadAccount", "detect_format",
           "read_records", "parse_keys", "compile_pattern", "DETECT_MAX_LINES", "SETTLE_S"]

FORMATS = ("generic", "megatron", "fairseq", "caffe", "hf-state", "jsonl", "csv", "tensorboard",
           "wandb-csv")

_READERS: dict[str, Callable[..., Iterator[StepRecord]]] = {
    "generic": generic.read, "megatron": megatron.read, "fairseq": fairseq.read, "caffe": caffe.read,
    "hf-state": hf.read_state, "jsonl": jsonl.read, "csv": csv_table.read_csv,
    "tensorboard": tensorboard_events.read, "wandb-csv": csv_table.read_wandb,
}
#: What a log without a training loss is judged on (replay says so first): the fp16 loss scale,
#: overflow skips, the grad norm, an evaluation's loss printed in a results table's rows.
JUDGED_WITHOUT_LOSS = (keys.GRAD_NORM, keys.LOSS_SCALE, keys.OVERFLOW_SKIPPED, keys.EVAL_LOSS)
#: The first lines a log's names are looked for in, beyond the records (a reinforcement
#: learner's: :func:`.vocabulary.value_term`).
NAMES_HEAD_LINES = 500
# Readers of ``(line_no, text)`` lines (a followed file: a ``None`` line is an idle tick).
LINE_READERS = ("generic", "megatron", "fairseq", "caffe", "jsonl", "csv")

# Other names for the same readers: the formats the generic reader reads without semantics of
# their own (docs/replay.md names them), and the names people use.
ALIASES = {
    "hf": "generic", "hf-trainer": "generic", "nanogpt": "generic", "nanogpt-speedrun": "generic",
    "modded-nanogpt": "generic", "llmc": "generic", "llm.c": "generic", "deepspeed": "generic",
    "deepspeed-chat": "generic", "litgpt": "generic", "lit-gpt": "generic", "mlx": "generic",
    "mlx-lm": "generic", "torchtitan": "generic", "nanotron": "generic", "torchtune": "generic",
    "keras": "generic", "lightning": "generic", "text": "generic", "trl": "generic",
    "axolotl": "generic", "unsloth": "generic", "composer": "generic", "llm-foundry": "generic",
    "maxtext": "generic", "olmo-core": "generic", "mmengine": "generic", "ultralytics": "generic",
    "paddlenlp": "generic", "nemo": "generic", "fairseq2": "generic",
    "llamafactory": "jsonl", "llama-factory": "jsonl", "runlog": "jsonl",
    "megatron-lm": "megatron", "megatron-deepspeed": "megatron", "gpt-neox": "megatron",
    "neox": "megatron", "megatron-core": "megatron", "trainer_state": "hf-state",
    "trainer-state": "hf-state", "tb": "tensorboard", "wandb": "wandb-csv",
    "lightning-csv": "csv", "metrics.csv": "csv",
}


def canonical_format(name: str) -> str:
    """``FORMATS`` member for a format name or alias; ``ValueError`` names an unknown one."""
    n = name.strip().lower()
    n = ALIASES.get(n, n)
    if n not in FORMATS and n != "auto":
        raise ValueError(f"format: unknown {name!r}; one of auto, {', '.join(FORMATS)} "
                         f"(also {', '.join(sorted(ALIASES))})")
    return n


def _is_tensorboard(path: str) -> bool:
    if path == "-":
        return False
    if os.path.isdir(path):
        return True
    return "tfevents" in os.path.basename(path)


def detect_format(path) -> str:
    """The format of the log at ``path`` (one of ``FORMATS``), from its content.

    Raises :class:`LogFormatError` for a missing file or one that is not text, and
    :class:`NoRecords` for text with no per-step training metric in the detection window.
    """
    p = str(path)
    if _is_tensorboard(p):
        if os.path.isdir(p) and not tensorboard_events.event_dirs(p):
            raise LogFormatError(p, None, "a directory without TensorBoard event files")
        return "tensorboard"
    return detect_lines(p, Source(p).lines())[0]


def read_records(path, format: str = "auto", tag_map: Mapping[str, str | None] | None = None,
                 on_ignore: Callable[[int, str, str], None] | None = None,
                 progress: bool = False, user_keys: Mapping[str, str] | None = None,
                 pattern: re.Pattern | None = None, lines: Iterable | None = None,
                 account: ReadAccount | None = None, fifo_wait_s: float = FIFO_WAIT_S) -> Iterator[StepRecord]:
    """Records of the log at ``path`` (a file, a gzip file, a TensorBoard directory, ``-`` for
    standard input, a pipe or a FIFO) in file order.

    ``format``: ``"auto"`` or one of ``FORMATS`` (aliases such as ``nanogpt-speedrun`` accepted).
    ``tag_map``: {source name: metric key or None} for named sources (TensorBoard, CSV, JSON).
    ``user_keys`` ({name in the log: ``"step"`` or a metric key}, see :func:`parse_keys`; also
    TensorBoard tags and CSV columns) and ``pattern`` (see :func:`compile_pattern`) tell the
    reader what a line says. ``lines``: ``(line_no, text)`` pairs to read instead of the file
    (``replay --follow``: its tail, checked as :class:`.source.TextLines` checks every input).
    ``on_ignore(line_no, text, reason)`` hears of every unreadable line, lines of binary data
    included (the rest is replayed); without it a one-line summary is logged. ``account``: a
    :class:`ReadAccount` to fill (what was read; its counts of records, of records with a loss
    and what a log without one is judged on are set when the records end, or the generator is
    closed). ``progress``: a ``rich`` bar for large files. ``fifo_wait_s``: how long a FIFO
    waits for a process to open it for writing. Opening and detection errors raise here; a log
    with no record at all raises :class:`LogFormatError` once the generator is exhausted.
    """
    fmt = canonical_format(format)
    if tag_map:
        for name, key in tag_map.items():
            if key is not None and not keys.is_known(key):
                raise ValueError(f"tag_map.{name}: {key!r} is not a metric key "
                                 f"({', '.join(keys.ALL)} or loss/<name>)")
    account = account if account is not None else ReadAccount(path, on_ignore)
    p = str(path)
    followed = lines is not None
    peek: list = []                    # a file's first lines, read before detection
    if not followed and fmt in ("auto", "tensorboard") and _is_tensorboard(p):
        fmt = "tensorboard"
    elif not followed:
        source = Source(p, fifo_wait_s=fifo_wait_s, on_ignore=account)
        if source.notebook:
            account.note("a Jupyter notebook: its cells' printed output read in order (an HTML table's rows as "
                         "tab-separated cells); line numbers count those lines, not the file's")
        lines = source.lines(progress=progress)
        if os.path.isfile(p):
            peek = list(islice(lines, NAMES_HEAD_LINES))
            lines = chain(peek, lines)
            if any(text is not None and FENCE(text) for _, text in peek):
                lines = pasted_blocks(lines, account.ignore)
    guess = consumed = None
    if fmt == "auto" and not pattern:
        # The user's names (--keys) skip the formats with semantics of their own; JSON and
        # tables are still told apart (a CSV column is named by its header or its position).
        try:
            fmt, consumed = detect_lines(p, lines, user_keys=user_keys)   # type: ignore[arg-type]
        except NoRecords as e:
            if e.guess is None:
                raise
            fmt, consumed, guess = "generic", e.consumed, e.guess   # progress lines: a guessed loss
        lines = chain(consumed, lines)               # type: ignore[arg-type]
    elif fmt == "auto":
        fmt = "generic"
    if lines is not None:
        # A reinforcement learner's names in the first lines (detection may stop short of them);
        # a followed log, a pipe or a FIFO is not waited on for more lines than detection read.
        head = peek if peek else list(islice(consumed or (), NAMES_HEAD_LINES))
        account.value_term(value_term(text for _, text in head if text is not None))
    if followed and fmt not in LINE_READERS:
        raise ValueError(f"format {fmt} cannot be followed (one of {', '.join(LINE_READERS)})")
    account.format = fmt
    return _records(p, fmt, tag_map, account, user_keys, pattern, lines, guess)


def _records(path, fmt, tag_map, account, user_keys, pattern, lines, guess=None) -> Iterator[StepRecord]:
    n = with_loss = 0
    loss = keys.LOSS
    others: set[str] = set()          # what records without a loss carry
    try:
        for rec in _READERS[fmt](path, account=account, tag_map=tag_map, lines=lines,
                                 user_keys=user_keys, pattern=pattern, guess=guess):
            n += 1
            if loss in rec.metrics:
                with_loss += 1
            else:
                others.update(rec.metrics)
            yield rec
    finally:                          # also when closed early (a follower that halted)
        account.records, account.with_loss = n, with_loss
        account.signals = sorted(others.intersection(JUDGED_WITHOUT_LOSS))
        account.count_records(n)
        account.finish()
    if n == 0:
        if fmt == "generic" and not (user_keys or pattern) and path != "-":
            # Say what was looked for and what came closest (detection would have, had the
            # format not been forced).
            detect_lines(path, Source(path).lines())
        ignored = f"; {account.unreadable} unreadable line(s) ignored" if account.unreadable else ""
        raise LogFormatError(path, None, f"no {fmt} records found{ignored}")
