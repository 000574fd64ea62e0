"""A per-epoch history printed as bracketed arrays: one line per epoch.

Keras' ``History.history`` printed as a dict (``{'loss': [0.69, 0.52, ...], 'val_loss': [...]}``,
wrapped by the terminal or by ``pprint`` one element per line, or ``json.dump(..., indent=2)``)
or numpy's ``loss: [0.69 0.52 ...]`` wrapped at 75 characters: arrays of numbers under names,
with no step. Element k of each array is epoch k (from 1). :class:`Histories` joins the lines
such a print spans and gives, in their place, the line ``epoch k: name: value | ...`` for every
epoch, which the reader's rules read as any line (the loss, evaluation names, the epoch as the
step). What is no history (a list beside a step, ``loss: [10.0]``; DeepSpeed's ``lr=[1e-05]``;
a block's ``IoU per class: [0.3, 0.5]``; arrays with no loss) is given back as it was printed.

>>> h = Histories()
>>> h.offer(1, "{'loss': [2.5, 2.1,") + h.offer(2, " 1.9], 'val_loss': [2.6, 2.2, 2.0]}") + h.end()
[History(line_no=1, lines=2, epochs=['epoch 1: loss: 2.5 | val_loss: 2.6', 'epoch 2: loss: 2.1 | val_loss: 2.2', 'epoch 3: loss: 1.9 | val_loss: 2.0'])]

Cost: lines without ``[`` pass at the cost of a substring test while no history is open; a
history costs time linear in its text. Memory: the lines of one history (``MAX_LINES``).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from ... import keys
from .source import strip_prefix
from .vocabulary import classify

# `'loss': [`, `"val_loss": [`, `loss: [`, `loss = array([`, `'acc': np.array([`
_OPENER = re.compile(r"""(['"]?)([A-Za-z_][\w ./-]*?)\1\s*[:=]\s*(?:(?:np\.)?array\(\s*)?\[""")
_ELEMENT = re.compile(r"""\s*,?\s*(?:np\.float(?:16|32|64)\(([^()]*)\)|([-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|"""
                      r"""[-+]?(?:nan|NaN|inf|Inf|Infinity)))""")
_CLOSE = re.compile(r"\s*,?\s*\]")
# What may stand between and around the arrays: brackets, commas, `dtype=float32)`.
_BETWEEN = re.compile(r"""[\s,{}()]*(?:dtype=\w+\)?[\s,{}()]*)?""")
_DIGIT = re.compile(r"\d")
# YAML's list under its name: `train_loss:` alone, then `- 0.69` per element
_YAML_KEY = re.compile(r"""\s*(['"]?)([A-Za-z_][\w ./-]*?)\1\s*:\s*""")
_YAML_ITEM = re.compile(r"""\s*-\s+([-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+]?(?:nan|NaN|inf|Inf|\.nan|\.inf))\s*""")
_MAY_OPEN = re.compile(r"[:=]\s*(?:(?:np\.)?array\(\s*)?\[").search


@dataclass
class History:
    """A history read from ``lines`` physical lines from ``line_no``: one line per epoch."""

    line_no: int
    lines: int
    epochs: list[str]


class Histories:
    """Lines -> lines: ``offer`` a physical line, get back what is final now: ``(line_no, text)``
    lines as printed, and :class:`History` items in place of the lines a history spanned."""

    MAX_LINES = 100_000

    def __init__(self, off: bool = False) -> None:
        self.off = off                       # (--pattern reads every line as it is)
        self.held: list[tuple[int, str]] = []
        self.arrays: dict[str, list[str]] = {}
        self.key: str | None = None          # the array open at the end of the last line
        self.yaml = False                    # ... a YAML list (`name:`, then `- value` lines)
        self.values: list[str] = []

    @property
    def open(self) -> bool:
        return bool(self.held)

    @staticmethod
    def opens(text: str) -> bool:
        """Whether a line with a ``[`` may open an array under a name (a cheap test before
        :meth:`offer`)."""
        return _MAY_OPEN(text) is not None

    def offer(self, line_no: int, text: str) -> list:
        if self.off or (not self.held and "[" not in text and text.strip() not in ("{", "}") and text[-1:] != ":"):
            return [(line_no, text)]
        if self._read(strip_prefix(text)) and len(self.held) < self.MAX_LINES:
            self.held.append((line_no, text))
            return []
        if self.key is not None:             # an array left open: no history after all
            out = self._give_back() + [(line_no, text)]
            return out
        out = self.end()
        return out + self.offer(line_no, text) if out else out + [(line_no, text)]

    def end(self) -> list:
        """The lines held: a :class:`History`, or the lines as printed (none is)."""
        if self.yaml and self.key is not None:   # a YAML list ends with the log
            self.arrays[self.key], self.key, self.yaml = self.values, None, False
        if self.key is not None or not self.held:
            return self._give_back()
        history = self._history()
        if history is None:
            return self._give_back()
        self._reset()
        return [history]

    def _read(self, text: str) -> bool:
        """Whether ``text`` continues (or opens) a history; the arrays it closes are kept."""
        yaml = self._yaml(text)
        if yaml is not None:
            return yaml
        pos, n = 0, len(text)
        while pos < n:
            if self.key is not None:
                pos = self._elements(text, pos)
                if pos < 0:
                    return False
                continue
            m = _OPENER.search(text, pos)
            gap = text[pos:m.start()] if m is not None else text[pos:]
            if _BETWEEN.fullmatch(gap) is None and not (pos == 0 and not self.held and not self.arrays
                                                        and not _DIGIT.search(gap)):
                return False                 # other text (a label may open the first line)
            if m is None:
                return bool(self.held) or bool(self.arrays) or text.strip() in ("{",)
            self.key, self.values, pos = m.group(2), [], m.end()
        return True

    def _yaml(self, text: str) -> bool | None:
        """A YAML list under its name (``train_loss:`` then ``- 0.69`` lines, a history dumped by
        ``yaml.dump``): whether ``text`` opens or continues one (its array kept as it closes), or
        None where the text is no YAML key alone nor, inside one, an element."""
        item = _YAML_ITEM.fullmatch(text)
        if item is not None and self.key is not None and self.yaml:
            self.values.append(item.group(1))
            return True
        key = _YAML_KEY.fullmatch(text)
        if key is None:
            if self.yaml and self.key is not None:   # the list ended: its array is kept
                self.arrays[self.key], self.key, self.yaml = self.values, None, False
            return None
        if self.key is not None and not self.yaml:
            return None
        if self.key is not None:
            self.arrays[self.key] = self.values
        self.key, self.values, self.yaml = key.group(2), [], True
        return True

    def _elements(self, text: str, pos: int) -> int:
        """Numbers of the open array from ``pos``: the position after them (and after ``]``,
        which closes it), or -1 for anything else."""
        while True:
            m = _ELEMENT.match(text, pos)
            if m is None:
                break
            self.values.append((m.group(1) or m.group(2)).strip())
            pos = m.end()
        close = _CLOSE.match(text, pos)
        if close is not None:
            assert self.key is not None
            self.arrays[self.key] = self.values
            self.key = None
            return close.end()
        rest = text[pos:]
        return len(text) if not rest.strip(" \t,") else -1

    def _history(self) -> History | None:
        """One line per epoch, where the arrays hold a training loss of two epochs or more: the
        names whose arrays are as long as the loss's."""
        losses = [len(v) for name, v in self.arrays.items() if _is_loss(name)]
        if not losses or max(losses) < 2:
            return None
        epochs = max(losses)
        names = [name for name, v in self.arrays.items() if len(v) == epochs]
        lines = [f"epoch {k + 1}: " + " | ".join(f"{name}: {self.arrays[name][k]}" for name in names)
                 for k in range(epochs)]
        return History(self.held[0][0], len(self.held), lines)

    def _give_back(self) -> list:
        out = list(self.held)
        self._reset()
        return out

    def _reset(self) -> None:
        self.held.clear()
        self.arrays, self.key, self.values, self.yaml = {}, None, [], False


def _is_loss(name: str) -> bool:
    role, key, _ = classify(name)
    return key == keys.LOSS and role in ("metric", "component", "statistic")
