"""The line tokenizer: a line of text -> its numbers and, around them, its template.

The text between the numbers is the line's *template*; for every number it gives the key
printed before it (``key: v``, ``key=v``, ``key v``, ``| key v |``, dict prints and JSON with
their key paths, ``Key is v.``), whether it is noise (a time of day, a date, digits inside a name),
a counter's total (``10/1000``) or a name glued to a counter (``ep6``, ``1020batch``). Nothing
here knows what a name means (:mod:`.vocabulary`) or which number is the step (:mod:`.plan`).

>>> texts, nums = split("step 10 | loss: 2.5 | lr 3.0e-4")
>>> nums, [key_before(t, i > 0) for i, t in enumerate(texts[:-1])]
(['10', '2.5', '3.0e-4'], ['step', 'loss', 'lr'])

Cost: one regular-expression split per line and O(numbers) work per new template.
"""
from __future__ import annotations

import re

from .vocabulary import NORM_BARS, classify

# Numbers: digits with an optional fraction and exponent (the sign stays in the template, so a
# template does not change with it), and the non-finite words, which only lines that contain
# them pay for. `nanxxx` (PaddleOCR) and `nanms` are NaNs with text glued on; `INFO` is no inf.
NUM = r"\d+(?:\.\d+)?(?:[eE][-+]?\d+)?"
# A parameter group's index inside its key's parentheses (OLMo-core's `optim/LR (group 0)=2e-05`)
# is the key's, not a number of the line.
_IN_KEY = r"(?<!\(group )"
_SPLIT = re.compile(f"{_IN_KEY}({NUM})").split
_SPLIT_NONFINITE = re.compile(
    rf"{_IN_KEY}({NUM}|(?<![A-Za-z])(?:nan|NaN|NAN|(?:[Ii]nfinity|inf|Inf|INF)(?![A-Za-z])))").split
_NONFINITE_HINT = re.compile(r"nan|NaN|NAN|[Ii]nfinity|inf|Inf|INF").search
# YAML spells them `.nan`, `.inf`, `-.inf` (rllib's pretty-printed results): a value's, after its key
_YAML_NONFINITE = re.compile(r"(?<=: )([-+]?)\.(nan|NaN|NAN|inf|Inf|INF)\b")

_GLUED_BEFORE = {"ep": "epoch", "epoch": "epoch", "it": "it", "iter": "iter",
                 "iteration": "iteration", "step": "step"}
_GLUED_AFTER = {"epoch": "epoch", "batch": "batch", "batches": "batch"}
_TRAILING_WORD = re.compile(r"(?<![A-Za-z_/.-])([A-Za-z]+)$")
_LEADING_WORD = re.compile(r"([A-Za-z]+)(?![A-Za-z])")
_QUOTES = " \t'\"\u2018\u2019\u201c\u201d"
_MARKDOWN = "`*"
#: Names no unit has, right after a number (a counter run into the next key: `iters: 100loss: 2.31`).
_KEY_NOT_UNIT = re.compile(r"[A-Za-z_]*loss[A-Za-z_]*|lr|gnorm|grad_norm", re.I)
# (and a bar's drawing, box-drawing and block glyphs: `▕███▏ batch 3`, `━━━━ 12/100`, `░░░ 4`, name nothing)
_BAR_GLYPHS = "".join(map(chr, range(0x2500, 0x25A0)))
_CUTS = ",|;[]{}()<>'\"=:\t\u2018\u2019\u201c\u201d\uff1a\uff0c" + _BAR_GLYPHS
# A possessive is no quote: LightGBM's `training's binary_logloss`, `valid_1's binary_logloss`.
_POSSESSIVE = re.compile(r"(?<=\w)['\u2019]s(?= )")
_AFTER_LAST_CUT = re.compile(f"[{re.escape(_CUTS)}]([^{re.escape(_CUTS)}]*)\\Z")
_PATH_TOKENS = re.compile(r"""['"]?([\w./ -]+?)['"]?\s*[:=]\s*\{|\{|\}""")
_WORD_INSIDE_KEY = re.compile(r"\s+[A-Za-z][\w ]*[:=]\s*$")
# A word of punctuation only between spaces separates fields, whatever its characters:
# `step 120 -- Loss: 2.31`, `it 5 ~ loss 2.1`, `iter 3 • lr 1e-4`, `step 4 :: loss 2.0`.
_LAST_SEPARATOR_WORD = re.compile(r".*(?:^|\s)[^\w\s]+\s")
_PUNCTUATION = re.compile(r"[^\w\s]").search
_BOX_VERTICALS = str.maketrans("\u2502\u2503\u2551", "|||")
_WHITESPACE = re.compile(r"[ \t]+")
# The characters after which a minus is the number's sign, not a word's hyphen or a separator:
# `loss: -1.0`, `nll_-3.45`, a CSV's `1,-1.19`, `| -0.5 |`.
SIGN_AFTER = " \t:=([_,;|'\""
_SIGN = re.compile(f"(?<=[{re.escape(SIGN_AFTER)}])-\x00")


