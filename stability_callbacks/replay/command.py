"""The ``replay`` command (docs/design.md, CLI): a log through the live Monitor, offline or as it grows.

``replay LOG`` reads the whole log (``-``: standard input), says what it read (the steps, the
printed name behind each key, how steps were numbered, the lines it ignored: also the first
``--json`` record), then prints a summary table (and ``--json`` / ``--report``);
``replay LOG --follow`` tails it through a :class:`~stability_callbacks.live.LiveRun` (run log,
alert sinks, halts: :mod:`.follow`). Both feed the records the same way (:class:`_Replay`).

Where the log prints no step, steps are record numbers: findings say so, and rollback advice
names no checkpoint step or batches to skip (docs/replay.md, What was read).

A log without a training loss but with a loss scale, overflow skips or a grad norm is judged on
them, and says so first (``no training loss read; judged on: ...``).

Exit codes: 0 no critical finding; 1 a critical finding; 2 unreadable input (not text, no known
format, nothing to judge: no training loss and none of those), a bad config or an output
(``--json``, ``--report``) that cannot be written, checked before reading (one message: the file
and line, the key, or the output);
3 (``--follow``) halted.
"""
from __future__ import annotations

import json
import re
import os
import sys
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from ..config import Config, ConfigError
from ..detectors.base import count
from ..record import Finding, severity_rank

if TYPE_CHECKING:
    from .readers import ReadAccount

# A follower says what a log without a training loss is judged on after this many records.
NO_LOSS_NOTE_AFTER = 10
# Said of every finding of a log whose steps are record numbers.
RECORD_NUMBERS = ("(step {step} is record number {step} of the log, which prints no step "
                  "numbers: find it by counting records, not by a step the trainer knows)")


@dataclass(frozen=True)
class FollowOptions:
    """``replay --follow``'s own options (docs/cli.md): where the run goes, the W&B run it writes
    into, when it stops, what a halt does."""

    run_dir: str | None = None
    wandb_project: str | None = None
    wandb_run_id: str | None = None
    pid: int | None = None
    poll_s: float = 1.0
    stop_file: str | None = None
    on_halt: str | None = None

    def __post_init__(self):
        if self.poll_s <= 0:
            raise ValueError("--poll-s and --idle-exit-s must be > 0")


@dataclass(frozen=True)
class ReplayOptions:
    """``replay``'s options, typed at the command line's edge (``cli.py``): the log, how to read
    it, what to write; ``follow``: None to read the log once, else the follower's options. The
    config (``--config``, ``--set``) travels apart, as the :class:`~stability_callbacks.config.Config`."""

    path: str
    format: str = "auto"
    json_out: str | None = None
    report: str | None = None
    warmup_steps: int | None = None
    keys: str | None = None
    pattern: str | None = None
    advice: str = "auto"
    #: ``--follow``: stop after this long without a new line; else how long a FIFO waits.
    idle_exit_s: float | None = None
    follow: FollowOptions | None = None

    def __post_init__(self):
        if self.idle_exit_s is not None and self.idle_exit_s <= 0:
            raise ValueError("--poll-s and --idle-exit-s must be > 0")


def run(args: ReplayOptions, config: Config) -> int:
    """``stability-callbacks replay``: the exit code. ``config``: read once, at the command
    line's edge (``--config``, ``--set``)."""
    from ..monitor import Monitor
    from .readers import FIFO_WAIT_S, LogFormatError, compile_pattern, parse_keys

    err = sys.stderr
    try:
        user_keys = parse_keys(args.keys) if args.keys else None
        pattern = compile_pattern(args.pattern) if args.pattern else None
        monitor = Monitor(config)
        if args.warmup_steps:
            monitor.set_warmup_steps(args.warmup_steps)
        check_outputs(args)
    except (ConfigError, ValueError) as e:
        print(f"error: {e}", file=err)
        return 2
    if args.follow is not None:
        return _follow(args, args.follow, monitor, user_keys, pattern)
    replay = _Replay(monitor, keep=bool(args.report))
    try:
        replay.judge(args.path, args.format, progress=err.isatty(), user_keys=user_keys, pattern=pattern,
                     fifo_wait_s=args.idle_exit_s or FIFO_WAIT_S)
    except (LogFormatError, OSError, ValueError) as e:
        print(f"error: {e}", file=err)
        return 2
    try:
        replay.finish(args)
    except OutputError as e:
        print(f"error: {e}", file=err)
        return 2
    if replay.nothing_to_judge(args.path):
        return 2
    return 1 if any(f.severity == "critical" for f in replay.findings) else 0


