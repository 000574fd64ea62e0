"""The user's names for a log: ``--keys`` (printed names or positions -> our keys) and
``--pattern`` (one regular expression whose named groups read each line). They override every
rule of the readers (docs/replay.md)."""
from __future__ import annotations

import re

from ... import keys

__all__ = ["parse_keys", "compile_pattern"]


def parse_keys(spec: str) -> dict[str, str]:
    """``"step=iter,loss=train_loss"`` -> ``{"iter": "step", "train_loss": "loss"}`` (the
    name printed in the log, or a number's position on the line or a CSV row's column, from 1
    -> our key); ``ValueError`` names a bad item.

    >>> parse_keys("step=it, loss=Train Loss"), parse_keys("step=1,loss=3")
    ({'it': 'step', 'Train Loss': 'loss'}, {'1': 'step', '3': 'loss'})
    """
    out: dict[str, str] = {}
    for item in spec.split(","):
        ours, sep, theirs = item.partition("=")
        ours, theirs = ours.strip(), theirs.strip()
        if not sep or not ours or not theirs:
            raise ValueError(f"--keys: {item.strip()!r} is not OURS=THEIRS "
                             f"(e.g. step=iter,loss=train_loss)")
        if ours != "step" and not keys.is_known(ours):
            raise ValueError(f"--keys: {ours!r} is not step or a metric key "
                             f"({', '.join(keys.ALL)} or loss/<name>)")
        if theirs.isdigit() and int(theirs) < 1:
            raise ValueError(f"--keys: {item.strip()!r}: positions count from 1")
        out[theirs] = ours
    return out


def compile_pattern(text: str) -> re.Pattern:
    """The ``--pattern`` regular expression; ``ValueError`` for a bad one or unknown groups."""
    try:
        pat = re.compile(text)
    except re.error as e:
        raise ValueError(f"--pattern: not a regular expression: {e}") from e
    names = set(pat.groupindex)
    bad = sorted(n for n in names if n not in ("step", "epoch") and not keys.is_known(n))
    if bad or not names - {"step", "epoch"}:
        raise ValueError(f"--pattern: named groups must be step, epoch and metric keys "
                         f"({', '.join(keys.ALL)}); got {sorted(names) or 'none'}")
    return pat
