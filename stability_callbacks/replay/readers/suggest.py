"""What to paste when a log is refused: whole ``replay`` command lines with ``--keys`` and
``--pattern``, built from the lines that came closest to a record, and each checked to read
those lines before it is printed (docs/cli.md, When a log is refused).

The step is a number that increased across the closest lines (named, else by its position;
not one glued to a unit, ``47s``, ``6%``); the loss the first number that looks like one: a
name with a loss or error word, then any other name, then an unnamed value; never a score
(``acc``, ``reward``, an error rate), an element of a list, a unit's number. A name that
``--keys`` cannot carry (a ``,`` or ``=`` in it, or printed twice on the line) is given by
its position. Every argument is quoted for the shell (:func:`shlex.quote`); nothing is a
placeholder.

>>> texts, nums = ["ep ", " mse_err ", " acc ", ""], ["3", "0.25", "0.5"]
>>> for line in commands("odd log.txt", texts, [nums, ["4", "0.2", "0.6"]]):
...     print(line)
stability-callbacks replay 'odd log.txt' --keys step=ep,loss=mse_err
stability-callbacks replay 'odd log.txt' --pattern 'ep\\s+(?P<step>\\d+)\\s+mse_err\\s+(?P<loss>[-+]?(?:\\d+(?:\\.\\d+)?(?:[eE][-+]?\\d+)?|nan|NaN|NAN|inf|Inf|INF))'

Where the lines that came closest are progress lines (a counter that increases beside a value
that varies) with one unnamed value and no name of a loss, :func:`guess` says that value may be
the loss: the reader reads it so, and says it is a guess. :class:`ClosestLines` keeps the
lines to choose from.

Cost: a few plans and one regular expression per refused log. State: none.
"""
from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass, field
from typing import Sequence

from ... import keys
from . import tokens
from .plan import Plan, slot_roles
from .source import strip_prefix
from .user_keys import parse_keys
from .vocabulary import EVAL_SPLITS, TRAIN_SPLITS, normalise_key

PROGRAM = "stability-callbacks replay"
_VALUE = r"[-+]?(?:\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|nan|NaN|NAN|inf|Inf|INF)"
_SPACE = re.compile(r"(?:\\[ \t])+")
# Words of names that measure an error (the loss first) and of names that score (never first).
_ERROR_WORDS = frozenset({"loss", "err", "error", "errd", "errg", "cost", "nll", "objective",
                          "mse", "mae", "rmse", "ce", "bce", "kl", "l1", "l2", "xent"})
_SCORE_WORDS = frozenset({"acc", "accuracy", "reward", "rewards", "return", "score", "precision",
                          "recall", "f1", "map", "bleu", "auc", "top1", "top5", "iou", "miou", "rate",
                          "wer", "cer"})
_NOT_A_VALUE = ("noise", "total", "eval", "summary", "ignore", "amount", "epoch", "per_epoch")


def commands(path: str, texts: list[str], samples: Sequence[Sequence[str]]) -> list[str]:
    """The command lines to paste for a log at ``path`` whose closest lines share the template
    ``texts`` (their numbers: ``samples``, the first line's first); [] when no number of them
    can be told to be a loss."""
    nums = list(samples[0])
    roles = slot_roles(texts, nums)
    step = _step(roles, samples, texts)
    loss = _loss(roles, samples, step, texts)
    if loss is not None and not roles[loss][3]:   # unnamed: a column that sums the ones before it first
        total = _total_column(samples, [i for i, r in enumerate(roles) if not r[3] and r[0] not in ("noise", "total")
                                        and i != step and not _unit(texts, i)
                                        and not all(s[i].isdigit() for s in samples if i < len(s))])
        loss = total[0] if total is not None else loss
    if loss is None:
        return []
    line = "".join(t + n for t, n in zip(texts, nums + [""]))
    out = []
    spec = ",".join(f"{ours}={_name(roles, i)}" for ours, i in (("step", step), ("loss", loss))
                    if i is not None)
    if _reads_keys(spec, line, loss):
        out.append(f"{PROGRAM} {shlex.quote(str(path))} --keys {shlex.quote(spec)}")
    pattern = _pattern(texts, step, loss)
    m = re.search(pattern, line)
    if m is not None and m.group("loss") == nums[loss]:
        out.append(f"{PROGRAM} {shlex.quote(str(path))} --pattern {shlex.quote(pattern)}")
    return out