def signed(text: str, signs: str = "-", alone: bool = False) -> bool:
    """Whether ``text`` ends with the sign of the number printed after it: a minus (or one of
    ``signs``) right after one of ``SIGN_AFTER`` (`loss: -1.0`, `nll_-3.45`, `1,-1.19`), or, with
    ``alone``, with nothing before it (the text between two numbers: `100 -2.5` read as `100`, `-2.5`)."""
    if not text or text[-1] not in signs:
        return False
    before = text[-2:-1]
    return before in SIGN_AFTER if before else alone
_PADDED = re.compile(r"(?<=[\[(]) (?=\x00)")   # a number's padding right after its opening bracket
_STATISTIC_QUALIFIERS = frozenset({"avg", "average", "mean", "ema", "smoothed", "running"})


# A number printed with thousands separators after a key (`loss: 1,234,567.89`, `| tokens | 1,048,576 |`):
# one number, not its first group of digits. Only after a space, `:` or `=` (a CSV row's cells
# follow commas or open the line) and not followed by a digit, a word or `,digit` (`1,100,0.5`).
_THOUSANDS = re.compile(r"(?<=[ :=])\d{1,3}(?:,\d{3})+(?:\.\d+)?(?![\w.]|,\d)")


def _no_separators(m: re.Match) -> str:
    return m.group(0).replace(",", "")


def split(line: str) -> tuple[list[str], list[str]]:
    """``(texts, numbers)``: ``len(texts) == len(numbers) + 1``; the texts are the template."""
    if "," in line:
        line = _THOUSANDS.sub(_no_separators, line)
    if _NONFINITE_HINT(line):
        if ".n" in line or ".i" in line or ".N" in line or ".I" in line:
            line = _YAML_NONFINITE.sub(r"\1\2", line)
        parts = _SPLIT_NONFINITE(line)
    else:
        parts = _SPLIT(line)
    return parts[0::2], parts[1::2]


_ARROW = re.compile(r"\s*(?:-+>|=+>|\u2192|\u21d2)$")


def _word_end(piece: str) -> int:
    """Where the first word of a piece ends: at a space or a cut."""
    i = 0
    while i < len(piece) and not piece[i].isspace() and piece[i] not in _CUTS:
        i += 1
    return i


def key_run_in(piece: str, i: int | None = None) -> bool:
    """Whether the word right after a number (``piece[:i]``, up to a cut) is the next key run into
    it, no unit: `100loss: 2.31`, or a name the vocabulary knows before `:` or `=` (a log pasted
    without its tabs: CatBoost's `0.6677535test: 0.7177535`; not `53.3msremaining:`, a unit and
    the next key)."""
    i = _word_end(piece) if i is None else i
    word = piece[:i]
    if not word:
        return False
    if _KEY_NOT_UNIT.fullmatch(word) is not None:
        return True
    return piece[i:i + 1] in (":", "=") and i > 2 and word.isalpha() and classify(word)[0] != "other"


