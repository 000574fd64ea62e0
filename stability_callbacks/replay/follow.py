"""``replay --follow``: watch a growing training log from the side, with the live Monitor.

A sidecar for jobs whose code we do not touch (Megatron, torchtitan, a non-Python trainer): the
log is tailed as it is written, its records go through :class:`~stability_callbacks.live.LiveRun`
(the same Monitor, run log and alert sinks as the integrations), and a halt-level finding
(``policy.halt_on: critical``) writes a stop file and/or runs a command the user named — the
job's own way to stop — before we exit.

:class:`TailLines` yields ``(line_no, text)`` like
:func:`~stability_callbacks.replay.readers.source.numbered_lines`, and ``(line_no, None)`` when a
poll finds nothing new (readers then release a record they held back for a late warning):

- a partial last line (no newline yet) is held back until it is complete — except its
  ``\\r``-terminated pieces (tqdm redraws), which are complete updates and go out at once;
- truncation (the file got shorter: ``copytruncate`` rotation, a job restarted with ``>``) and
  rotation (the path now names a new file: renamed and recreated) are followed: the rest of the
  old file is read first, then the new one from its start, its lines numbered from 1 again;
- a file that does not exist yet is waited for (if it never appears: :class:`LogFormatError`,
  ``no such file``);
- standard input (``-``) is refused: it cannot be polled for what is new nor reopened;
- a FIFO is read as a stream, never seeked: before a process opens it for writing, each poll is
  an idle tick (so ``--idle-exit-s`` holds; if none ever does: :class:`LogFormatError`); when its
  writer closes it, the input has ended;
- the bytes become lines as ``replay`` makes them (:class:`~.readers.source.TextLines`): gzip is
  unpacked as it grows; input whose first bytes are not text is refused with the reason
  (:class:`LogFormatError`) before a line goes out; a later line of binary data (garbage
  appended, a new file that is not text) is left out and reported to ``on_ignore``, never read
  as a record, and following goes on with the text that comes after it.

It ends when ``should_stop()`` says so (the job's process ended, the log stayed idle too long,
a halt, SIGTERM or Ctrl-C), after reading what is left. Cost: one ``stat`` per poll, O(chunk) memory.
"""
from __future__ import annotations

import json
import logging
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Generator, Iterator

from ..runlog import RUN_DIR_NAME
from .readers.source import CHUNK_BYTES, NO_WRITER, LogFormatError, TextLines, open_input

log = logging.getLogger("stability_callbacks")


class TailLines:
    """The lines of a file as it grows (see the module docstring). ``on_ignore(line_no, text,
    reason)`` hears of each line of binary data left out.

    >>> import tempfile, os
    >>> p = os.path.join(tempfile.mkdtemp(), "train.log")
    >>> _ = open(p, "w").write("step 1 loss 2.5\\nstep 2 lo")
    >>> tail = TailLines(p, poll_s=0.01, should_stop=lambda: True)
    >>> list(tail)
    [(1, 'step 1 loss 2.5'), (2, 'step 2 lo')]
    """

    def __init__(self, path, *, poll_s: float = 1.0, should_stop: Callable[[], bool] = lambda: False,
                 on_ignore=None):
        self.path = str(path)
        self.poll_s = poll_s
        self.should_stop = should_stop
        self.on_ignore = on_ignore
        self.rotations = 0
        self.truncations = 0

    def __iter__(self) -> Iterator[tuple[int, str | None]]:
        if self.path == "-":
            raise LogFormatError(self.path, None, "--follow reads a growing file or a FIFO, not standard "
                                 "input: give the log's path (a pipe: mkfifo one), or replay - without --follow")
        given = False             # a line went out: later files are checked line by line
        since = time.monotonic()
        while True:
            opened = open_input(self.path)
            if opened is None:                          # not there yet
                if self.should_stop():
                    raise LogFormatError(self.path, None, f"no such file (waited "
                                         f"{time.monotonic() - since:.1f} s for it to appear)")
                time.sleep(self.poll_s)
                continue
            f, fifo = opened
            cut = TextLines(self.path, on_ignore=self.on_ignore, check_head=not given, redraws=True)
            with f:
                ended = yield from (self._fifo(f, cut, since) if fifo else self._file(f, cut))
            given = given or cut.line_no > 0
            if ended:
                return

    def _file(self, f, cut: TextLines) -> Generator[tuple[int, str | None], None, bool]:
        """One file's lines until it is replaced (False) or following stops (True)."""
        while True:
            chunk = f.read(CHUNK_BYTES)
            if chunk:
                yield from cut.feed(chunk)
                continue
            # Nothing new: rotated, truncated, finished, or just quiet.
            switched = self._switched(f)
            if switched:
                yield from cut.end(complete=False)
                if switched == "rotated":
                    self.rotations += 1
                else:
                    self.truncations += 1
                log.info("%s was %s; following the new file", self.path, switched)
                return False
            if self.should_stop():
                yield from cut.end(complete=False)
                return True
            yield cut.line_no, None
            time.sleep(self.poll_s)

    def _fifo(self, f, cut: TextLines, since: float) -> Generator[tuple[int, str | None], None, bool]:
        """A FIFO's lines, read without blocking or seeking: ``b""`` is no writer yet, or the
        writer gone (the end of the input); None is a writer with nothing new."""
        writer = False
        while True:
            chunk = f.read(CHUNK_BYTES)
            if chunk:
                writer = True
                yield from cut.feed(chunk)
                continue
            if chunk == b"" and writer:
                yield from cut.end(complete=False)
                return True
            writer = writer or chunk is None
            if self.should_stop():
                if not writer:
                    raise LogFormatError(self.path, None, f"{NO_WRITER} (waited "
                                         f"{time.monotonic() - since:.1f} s for one)")
                yield from cut.end(complete=False)
                return True
            yield cut.line_no, None
            time.sleep(self.poll_s)

    def _switched(self, f) -> str | None:
        try:
            now = os.stat(self.path)
        except FileNotFoundError:
            return None                   # renamed away, not recreated yet: keep the old one
        mine = os.fstat(f.fileno())
        if (now.st_ino, now.st_dev) != (mine.st_ino, mine.st_dev):
            return "rotated"
        if now.st_size < f.tell():
            return "truncated"
        return None


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie — ended, not yet reaped — does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[0] != b"Z"
    except (OSError, IndexError):
        return True