def _step(roles, samples, texts) -> int | None:
    """The number that increased across the sample lines (a counter's name first)."""
    rising = [((0 if roles[i][0] in ("step", "batch") else 1 if roles[i][3] else 2), i)
              for i in _rising(roles, samples, texts)]
    return min(rising)[1] if rising else None


def _rising(roles, samples, texts) -> list[int]:
    """The integers that count across the sample lines: they increase (strictly or with
    repeats), or restart only where an integer before them goes up (an epoch's iterations in
    a table's columns: ``1 10 2.30``, ..., ``2 10 1.95``); not a unit's (``47s``, ``6%``)."""
    ints: dict[int, list[int]] = {}
    for i, (role, _, _, _) in enumerate(roles):
        values = [s[i] for s in samples if i < len(s)]
        if role not in ("noise", "total") and not _unit(texts, i) and len(values) > 1 \
                and all(v.isdigit() for v in values):
            ints[i] = [int(v) for v in values]
    out = []
    for i, seq in ints.items():
        if not any(b > a for a, b in zip(seq, seq[1:])):
            continue
        falls = [j for j, (a, b) in enumerate(zip(seq, seq[1:])) if b < a]
        if all(any(k < i and other[j + 1] > other[j] for k, other in ints.items()) for j in falls):
            out.append(i)
    return out


def _finest(counters: list[int], samples) -> int:
    """Of the integers that count, the one that moves on most lines (``epoch, step``: the step;
    ``epoch, iter``: the iteration, which restarts), the first on a tie."""
    def moves(i):
        values = [s[i] for s in samples if i < len(s)]
        return sum(a != b for a, b in zip(values, values[1:])), -i
    return max(counters, key=moves)


def _outer(roles, samples, texts, step: int) -> int | None:
    """The nearest integer before the step that never goes down across the sample lines: it may
    count the step's epochs (``Assembler._outer_step`` decides when the step restarts)."""
    for i in range(step - 1, -1, -1):
        values = [s[i] for s in samples if i < len(s)]
        if roles[i][0] in ("noise", "total") or _unit(texts, i) or not all(v.isdigit() for v in values):
            continue
        ints = [int(v) for v in values]
        if all(b >= a for a, b in zip(ints, ints[1:])):
            return i
    return None


def _unit(texts, i: int) -> bool:
    """Whether number ``i`` is glued to a unit (``47s``, ``1m``, ``6%``)."""
    after = texts[i + 1][:1] if i + 1 < len(texts) else ""
    return (after.isalpha() and not tokens.key_run_in(texts[i + 1])) or after == "%"


def _varying(roles, samples, texts) -> list[int]:
    """The unnamed values that are no integers and differ across the sample lines."""
    out = []
    for i, (role, _, _, name) in enumerate(roles):
        values = [s[i] for s in samples if i < len(s)]
        if role in ("noise", "total") or name or _unit(texts, i) or all(v.isdigit() for v in values):
            continue
        if len(set(values)) > 1:
            out.append(i)
    return out


def _float_varies(samples: Sequence[Sequence[str]]) -> bool:
    """Whether a number that is no integer differs across a template's lines."""
    return len(samples) > 1 and any(len({s[i] for s in samples if i < len(s)}) > 1 and
                                    not all(s[i].isdigit() for s in samples if i < len(s))
                                    for i in range(len(samples[0])))


