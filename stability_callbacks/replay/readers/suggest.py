"""What to paste when a log is refused: whole ``replay`` command lines with ``--keys`` and
``--pattern``, built from the lines that came closest to a record, and each checked to read
those lines before it is printed (docs/cli.md, When a log is refused).

The step is a number that increased across the closest lines (named, else by its position);
the loss the first number that looks like one: a name with a loss or error word, then any
other name, then an unnamed value, names of scores (``acc``, ``reward``) last. A name that
``--keys`` cannot carry (a ``,`` or ``=`` in it, or printed twice on the line) is given by
its position. Every argument is quoted for the shell (:func:`shlex.quote`); nothing is a
placeholder.

>>> texts, nums = ["ep ", " mse_err ", " acc ", ""], ["3", "0.25", "0.5"]
>>> for line in commands("odd log.txt", texts, [nums, ["4", "0.2", "0.6"]]):
...     print(line)
stability-callbacks replay 'odd log.txt' --keys step=ep,loss=mse_err
stability-callbacks replay 'odd log.txt' --pattern 'ep\\s+(?P<step>\\d+)\\s+mse_err\\s+(?P<loss>[-+]?(?:\\d+(?:\\.\\d+)?(?:[eE][-+]?\\d+)?|nan|NaN|NAN|inf|Inf|INF))'

Cost: a few plans and one regular expression per refused log. State: none.
"""
from __future__ import annotations

import re
import shlex
from typing import Sequence

from ... import keys
from .plan import slot_roles
from .user_keys import parse_keys
from .vocabulary import normalise_key

PROGRAM = "stability-callbacks replay"
_VALUE = r"[-+]?(?:\d+(?:\.\d+)?(?:[eE][-+]?\d+)?|nan|NaN|NAN|inf|Inf|INF)"
_SPACE = re.compile(r"(?:\\[ \t])+")
# Words of names that measure an error (the loss first) and of names that score (never first).
_ERROR_WORDS = frozenset({"loss", "err", "error", "errd", "errg", "cost", "nll", "objective",
                          "mse", "mae", "rmse", "ce", "bce", "kl", "l1", "l2", "xent"})
_SCORE_WORDS = frozenset({"acc", "accuracy", "reward", "rewards", "return", "score", "precision",
                          "recall", "f1", "map", "bleu", "auc", "top1", "top5", "iou", "miou"})
_NOT_A_VALUE = ("noise", "total", "eval", "summary", "ignore", "amount", "epoch", "per_epoch")


def commands(path: str, texts: list[str], samples: Sequence[Sequence[str]]) -> list[str]:
    """The command lines to paste for a log at ``path`` whose closest lines share the template
    ``texts`` (their numbers: ``samples``, the first line's first); [] when no number of them
    can be told to be a loss."""
    nums = list(samples[0])
    roles = slot_roles(texts, nums)
    step = _step(roles, samples)
    loss = _loss(roles, nums, step)
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


def _step(roles, samples) -> int | None:
    """The number that increased across the sample lines (a counter's name first)."""
    rising = []
    for i, (role, _, _, name) in enumerate(roles):
        values = [s[i] for s in samples if i < len(s)]
        if role in ("noise", "total") or not all(v.isdigit() for v in values):
            continue
        ints = [int(v) for v in values]
        if len(ints) > 1 and ints[-1] > ints[0] and all(b >= a for a, b in zip(ints, ints[1:])):
            rising.append(((0 if role in ("step", "batch") else 1 if name else 2), i))
    return min(rising)[1] if rising else None


def _loss(roles, nums, step) -> int | None:
    ranked = []
    for i, (role, key, _, name) in enumerate(roles):
        if i == step or role in _NOT_A_VALUE or (role == "metric" and key != keys.LOSS):
            continue
        words = set(normalise_key(name).split())
        rank = (0 if words & _ERROR_WORDS or role in ("component", "statistic") else
                3 if words & _SCORE_WORDS else 1 if name else 2)
        if rank == 2 and nums[i].isdigit():
            continue              # an unnamed integer: a count, not a loss
        ranked.append((rank, i))
    return min(ranked)[1] if ranked else None


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


def _pattern(texts: list[str], step: int | None, loss: int) -> str:
    """A regular expression for the template's lines from the first number wanted to the last:
    the text between numbers as printed (any run of spaces for a space; signs belong to the
    numbers), the step and loss as named groups."""
    first = min(i for i in (step, loss) if i is not None)
    last = max(i for i in (step, loss) if i is not None)
    parts = []
    for i in range(first, last + 1):
        piece = texts[i].rstrip("-+") if i > first else _key_part(texts[i].rstrip("-+"))
        parts.append(_SPACE.sub(r"\\s+", re.escape(piece)))
        parts.append(r"(?P<step>\d+)" if i == step else f"(?P<loss>{_VALUE})" if i == loss else _VALUE)
    return "".join(parts)


def _key_part(piece: str) -> str:
    """The end of the text before the first number wanted: its last words (the key)."""
    m = re.search(r"[A-Za-z_][\w ./-]*[^\w]*$", piece)
    return piece[m.start():] if m else piece[-3:]
