"""A log's text, read once: files, gzip files, ``-`` (stdin), pipes and FIFOs.

:func:`open_input` opens the input (a FIFO without waiting for its writer); :class:`TextLines`
turns its bytes into ``(line_no, text)``: it unpacks gzip, refuses what is not text with a
reason (a known binary magic, NUL bytes, a high density of invalid UTF-8) before the first line,
and leaves out later lines of binary data. :class:`Source` reads an input once with them
(``replay``), and ``replay --follow``'s tail (:mod:`..follow`) reads a growing one with the
same two: one way to open and check input. Detection consumes a prefix of the lines and hands
them back (``read_records`` chains them), so a stream is read in full. Invalid UTF-8 in a text
log becomes U+FFFD; memory stays O(chunk + longest line).
"""
from __future__ import annotations

import io
import json
import os
import re
import stat
import sys
import time
import zlib
from typing import IO, Iterator

# Files below this size finish before a progress bar would be readable.
PROGRESS_MIN_BYTES = 4 * 1024 * 1024
SNIFF_BYTES = 64 * 1024
#: What one read takes (``replay`` and ``--follow``): small enough that its buffers are reused,
#: not mapped afresh (1 MiB reads made reading a 300 MB log ~2x slower).
CHUNK_BYTES = 64 * 1024
#: How long ``replay`` waits for a process to open a FIFO for writing (``--idle-exit-s`` sets it).
FIFO_WAIT_S = 10.0
#: What a FIFO nobody writes is said to be (``replay``, and ``--follow`` when it gives up).
NO_WRITER = "a FIFO that no process opened for writing"
#: The reason a line of binary data is left out (an unreadable line, in the account).
BINARY_LINE = "unreadable: binary data (not UTF-8, with a control byte no text log prints)"
_GZIP_MAGIC = b"\x1f\x8b"
# Control characters no text log prints (tab, line ends, form feed, BEL, backspace and ESC
# are printed: tqdm, Keras, colours, terminal titles).
_CONTROL = re.compile("[\x01-\x06\x0e-\x1a\x1c-\x1f]")

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
    >>> not_text(bytes(5000) + b"step 7 loss 2.5\\n") is None    # NULs first: a hole, then text
    True
    """
    for magic, what in _MAGIC:
        if head.startswith(magic):
            return f"{what} (magic bytes {magic.hex(' ')})"
    if len(head) >= 10 and head[8:10] == b'{"' and int.from_bytes(head[:8], "little") < 1 << 30:
        return "a safetensors file (an 8-byte header length, then its JSON header)"
    head = head.lstrip(b"\x00")          # a file truncated under its writer starts with NULs
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


class TextLines:
    """Bytes in, ``(line_no, text)`` out: the one place where a log's bytes become lines, for
    ``replay`` (:class:`Source`) and ``replay --follow`` (:class:`~..follow.TailLines`) alike.

    - gzip is unpacked as the bytes come (a file being written through gzip too; members after
      the first are read on);
    - the first bytes (up to ``SNIFF_BYTES``) are checked (:func:`not_text`): input that is not
      text is refused (:class:`LogFormatError`) before any line is given out;
    - a later line of binary data (invalid UTF-8 or NUL bytes, with a control byte no text log
      prints or more than a quarter of it not UTF-8: garbage appended to a log) is left out and
      reported to ``on_ignore`` as unreadable; NUL bytes are dropped (a file truncated under its
      writer starts with them). The rule looks at the line alone, so where the reads happen to
      cut the input (``replay``, ``--follow``) never changes it;
    - only ``\\n`` ends a line (a ``\\r`` inside one is a tqdm redraw, see :func:`segments`); a
      line's ``\\r`` ends and its e-mail quoting are removed; invalid UTF-8 becomes U+FFFD;
    - ``redraws``: the ``\\r``-ended pieces of a line not finished yet go out at once (a followed
      file: each is a complete tqdm update); the rest of the line comes with its end.

    >>> cut = TextLines("run.log", on_ignore=lambda n, text, why: print(f"line {n} left out"))
    >>> cut.feed(b"step 1 loss 2.5\\n> step 2 lo")
    [(1, 'step 1 loss 2.5')]
    >>> cut.feed(b"ss 2.4\\n\\x93\\x02\\x9f7\\xe1\\nstep 4 loss 2.3\\nstep 5"), cut.end()
    line 3 left out
    ([(2, 'step 2 loss 2.4'), (4, 'step 4 loss 2.3')], [(5, 'step 5')])
    >>> TextLines("x.pt").feed(b"PK\\x03\\x04...")
    Traceback (most recent call last):
    ...
    stability_callbacks.replay.readers.source.LogFormatError: x.pt: not a text log: a zip archive (a torch .pt/.pth checkpoint, a .zip) (magic bytes 50 4b 03 04)

    Cost: a few passes of C code over each chunk (decoding, a search for NUL and U+FFFD,
    splitting); only the lines of a chunk holding NUL or invalid UTF-8 are checked one by one.
    Memory: a chunk.
    """

    def __init__(self, path, *, on_ignore=None, check_head: bool = True, redraws: bool = False):
        self.path = str(path)
        self.on_ignore = on_ignore
        self.redraws = redraws
        self.line_no = 0
        self.binary = 0                       # lines of binary data left out
        self._head_checked = not check_head
        self._started = False
        self._gunzip: zlib._Decompress | None = None
        self._partial = b""

    def feed(self, data: bytes) -> list[tuple[int, str]]:
        """The lines ``data`` completes (a partial last line waits for the next bytes)."""
        if not self._started and data:
            self._started = True
            if data[:2] == _GZIP_MAGIC:
                self._gunzip = zlib.decompressobj(wbits=31)
        if self._gunzip is not None:
            data = self._unpack(data)
        if not data:
            return []
        if not self._head_checked:
            self._head_checked = True
            why = not_text(data[:SNIFF_BYTES])
            if why is not None:
                raise LogFormatError(self.path, None, f"not a text log: {why}")
        data = self._partial + data if self._partial else data
        cut = data.rfind(b"\n") + 1
        self._partial = data[cut:]
        out = self._lines(memoryview(data)[:cut]) if cut else []
        if self.redraws and b"\r" in self._partial:       # tqdm redraws: complete updates
            cut = self._partial.rfind(b"\r") + 1
            piece = self._line(self.line_no + 1, self._partial[:cut].decode("utf-8", "replace"))
            self._partial = self._partial[cut:]
            if piece is not None:
                out.append(piece)
        return out

    def end(self, *, complete: bool = True) -> list[tuple[int, str]]:
        """The last line, unfinished (no line end). ``complete``: the input ended (a gzip stream
        cut short is an error); False: following stopped, or the file was replaced, and what
        is there is all there will be."""
        gz = self._gunzip
        if complete and gz is not None and not gz.eof:
            what = "a gzip file cut short" if self._head_checked else "a gzip file that does not unpack"
            raise LogFormatError(self.path, None, f"{what}: it ends inside its compressed stream "
                                 "(still being written? replay --follow reads it as it grows)")
        last, self._partial = self._partial, b""
        line = self._line(self.line_no + 1, last.decode("utf-8", "replace")) if last else None
        if line is not None:
            self.line_no += 1
        return [line] if line is not None else []

    def _unpack(self, data: bytes) -> bytes:
        """What gzip ``data`` unpacks to so far (every member; zero padding after one skipped)."""
        out = []
        try:
            while data:
                gz = self._gunzip
                assert gz is not None
                out.append(gz.decompress(data))
                if not gz.eof:
                    break
                data = gz.unused_data.lstrip(b"\x00")
                if data:
                    self._gunzip = zlib.decompressobj(wbits=31)
        except zlib.error as e:
            raise LogFormatError(self.path, None, f"a gzip file that does not unpack: {e}") from e
        return b"".join(out)

    def _lines(self, block: memoryview) -> list[tuple[int, str]]:
        """The lines of ``block`` (whole lines, each ending with ``\\n``)."""
        text = str(block, "utf-8", "replace")
        parts = text.split("\n")
        parts.pop()                                         # after the last \n: nothing
        n = self.line_no
        self.line_no += len(parts)
        if "\ufffd" in text or "\x00" in text:              # binary data? line by line
            return [x for x in (self._line(n + i, t) for i, t in enumerate(parts, 1)) if x is not None]
        if "\r" in text:                                    # per line only where a chunk needs it
            parts = [t.rstrip("\r") for t in parts]
        if ">" in text:
            parts = [strip_quote(t) if ">" in t[:8] else t for t in parts]
        return list(zip(range(n + 1, self.line_no + 1), parts))

    def _line(self, line_no: int, line: str) -> tuple[int, str] | None:
        """One line checked: None for binary data (reported to ``on_ignore``)."""
        suspect = "\ufffd" in line
        if "\x00" in line:
            suspect, line = True, line.replace("\x00", "")
        if suspect and (_CONTROL.search(line) is not None or line.count("\ufffd") * 4 > len(line)):
            self.binary += 1
            if self.on_ignore is not None:
                self.on_ignore(line_no, "", BINARY_LINE)
            return None
        line = line.rstrip("\r")
        if ">" in line[:8]:
            line = strip_quote(line)
        return line_no, line


class Source:
    """One input, opened for one pass (see the module docstring). ``path`` is a file, a gzip
    file, a FIFO, or ``-`` for standard input. A FIFO that no process has opened for writing
    is waited for ``fifo_wait_s``, then refused. ``on_ignore(line_no, text, reason)`` hears of
    the lines of binary data left out (:class:`TextLines`). Whatever refuses the input (not
    there, not text, a gzip file that does not unpack) raises here, before a line is read."""

    def __init__(self, path, *, fifo_wait_s: float = FIFO_WAIT_S, on_ignore=None):
        self.path = str(path)
        opened = open_input(self.path)
        if opened is None:
            raise LogFormatError(self.path, None, "no such file")
        self._raw, fifo = opened
        self.size = os.fstat(self._raw.fileno()).st_size if self.path != "-" and not fifo else 0
        self._cut = TextLines(self.path, on_ignore=on_ignore)
        try:
            first = _await_writer(self._raw, self.path, fifo_wait_s) if fifo else b""
            head = first + _read_head(self._raw, SNIFF_BYTES - len(first))
            self._first = self._cut.feed(head)
        except BaseException:
            self._close()
            raise
        self._done = len(head)
        self.notebook = _NOTEBOOK.match(head) is not None and self._from_notebook(head)

    def _from_notebook(self, head: bytes) -> bool:
        """A Jupyter notebook (``.ipynb``: Colab's, with its outputs): its cells' printed output is
        the log, read in their order (a table drawn in HTML, HF's ``Step | Training Loss``, as its
        rows' cells separated by tabs); line numbers count those lines. False: no notebook after all."""
        try:
            data = head + self._raw.read(NOTEBOOK_MAX_BYTES)
            text = notebook_text(json.loads(data))
        except (ValueError, TypeError, AttributeError, OSError):
            return False
        self._close()
        self._cut = TextLines(self.path)
        self._first = self._cut.feed(text.encode()) + list(self._cut.end())
        self._raw = io.BytesIO(b"")
        return True

    def lines(self, *, progress: bool = False) -> Iterator[tuple[int, str]]:
        """``(line_no, text)`` (1-based; see :class:`TextLines`), in one pass."""
        bar = _ProgressBar(self.path, self.size) if progress and self.size >= PROGRESS_MIN_BYTES else None
        try:
            yield from self._first
            self._first = []
            read = getattr(self._raw, "read1", self._raw.read)
            while True:
                data = read(CHUNK_BYTES)
                if not data:
                    break
                if bar is not None:
                    self._done += len(data)
                    bar.update(self._done)
                yield from self._cut.feed(data)
            yield from self._cut.end()
        except OSError as e:
            raise LogFormatError(self.path, None, f"read failed: {e}") from e
        finally:
            if bar is not None:
                bar.close()
            self._close()

    def _close(self) -> None:
        if self._raw is not sys.stdin.buffer:
            self._raw.close()


_NOTEBOOK = re.compile(rb'\s*\{\s*"(?:cells|metadata|nbformat)"')
#: The most of a notebook read (its outputs are the log; a notebook is read whole, as JSON).
NOTEBOOK_MAX_BYTES = 256 * 1024 * 1024
_ROW = re.compile(r"<tr\b.*?</tr>", re.S | re.I)
_CELL = re.compile(r"<t[dh]\b[^>]*>(.*?)</t[dh]>", re.S | re.I)
_TAG = re.compile(r"<[^>]+>")


def notebook_text(nb: dict) -> str:
    """The printed output of a notebook's cells, in order: streams and plain text as printed, an
    HTML table's rows as cells separated by tabs (a table's only text where its plain form is a
    placeholder, as HF's notebook progress shows it); the code itself is no log."""
    out: list[str] = []
    for cell in nb["cells"]:
        for o in cell.get("outputs", ()):
            if o.get("output_type") == "stream":
                out.append(_joined(o.get("text", "")))
                continue
            data = o.get("data", {})
            html, plain = _joined(data.get("text/html", "")), _joined(data.get("text/plain", ""))
            if html and (not plain or plain.startswith("<IPython")):
                out += ["\t".join(_TAG.sub("", c).strip() for c in _CELL.findall(row)) for row in _ROW.findall(html)]
                out += [_TAG.sub("", line).strip() for line in html.split("\n")
                        if "<t" not in line and "</t" not in line and _TAG.sub("", line).strip()][:3]
            elif plain:
                out.append(plain)
    return "\n".join(x.rstrip("\n") for x in out) + "\n"


def _joined(text) -> str:
    return "".join(text) if isinstance(text, list) else str(text)


def open_input(path: str) -> tuple[IO[bytes], bool] | None:
    """``(file, is_fifo)``: the input at ``path`` opened to read bytes (``-``: standard input);
    None when there is no such file. A FIFO is opened without waiting for a writer (reads give
    ``b""`` while there is none, None while its writer writes nothing); everything else is read
    as it is. :class:`LogFormatError` for a directory or a file that cannot be opened."""
    if path == "-":
        return sys.stdin.buffer, False
    try:
        mode = os.stat(path).st_mode
        if stat.S_ISDIR(mode):
            raise LogFormatError(path, None, "a directory, not a log file (TensorBoard runs: replay DIR, without --follow or --format)")
        if stat.S_ISFIFO(mode):
            return os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK), "rb", buffering=0), True
        return open(path, "rb", buffering=0), False
    except FileNotFoundError:
        return None
    except OSError as e:
        raise LogFormatError(path, None, f"cannot open: {e.strerror or e}") from e