def progress(texts: list[str], samples: Sequence[Sequence[str]]) -> bool:
    """Whether a template's lines are progress lines: a counter that increases beside a value
    that varies (whatever their names: the lines a log reports its training with)."""
    if len(samples) < 3:
        return False
    roles = slot_roles(texts, list(samples[0]))
    if not _rising(roles, samples, texts):
        return False
    return any(len({s[i] for s in samples if i < len(s)}) > 1 and not all(s[i].isdigit() for s in samples)
               for i in range(len(roles)) if roles[i][0] not in ("noise", "total"))


@dataclass
class Guess:
    """The loss of progress lines that name none: ``pattern`` reads the step and the loss from
    them, ``names`` says so in the account (``#7``: the 7th number of the line)."""

    pattern: re.Pattern
    names: dict[str, str]
    line_no: int = 0
    which: str = "the one that varies beside the counter {step}"
    template: str = ""              # the progress lines' template (tokens.fold)
    said: str = ""                  # the account's note, where it is not that of an unnamed number


GUESSED = "the unnamed number that varies beside the counter on the log's progress lines (a guess: the log names no loss)"
GUESSED_NAN = ("the first unnamed number after the counter that is NaN or Inf on every line, of {n} unnamed "
               "numbers on the log's progress lines (a guess: the log names none, and none falls like a loss)")
GUESSED_SPLIT = "a split, no metric, on the log's progress lines: a guess that it is the training loss, as it falls like one"
GUESSED_TOTAL = ("the unnamed number that is the sum of the {m} right before it on every line, of {n} unnamed "
                 "numbers on the log's progress lines (a guess: a loss's total over its terms; the log names none)")
GUESSED_COLUMN = ("the first unnamed number after the counter that falls like a loss, of {n} unnamed numbers on the "
                  "log's progress lines (a guess: the log names none of them)")


def guess(texts: list[str], samples: Sequence[Sequence[str]]) -> Guess | None:
    """Progress lines whose loss has no name (the PyTorch tutorials' ``1m 47s (- 25m 3s) (5000
    6%) 2.8850``): where the template's lines print a counter that increases and one unnamed
    number that is no integer, and it varies, stays above 0 and does not end above where it
    began (a loss falls or wavers; an accuracy, a time, a count climb), that number may be the
    loss. A guess, said as such (:data:`GUESSED`); None otherwise (the log is refused with
    suggestions that point at these lines)."""
    if len(samples) < 3:
        return None
    roles = slot_roles(texts, list(samples[0]))
    counters = _rising(roles, samples, texts)
    prose = _prose_loss(texts, samples, roles, _finest(counters, samples) if counters else None)
    if prose is not None:
        return prose
    unnamed = [i for i, (role, _, _, name) in enumerate(roles)
               if role not in ("noise", "total") and not name and not _unit(texts, i)
               and not all(s[i].isdigit() for s in samples if i < len(s))]
    if not counters:
        return _headless(texts, samples)
    step = _finest(counters, samples)
    epoch = _outer(roles, samples, texts, step)
    said = {"step": roles[step][3] or f"#{step + 1}"}
    split = _split_loss(roles, samples, step, texts)
    if split is not None:   # (a counter named as an epoch numbers the records by their epochs)
        return Guess(re.compile(_pattern(texts, step, split, epoch) if roles[step][0] != "epoch"
                                else _pattern(texts, None, split, step)),
                     {"loss": f"{roles[split][3]} ({GUESSED_SPLIT})", **said}, said=(
                         f"the log names no loss: the loss is a guess, the number named only {roles[split][3]!r} (a "
                         f"split, no metric) on its progress lines, beside {said['step']!r}, as it falls like a loss"),
                     template=tokens.fold(texts))
    if not unnamed:
        return None
    if len(unnamed) == 1 and _varying(roles, samples, texts) == unnamed:
        if not _falls(samples, unnamed[0]):
            return None
        loss = unnamed[0]
        return Guess(re.compile(_pattern(texts, step, loss, epoch)), {"loss": f"#{loss + 1} ({GUESSED})", **said},
                     template=tokens.fold(texts))
    if any(name for i, (role, _, _, name) in enumerate(roles)
           if i != step and role not in ("noise", "total", "epoch", "step", "batch")):
        return None
    # Columns with no names at all (`  1/50   2.3026   0.1000   2.2990   0.1135`, the header an
    # excerpt missed): a column that is the sum of those right before it on every line (YOLOv5's
    # `box obj cls total`: the loss's total over its terms), else the first after the counter that
    # falls like a loss.
    n = len(unnamed)

    def column(i: int, what: str, which: str) -> Guess:
        return Guess(re.compile(_pattern(texts, step, i, epoch)), {"loss": f"#{i + 1} ({what})", **said},
                     which=which, template=tokens.fold(texts))
    total = _total_column(samples, [i for i in unnamed if i > step])
    if total is not None:
        return column(total[0], GUESSED_TOTAL.format(m=total[1], n=n),
                      f"the sum of the {total[1]} unnamed numbers right before it on every line, of {n}")
    falls = next((i for i in unnamed if i > step and _falls(samples, i)), None)
    if falls is not None:
        return column(falls, GUESSED_COLUMN.format(n=n),
                      f"the first after the counter {{step}} that falls like a loss, of {n} unnamed numbers")
    # none falls: a column not finite on every line (`  12   nan   nan   0.12`) is a loss gone NaN,
    # the first after the counter (a guess said as such; an accuracy or a time prints numbers)
    nan = next((i for i in unnamed if i > step and _non_finite(samples, i)), None)
    return None if nan is None else column(nan, GUESSED_NAN.format(n=n), (
        f"the first after the counter {{step}} that is not finite on every line, of {n} unnamed numbers (no "
        f"number of them falls like a loss)"))


