"""Streaming a text log line by line: line numbers, quoting, progress, skip reports.

Every text reader consumes :func:`numbered_lines`; none of them loads a whole file. Invalid
UTF-8 becomes U+FFFD rather than an error; memory stays O(longest line) whatever the log size.
"""
from __future__ import annotations

import logging
import os
import re
from typing import Callable, Iterator

logger = logging.getLogger(__name__)

# Files below this size finish before a progress bar would be readable.
PROGRESS_MIN_BYTES = 4 * 1024 * 1024
_PROGRESS_EVERY_LINES = 4096

# "> " (and "> > ") prefixes of text quoted in an issue, a forum post or an e-mail.
_QUOTE = re.compile(r"^[ \t]*(?:>[ \t]?)+")
# Colour and cursor escapes (CSI sequences; OSC titles end with BEL or ESC \).
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")

SkipCallback = Callable[[int, str, str], None]


class LogFormatError(ValueError):
    """A log that cannot be replayed at all: missing, unreadable, or of no known format.

    ``str()`` names the file and, where one is to blame, the line:

    >>> str(LogFormatError("run.log", 12, "bad header"))
    'run.log:12: bad header'
    """

    def __init__(self, path, line_no: int | None, msg: str):
        self.path = str(path)
        self.line_no = line_no
        self.msg = msg
        where = self.path if line_no is None else f"{self.path}:{line_no}"
        super().__init__(f"{where}: {msg}")


class SkipReport:
    """Forwards unreadable lines to the caller's ``on_skip``; without one, logs a summary once.

    A partly unreadable file is replayed anyway (the readable records still carry the story), so
    skipping is never an error; it is counted and, where nobody listens, reported at the end.
    """

    def __init__(self, path, on_skip: SkipCallback | None):
        self.path = str(path)
        self.on_skip = on_skip
        self.count = 0
        self.first: tuple[int, str] | None = None

    def __call__(self, line_no: int, text: str, reason: str) -> None:
        self.count += 1
        if self.first is None:
            self.first = (line_no, reason)
        if self.on_skip is not None:
            self.on_skip(line_no, text, reason)

    def finish(self) -> None:
        if self.on_skip is None and self.count and self.first is not None:
            line_no, reason = self.first
            logger.warning("%s: skipped %d unreadable line(s); first at line %d: %s",
                           self.path, self.count, line_no, reason)


def strip_quote(line: str) -> str:
    """Remove e-mail / issue quoting (``> ``) from the start of a line.

    >>> strip_quote("> > iteration 5/ 10 |")
    'iteration 5/ 10 |'
    """
    if ">" in line[:8]:
        m = _QUOTE.match(line)
        if m:
            return line[m.end():]
    return line


_LEVEL = r"(?:INFO|WARNING|WARN|ERROR|DEBUG|CRITICAL|NOTICE)"
# What a launcher or a logging handler puts before a program's own line: torchrun's `[rank0]:`,
# absl / glog's `I1123 12:00:00.123456 140234 train.py:123] ` (JAX, TensorFlow), a date and time
# (ISO, day/month or `Nov 23`, with milliseconds, in brackets or not), a logging level with or
# without its logger (`INFO:root:`, `__main__ - INFO - `), in any order. Each takes one space
# after it: the indentation of the line itself stays (OLMo's blocks). One home for the level
# words: a key never starts with one once the prefix is gone.
_LINE_PREFIX = re.compile(
    r"(?:\[?rank\s*\d+\]?:[ \t]?"
    r"|[IWEF]\d{4} \d\d:\d\d:\d\d(?:\.\d+)?[ \t]+\d+[ \t]+[\w./-]+:\d+\][ \t]"
    r"|\[?(?:\d{4}[-/.]\d\d[-/.]\d\d|\d\d?[-/.]\d\d?[-/.]\d{2,4}|[A-Z][a-z]{2}[ \t]+\d\d?)[ T]"
    r"\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\]?(?:[ \t]?[,|:-])?[ \t]"
    r"|\[?\d\d:\d\d:\d\d(?:[.,]\d+)?\]?(?:[ \t]?[,|-])?[ \t]"
    r"|[ \t]*(?:[\w.]+[ \t]+-[ \t]+)?\[?" + _LEVEL + r"\]?(?::[\w.]*:|[ \t]*[-|:][ \t]|[ \t]))+")