#: The signals that end following the way its other ends do, and how the end names them.
ENDING_SIGNALS = {signal.SIGTERM: "SIGTERM", signal.SIGINT: "Ctrl-C"}


class StopConditions:
    """When following ends: the job's process is gone, the log stayed idle too long, a halt, or
    a signal (:meth:`on_signals`)."""

    def __init__(self, *, pid: int | None = None, idle_exit_s: float | None = None):
        self.pid = pid
        self.idle_exit_s = idle_exit_s
        self.halted = False
        self.signalled: str | None = None
        self.reason: str | None = None
        self._last_activity = time.monotonic()

    def activity(self) -> None:
        self._last_activity = time.monotonic()

    @contextmanager
    def on_signals(self) -> Iterator[None]:
        """Inside: SIGTERM (a scheduler ending the job, and its sidecar with it) and Ctrl-C end
        following as its other ends do: what the log holds is read, then the summary and the
        report. A second one stops at once (``KeyboardInterrupt``). A signal the process was
        told to ignore stays ignored; outside the main thread nothing changes."""
        def ending(signum, frame):
            if self.signalled is not None:
                raise KeyboardInterrupt
            self.signalled = ENDING_SIGNALS[signal.Signals(signum)]

        before = {}
        if threading.current_thread() is threading.main_thread():
            for sig in ENDING_SIGNALS:
                if signal.getsignal(sig) is not signal.SIG_IGN:
                    before[sig] = signal.signal(sig, ending)
        try:
            yield
        finally:
            for sig, handler in before.items():
                signal.signal(sig, handler)

    def __call__(self) -> bool:
        if self.halted:
            self.reason = "halt"
        elif self.signalled is not None:
            self.reason = self.signalled
        elif self.pid is not None and not process_alive(self.pid):
            self.reason = f"process {self.pid} ended"
        elif self.idle_exit_s is not None and time.monotonic() - self._last_activity >= self.idle_exit_s:
            self.reason = f"no new line for {self.idle_exit_s:g} s"
        return self.reason is not None


def follow_run_dir(path: str, run_dir: str | None) -> Path:
    """Where a follower of the log at ``path`` keeps its run (``--run-dir``): by default
    ``stability/`` next to the log it follows, where the job keeps its own files."""
    if run_dir:
        return Path(run_dir)
    return Path(os.path.abspath(path)).parent / RUN_DIR_NAME


def follow_wandb_run(args, *, wanted: bool):
    """``(run, why_off)``: the job's W&B run to write into (``args``: the follower's options,
    :class:`~.command.FollowOptions`), when ``actions.wandb`` is configured
    (``wanted``) and a run id is given (``--wandb-run-id``, else ``WANDB_RUN_ID``; the project
    from ``--wandb-project``, else wandb's own ``WANDB_PROJECT``). The follower joins it
    (``resume="allow"``: the job's run if it exists, a run of that id otherwise). Without an id
    the sink is off, and ``why_off`` says so."""
    if not wanted:
        return None, None
    run_id = args.wandb_run_id or os.environ.get("WANDB_RUN_ID")
    if not run_id:
        return None, ("no W&B run to write to: pass --wandb-run-id ID (and --wandb-project), or "
                      "set WANDB_RUN_ID to the job's run")
    try:
        import wandb
    except ImportError:
        raise ValueError("actions.wandb needs the wandb package: pip install "
                         "'stability-callbacks[wandb]'") from None
    try:
        return wandb.init(project=args.wandb_project, id=run_id, resume="allow"), None
    except Exception as e:   # the follower goes on with its other sinks
        return None, f"joining W&B run {run_id} failed: {type(e).__name__}: {e}"


def carry_out_halt(finding, *, stop_file: str | None, on_halt: str | None) -> list[str]:
    """Write the stop file and run the user's command for a halt; returns what was done.

    The stop file holds the finding that halted (JSON), so a job that polls for it can log why.
    The command runs through the shell with ``STABILITY_STEP``, ``STABILITY_KIND`` and
    ``STABILITY_MESSAGE`` in its environment (e.g. ``scancel $SLURM_JOB_ID``); a failing
    command is reported, never raised.
    """
    done = []
    if stop_file:
        path = Path(stop_file)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(finding.to_json()) + "\n", encoding="utf-8")
        os.replace(tmp, path)             # the job never sees a half-written file
        done.append(f"stop file written: {path}")
    if on_halt:
        env = dict(os.environ, STABILITY_STEP=str(finding.step), STABILITY_KIND=finding.kind,
                   STABILITY_MESSAGE=finding.message)
        try:
            r = subprocess.run(on_halt, shell=True, env=env, timeout=300)
            done.append(f"ran {shlex.quote(on_halt)} (exit {r.returncode})")
        except (OSError, subprocess.SubprocessError) as e:
            done.append(f"could not run {shlex.quote(on_halt)}: {e}")
            print(f"warning: --on-halt command failed: {e}", file=sys.stderr)
    return done