GUESSED_HEADLESS = ("the first column that falls like a loss, of {n} unnamed columns with no counter among them (a "
                    "guess: the table has no header; records numbered in order)")
GUESSED_FIRST = ("the first column that is not a count, of {n} unnamed columns with no counter among them, none "
                 "falling like a loss (a guess: the table has no header, and code that prints one prints its loss "
                 "first; records numbered in order)")


def _headless(texts: list[str], samples: Sequence[Sequence[str]]) -> Guess | None:
    """A table of numbers with no header and no counter (``2.1689,-196.21`` on every line: a loss
    and a reward): the first column that falls like a loss (:func:`_falls`; a reward, an
    accuracy climb), else — none falls: a loss that rises (a DQN's, as its Q-values grow), one
    that never learns — the first that is not a count (``print(loss, reward)`` prints the loss
    first), the records numbered in order. A guess, said as such (a refusal's suggestion could
    name no better column); None where the lines print anything but numbers between separators,
    or every column is a count."""
    if any(t.strip().rstrip("-+") not in ("", ",", ";") for t in texts):   # (a sign stays in the template)
        return None
    n = len(texts) - 1
    values = [i for i in range(n) if not all(s[i].isdigit() for s in samples if i < len(s))]
    # (a minus the template holds is the column's sign: -196.21 climbing to -150 does not fall)
    signed = [[("-" if texts[i].endswith("-") else "") + v for i, v in enumerate(s)] for s in samples]
    loss = next((i for i in values if _falls(signed, i)), None)
    what, which = GUESSED_HEADLESS, "the first that falls like a loss"
    if loss is None and values:
        loss, what, which = values[0], GUESSED_FIRST, "the first that is not a count, none falling like a loss"
    if loss is None:
        return None
    return Guess(re.compile(_pattern(texts, None, loss)), {"loss": f"#{loss + 1} ({what.format(n=n)})"},
                 template=tokens.fold(texts), said=(
                     f"the log names no loss and prints no counter: the loss is a guess, column #{loss + 1} of {n} "
                     f"({which}), the records numbered in order"))