#: Fewer steps with a loss than this and a replay says that its verdict says little.
MIN_JUDGED = 3
#: Records a replay hands the Monitor at a time (Monitor.update_many).
FEED_BATCH = 256


class _Replay:
    """What a replay gathers (findings; records and LR phases for a report) and how it ends
    (skipped lines noted, ``--json``, the summary table, ``--report``): one way for both modes."""

    def __init__(self, monitor, *, keep: bool):
        self.monitor = monitor
        self.findings: list[Finding] = []
        self.records: list | None = [] if keep else None
        self.phases: list = []
        self.count = 0
        self.account: ReadAccount | None = None

    def ignore(self, line_no: int, text: str, reason: str) -> None:
        """An unreadable line: counted in the account, said once at the end."""

    def nothing_to_judge(self, path) -> bool:
        """No training loss was read and nothing else to judge: said (exit 2, for both modes)."""
        account = self.account
        if account is None or account.with_loss or account.signals:
            return False
        print(f"error: {path}: no training loss was read and nothing else to judge "
              f"({account.records} steps, keys: {', '.join(account.keys) or 'none'}); "
              "name the loss the log prints with --keys loss=NAME", file=sys.stderr)
        return True

    def judge(self, path, fmt: str = "auto", **read) -> None:
        """The whole log at ``path`` through the Monitor as ``replay`` judges it: read with its
        account (which tells the Monitor where steps are epochs or records' ranks), then the end
        of the log (:meth:`Monitor.end`). ``read``: :func:`read_records`' other arguments."""
        from .readers import ReadAccount, read_records

        account = self.account = ReadAccount(path, self.ignore)
        records = read_records(path, fmt, account=account, **read)
        if account.objective is not None:   # known from the log's first lines, before its records
            self.monitor.declare_objective()
        self.feed(told_of_names(records, account, self.monitor), self.monitor.update)
        self.findings += self.monitor.end()

    def feed(self, stream, observe, after=None) -> None:
        """Every record into ``observe`` (``Monitor.update`` or ``LiveRun.observe``);
        ``after(record, found)`` returning True stops early (a halt). Into the Monitor's own
        ``update`` with nothing asked of each record on its own (no ``after``, no records kept for
        a report), they go in batches to ``Monitor.update_many`` instead: the same findings."""
        if observe == self.monitor.update and after is None and self.records is None:
            self._feed_batches(stream, self.monitor.update_many)
            return
        monitor = self.monitor
        for rec in stream:
            self.count += 1
            numbering = self._numbering(rec)
            if numbering is not None:
                monitor.steps_are_epochs, monitor.steps_by_order = numbering
            found = observe(rec)
            self.findings += found
            if self.records is not None:
                self.records.append(rec)
                self.phases.append((rec.step, monitor.phase_at_last_step))
            if after is not None and after(rec, found):
                break

    def _feed_batches(self, stream, many) -> None:
        """:meth:`feed` in batches of ``FEED_BATCH`` records; a batch ends early where the
        numbering changes (the Monitor holds one for all the records it is given at once)."""
        monitor = self.monitor
        batch: list = []

        def judge() -> None:
            nonlocal batch
            pending, batch = batch, []
            self.count += len(pending)
            self.findings += many(pending)
        # the account's numberings, changed in place as it learns them (read at each record, as
        # _numbering does; asked only where one says epochs or ranks, which most logs never do)
        numberings = self.account.numbering if self.account is not None else {}
        try:
            for rec in stream:
                numbering = (self._numbering(rec) if "epoch" in numberings or "order" in numberings
                             else None)
                if numbering is not None and numbering != (monitor.steps_are_epochs, monitor.steps_by_order):
                    judge()
                    monitor.steps_are_epochs, monitor.steps_by_order = numbering
                elif len(batch) == FEED_BATCH:
                    judge()
                batch.append(rec)
        finally:   # what was read before a refusal is judged, as it is one record at a time
            judge()

    def _numbering(self, rec) -> tuple[bool, bool] | None:
        """Whether ``rec``'s step is an epoch, and whether it is a record's rank, as the account
        knows it when the record is read; None while it numbers no step so (most logs)."""
        account = self.account
        if account is None or not ("epoch" in account.numbering or "order" in account.numbering):
            return None
        how = account.numbered_by(rec.step)   # a step there is an epoch, or a record's rank
        return how == "epoch", how == "order"

    def finish(self, args: ReplayOptions) -> None:
        """``replay``'s end: what was read and the JSON (:meth:`read_out`), the summary table
        with every warning-or-worse finding, the report."""
        summary_to = self.read_out(args)
        account = self.account
        if account is not None and not account.with_loss and not account.signals:
            return   # nothing to judge: no summary of 0 findings (nothing_to_judge says why)
        if account is not None and account.with_loss < MIN_JUDGED:
            print(f"note: only {count(account.with_loss)} with a loss: too few to "
                  "judge a spike or a trend against (a NaN or Inf is still found): the findings below say little",
                  file=summary_to)
        forms = _advice_forms(args, account)
        name = Path(args.path).name
        print_summary(self.findings, self.count, name, file=summary_to, advice_forms=forms)
        if args.report:
            from .report import write_report
            with _writing("--report", args.report):
                path = write_report(args.report, self.records or [], self.findings, title=name,
                                    phases=self.phases, advice_forms=forms)
            print(f"report: {path}", file=summary_to)

    def read_out(self, args: ReplayOptions):
        """What was read (what the findings are judged on, the account's lines, the unreadable
        lines) and ``--json``, for both modes; returns where the summary goes."""
        account = self.account
        summary_to = sys.stderr if args.json_out == "-" else sys.stdout
        if account is not None:
            account.records = self.count
            if not account.with_loss and account.signals:
                print(f"no training loss read; judged on: {', '.join(account.signals)}", file=summary_to)
            self.findings = [said_of(f, account) for f in self.findings]
            for line in account.lines():
                print(line, file=summary_to)
            if account.first_unreadable is not None:
                line_no, reason = account.first_unreadable
                print(f"note: ignored {account.unreadable} unreadable line(s) of {args.path} "
                      f"(first: line {line_no}: {reason})", file=sys.stderr)
        if args.json_out:
            with _writing("--json", args.json_out):
                out = sys.stdout if args.json_out == "-" else open(args.json_out, "w", encoding="utf-8")
                if account is not None:
                    out.write(json.dumps(account.to_json()) + "\n")
                for f in self.findings:
                    out.write(json.dumps(f.to_json()) + "\n")
                if out is not sys.stdout:
                    out.close()
        return summary_to


