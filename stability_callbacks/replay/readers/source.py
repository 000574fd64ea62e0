"""A log's text, read once: files, gzip files, ``-`` (stdin), pipes and FIFOs.

:class:`Source` opens the input, refuses what is not text with a reason (a known binary magic,
NUL bytes, a high density of invalid UTF-8), unpacks gzip transparently, and yields
``(line_no, text)`` (:meth:`Source.lines`) in one pass: detection consumes a prefix of those
lines and hands them back (``read_records`` chains them), so a stream is read in full.
Invalid UTF-8 in a text log becomes U+FFFD; memory stays O(longest line).
"""
from __future__ import annotations

import gzip
import io
import os
import re
import stat
import sys
from typing import IO, Iterator

# Files below this size finish before a progress bar would be readable.
PROGRESS_MIN_BYTES = 4 * 1024 * 1024
_PROGRESS_EVERY_LINES = 4096
SNIFF_BYTES = 64 * 1024

# "> " (and "> > ") prefixes of text quoted in an issue, a forum post or an e-mail.
_QUOTE = re.compile(r"^[ \t]*(?:>[ \t]?)+")
# Colour and cursor escapes (CSI sequences; OSC titles end with BEL or ESC \).
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b[@-Z\\-_]")

# Magic bytes of files people point replay at by mistake.
_MAGIC = ((b"\x7fELF", "an ELF executable"), (b"PK\x03\x04", "a zip archive (a torch .pt/.pth "
          "checkpoint, a .zip)"), (b"\x80\x02", "a pickle (an old torch checkpoint)"),
          (b"\x80\x04", "a pickle"), (b"\x80\x05", "a pickle"), (b"\x89HDF", "an HDF5 file"),
          (b"\x93NUMPY", "a NumPy array"), (b"\x89PNG", "a PNG image"), (b"%PDF", "a PDF"),
          (b"\xca\xfe\xba\xbe", "a Mach-O binary"), (b"\xcf\xfa\xed\xfe", "a Mach-O binary"),
          (b"MZ", "a Windows executable"), (b"BZh", "a bzip2 archive"),
          (b"\xfd7zXZ", "an xz archive"), (b"\x28\xb5\x2f\xfd", "a zstd archive"))


class LogFormatError(ValueError):
    """A log that cannot be replayed at all: missing, not text, or of no known format.

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


def not_text(head: bytes) -> str | None:
    """Why the first bytes of a file are no text log, or None.

    >>> not_text(b"\\x7fELF\\x02\\x01"), not_text(b"step 1 loss 2.5\\n")
    ('an ELF executable (magic bytes 7f 45 4c 46)', None)
    """
    for magic, what in _MAGIC:
        if head.startswith(magic):
            return f"{what} (magic bytes {magic.hex(' ')})"
    if len(head) >= 10 and head[8:10] == b'{"' and int.from_bytes(head[:8], "little") < 1 << 30:
        return "a safetensors file (an 8-byte header length, then its JSON header)"
    if not head:
        return None
    nul = head.count(b"\x00")
    if nul * 100 > len(head):
        return f"binary data: {nul} NUL bytes in the first {len(head)} bytes"
    text = head.decode("utf-8", errors="replace")
    bad = text.count("\ufffd") - head.decode("utf-8", errors="ignore").count("\ufffd")
    if bad * 20 > len(text):
        return f"binary data: {bad} of the first {len(text)} characters are not UTF-8"
    return None


class Source:
    """One input, opened for one pass (see the module docstring). ``path`` is a file, a
    gzip file, a FIFO, or ``-`` for standard input."""

    def __init__(self, path):
        self.path = str(path)
        self.size = 0
        try:
            if self.path == "-":
                raw: IO[bytes] = sys.stdin.buffer
            else:
                mode = os.stat(self.path).st_mode
                if stat.S_ISDIR(mode):
                    raise LogFormatError(self.path, None, "a directory without TensorBoard event files")
                if stat.S_ISREG(mode):
                    self.size = os.path.getsize(self.path)
                raw = open(self.path, "rb")
        except FileNotFoundError as e:
            raise LogFormatError(self.path, None, "no such file") from e
        except OSError as e:
            raise LogFormatError(self.path, None, f"cannot open: {e.strerror or e}") from e
        head = _read_head(raw, SNIFF_BYTES)
        if head[:2] == b"\x1f\x8b":
            unpacked = gzip.GzipFile(fileobj=io.BufferedReader(_Prefixed(raw, head)), mode="rb")
            try:
                head = _read_head(unpacked, SNIFF_BYTES)
            except (OSError, EOFError) as e:
                raise LogFormatError(self.path, None, f"a gzip file that does not unpack: {e}") from e
            raw, self.size = unpacked, 0      # type: ignore[assignment]
        why = not_text(head)
        if why is not None:
            if raw is not sys.stdin.buffer:
                raw.close()
            raise LogFormatError(self.path, None, f"not a text log: {why}")
        self.head = head
        if self.size and raw.seekable():
            raw.seek(0)                       # a regular file: read it again from the start
            self._stream: IO[bytes] = raw
        else:
            self._stream = io.BufferedReader(_Prefixed(raw, head))

    def text(self) -> str:
        """The whole content (JSON documents)."""
        with self._stream as f:
            return f.read().decode("utf-8", errors="replace")

    def lines(self, *, progress: bool = False) -> Iterator[tuple[int, str]]:
        """``(line_no, text)`` (1-based, quoting and line ends removed), in one pass.

        Only ``\\n`` ends a line (a ``\\r`` inside one is a tqdm redraw, see :func:`segments`).
        """
        bar = _ProgressBar(self.path, self.size) if progress and self.size >= PROGRESS_MIN_BYTES else None
        f = io.TextIOWrapper(self._stream, encoding="utf-8", errors="replace", newline="\n")  # type: ignore[arg-type]
        try:
            done = 0
            for line_no, text in enumerate(f, 1):
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
        except (OSError, EOFError) as e:
            raise LogFormatError(self.path, None, f"read failed: {e}") from e
        finally:
            if bar is not None:
                bar.close()
            f.close()


def _read_head(f, size: int) -> bytes:
    """Up to ``size`` first bytes (a pipe delivers them in pieces)."""
    chunks, got = [], 0
    while got < size:
        data = f.read(size - got)
        if not data:
            break
        chunks.append(data)
        got += len(data)
    return b"".join(chunks)


class _Prefixed(io.RawIOBase):
    """A binary stream that first gives back the bytes already read from it."""

    def __init__(self, f, prefix: bytes):
        self.f = f
        self.prefix = memoryview(prefix)

    def readable(self) -> bool:
        return True

    def readinto(self, b) -> int:
        if self.prefix:
            n = min(len(b), len(self.prefix))
            b[:n] = self.prefix[:n]
            self.prefix = self.prefix[n:]
            return n
        data = self.f.read(len(b))
        b[:len(data)] = data
        return len(data)

    def close(self) -> None:
        if self.f is not sys.stdin.buffer:
            self.f.close()
        super().close()


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
# after it: the indentation of the line itself stays (OLMo's blocks).
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
    """``(line_no, text)`` of a text file (see :meth:`Source.lines`), at most ``max_lines``."""
    for line_no, text in Source(path).lines(progress=progress):
        if max_lines is not None and line_no > max_lines:
            return
        yield line_no, text


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