def _split_loss(roles, samples, step: int, texts: list[str]) -> int | None:
    """The number named only by the training split (``epoch 3 | train 0.52 | valid 0.61``: a
    split and no metric, beside ones named only by an evaluation split; CatBoost's ``0: learn:
    0.67 test: 0.67 best: 0.67 (0) total: 47ms remaining: 14s``), where it falls like a loss and
    every other name on the line is a counter's, an evaluation split's, a run summary's (a best
    so far) or a duration's; else None."""
    names = {i: normalise_key(name) for i, (role, _, _, name) in enumerate(roles)
             if name and i != step and role not in ("noise", "total", "epoch", "step", "batch", "summary")
             and not _unit(texts, i)}
    train = [i for i, n in names.items() if n in TRAIN_SPLITS]
    if len(train) != 1 or any(n not in TRAIN_SPLITS | EVAL_SPLITS for n in names.values()):
        return None
    i = train[0]
    return i if not all(s[i].isdigit() for s in samples) and _falls(samples, i) else None


def _total_column(samples: Sequence[Sequence[str]], columns: list[int]) -> tuple[int, int] | None:
    """``(column, m)``: the first of ``columns`` whose number is the sum of the ``m`` (2 or more)
    columns right before it on every sample line, to the digits printed; None where none is."""
    try:
        rows = [[float(s[i]) for i in columns] for s in samples]
        digits = [max(_decimals(s[i]) for s in samples) for i in columns]
    except (ValueError, IndexError):
        return None
    for k in range(2, len(columns)):
        for m in range(k, 1, -1):
            if all(abs(r[k] - sum(r[k - m:k])) <= m * 10.0 ** -min(digits[k - m:k + 1]) for r in rows) \
                    and any(r[k] for r in rows):
                return columns[k], m
    return None


def _decimals(text: str) -> int:
    """The digits a number is printed with after its point (``0.1177``: 4)."""
    return len(text) - text.index(".") - 1 if "." in text and "e" not in text.lower() else 0


def _non_finite(samples: Sequence[Sequence[str]], i: int) -> bool:
    """Whether number ``i`` of the sample lines is NaN or Inf on every one."""
    try:
        return all(not math.isfinite(float(s[i])) for s in samples)
    except (ValueError, IndexError):
        return False


def _falls(samples: Sequence[Sequence[str]], i: int) -> bool:
    """Whether number ``i`` of the sample lines moves like a loss: it varies, stays above 0 and
    does not end above where it began (an accuracy, a time, a count climb), up to where it goes
    NaN or Inf, if it does (a loss gone NaN a few lines in: `5000 5% (0m 4s) nan ..`)."""
    try:
        values = [float(s[i]) for s in samples]
    except (ValueError, IndexError):
        return False
    gone = next((k for k, v in enumerate(values) if not math.isfinite(v)), len(values))
    values = values[:gone]
    return len(set(values)) > 1 and all(0 < v for v in values) and values[-1] <= values[0]


def _loss(roles, samples, step, texts) -> int | None:
    """The number to suggest as the loss: one named as an error first, then any named, then an
    unnamed one that is no integer; never a score, a unit's, a list's element, nor — named with
    no error's word — one that stays the same on every sample line (Lightning's `v_num=0`) or
    rises at every one (StyleGAN's `kimg 4.0`, `8.0`, `12.0`: progress, no loss)."""
    nums = samples[0]
    ranked = []
    for i, (role, key, _, name) in enumerate(roles):
        if i == step or role in _NOT_A_VALUE or (role == "metric" and key != keys.LOSS) \
                or _in_list(texts, i) or _unit(texts, i):
            continue
        words = set(normalise_key(name).split())
        if words & _SCORE_WORDS:
            continue              # an accuracy, a reward, an error rate: no loss to suggest
        rank = 0 if words & _ERROR_WORDS or role in ("component", "statistic") else 1 if name else 2
        if rank == 2 and nums[i].isdigit():
            continue              # an unnamed integer: a count, not a loss
        if rank == 1 and _constant_or_rising(samples, i):
            continue
        ranked.append((rank, i))
    return min(ranked)[1] if ranked else None


def _constant_or_rising(samples, i: int) -> bool:
    """Whether number ``i`` is the same on every sample line, or higher on each than on the one
    before (3 lines at least)."""
    try:
        values = [float(s[i]) for s in samples if i < len(s)]
    except ValueError:
        return False
    return len(values) >= 3 and (len(set(values)) == 1 or all(b > a for a, b in zip(values, values[1:])))


