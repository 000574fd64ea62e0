"""What a reader read: the steps, which printed name became each of our keys, how the steps were
numbered, and the lines it ignored, by reason (docs/replay.md, What was read).

Every reader reports into one :class:`ReadAccount`; ``replay`` prints it before its findings
and writes it as the first ``--json`` record, so a replay always says what it assumed.

>>> a = ReadAccount("run.log")
>>> a.saw("loss", "lm loss"); a.numbered("counter", "iteration"); a.ignore(7, "x", "evaluation")
>>> a.to_json()["keys"], a.to_json()["steps_numbered_by"], a.to_json()["ignored_lines"]
({'loss': ['lm loss']}, {'the log': ['iteration']}, {'evaluation': {'lines': 1, 'first_line': 7}})

Cost: O(1) per line (a counter per reason); state: the distinct printed names and reasons.
"""
from __future__ import annotations

import logging
from typing import Callable

from ...detectors.base import count

logger = logging.getLogger(__name__)

IgnoreCallback = Callable[[int, str, str], None]

#: How steps may be numbered: the log's own counter, the order of the records, the epoch, the
#: step after the last one printed (an overflow line that prints none).
NUMBERINGS = {"counter": "the log", "order": "order of appearance", "epoch": "the epoch",
              "after": "the step after the last printed", "samples": "samples seen / unit"}
_LABELS = {"counter": "the log's counter", "order": "order of appearance (the records print no counter "
           "taken for the step: step N is the N-th record)", "epoch": "the epoch (no count finer than the epoch moves from record to "
           "record: step N is epoch N)",
           "after": "the step after the last one printed ({after} lines that print no step)",
           "samples": "the log's counter of samples seen, divided by {unit:,}"}
_NO_STEPS = "which prints no step numbers"
#: Parts of a log numbered differently that the account lists one by one.
MAX_SEGMENTS = 8
#: Reasons a line is ignored that the caller hears of line by line (a partly unreadable file).
UNREADABLE = "unreadable"