def key_before(piece: str, glued: bool) -> str:
    """The key a piece of text gives the number after it (``" | lm loss: "`` -> ``lm loss``).

    ``glued``: the piece starts right after a number, so its first token is that number's unit
    (``ms, mfu `` -> ``mfu``). A parenthesis after a key is a unit (``(ms)``), dropped, or a
    statistic (``loss (avg):``), kept as a word of the key.
    """
    s = piece
    if signed(s, "-+"):
        s = s[:-1]                             # the number's sign: `loss: -1.0000`, `nll_-3.45`
    if glued:
        i = _word_end(s)
        if not key_run_in(s, i):
            s = s[i:]
    if "s " in s:
        s = _POSSESSIVE.sub("", s)
    s = s.rstrip(_QUOTES + _MARKDOWN + "[(~")       # (markdown's code and emphasis: loss: `2.31`, **loss**:)
    s = s.rstrip(" \t:=\uff1a").rstrip(_QUOTES + _MARKDOWN)   # (and a full-width colon: `损失：2.3`)
    if s[-1:] in ">\u2192\u21d2":
        s = _ARROW.sub("", s)                  # an arrow for a colon: nanoT5's `Loss --> 5.386`, `loss => 2.3`
    if s[-1:] in "|2\u2016":
        bars = NORM_BARS.search(s)             # a norm's bars around the gradient: `||g||`, `|grad|`, `||grad||_2`
        if bars is not None:
            return bars.group(0).strip()
    if s[-1:] == "_" and s[-2:-1].isalnum():   # a key glued to its value by an underscore: `loss_2.31`
        s = s[:-1]
    qualifier = ""
    if s.endswith(")") and "(" in s:           # `elapsed time per iteration (ms):`
        inner = s[s.rfind("(") + 1:-1]
        if _STATISTIC_QUALIFIERS.intersection(inner.lower().split()):
            qualifier = " " + inner
        s = s[:s.rfind("(")].rstrip()
    elif s.endswith("]") and "[" in s:         # `| [Loss] 51566519.44 | [step]    89 |`
        inner = s[s.rfind("[") + 1:-1].strip()
        if inner[:1].isalpha():
            return inner
    if s[-1:] in "|\u2502\u2503\u2551":        # a key in a cell of its own: `| loss | 0.0453 |`
        inner = s[:-1].rstrip()
        m = _AFTER_LAST_CUT.search(inner)
        if (m.group(1) if m else inner).strip()[:1].isalpha():
            s = inner
    m = _AFTER_LAST_CUT.search(s)
    cut = m.start() if m else -1
    for sep in (" - ", "  "):                  # Keras ` - loss: `, torchtitan's double spaces
        j = s.rfind(sep)
        if j >= 0 and j + len(sep) - 1 > cut:
            cut = j + len(sep) - 1
    m = _LAST_SEPARATOR_WORD.match(s, cut + 1) if _PUNCTUATION(s, cut + 1) else None
    if m is not None:
        cut = m.end() - 2
    key = s[cut + 1:].strip()
    if key.endswith(" is") and (". " in piece or cut >= 0):
        # prose: BigDL's `.../second. Loss is 1.26.`, MindSpore's `epoch: 1 step: 100, loss is
        # 2.30`: after a sentence or a field (not a warning's own `loss is nan at step 12`)
        key = key[:-3].rstrip()
        key = key[key.rfind(". ") + 2:] if ". " in key else key
    if key[:1] in _MARKDOWN:
        key = key.lstrip(_MARKDOWN)            # `**Step 4000**`: markdown's emphasis, no part of the name
    return key + qualifier if key else key


def paths(texts: list[str]) -> list[str]:
    """The enclosing dict keys of every number (``{"train": {"loss": 2}}`` -> ``train``)."""
    stack: list[str] = []
    out = []
    for piece in texts[:-1]:
        for m in _PATH_TOKENS.finditer(piece):
            if m.group(0) == "}":
                if stack:
                    stack.pop()
            else:
                stack.append((m.group(1) or "").strip())
        out.append("/".join(p for p in stack if p))
    return out


def noise(texts: list[str], nums: list[str]) -> list[bool]:
    """Numbers that are no values: parts of names (``rank0``, ``v1.2``), times of day and
    durations (``09:30:39,305``, ``00:30<00:36``), dates (``2023-03-22``, ``07/21/2024``,
    ``10/30 22:18:02``) and the start of a range (``1-1020``, ``[100:200]``, ``steps 1000 -
    2000``, ``(100–200)``: an interval, whose end counts)."""
    n = len(nums)
    out = [False] * n
    for i in range(n):
        before, after = texts[i], texts[i + 1]
        if before and (before[-1].isalpha() or before[-1] == "." or (
                before[-1] == "_" and "." not in nums[i] and not _counter_glued(before, after))):
            out[i] = True   # digits inside a name (`resnet_50`); a fraction after `_` is a value (`loss_2.31`)
        if (after == ":" and i + 1 < n) or (before == ":" and i > 0):
            out[i] = True
    for i in range(n - 1):
        if _range(texts, nums, i):
            out[i], out[i + 1] = True, False
        if before in (",", ".") and i > 1 and out[i - 1] and texts[i - 1] == ":":
            out[i] = True
    for i in range(n - 1):
        sep = texts[i + 1]
        if sep not in ("/", "-"):
            continue
        if i + 2 < n and texts[i + 2] == sep:
            out[i] = out[i + 1] = out[i + 2] = True                    # a date
        elif sep == "-":
            out[i] = True                                              # a range: its end counts
        elif i + 2 < n and texts[i + 2] in (" ", "T", "-") and texts[i + 3:i + 4] == [":"] \
                and _day_or_month(nums[i]) and _day_or_month(nums[i + 1]):
            out[i] = out[i + 1] = True                                 # 10/30 22:18:02 (not `12/100 0:00:01`)
    return out