def strip_prefix(line: str) -> str:
    """The line without what a launcher or logger put before it (:data:`_LINE_PREFIX`).

    >>> strip_prefix("[rank0]: 2024-05-01 12:00:00,123 INFO Iter 10: loss 2.3")
    'Iter 10: loss 2.3'
    >>> strip_prefix("2024-05-01 12:00:00,123 - __main__ - INFO - step 5 loss 2.0")
    'step 5 loss 2.0'
    >>> strip_prefix("I1123 12:00:00.123456 140234 train.py:123] [100] loss=2.3")
    '[100] loss=2.3'
    >>> strip_prefix("11/23/2026 12:00:00 INFO Iter 10"), strip_prefix("Nov 23 12:00:00 INFO Iter 10")
    ('Iter 10', 'Iter 10')
    >>> strip_prefix("0 train 10.93"), strip_prefix("12 | loss 2.5"), strip_prefix("[rank0]:    loss=2")
    ('0 train 10.93', '12 | loss 2.5', '   loss=2')
    """
    m = _LINE_PREFIX.match(line)
    return line[m.end():] if m else line


def segments(line: str) -> list[str]:
    """The pieces of one physical line a terminal would have shown as separate lines.

    tqdm and Keras redraw a bar with ``\\r`` (or backspaces), so a captured log holds many
    updates on one line; colour codes and quoting are removed from each piece.

    >>> segments("\\x1b[32mstep 1\\x1b[0m loss 2.5\\r> step 2 loss 2.4")
    ['step 1 loss 2.5', 'step 2 loss 2.4']
    """
    if "\x1b" in line:
        line = _ANSI.sub("", line)
    if "\r" not in line and "\b" not in line:
        return [line]
    if "\b" in line:
        line = line.replace("\b", "\r")
    return [strip_quote(p) for p in line.split("\r") if p and not p.isspace()]


def numbered_lines(path, *, progress: bool = False, max_lines: int | None = None
                   ) -> Iterator[tuple[int, str]]:
    """Yield ``(line_no, text)`` (1-based, quoting and line ends removed) of a text file.

    Streams; a ``rich`` progress bar on stderr for files over ``PROGRESS_MIN_BYTES`` when asked.
    Only ``\\n`` ends a line (a ``\\r`` inside one is a tqdm redraw, see :func:`segments`).
    """
    try:
        size = os.path.getsize(path)
        f = open(path, encoding="utf-8", errors="replace", newline="\n")
    except OSError as e:
        raise LogFormatError(path, None, f"cannot open: {e.strerror or e}") from e
    bar = None
    if progress and size >= PROGRESS_MIN_BYTES:
        bar = _ProgressBar(path, size)
    try:
        with f:
            done = 0
            for line_no, text in enumerate(f, 1):
                if max_lines is not None and line_no > max_lines:
                    return
                if bar is not None:
                    done += len(text)           # characters: close enough to bytes for a bar
                    if line_no % _PROGRESS_EVERY_LINES == 0:
                        bar.update(done)
                text = text.rstrip("\r\n")
                if "\x00" in text:
                    text = text.replace("\x00", "")
                if ">" in text[:8]:
                    text = strip_quote(text)
                yield line_no, text
    finally:
        if bar is not None:
            bar.close()


class _ProgressBar:
    def __init__(self, path, size: int):
        from rich.console import Console
        from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn,
                                   TimeRemainingColumn)
        self._progress = Progress(TextColumn("reading {task.description}"), BarColumn(),
                                  DownloadColumn(), TimeRemainingColumn(),
                                  console=Console(stderr=True), transient=True)
        self._progress.start()
        self._task = self._progress.add_task(os.path.basename(str(path)), total=size)

    def update(self, done: int) -> None:
        self._progress.update(self._task, completed=done)

    def close(self) -> None:
        self._progress.stop()


def to_float(text: str) -> float:
    """``float()`` that also reads the spellings logs use for non-finite values.

    >>> to_float("-Infinity"), to_float("NaN"), to_float("1.5E+00")
    (-inf, nan, 1.5)
    """
    try:
        return float(text)
    except ValueError:
        t = text.strip().strip("'\"").lower()
        if t in ("nan", "-nan", "+nan"):
            return float("nan")
        if t in ("inf", "+inf", "infinity", "+infinity"):
            return float("inf")
        if t in ("-inf", "-infinity"):
            return float("-inf")
        return float(t)