class OutputError(Exception):
    """An output (``--json``, ``--report``) that cannot be written: exit 2, one line."""


def check_outputs(args: ReplayOptions) -> None:
    """``--json`` and ``--report`` can be written, checked before the log is read: ``ValueError``,
    one line, otherwise (a folder in the way, a file where a folder must be, no permission).
    Also the report's suffix."""
    if args.report:
        from .report import check_report_path
        check_report_path(args.report)
    for flag, path in (("--json", args.json_out), ("--report", args.report)):
        if path and path != "-":
            problem = _unwritable(Path(path))
            if problem:
                raise ValueError(f"{flag} {path}: cannot write it: {problem}")


def _unwritable(path: Path) -> str | None:
    """Why ``path`` cannot be written (its missing folders are made when it is), or None."""
    import os
    if path.is_dir():
        return "it is a folder"
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        return f"{folder} is not a folder"
    if not os.access(folder, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        return "permission denied"
    return None


@contextmanager
def _writing(flag: str, path: str):
    """Writing an output: its folders made first; an OSError (checked before reading, but a disk
    fills, a folder goes) becomes :class:`OutputError`, one line."""
    try:
        if path != "-":
            Path(path).parent.mkdir(parents=True, exist_ok=True)
        yield
    except OSError as e:
        raise OutputError(f"{flag} {path}: cannot write it: {e.strerror or e}") from None


def _follow(args: ReplayOptions, follow: FollowOptions, monitor, user_keys, pattern) -> int:
    from ..live import LiveRun
    from .follow import StopConditions, TailLines, carry_out_halt, follow_run_dir, follow_wandb_run
    from .readers import LogFormatError, ReadAccount, read_records

    err = sys.stderr
    forms = _advice_forms(args, None)
    # The follower prints every finding itself (once); the log sink would print them again.
    off = {"log": "the follower prints the findings"}
    try:
        wandb_run, why = follow_wandb_run(follow, wanted="wandb" in monitor.config.actions)
        if why:
            off["wandb"] = why
            print(f"note: actions.wandb is off: {why}", file=err)
        replay = _Replay(monitor, keep=False)   # the report reads the run log back
        replay.account = account = ReadAccount(args.path, replay.ignore)
        # A finding whose step the log does not print says how it was numbered, before the run
        # log and the alerts hear of it (the reader knows once it has a plan).
        run = LiveRun(monitor=monitor, run_dir=follow_run_dir(args.path, follow.run_dir), is_rank0=True,
                      run_name=Path(args.path).name, wandb_run=wandb_run, advice_forms=forms,
                      sinks_off=off, amend=lambda f: said_of(f, account))
    except (ConfigError, ValueError) as e:
        print(f"error: {e}", file=err)
        return 2
    stop = StopConditions(pid=follow.pid, idle_exit_s=args.idle_exit_s)
    tail = TailLines(args.path, poll_s=follow.poll_s, should_stop=stop, on_ignore=_said_once(args.path, account))

    def lines():
        for item in tail:
            if item[1] is not None:
                stop.activity()
            yield item

    halt: list[Finding] = []

    def observe(rec):
        if replay.count == 1:                  # the first record opens the run log's segment
            run.start(rec.step - 1, "start")
        return run.observe(rec)

    first_keys: set[str] = set()       # what the first records carry

    def after(rec, found):
        if replay.count <= NO_LOSS_NOTE_AFTER:
            first_keys.update(rec.metrics)
            if replay.count == NO_LOSS_NOTE_AFTER:
                _no_loss_yet(first_keys)
        for f in found:
            if f.severity != "info":
                print_finding(f, forms)
        if run.control.stop:
            critical = [f for f in run.findings if f.severity == "critical"]
            halt.append(next((f for f in critical if f.kind != "rollback_advice"), critical[-1]))
            stop.halted = True
            return True
        return False

    print(f"following {args.path} (run folder: {run.run_dir}); Ctrl-C to stop", flush=True)
    _say_what_is_awaited(args.path)
    stream = None
    refused: Exception | None = None
    with stop.on_signals():
        try:
            stream = read_records(args.path, args.format, user_keys=user_keys, pattern=pattern,
                                  lines=lines(), account=replay.account)
            if replay.account is not None and replay.account.objective is not None:
                run.monitor.declare_objective()
            replay.feed(told_of_names(stream, replay.account, run.monitor), observe, after=after)
        except (LogFormatError, OSError, ValueError) as e:
            refused = e
        except KeyboardInterrupt:          # a second Ctrl-C or SIGTERM: at once
            stop.reason = stop.signalled or "Ctrl-C"
        finally:
            close = getattr(stream, "close", None)
            if close is not None:
                close()               # the tail's file
    done = carry_out_halt(halt[0], stop_file=follow.stop_file, on_halt=follow.on_halt) if halt else []
    run.close()
    if wandb_run is not None:
        wandb_run.finish()
    if refused is not None:
        print(f"error: {refused}", file=err)
        return 2
    return _end_follow(args, replay, run, stop, halt[0] if halt else None, done)


def _end_follow(args: ReplayOptions, replay: "_Replay", run, stop, halt: Finding | None, done: list[str]) -> int:
    """The end of following, as a live run ends (docs/integrations.md, The end of a run): what
    was read and ``--json`` as ``replay`` says them, then the run's report (next to the run log,
    or ``--report``) and its summary block, from its :class:`~stability_callbacks.outcome.Outcome`;
    the exit code is the outcome's. Input with nothing to judge is refused instead (exit 2, its
    reason only: no summary, no report)."""
    from .report import report_run_end

    if replay.nothing_to_judge(args.path):
        return 2
    try:
        summary_to = replay.read_out(args)
    except OutputError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    outcome = run.outcome(halted_at=halt.step if halt is not None else None)
    outcome.stopped = stop.reason or "end of input"
    if halt is not None:
        outcome.halt_done = done or ["no --stop-file or --on-halt given: stop the job yourself"]
    report_run_end(run, outcome, out_path=args.report)
    print("\n".join(outcome.summary_lines()), file=summary_to, flush=True)
    return outcome.exit_code


def _say_what_is_awaited(path: str) -> None:
    """A note when the follower starts before its input: a log not there yet, a FIFO (read from
    when a process opens it for writing); either waits until --idle-exit-s or --pid ends it."""
    import stat
    if path == "-":
        return
    try:
        fifo = stat.S_ISFIFO(os.stat(path).st_mode)
    except FileNotFoundError:
        what = "does not exist yet: waiting for it to appear"
    else:
        if not fifo:
            return
        what = "is a FIFO: read as a stream once a process opens it for writing"
    print(f"note: {path} {what} (--idle-exit-s or --pid ends the wait)", file=sys.stderr, flush=True)


def _said_once(path, account):
    """``on_ignore`` for a followed log's lines of binary data: each counted in ``account``
    (an unreadable line), the first also said as it happens."""
    first: list[int] = []

    def left_out(line_no: int, text: str, reason: str) -> None:
        if not first:
            first.append(line_no)
            print(f"warning: {path}:{line_no}: binary data, not text: left out, not judged (so are "
                  "later lines like it; following goes on)", file=sys.stderr, flush=True)
        account(line_no, text, reason)
    return left_out


def _no_loss_yet(first_keys: set[str]) -> None:
    """Said once while following a log whose first records carry no training loss: what it is
    judged on so far, or that nothing is (the end of following says it again, as ``replay``)."""
    from .. import keys
    from .readers import JUDGED_WITHOUT_LOSS
    if keys.LOSS in first_keys:
        return
    signals = [k for k in JUDGED_WITHOUT_LOSS if k in first_keys]
    said = (f"judged on: {', '.join(signals)}" if signals else "nothing else to judge: name the loss "
            "the log prints with --keys loss=NAME")
    print(f"note: no training loss read in the first {NO_LOSS_NOTE_AFTER} steps (keys: "
          f"{', '.join(sorted(first_keys)) or 'none'}); {said}", file=sys.stderr, flush=True)


def told_of_names(records, account, monitor):
    """``records``, the Monitor told at the first what the loss's printed name says of it (a
    cross-entropy is never below zero; a GAN's discriminator and generator terms summed are no
    objective anyone minimises), once the reader has named it."""
    from .readers.vocabulary import adversarial, binary_name, cross_entropy_name

    records = iter(records)
    for rec in records:   # until the reader has named the loss (its first record, mostly)
        if account is not None and "loss" in account.keys:
            name = cross_entropy_name(account.keys["loss"])
            if name is not None:
                monitor.declare_cross_entropy(name)
                if binary_name(name):   # a binary cross-entropy: its chance level is ln 2, where it starts
                    monitor.set_num_outputs(1)
            game = adversarial(account.keys["loss"]) if account.objective is None else None
            if game is not None:
                monitor.declare_game()
                account.note(f"the loss is a discriminator's and a generator's terms summed ({game}): two players "
                             f"pulling against each other, so it is judged as an objective of any sign (NaN, jumps "
                             f"of orders of magnitude, the grad norm), not against a level it should keep or fall to")
            yield rec
            break
        yield rec
    yield from records   # the rest as they come


def judge_log(path, config: "Config | str | dict | None" = None, fmt: str = "auto") -> list[Finding]:
    """A log's findings as ``replay`` judges them, printing nothing (tests, notebooks): read with
    its account, fed to a :class:`~stability_callbacks.Monitor`, the end of the log asked, each
    finding said of the log's own numbering (:func:`said_of`). Raises what ``read_records`` raises."""
    from ..monitor import Monitor

    replay = _Replay(Monitor(config), keep=False)
    replay.judge(path, fmt)
    account = replay.account
    assert account is not None
    account.records = replay.count
    return [said_of(f, account) for f in replay.findings]


def said_of(f: Finding, account: "ReadAccount") -> Finding:
    """A finding that says how its step was numbered where the log does not print it (the part
    of the log the step falls in: :meth:`ReadAccount.step_caveat`), and as it is where the log
    printed it. Rollback advice whose step or onset the log does not print names no checkpoint
    step or batches to skip."""
    caveat = account.step_caveat(f.step)
    if caveat is None and f.kind == "rollback_advice" and isinstance(f.onset_step, int) \
            and account.step_caveat(f.onset_step) is not None:
        caveat = account.step_caveat(f.onset_step)
    if caveat is not None:
        return record_numbered(f, caveat)
    if f.kind == "rollback_advice" and account.counts_epochs(f.step) \
            and account.counts_epochs(f.onset_step if isinstance(f.onset_step, int) else f.step):
        return epoch_numbered(f)
    if f.kind != "rollback_advice" and account.counts_epochs(f.step) and _STEP_NUMBER.search(f.message):
        # (the advice beside it says "epoch 40": so does the finding, of the steps it names)
        from dataclasses import replace
        said = _STEPS_LATER.sub(r"\1 epoch\2 \3", _STEP_NUMBER.sub(r"epoch\1 ", f.message))
        return replace(f, message=said.replace("within ~100 steps;", "within ~100 optimizer steps, inside one epoch;"))
    return f


_STEP_NUMBER = re.compile(r"\bstep(s?) (?=-?\d)")
_STEPS_LATER = re.compile(r"\b(\d[\d,]*) step(s?) (later|after)\b")   # (`3 steps later`, `1 step after its onset`)


def epoch_numbered(f: Finding) -> Finding:
    """Rollback advice on a log whose steps are epochs: its checkpoint, onset and batches to skip
    are epochs (``skip the batches of epochs 40-40 (1 epoch)``, not of one step)."""
    from dataclasses import replace
    return replace(f, message=re.sub(r"\bstep(s?)\b", r"epoch\1", f.message),
                   details=dict(f.details, step_unit="epoch"))


def record_numbered(f: Finding, caveat: str | None = None) -> Finding:
    """A finding whose step the log does not print, saying so (``caveat``: how it was numbered;
    by default, a record number of a log that prints no step numbers); rollback advice keeps its
    onset and drops the checkpoint step and the batches to skip (steps the log does not print
    are neither). A finding that says so already is returned as it is."""
    from dataclasses import replace
    if f.details.get("step_is_record_number"):
        return f
    caveat = caveat or RECORD_NUMBERS.format(step=f.step)
    details = dict(f.details, step_is_record_number=True)
    message = f"{f.message} {caveat}"
    if f.kind == "rollback_advice":
        for k in ("skip_steps", "consumed_samples", "checkpoint_step", "checkpoint_path", "from_start"):
            details.pop(k, None)
        message = (f"the run went wrong at step {f.step}, a step the log does not print, so no checkpoint "
                   "step or batches to skip can be named from it: go back to the last checkpoint saved "
                   f"before that point and find its step in the trainer's own log. {caveat}")
    return replace(f, message=message, details=details)


def _advice_forms(args: ReplayOptions, account: "ReadAccount | None") -> tuple[str, ...] | None:
    """The rollback forms to print (``--advice``): ``all`` (None), one framework, or (``auto``)
    the one the log speaks: the ``--format`` named, else the format the reader detected."""
    from ..advice import advice_forms_for

    if args.advice == "all":
        return None
    if args.advice != "auto":
        return (args.advice,)
    return advice_forms_for(args.format if args.format != "auto" else account.format if account else None)


def print_finding(f: Finding, advice_forms: tuple[str, ...] | None, *, console=None) -> None:
    """One finding as a line (``[severity] step N kind: message``), and under rollback advice
    its native forms (``advice_forms``: those frameworks; None: all four; ``()``: a hint). A log
    without step numbers gets no forms: record numbers are neither checkpoints nor batches; nor
    does one whose steps are epochs, or go below zero."""
    out = console.print if console is not None else (lambda text, **_: print(text, flush=True))
    out(f"[{f.severity}] step {f.step} {f.kind}: {f.message}", markup=False)
    if f.kind == "rollback_advice" and f.details.get("step_unit") == "epoch":
        out("    (the log's steps are epochs: a framework's command names optimizer steps, which the "
            "log does not print)", markup=False)
    elif f.kind == "rollback_advice" and min(f.details.get("skip_steps") or [0]) < 0:
        out("    (the log's steps go below zero: a framework's command names optimizer steps, which "
            "count from zero)", markup=False)
    elif f.kind == "rollback_advice" and not f.details.get("step_is_record_number"):
        from ..advice import native_forms
        forms = native_forms(f.details, advice_forms)
        for fw, text in forms.items():
            out(f"    {fw}: {text}", markup=False)
        if not forms:
            out("    (--advice all, or --advice hf|lightning|megatron|deepspeed: this advice as "
                "that framework's command)", markup=False)


def print_summary(findings: list[Finding], num_records: int, name: str, *, file=None,
                  advice_forms: tuple[str, ...] | None = None) -> None:
    """A table of finding kinds, then every warning-or-worse finding with its
    sentence, rollback advice in the forms ``advice_forms`` names (None: all four)."""
    from rich.console import Console
    from rich.table import Table

    console = Console(file=file or sys.stdout, width=120, highlight=False, soft_wrap=False)
    # The heading on a line of its own: as the table's title, rich wraps it to the table's width.
    console.print(f"{name}: {count(num_records)}, {count(len(findings), 'finding')}")
    table = Table()
    for col in ("kind", "severity", "count", "first step", "last step"):
        table.add_column(col)
    groups: dict[tuple[str, str], list[Finding]] = {}
    for f in findings:
        groups.setdefault((f.kind, f.severity), []).append(f)
    for (kind, sev), fs in sorted(groups.items(), key=lambda kv: (-severity_rank(kv[0][1]), kv[1][0].step)):
        table.add_row(kind, sev, str(len(fs)), str(fs[0].step), str(fs[-1].step))
    if findings:
        console.print(table)
    serious = [f for f in findings if severity_rank(f.severity) >= 1]
    for f in serious[:50]:
        print_finding(f, advice_forms, console=console)
    if len(serious) > 50:
        console.print(f"... and {len(serious) - 50} more warning-or-worse findings (see --json)")
    counts = Counter(f.severity for f in findings)
    console.print(f"critical: {counts['critical']}  warning: {counts['warning']}  info: {counts['info']}")