_LAST_WORD = re.compile(r"([A-Za-z]+)$")


def _counter_glued(before: str, after: str) -> bool:
    """Whether an integer after `_` is a counter's, glued to its name (`step_1200 loss_-0.53`,
    `iter_100`): the name a counter's word, the integer ending the name (not `step_10_ckpt`)."""
    word = _LAST_WORD.search(before[:-1])   # (`global_step_1200`: its last word)
    return word is not None and word.group(1).lower() in _RANGE_WORDS | {"epoch", "ep"} \
        and not after[:1].isalnum() and after[:1] not in "_."


def _day_or_month(num: str) -> bool:
    """Whether a number can be a date's day or month: 1 or 2 digits, 1 to 31."""
    return num.isdigit() and len(num) <= 2 and 1 <= int(num) <= 31


def _range(texts: list[str], nums: list[str], i: int) -> bool:
    """Whether numbers ``i`` and ``i + 1`` print an interval: two integers, the second larger,
    joined by ``:`` (not a time: minutes and seconds are two digits below 60), `` - `` or ``–``
    (not a field separator: the text before the first opens a bracket or names a counter)."""
    sep, a, b = texts[i + 1], nums[i], nums[i + 1]
    if sep.strip() not in (":", "-", "\u2013") or not (a.isdigit() and b.isdigit()) or int(b) <= int(a):
        return False
    after = texts[i + 2] if i + 2 < len(texts) else ""
    if after[:1].isalnum() or after[:1] in "./":
        return False                          # `2000s`, `100-200/1000`
    if sep == ":":
        return after[:1] != ":" and not (len(b) == 2 and int(b) < 60)   # not `12:30`, `1:00:05`
    if sep == "-":
        return False                          # `1-1020`: the rule of ranges without spaces
    before = texts[i].rstrip()
    word = _TRAILING_WORD.search(before)
    return before.endswith(("[", "(")) or (word is not None and word.group(1).lower() in _RANGE_WORDS)


_RANGE_WORDS = frozenset({"step", "steps", "batch", "batches", "iter", "iters", "iteration",
                          "iterations", "it", "update", "updates", "sample", "samples"})


def glued_names(texts: list[str], nums: list[str]) -> list[str | None]:
    """Counter names glued to their number (``ep6``, ``it156``, ``1epoch``, ``1020batch``)."""
    out: list[str | None] = [None] * len(nums)
    for i, num in enumerate(nums):
        m = _TRAILING_WORD.search(texts[i])
        if m and m.group(1).lower() in _GLUED_BEFORE and not texts[i + 1][:1].isalpha():
            out[i] = _GLUED_BEFORE[m.group(1).lower()]
        elif num.isdigit():
            m = _LEADING_WORD.match(texts[i + 1])
            if m and m.group(1).lower() in _GLUED_AFTER:
                out[i] = _GLUED_AFTER[m.group(1).lower()]
    return out


def befores(texts: list[str], nums: list[str], is_noise: list[bool],
            glued: list[str | None]) -> list[str]:
    """The text each number's key is read from: its own piece, or, where digits or a non-finite
    word sit inside the next key's name (``optim0_lr0=``, ``number of nan iterations:``), the
    pieces joined up to it."""
    out = list(texts[:len(nums)])
    for i in range(len(nums) - 1):
        if glued[i]:
            continue
        if is_noise[i] and _range(texts, nums, i):
            out[i + 1] = " " + out[i]          # `steps 1000 - 2000`: the end is the steps' (the
            continue                           # space: no unit of the number before it)
        if nums[i][:1] in "nNiI" and _WORD_INSIDE_KEY.match(texts[i + 1]) \
                and not texts[i].rstrip(" '\"").endswith((":", "=")):
            is_noise[i] = True
            out[i + 1] = out[i] + nums[i] + texts[i + 1]
        elif is_noise[i] and (texts[i][-1:].isalpha() or texts[i][-1:] == "_"):
            out[i + 1] = out[i] + nums[i] + texts[i + 1]
    return out


#: Words printed after a number that are its unit, not its name (`12.3 s`, `0.5 GB`).
_UNIT_WORDS = frozenset({"s", "sec", "secs", "second", "seconds", "ms", "us", "min", "mins", "minutes", "h",
                         "hr", "hours", "it/s", "s/it", "samples/s", "tokens/s", "tok/s", "img/s", "b", "kb",
                         "mb", "gb", "kib", "mib", "gib", "tb", "samples", "tokens", "steps", "epochs", "iters",
                         "it", "remaining", "left", "elapsed", "eta"})