def _await_writer(f, path: str, wait_s: float) -> bytes:
    """The first bytes of a FIFO opened without blocking, once a process has opened it for
    writing (then it blocks like any stream); :class:`LogFormatError` after ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while True:
        data = f.read(CHUNK_BYTES)
        if data is None or data:                 # a writer: nothing written yet, or its first bytes
            os.set_blocking(f.fileno(), True)
            return data or b""
        if time.monotonic() >= deadline:
            raise LogFormatError(path, None, f"{NO_WRITER} within {wait_s:g} s (start the job that "
                                 "writes it, or replay --follow, which waits for it)")
        time.sleep(0.05)


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
# after it: the indentation of the line itself stays (OLMo's blocks). A run followed by what it
# cannot match is held (possessive: `*+`, `++`): no match needs part of it given back, and the
# engine keeps no way back into it (a line with no prefix is ruled out ~15% sooner).
_LINE_PREFIX = re.compile(
    r"(?:\[?rank\s*+\d+\]?:[ \t]?"
    r"|[IWEF]\d{4} \d\d:\d\d:\d\d(?:\.\d+)?[ \t]+\d+[ \t]+[\w./-]++:\d+\][ \t]"
    r"|\[?(?:\d{4}[-/.]\d\d[-/.]\d\d|\d\d?[-/.]\d\d?[-/.]\d{2,4}|[A-Z][a-z]{2}[ \t]+\d\d?)[ T]"
    r"\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d)?\]?(?:[ \t]?[,|:-])?[ \t]"
    r"|\[?\d\d:\d\d:\d\d(?:[.,]\d+)?\]?(?:[ \t]?[,|-])?[ \t]"
    r"|\[[\w-]++(?:\.[\w-]++)++:\d+\](?:[ \t]\(\d+/\d+\))?[ \t]"   # a logger's `[train.py:876]` (icefall's rank/world after it)
    r"|[ \t]*+(?:[\w.]++[ \t]++-[ \t]++)?\[?" + _LEVEL + r"\]?(?::[\w.]*:|[ \t]*[-|:][ \t]|[ \t]))+")


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
    >>> strip_prefix("2026-11-30 10:00:00,000 INFO [train.py:876] (0/4) Epoch 1, batch 50, loss 2.3")
    'Epoch 1, batch 50, loss 2.3'
    >>> strip_prefix("(3/10) loss 2.3")
    '(3/10) loss 2.3'
    """
    m = _LINE_PREFIX.match(line)
    line = line[m.end():] if m else line
    return _untensor(line) if "(" in line and _WRAPPED_HINT(line) else line