def _in_list(texts, i: int) -> bool:
    """Whether number ``i`` is an element of a bracketed list of several (``[0.5, 0.4, 0.35]``:
    per class, per group; not ``loss: [10.0]``)."""
    j = i
    while j > 0 and texts[j].strip() == ",":
        j -= 1
    if not texts[j].rstrip().endswith("["):
        return False
    return j < i or (i + 1 < len(texts) and texts[i + 1].strip() == ",")


def _name(roles, i: int) -> str:
    """How ``--keys`` names number ``i``: its printed name, or its position from 1."""
    name = roles[i][3]
    norm = normalise_key(name)
    if not norm or "," in name or "=" in name or name != name.strip() \
            or sum(normalise_key(r[3]) == norm for r in roles) > 1:
        return str(i + 1)
    return name


def _reads_keys(spec: str, line: str, loss: int) -> bool:
    """Whether ``--keys spec`` reads the line's number ``loss`` as the loss."""
    from .generic import LineReader
    try:
        got = LineReader(parse_keys(spec)).parse(line)
    except ValueError:
        return False
    return got is not None and got[1].kind == "record" and got[1].loss_at == loss


# `the training loss is 2.31`, `Loss went down to 0.95`, `train loss now 1.2`: a number right
# after the word "loss" and at most a few words that end in a verb or preposition of prose.
_PROSE_LOSS = re.compile(r"\bloss(?:\s+\w+){0,2}?\s+(?:is|now|to|was|of|at)\s*$", re.I)
PROSE = "the number after it, in prose on {n} lines or more{counter}: a guess"


def _prose_loss(texts: list[str], samples: Sequence[Sequence[str]], roles, step: int | None) -> Guess | None:
    """The loss of lines that say it in prose (``the training loss is 2.31``, printed again and
    again in the same words): the number right after the word ``loss`` and a verb or preposition,
    where it varies across the lines and is no integer; ``step``: the counter that rises across
    them (``Step 120: the loss is 2.31``), if any, numbers the records."""
    for i in range(len(texts) - 1):
        values = [s[i] for s in samples if i < len(s)]
        if _PROSE_LOSS.search(texts[i]) and len(set(values)) > 1 and not all(v.isdigit() for v in values):
            name = _key_part(texts[i]).strip()
            step = step if step != i else None
            counter = ", no counter" if step is None else ""
            names = {"loss": f"{name!r} ({PROSE.format(n=len(samples), counter=counter)})"}
            numbered = "the records are numbered in order"
            if step is not None:
                names["step"] = roles[step][3] or f"#{step + 1}"
                numbered = f"the records are numbered by the counter {names['step']!r}"
            return Guess(re.compile(_pattern(texts, step, i)), names,
                         template=tokens.fold(texts), said=(
                             f"the log prints the loss only in prose ({name!r}, on {len(samples)} lines or more): "
                             f"the loss is the number after it, a guess, and {numbered}"))
    return None


def _pattern(texts: list[str], step: int | None, loss: int, epoch: int | None = None) -> str:
    """A regular expression for the template's lines from the first number wanted to the last:
    the text between numbers as printed (any run of spaces for a space; signs belong to the
    numbers), the step, the loss and an integer that may count epochs as named groups."""
    wanted = [i for i in (step, loss, epoch) if i is not None]
    first, last = min(wanted), max(wanted)
    parts = []
    if first > 0 and not re.search(r"[A-Za-z_]", texts[first]):
        # no key before the first number wanted (columns): anchored at the line's start, the
        # numbers before it skipped by count (unanchored, `\s+(\d+)\s+(x)` would take the
        # first two columns, whichever they are)
        parts.append(r"^\s*")
        first = 0
    groups = {step: r"(?P<step>\d+)", loss: f"(?P<loss>{_VALUE})", epoch: r"(?P<epoch>\d+)"}
    for i in range(first, last + 1):
        piece = texts[i].rstrip("-+") if i > first or parts else _key_part(texts[i].rstrip("-+"))
        if i == 0 and parts:
            piece = piece.lstrip()
        parts.append(_SPACE.sub(r"\\s+", re.escape(piece)))
        parts.append(groups.get(i, _VALUE))
    return "".join(parts)