class ReadAccount:
    """The account of one read (see the module docstring). ``on_ignore(line_no, text, reason)``
    hears of every unreadable line; without it, they are logged once at the end."""

    def __init__(self, path, on_ignore: IgnoreCallback | None = None):
        self.path = str(path)
        self.on_ignore = on_ignore
        self.format = ""
        self.records = 0
        self.with_loss = 0
        self.keys: dict[str, list[str]] = {}
        self.numbering: dict[str, list[str]] = {}
        self.segments: list[list] = []               # [how, [names], first record, last record, first step]
        self.segment_how = ""
        self.ignored: dict[str, list[int]] = {}      # reason -> [count, first line]
        self.changed: dict[str, list[int]] = {}      # records merged, split, dropped or marked: why -> [count, first line]
        self.notes: list[str] = []
        self.signals: list[str] = []                 # what a log without a loss is judged on
        self.sample_unit = 0                         # samples per step, where a counter counts samples
        self.sample_epoch = 0                        # ... and steps per epoch
        # Why records are numbered in order (a finding says so: step_caveat).
        self.order_reason = _NO_STEPS
        self.after_what = "overflow"   # the lines numbered "after" (an overflow's, a NaN warning's)
        self.first_unreadable: tuple[int, str] | None = None
        #: A reinforcement learner's name the log prints (``value_loss``, ``ep_rew_mean``): its
        #: loss is an objective built from returns.
        self.objective: str | None = None

    def saw(self, key: str, printed: str) -> None:
        names = self.keys.setdefault(key, [])
        if printed not in names and len(names) < 8:
            names.append(printed)

    def value_term(self, printed: str | None) -> None:
        """The log prints a reinforcement learner's name (``printed``, from its first lines; None:
        it prints none): its loss is an objective built from returns, judged as one of any sign."""
        self.objective = printed
        if printed is not None:
            self.note(f"the log prints a reinforcement learner's name ({printed!r}): its loss is built from "
                      f"returns, whose scale moves as the policy improves, so it is judged as an objective of "
                      f"any sign (NaN, jumps of orders of magnitude, the grad norm), not against a level it "
                      f"should keep")

    def numbered(self, how: str, name: str = "") -> None:
        names = self.numbering.setdefault(how, [])
        if name and name not in names and len(names) < 8:
            names.append(name)

    def record_numbered(self, how: str, name: str, index: int, step: int) -> None:
        """Record ``index`` (from 1), at ``step``, is numbered ``how`` and the one before it
        otherwise (a reader that knows calls it on every change: the account keeps the parts of
        the log, each with its first record and step: :meth:`step_caveat`)."""
        self.segment_how = how
        if self.segments:
            self.segments[-1][3] = index - 1
        self.segments.append([how, [name] if name else [], index, index, step])

    def renumbered(self, index: int, how: str, step: int) -> None:
        """Record ``index``, the last one so far, is numbered ``how``, at ``step``, after all."""
        self.numbered(how)
        if self.segments and self.segments[-1][2] == index:
            self.segments[-1][0], self.segments[-1][4] = how, step
            if len(self.segments) > 1 and self.segments[-2][0] == how:
                self.segments.pop()            # the part before is numbered so too: one part
        elif self.segments:
            self.segments[-1][3] = index - 1
            self.segments.append([how, [], index, index, step])
        self.segment_how = self.segments[-1][0] if self.segments else how
        used = {s[0] for s in self.segments}   # a numbering no part keeps is not said
        for gone in [h for h in self.numbering if h not in used]:
            del self.numbering[gone]

    def forget_records(self, printed: tuple) -> None:
        """The records read so far were no records after all (one dropped, whose plan printed
        ``printed``, (key, name) pairs): the log's parts, numberings and those names start anew
        (the numberings in place: the replay reads them as they change)."""
        self.segments, self.segment_how = [], ""
        self.numbering.clear()
        for key, name in printed:
            names = self.keys.get(key)
            if names is not None and name in names:
                names.remove(name)
                if not names:
                    del self.keys[key]

    def forget_last(self, index: int) -> None:
        """Record ``index``, the last, numbered in order, was no record after all: its part of the
        log goes, and the numbering in order where no other part has it."""
        if self.segments and self.segments[-1][2] == index:
            self.segments.pop()
            self.segment_how = self.segments[-1][0] if self.segments else ""
        if "order" in self.numbering and not any(seg[0] == "order" for seg in self.segments):
            del self.numbering["order"]

    def restep(self, index: int, step: int) -> None:
        """Record ``index``, the last one so far, is at ``step`` after all (same numbering)."""
        if self.segments and self.segments[-1][2] == index:
            self.segments[-1][4] = step

    def count_records(self, n: int) -> None:
        """The number of records read (closes the last part)."""
        if self.segments:
            self.segments[-1][3] = n

    @property
    def counted(self) -> bool:
        """Some step so far was the log's own count."""
        return "counter" in self.numbering or "epoch" in self.numbering or "samples" in self.numbering

    def note(self, text: str) -> None:
        if text not in self.notes and len(self.notes) < 20:
            self.notes.append(text)

    def ignore(self, line_no: int, text: str, reason: str) -> None:
        """A line that gave no record: ``reason`` is short and shared by lines alike
        (``evaluation``, ``run summary``, ``no training metric``); unreadable lines carry
        ``unreadable: <what>`` and go to ``on_ignore`` too."""
        if reason.startswith(UNREADABLE):
            group = UNREADABLE
            if self.first_unreadable is None:
                self.first_unreadable = (line_no, reason)
            if self.on_ignore is not None:
                self.on_ignore(line_no, text, reason)
        else:
            group = reason
        seen = self.ignored.get(group)
        if seen is None:
            self.ignored[group] = [1, line_no]
        else:
            seen[0] += 1

    def change(self, line_no: int, what: str, n: int = 1) -> None:
        """``n`` records were merged, split from one line or dropped, ``what`` says how and why
        (``records read from lines that hold several ...``): the account says every one."""
        seen = self.changed.get(what)
        if seen is None:
            self.changed[what] = [n, line_no]
        else:
            seen[0] += n

    def unignore(self, reason: str) -> None:
        """The last line ignored for ``reason`` gave a record after all (a NaN warning after the
        last record, read once the log ended)."""
        seen = self.ignored.get(reason)
        if seen is not None and seen[0] > 1:
            seen[0] -= 1
        elif seen is not None:
            del self.ignored[reason]

    def __call__(self, line_no: int, text: str, reason: str) -> None:
        """An unreadable line (the callback readers call)."""
        self.ignore(line_no, text, reason if reason.startswith(UNREADABLE) else f"{UNREADABLE}: {reason}")

    @property
    def unreadable(self) -> int:
        return self.ignored.get(UNREADABLE, [0])[0]

    def finish(self) -> None:
        if self.on_ignore is None and self.first_unreadable is not None:
            line_no, reason = self.first_unreadable
            logger.warning("%s: ignored %d unreadable line(s); first at line %d: %s",
                           self.path, self.unreadable, line_no, reason)

    def to_json(self) -> dict:
        return {"type": "read", "path": self.path, "format": self.format, "steps": self.records,
                "steps_with_loss": self.with_loss, "keys": dict(self.keys),
                "steps_numbered_by": {NUMBERINGS[k]: v for k, v in self.numbering.items()},
                "numbering_parts": [{"by": NUMBERINGS[how], "names": names, "first_record": a,
                                     "last_record": b} for how, names, a, b, _ in self.segments]
                if len({how for how, *_ in self.segments}) > 1 else [],
                "ignored_lines": {r: {"lines": c, "first_line": f} for r, (c, f) in self.ignored.items()},
                "notes": list(self.notes),
                **({"records_changed": {r: {"records": c, "first_line": f} for r, (c, f) in self.changed.items()}}
                   if self.changed else {})}

    def lines(self) -> list[str]:
        """The account as a few human lines (``replay`` prints them first)."""
        out = [f"read {count(self.records)} ({self.format or 'unknown format'})"]
        if self.keys:
            out.append("  keys: " + ", ".join(f"{k} <- {' | '.join(repr(n) for n in v)}"
                                             for k, v in self.keys.items()))
        out += self._numbering_lines()
        if self.ignored:
            parts = [f"{c:,} {r}" + (f" (first: line {f})" if f else "")
                     for r, (c, f) in sorted(self.ignored.items(), key=lambda kv: -kv[1][0])]
            out.append("  lines ignored: " + "; ".join(parts))
        if self.changed:
            out.append("  records merged, split, dropped or marked: " + "; ".join(
                f"{c:,} {r} (first: line {f})" for r, (c, f) in self.changed.items()))
        out += [f"  note: {n}" for n in self.notes]
        return out

    def _numbering_lines(self) -> list[str]:
        """How steps were numbered: once for the log, or part by part where parts differ."""
        if len({how for how, *_ in self.segments}) <= 1:
            return [f"  steps numbered by {self._label(how)}" + (f": {', '.join(repr(n) for n in names)}"
                                                                if names else "")
                    for how, names in self.numbering.items()]
        out = [f"  steps numbered differently in {len(self.segments)} parts of the log:"]
        for how, names, a, b, _ in self.segments[:MAX_SEGMENTS]:
            said = f": {', '.join(repr(n) for n in names)}" if names else ""
            out.append(f"    records {a:,}-{b:,} by {self._label(how)}{said}")
        if len(self.segments) > MAX_SEGMENTS:
            out.append(f"    ... and {len(self.segments) - MAX_SEGMENTS} more parts")
        return out

    def step_caveat(self, step: int) -> str | None:
        """What a finding at ``step`` says of how its step was numbered, where the log did not
        print it (the part of the log it falls in: records in order, overflow lines after the
        last printed step, samples seen / a unit), or None where the log printed it (its
        counter, its epoch)."""
        part = self._part_at(step)
        if part is None or part[0] in ("counter", "epoch"):
            return None
        how, _, first_record, last_record, first_step = part
        before = first_step - 1
        if how == "samples":
            return (f"(step {step} is not printed by the log: its counter counts samples, and steps are "
                    f"samples seen / {self.sample_unit:,}, {self.sample_epoch:,} to an epoch)")
        if how == "after":
            return (f"(step {step} is not printed by the log: it is the {_ordinal(step - before)} {self.after_what} "
                    f"line after step {before}, the last step printed: find it by counting {self.after_what} lines "
                    "from there)")
        if all(s[0] == "order" for s in self.segments):
            return (f"(step {step} is record number {first_record + step - first_step} of the log, "
                    f"{self.order_reason}: find it by counting records, not by a step the trainer knows)")
        if first_record == 1:
            return (f"(step {step} is record number {1 + step - first_step} of the log, whose first "
                    f"{last_record} records print no step: find it by counting records from the log's start)")
        return (f"(step {step} is not printed by the log: it is the {_ordinal(step - before)} record after "
                f"step {before}, the last step before records that print none: find it by counting "
                "records from there)")

    def counts_epochs(self, step: int) -> bool:
        """Whether ``step`` is an epoch as the log prints it (the part it falls in prints nothing
        finer): one step there is a whole epoch's batches."""
        return self.numbered_by(step) == "epoch"

    def numbered_by(self, step: int) -> str | None:
        """How the part of the log ``step`` falls in is numbered (``_LABELS``' keys), if known."""
        part = self._part_at(step)
        return part[0] if part is not None else None

    def _part_at(self, step: int) -> list | None:
        """The part of the log a step falls in: the last whose first step is at or before it."""
        if not self.segments:
            if len(self.numbering) != 1:
                return None
            how = next(iter(self.numbering))
            return [how, [], 1, self.records, 1]
        found = self.segments[0]
        for seg in self.segments:
            if seg[4] <= step:
                found = seg
        return found

    def _label(self, how: str) -> str:
        if how == "order" and self.order_reason != _NO_STEPS:
            # the records print a counter, not taken: say which and why (not "no counter")
            return f"order of appearance (step N is the N-th record of the log, {self.order_reason})"
        return _LABELS[how].format(unit=self.sample_unit, after=self.after_what)

    @property
    def order_numbered(self) -> bool:
        """True when some steps are record numbers, not steps the trainer counted."""
        return "order" in self.numbering


def _ordinal(n: int) -> str:
    """``1st``, ``2nd``, ``3rd``, ``11th``, ``22nd``."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n:,}{suffix}"