#: A scalar as a framework's ``print`` shows it, wrapped: torch's ``tensor(2.3026, device='cuda:0',
#: grad_fn=<NllLossBackward0>)``, ``tensor([0.5])``; TF's ``tf.Tensor(2.3, shape=(), dtype=float32)``
#: and ``<tf.Tensor: shape=(), dtype=float32, numpy=2.3>``; JAX's ``Array(2.3, dtype=float32)``
#: (``DeviceArray`` before it); NumPy 2's ``np.float32(2.3)``; Paddle's ``Tensor(shape=[1],
#: dtype=float32, place=Place(gpu:0), stop_gradient=True, [2.30])``; MindSpore's ``Tensor(shape=[],
#: dtype=Float32, value= 2.3)``; an array of them (``tensor([0.5, 0.3])``: ``[0.5, 0.3]``). The wrapper
#: is the value's print, not a field of the line: the key before it names the value inside (group
#: ``rest``: what follows a value, a grad_fn).
_VALUE = r"[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|nan|inf|NaN|Inf)"
_ARGS = r"(?:[^()]|\([^()]*\))*"
_TENSOR = re.compile(
    rf"\b(?:tensor|tf\.Tensor|Array|DeviceArray|array)\((?P<a>\[[^\[\]()]*,[^\[\]()]*\])(?:,{_ARGS})?\)"
    rf"|\b(?:tensor|tf\.Tensor|Tensor|Array|DeviceArray|array|np\.float\d+|numpy\.float\d+)\(\[?\s*(?P<v>{_VALUE})\s*\]?"
    rf"(?P<rest>(?:,{_ARGS})?)\)"
    rf"|\bTensor\(shape=\[[^\]]*\],(?:[^()\[\]]|\([^()]*\))*(?:value=\s*(?P<m>{_VALUE})\s*|\[\s*(?P<p>{_VALUE})\s*\])\)"
    rf"|<tf\.Tensor:[^<>]*?numpy=\s*(?P<t>{_VALUE})\s*>")