_NAME_AFTER = re.compile(r"\s*\(?([A-Za-z][\w./-]*(?: [A-Za-z][\w./-]*){0,3})\)?\s*")
_AFTER_NAME_CUT = re.compile(r"\s-\s|[|,;\t]")


def names_after(texts: list[str], befores: list[str], has_key: list[bool]) -> None:
    """A line that prints each name after its value (``2.31 train loss | 2.40 valid loss | 0.53
    acc``, ``Epoch 3: 12.3s - 2.21 (train) - 2.30 (val)``): where the line ends with a name
    and a number with no key of its own is followed, up to a field separator, by a name alone
    (not a unit: ``12.3 s``), that name is the number's, and the next number's key is read
    from what follows the separator. ``befores`` (the text each key is read from) is changed
    in place; ``has_key[i]``: number ``i`` has a key printed before it, or a name glued."""
    n = len(befores)
    if n < 2 or not _after_name(texts[n], last=True):
        return
    taken = False
    for i in range(n):
        if has_key[i] and not taken:
            continue
        taken = False
        piece = texts[i + 1]
        if not piece[:1].isspace() and piece[:1] != "(":
            continue
        name = _after_name(piece, last=i == n - 1)
        if name:
            befores[i] = f" {name[0]}: "
            if i + 1 < n:
                befores[i + 1] = name[1]
                taken = True


def _after_name(piece: str, last: bool) -> tuple[str, str] | None:
    """``(name, the text after its separator)`` of a piece after a number that is a name alone
    up to a field separator (or the line's end, ``last``), else None."""
    cut = _AFTER_NAME_CUT.search(piece)
    head, rest = (piece[:cut.start()], piece[cut.start():]) if cut else (piece, "")
    if not last and cut is None:
        return None
    m = _NAME_AFTER.fullmatch(head)
    if m is None or m.group(1).lower() in _UNIT_WORDS or any(c.isalpha() for c in rest):
        return None
    return m.group(1), rest


def in_loss_group(texts: list[str], i: int) -> bool:
    """Whether number ``i`` sits in a bracketed group named for losses (``[Losses: ... total``).
    Reads back from number ``i`` to the group's opening bracket only."""
    for j in range(i, -1, -1):
        piece = texts[j]
        k_open = max(piece.rfind(c) for c in "[({")
        k_close = max(piece.rfind(c) for c in "])}")
        if k_open > k_close:
            return "loss" in piece[k_open:].lower().split(":")[0]
        if k_close >= 0:
            return False
    return False


def pipes(line: str) -> str:
    """The line with box-drawing verticals (rich's tables: ``│ 1 │ 0.52 │``) as ``|``."""
    return line.translate(_BOX_VERTICALS)


def separator(line: str) -> str:
    """What separates a table line's cells: ``|`` where it has one (rich's box verticals too),
    ``,`` where it has a comma and no blank inside (a CSV's header pasted in a text:
    ``step,loss,lr``), a tab where tabs part names with blanks inside (``Step\tTraining Loss``),
    else whitespace runs (``""``)."""
    line = line.translate(_BOX_VERTICALS)
    if "|" in line:
        return "|"
    if "\t" in line.strip() and " " in line.strip().replace("\t", ""):
        return "\t"    # tab-separated names with blanks inside (HF's notebook table copied: `Step\tTraining Loss`)
    return "," if "," in line and not any(c.isspace() for c in line.strip()) else ""


def cells(line: str, sep: str | None = None) -> list[str]:
    """The cells of a table line, separated by ``sep`` (:func:`separator`'s; None: the line's own).

    >>> cells("Step | Training Loss | reward"), cells("   Epoch    GPU_mem   box_loss"), cells("step,loss,lr")
    (['Step', 'Training Loss', 'reward'], ['Epoch', 'GPU_mem', 'box_loss'], ['step', 'loss', 'lr'])
    """
    line = line.translate(_BOX_VERTICALS)       # rich's box tables: `│ 1 │ 0.52 │`
    sep = separator(line) if sep is None else sep
    if sep == "|":
        return [c.strip() for c in line.strip().strip("|").split("|")]
    if sep in (",", "\t"):
        return [c.strip() for c in line.strip().split(sep)]
    return line.split()


def fold(texts: list[str]) -> str:
    """A template with whitespace runs and the numbers' signs folded (lines that differ only in
    padding or sign share it; a right-aligned count's padding inside its bracket too: timm's
    `[  0/500` and `[100/500`)."""
    return _PADDED.sub("", _SIGN.sub("\x00", _WHITESPACE.sub(" ", "\x00".join(texts))))
