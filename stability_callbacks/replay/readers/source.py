"""Streaming a text log line by line: line numbers, quoting, progress, skip reports.

Every text reader consumes :func:`numbered_lines`; none of them loads a whole file. Lines are
read as bytes and decoded one at a time (invalid UTF-8 becomes U+FFFD rather than an error), so
memory stays O(longest line) whatever the log size.
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


def numbered_lines(path, *, progress: bool = False, max_lines: int | None = None
                   ) -> Iterator[tuple[int, str]]:
    """Yield ``(line_no, text)`` (1-based, quoting and line ends removed) of a text file.

    Streams; a ``rich`` progress bar on stderr for files over ``PROGRESS_MIN_BYTES`` when asked.
    """
    try:
        size = os.path.getsize(path)
        f = open(path, "rb")
    except OSError as e:
        raise LogFormatError(path, None, f"cannot open: {e.strerror or e}") from e
    bar = None
    if progress and size >= PROGRESS_MIN_BYTES:
        bar = _ProgressBar(path, size)
    try:
        with f:
            done = 0
            for line_no, raw in enumerate(f, 1):
                if max_lines is not None and line_no > max_lines:
                    return
                if bar is not None:
                    done += len(raw)
                    if line_no % _PROGRESS_EVERY_LINES == 0:
                        bar.update(done)
                text = raw.decode("utf-8", "replace").rstrip("\r\n")
                if "\x00" in text:
                    text = text.replace("\x00", "")
                yield line_no, strip_quote(text)
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