_WRAPPED_HINT = re.compile(r"ensor[(:]|rray\(|\.float\d").search
#: The name a bare printed tensor with a grad_fn gets (vocabulary.json: the loss, below a printed one).
GRAD_TENSOR = "tensor_with_grad_fn"


def _untensor(line: str) -> str:
    """``loss: tensor(2.3, grad_fn=<...>)`` -> ``loss: 2.3`` (each wrapper of :data:`_TENSOR`); a
    line that is only such a tensor with a grad_fn (a training loop's ``print(loss)``: what
    backward() is called on) -> ``tensor_with_grad_fn 2.3``.

    >>> _untensor("loss: tensor(2.3026, device='cuda:0', grad_fn=<NllLossBackward0>)")
    'loss: 2.3026'
    >>> _untensor("tensor(nan, grad_fn=<DivBackward0>)"), _untensor("acc tensor([0.93])")
    ('tensor_with_grad_fn nan', 'acc 0.93')
    >>> _untensor("step 3 loss=tf.Tensor(2.3, shape=(), dtype=float32) acc=<tf.Tensor: shape=(), dtype=float32, numpy=0.5>")
    'step 3 loss=2.3 acc=0.5'
    >>> _untensor("step 3 loss: Array(2.3, dtype=float32) lr: np.float64(0.001)")
    'step 3 loss: 2.3 lr: 0.001'
    >>> _untensor("loss: Tensor(shape=[1], dtype=float32, place=Place(gpu:0), stop_gradient=True, [2.30])")
    'loss: 2.30'
    >>> _untensor("losses = tensor([0.52, 0.31, 0.11], device='cuda:0')")
    'losses = [0.52, 0.31, 0.11]'
    """
    m = _TENSOR.search(line)
    if m is not None and m.group("rest") and "grad_fn" in m.group("rest") and not line[:m.start()].strip() \
            and not line[m.end():].strip():
        return f"{GRAD_TENSOR} {m.group('v')}"
    return _TENSOR.sub(lambda m: next(g for g in m.group("a", "v", "m", "p", "t") if g), line)


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
        if not _glued_redraws(line):
            return [line]
        # a bar's redraws whose `\r` a copy lost (a Colab cell pasted: `.. 1/8 [00:00<00:04, 1.67it/s]
        # 1/40 2.38G ..`): a redraw ends at its bar's status, the next begins after it
        line = _BAR_STATUS.sub(lambda m: m.group(0) + "\r", line)
    if "\b" in line:
        line = line.replace("\b", "\r")
    return [strip_quote(p) for p in line.split("\r") if p and not p.isspace()]