def _key_part(piece: str) -> str:
    """The end of the text before the first number wanted: its last words (the key)."""
    m = re.search(r"[A-Za-z_][\w ./-]*[^\w]*$", piece)
    return piece[m.start():] if m else piece[-3:]


@dataclass
class _Near:
    """A template of lines that made no record: its best score, its first lines, the numbers of
    its first ``ClosestLines.SAMPLES`` lines."""

    score: int
    texts: list[str]
    lines: list[tuple[int, str, tuple]] = field(default_factory=list)
    samples: list[list[str]] = field(default_factory=list)


_PROSE_TAIL = re.compile(r"\s[^\W\d_]{2,}").match


class ClosestLines:
    """The lines that came closest to a record, for the error message, and their templates'
    numbers (what to suggest or guess: :mod:`.suggest`). Templates rank by what their lines do
    first (a counter that increases beside a value that varies: progress lines, whatever their
    names), then by how many keyed numbers a line has, then by their first line; a template
    lists its first lines. Memory: ``MAX_TEMPLATES`` x (``LINES`` lines + ``SAMPLES`` samples)."""

    SAMPLES = 8
    LINES = 3
    MAX_TEMPLATES = 64

    def __init__(self, size: int = 3):
        self.size = size
        self.templates: dict[str, _Near] = {}

    def offer(self, line_no: int, text: str, plan: Plan) -> None:
        text = text.strip()[:200]
        texts, nums = tokens.split(strip_prefix(text))   # (as the reader reads it: `tensor(2.5, device=..)` is 2.5)
        # free text after the last number (the PyTorch name-classification tutorial's `5000 5% (0m
        # 8s) 2.6379 Ahn / Chinese ✗ (Korean)`: each line's prediction) is no part of the template
        key = tokens.fold(texts[:-1] + ["\x01"] if _PROSE_TAIL(texts[-1]) else texts)
        near = self.templates.get(key)
        if near is None:
            if len(self.templates) >= self.MAX_TEMPLATES and not self._evict():
                return
            near = self.templates[key] = _Near(plan.score, texts)
        near.score = max(near.score, plan.score)
        if len(near.lines) < self.LINES:
            near.lines.append((line_no, text, plan.named))
        if len(near.samples) < self.SAMPLES:
            near.samples.append(nums)

    def _evict(self) -> bool:
        """Room for another template: the lowest-scored one printed once goes (a line of a
        block of prints; progress lines print their template again and again)."""
        once = [(n.score, -n.lines[0][0], k) for k, n in self.templates.items() if len(n.samples) == 1]
        if not once:
            return False
        del self.templates[min(once)[2]]
        return True

    def _ranked(self) -> list[_Near]:
        return sorted(self.templates.values(),
                      key=lambda n: (-progress(n.texts, n.samples), -_float_varies(n.samples), -n.score, n.lines[0][0]))

    def lines(self) -> list[tuple[int, str, tuple]]:
        return [line for near in self._ranked() for line in near.lines][:self.size]

    def best(self) -> tuple[list[str], list[list[str]]] | None:
        """The template of the closest line and its sample numbers, where a float varies across
        its lines (a banner printed once, `Found 50000 images belonging to 10 classes`, or
        counts alone hold no loss to suggest)."""
        ranked = self._ranked()
        return (ranked[0].texts, ranked[0].samples) if ranked and _float_varies(ranked[0].samples) else None

    def guess(self) -> Guess | None:
        """The loss of progress lines that name none (:func:`.suggest.guess`), or None."""
        ranked = self._ranked()
        got = guess(ranked[0].texts, ranked[0].samples) if ranked else None
        if got is not None:
            got.line_no = ranked[0].lines[0][0]
        return got