#: A tqdm bar's status, `[elapsed<remaining, rate(, postfix)]`, with more text after it on the line.
_BAR_STATUS = re.compile(r"\[\d+:\d\d(?::\d\d)?<[^\[\]]*?(?:it/s|s/it)[^\[\]]*\](?=\s+\S)")


def _glued_redraws(line: str) -> bool:
    """Whether a line holds a bar's redraws glued without their `\r`: a bar's status with more text after it."""
    return ("it/s" in line or "s/it" in line) and _BAR_STATUS.search(line) is not None


def several(line: str) -> bool:
    """Whether a line may show as more than one (:func:`segments` cuts it): redraws, colour codes,
    redraws glued without their `\r`."""
    return "\r" in line or "\x1b" in line or "\b" in line or _glued_redraws(line)


# A markdown code fence (```` ``` ````, ```` ```text ````, `~~~`): markup around a pasted block, no line of it.
FENCE = re.compile(r"\s*(?:```|~~~)[\w-]*\s*$").match
# A person's sentence: four words in a row (`The log shows loss = 0.41 then nan`), which no
# program's record prints between its numbers.
_SENTENCE = re.compile(r"(?<![\w/.-])[A-Za-z][a-z']*(?: [A-Za-z][a-z']*){3}(?![\w/.-])").search
PROSE = "prose around the pasted blocks (a markdown post: its log lies between the fences)"


def pasted_blocks(lines: Iterator[tuple[int, str]], ignore) -> Iterator[tuple[int, str]]:
    """The lines of a markdown post (an issue's text, with its log fenced): a line outside the
    fences that reads as a sentence and quotes a number (``I see loss: 0.41 and then nan``) is
    the post's prose, no record: ``ignore(line_no, text, PROSE)``, and not given on."""
    inside = False
    for line_no, text in lines:
        if text is not None and FENCE(text):
            inside = not inside
        elif text is not None and not inside and _SENTENCE(text) and any(c.isdigit() for c in text):
            ignore(line_no, text, PROSE)
            continue
        yield line_no, text


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
