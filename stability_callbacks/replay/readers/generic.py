"""The generic metric-line reader: any text log whose lines print training metrics.

A small grammar that learns each log's structure from the log (docs/replay.md, The reader
grammar): each line is cut into numbers and its template (:mod:`.tokens`); a template is
interpreted once — which number is the step, which the loss, what kind of line — from the
line's structure and the vocabulary as a tie-breaker (:mod:`.plan`, :mod:`.vocabulary`), and
where that leaves a counter open, from what the template's integers do across its lines
(:class:`Template`: the one that counts up is the step). Records printed one key per line are
joined into one line first (:class:`Blocks`), and a per-epoch history printed as arrays becomes
a line per epoch (:mod:`.history`). The plan is cached, so an ordinary line costs one
regular-expression match and a few ``float()`` calls. The assembler (:mod:`.assemble`) turns
the lines into records; :class:`Reading` holds lines, in order, while a template is watched.
Tables (a header row of names, rows of values) are read as their rows' ``name: value`` pairs.

``--keys`` names (or positions) come before every rule; ``--pattern`` replaces the grammar by
one regular expression.

Memory is O(1) per line (plus at most ``MAX_TEMPLATES`` cached plans and ``HOLD_MAX_LINES`` held
lines); cost is linear in the line's length, however many numbers it holds.
"""
from __future__ import annotations

import math
import re
from collections import deque
from typing import Any, Callable, Iterable, Iterator, Mapping, Sequence

from ...record import StepRecord
from . import tokens
from .account import ReadAccount
from .assemble import NAN_WARNING, Assembler
from .checkpoints import saved, says_saved
from .history import Histories
from .plan import LOSS_KINDS, Plan, choose_counter, count_after_slash, make_plan, report_row, signed, warning
from .source import FENCE, segments, several, strip_prefix
from .vocabulary import classify, normalise_key

MAX_TEMPLATES = 4096
_NO_PLAN = Plan()
# Plans are pure functions of a template, which of its numbers are integers (what may count) and
# the user's keys: shared by every reader of the process (detection and reading of one log
# interpret each template once; another log's `1,-1.19` is no plan for `2.1689,-196.21`).
_PLANS: dict[tuple, Plan] = {}
# A learned record template as one regular expression: the next line of the same shape is read
# by a single match (about twice as fast as splitting it), whitespace runs of any width. Only
# templates of ordinary lines are compiled (a regular expression per number costs to build).
_COMPILE_MAX_NUMBERS = 64
_TEMPLATE_NUMBER = f"({tokens.NUM})"
# ... matched possessively (a quarter faster: the engine keeps no way back into it), where the
# text after it could take back nothing of it (_template_match)
_TEMPLATE_NUMBER_HELD = r"(\d++(?:\.\d++)?+(?:[eE][-+]?\d++)?+)"
_SPACES = re.compile(r"(?:\\[ \t])+")
_DIGIT = re.compile(r"\d").search
_RULE_CELL = re.compile(r"^:?-{2,}:?$")
_NAME_CELL = re.compile(r"^[A-Za-z][\w ()./%-]*$")
# A model summary's header (Lightning's `| Name | Type | Params | Mode`, Keras's `Layer (type)  Output Shape
# Param #`): its rows name modules, a loss module among them (`1 | criterion | CrossEntropyLoss | 0`), and
# count parameters: no records.
_PARAMS_CELL = re.compile(r"^(?:# ?)?params?(?: ?#)?$", re.I)
# A template is watched for LEARN_LINES lines at least (two steps up), LEARN_MAX_LINES at most;
# lines wait behind an undecided template for HOLD_MAX_LINES at most.
LEARN_LINES = 3
LEARN_MAX_LINES = 16
HOLD_MAX_LINES = 4096
# A section row above one-key lines (stable-baselines3's `| train/ |`, `rollout/`).
_SECTION = re.compile(r"^\|?\s*([A-Za-z][\w ]*?)\s*/\s*(?:\|\s*)*$")
_AFTER_VALUE = " \t|,;"
SEVERAL = "records read from lines that hold several (a template repeated within the line: text re-wrapped)"
HEAD_DROPPED = "partial records dropped at a line's start (the line cuts the record's start, printed on no line)"
CUT_JOINED = "records cut by a line's end, read with the next line"
CUT_DROPPED = "partial records dropped at a line's end (no line goes on with it)"
WRAPPED_JOINED = "lines wrapped inside a record (a dict left open, a key with its value on the next line), read joined"
#: Lines a wrapped record may span beyond its first; a dict still open, as many as a pretty-printed
#: one has keys (``pprint.pformat`` of EasyLM's metrics: one key per line).
_WRAP_JOINS = 3
_DICT_JOINS = 64
_KEY_CUT = re.compile(r"[A-Za-z_)\]'\"]\s*[:=]\s*$")
#: A field's value, then a separator, then the key a wrap cut from its value (`loss 2.7 | lr:`).
_FIELD_BEFORE_KEY = re.compile(r"\d\s*(?:[|,;]|\s-\s|\s{2,})\s*([A-Za-z_][\w/ .-]*?)\s*[:=]\s*$")


def _open_braces(text: str) -> int:
    """The braces a line leaves open (``{'loss': 2.7, 'grad_norm': 1.9,``: 1), negative where it
    closes more than it opens."""
    return text.count("{") - text.count("}") if "{" in text or "}" in text else 0


def _one_side(cells: list[str], training: list[int], evals: list[int]) -> bool:
    """Whether a table's row has numbers on one side only, training columns or an evaluation's, the
    other side's cells all ``NaN`` (pandas' missing value): a row of one kind in a frame of both."""
    def side(cols):
        return {"NaN" if cells[i] == "NaN" else "number" if cells[i][:1].isdigit() else "" for i in cols if i < len(cells)}
    a, b = side(training), side(evals)
    return (a == {"number"} and b == {"NaN"}) or (b == {"number"} and a == {"NaN"})


def _wraps(text: str) -> bool:
    """Whether a line stops inside a record a wrap cut (an e-mail or terminal wrap of a pasted
    log): a dict it opens and does not close (``{'loss': 2.7, 'grad_norm': 1.9,``), or a key
    whose value is not on it, a metric's or a counter's (``loss 2.7 | lr:``); the next line goes
    on with it."""
    if not _DIGIT(text):
        return False                   # (prose, a header `Run:`, a pretty-printed JSON's `{`: no record)
    if _open_braces(text) > 0:
        return _DIGIT(text, text.rfind("{")) is not None   # values in the dict it leaves open
    m = _FIELD_BEFORE_KEY.search(text) if _KEY_CUT.search(text) else None
    return m is not None and classify(m.group(1))[0] in ("metric", "step", "component", "epoch", "statistic")
HISTORY_SUMMARY = "run summary (a history of the records above, printed as arrays)"
SAVE_LINE = "a checkpoint's save (no header of the records after it)"
_REASONS = {"eval": "evaluation", "summary": "run summary", "ignore": "no training metric",
            "overflow": "overflow (folded into the next record)", "epoch": "epoch header",
            "header": "step header", "nan": NAN_WARNING}


def _integers(nums: Sequence[str]) -> int:
    """Which of a line's numbers are integers, as bits (a plan reads its counters from them)."""
    bits = 0
    for i, num in enumerate(nums):
        if num.isdigit():
            bits |= 1 << i
    return bits


class LineReader:
    """Interpretation of single lines: ``(numbers, plan)`` or ``None`` for a line without
    numbers. Plans of templates are cached; the last record template is tried first.

    With ``learn``, a template whose plan leaves an integer open as a possible counter (no step
    by name or structure) is watched across its lines (:class:`Template`) before its plan is
    final: :meth:`interpret` returns it with the line until then (the caller holds the line)."""

    def __init__(self, user_keys: Mapping[str, str] | None = None,
                 pattern: re.Pattern | None = None, learn: bool = False,
                 names: Mapping[str, str] | None = None):
        self.user = {normalise_key(k) if not k.strip().isdigit() else k.strip(): v
                     for k, v in (user_keys or {}).items()}
        self._user_key = tuple(sorted(self.user.items()))
        self.pattern = pattern
        self.names = dict(names or {})                # how the account names the pattern's groups
        self.learn = learn
        self.last: Plan | None = None
        self.table: tuple[list[str], list[int], str, tuple[list[int], list[int]]] | None = None   # header,
        # key columns, separator, (the loss's columns, an evaluation's)
        self.table_width = 0                  # the cells of the table's first row
        self.templates: dict[str, Template] = {}      # this log's templates that were watched
        self.row = False                              # the last line tokenized was a table's row
        self.counter_names: set[str] = set()          # the names of the counters they showed
        self.model_summary = 0                        # inside a model summary's rows: their cells (_PARAMS_CELL)

    def parse(self, seg: str) -> tuple[tuple | list, Plan] | None:
        """``(numbers, plan)`` of one line, or None (no numbers)."""
        last = self.last
        if last is not None and last.match is not None:   # a record plan: compiled
            m = last.match(seg)
            if m is not None:
                return m.groups(), last
        if self.pattern is not None:
            return self._parse_pattern(seg)
        got = self.tokenize(seg)
        if got is None:
            return None
        plan, _ = self.interpret(*got)
        return got[1], plan

    def tokenize(self, seg: str) -> tuple[list[str], list[str]] | None:
        """``(texts, numbers)`` of a line (a table row as its ``name: value`` pairs), or None for
        a line without numbers (which may start a table)."""
        texts, nums = tokens.split(seg)
        if not nums or ("|" in seg and texts[0][-1:].isalpha() and all(tokens.noise(texts, nums))):
            self._table_header(seg)       # (a header's names may hold digits: `Overall F1`, `Top5 Acc`)
            return None
        if self.model_summary:
            if 0 <= len(tokens.cells(seg, "|")) - self.model_summary <= 1 and "%|" not in seg:   # (+1: the index)
                return None               # a module's row of a model summary (said as a line of no numbers)
            self.model_summary = 0
        self.row = False
        if self.table is not None:
            row = self._table_row(seg)
            if row is not None:
                texts, nums = tokens.split(row)
                self.row = True
        return texts, nums

    def interpret(self, texts: list[str], nums: list[str]) -> tuple[Plan, Template | None]:
        """The plan of a tokenized line, and the :class:`Template` still watching its numbers
        (None once the plan is final)."""
        tkey = ("\x00".join(texts), self._user_key, _integers(nums))
        plan = _PLANS.get(tkey)
        if plan is None:
            if len(_PLANS) >= MAX_TEMPLATES:
                _PLANS.clear()
            plan = _PLANS[tkey] = make_plan(texts, nums, self.user)
            plan.merged = tokens.fold(texts)
        if (plan.counters or plan.slash) and self.learn:
            watched = self.templates.get(plan.merged)
            if watched is None:
                watched = self.templates[plan.merged] = Template(texts, nums, plan)
            if not watched.settled:
                return plan, watched
            plan = watched.for_line(plan)
        if plan.kind == "record":
            if plan.match is None and len(nums) <= _COMPILE_MAX_NUMBERS:
                plan.match = _template_match(texts)
            self.last = plan
        return plan, None

    def decide(self, watched: Template) -> None:
        """The template's final plan, from what its numbers did (:meth:`Template.hints`), or
        from the counter another template of the log showed (the same printed name: a line
        that differs in the digits of another number, `Sen. 965,843` beside `Sen. 1,052,108`)."""
        hints = watched.hints() or self._named_counter(watched)
        watched.plan = (make_plan(watched.texts, watched.nums, self.user, hints=hints) if hints else
                        count_after_slash(watched.names_plan) if watched.total_moved else watched.names_plan)
        watched.plan.merged = watched.names_plan.merged
        watched.settled = True
        if hints:
            i = next(iter(hints))
            name = next((nm for j, nm in watched.names_plan.counters if j == i), "")
            if name and name not in self.counter_names:
                self.counter_names.add(name)
                for other in list(self.templates.values()):
                    if not other.settled and self._named_counter(other):
                        self.decide(other)

    def _named_counter(self, watched: Template) -> dict[int, str]:
        """{index: "step"} for a counter named as one this log's lines showed, or {}."""
        for i, name in watched.names_plan.counters:
            if name and name in self.counter_names:
                return {i: "step"}
        return {}

    def _table_header(self, line: str) -> None:
        """A row of names with a step or epoch column and a loss column starts a table; rule
        rows (``-- | --``) keep it."""
        cells = tokens.cells(line)
        if len(cells) < 2 or all(_RULE_CELL.match(c) for c in cells if c):
            return
        if not all(_NAME_CELL.match(c) for c in cells if c):
            return
        if any(_PARAMS_CELL.match(c) for c in cells):
            self.model_summary = len(cells)   # (its rows follow, as many cells each: see tokenize)
            return
        if not all(cells):
            return
        roles = [classify(c, self.user)[:2] for c in cells]
        counters = [i for i, (r, _) in enumerate(roles) if r in ("step", "epoch")]
        losses = [i for i, (r, k) in enumerate(roles) if k == "loss" and r in ("metric", "component")]
        if counters and losses:
            evals = [i for i, (r, _) in enumerate(roles) if r == "eval"]
            self.table, self.table_width = (cells, counters + losses, tokens.separator(line), (losses, evals)), 0

    def _table_row(self, line: str) -> str | None:
        """A table row as ``name: value | ...``, or None when the line is no row of it."""
        assert self.table is not None
        names, key_cols, sep, (losses, evals) = self.table
        cells = [c.strip("*_`") for c in tokens.cells(line, sep)]   # (markdown's emphasis on a row: `**0.412**`)
        if not len(names) <= len(cells) <= len(names) + 8:
            return None
        width = len(cells)
        if self.table_width and width != self.table_width and report_row(cells):
            return None                   # a report after the table (a classification report's rows)
        if width == len(names) + 1 and self.table_width in (0, width) and sep not in ("|", ",", "\t") \
                and cells[0].isdigit():
            cells = cells[1:]             # a pandas frame's index, a column with no name, on every row
        if "NaN" in cells and evals and _one_side(cells, losses, evals):
            # pandas' missing value in a frame of a trainer's history (HF's log_history: the training
            # columns NaN on an evaluation's rows and the evaluation's on the training rows): no NaN
            cells = ["" if c == "NaN" else c for c in cells]
        if any(not cells[i][:1].isdigit() and cells[i][:2] != "-0" and cells[i][:1] != "-"
               and cells[i].lower() not in ("nan", "inf", "infinity", "no log") for i in key_cols):
            return None                   # (HF's `No log`: a training loss not logged by that row's step)
        self.table_width = self.table_width or width
        return " | ".join(f"{name}: {cell.rstrip(':')}" for name, cell in zip(names, cells)
                          if cell[:1].isdigit() or cell[:1] == "-" or cell.lower() in ("nan", "inf", "infinity"))

    def _parse_pattern(self, seg: str):
        m = self.pattern.search(seg) if self.pattern is not None else None
        if m is None:
            return None
        nums: list[str] = []
        metrics: list[tuple[int, str, bool]] = []
        step = None
        outer: tuple[int, ...] = ()
        for name, value in m.groupdict().items():
            if value is None:
                continue
            if name == "step":
                step = len(nums)
            elif name == "epoch":
                outer = (len(nums),)      # counts the step's epochs if it goes up as the step restarts
            else:
                metrics.append((len(nums), name, False))
            nums.append(value.strip())
        loss_at = next((i for i, k, _ in metrics if k == "loss"), None)
        said = self.names
        printed = tuple((k, said.get(k, f"(?P<{k}>)")) for _, k, _ in metrics) + (
            (("step", said.get("step", "(?P<step>)")),) if step is not None else ())
        # an epoch group without a step numbers the records by their epochs
        return nums, Plan(metrics=tuple(metrics), step=step, loss_at=loss_at, printed=printed,
                          loss_kind="exact" if loss_at is not None else "", step_name=said.get("step", ""),
                          outer=outer if step is not None else (),
                          epoch=outer[0] if outer and step is None else None)


class Template:
    """What the integers of one template (its lines with whitespace and signs folded) do across
    its lines: the one that increases from line to line, strictly or with repeats, is the step;
    one that goes down or is no integer is not. ``observe`` is O(candidates) per line; a
    template is watched for at most ``LEARN_MAX_LINES`` lines.

    >>> reader = LineReader(learn=True)
    >>> for line in ("Update 12: avg loss 1.2", "Update 13: avg loss 1.1", "Update 14: avg loss 1.0"):
    ...     plan, watched = reader.interpret(*reader.tokenize(line))
    ...     if watched is not None and watched.observe(reader.tokenize(line)[1]):
    ...         reader.decide(watched)
    >>> plan = reader.interpret(*reader.tokenize("Update 15: avg loss 0.9"))[0]
    >>> plan.step, plan.step_name, plan.loss_kind
    (0, 'Update', 'statistic')
    """

    __slots__ = ("texts", "nums", "names_plan", "plan", "settled", "lines", "last", "ups", "dead",
                 "epoch_last", "epoch_ups", "_signed", "total_moved")

    def __init__(self, texts: list[str], nums: list[str], names_plan: Plan):
        self.texts, self.nums, self.names_plan = texts, nums, names_plan
        self.plan = names_plan
        self.settled = False
        self.lines = 0
        n = len(names_plan.counters)
        self.last: list[int] = [0] * n
        self.ups = [0] * n
        self.dead = [False] * n
        self.epoch_last = -1
        self.epoch_ups = 0                    # lines whose epoch was up on the line before
        self._signed: dict[tuple[int, ...], Plan] = {}
        self.total_moved = False              # a slash's count stayed and its total moved (Plan.slash)

    def for_line(self, own: Plan) -> Plan:
        """The template's plan for one of its lines (``own``: that line's plan by names): with
        that line's signs, not its first line's (:func:`.plan.signed`)."""
        if own.signs == self.plan.signs:
            return self.plan
        got = self._signed.get(own.signs)
        if got is None:
            got = self._signed[own.signs] = signed(self.plan, own.signs)
        return got

    def observe(self, nums) -> bool:
        """One more line of the template; True once its numbers have said enough (a number
        rose over ``LEARN_LINES`` lines, or ``LEARN_MAX_LINES`` lines passed; a count and its
        total: their second line)."""
        first = self.lines == 0
        at, total_at = self.names_plan.step, self.names_plan.step_total
        if self.names_plan.slash and at is not None and total_at is not None:
            if not first:
                self.total_moved = nums[at] == self.nums[at] and int(nums[total_at]) > int(self.nums[total_at])
            self.lines += 1
            return not first
        at = self.names_plan.epoch
        if at is not None and nums[at].isdigit():
            epoch = int(nums[at])
            self.epoch_ups += not first and epoch > self.epoch_last
            self.epoch_last = epoch
        went_up = -1                          # the first counter up on this line (its index)
        for j, (i, _) in enumerate(self.names_plan.counters):
            text = nums[i]
            if self.dead[j] or not text.isdigit():
                self.dead[j] = True
                continue
            value = int(text)
            if not first:
                if value > self.last[j]:
                    self.ups[j] += 1
                    went_up = j if went_up < 0 else went_up
                elif value < self.last[j] and not 0 <= went_up < j:
                    self.dead[j] = True       # down, and no counter before it up: no counter
                    # (one that restarts as a counter before it goes up counts that one's epochs)
            self.last[j] = value
        self.lines += 1
        rose = any(u and not d for d, u in zip(self.dead, self.ups))
        return (self.lines >= LEARN_LINES and rose) or self.lines >= LEARN_MAX_LINES

    def hints(self) -> dict[int, str]:
        """{number index: "step"} for the counter the lines showed, or {} (none increased, or
        the line's epoch went up on every line: nothing finer is needed)."""
        if self.lines > 1 and self.epoch_ups == self.lines - 1:
            return {}
        ups = {c: u for c, dead, u in zip(self.names_plan.counters, self.dead, self.ups) if u and not dead}
        return {choose_counter(list(ups), {i: u for (i, _), u in ups.items()}): "step"} if ups else {}


class _LossWait:
    """Lines whose loss is a statistic (``avg loss``) or a sum of terms, held while the log has
    not shown whether it prints the loss itself (an epoch's summary may come before the lines of
    the next epoch): settled by a line with the loss itself, or after ``LEARN_LINES`` of them."""

    __slots__ = ("settled", "lines")

    def __init__(self):
        self.settled = False
        self.lines = 0


class Blocks:
    """Records printed one key per line: consecutive lines of one key and one value each, with
    distinct keys (stable-baselines3's tables between rule lines, with their ``train/`` section
    rows; ``key: value`` blocks between blank lines, the step anywhere in them), make one line
    ``key: value | key: value | ...``. The line right above a block that is no record itself
    (``Epoch 3 of 500 took 494s``, ``[test] epoch: 1/10``) heads it: its text opens the joined
    line (its epoch, its split). A key seen again, or any other line, ends the block; a block of
    one line is that line. Memory: one block (``MAX_LINES``)."""

    MAX_LINES = 256
    MAX_DEPTH = 64

    def __init__(self, heads=None):
        self.items: list[tuple] = []          # (unit, key, value text)
        self.keys: set[str] = set()
        self.section = ""
        self.heads = heads                    # (texts, nums) -> whether a line may head a block
        self.above: tuple | None = None       # the unit above, which may head a block
        self.head: str = ""
        self.summary = False                  # the block opened with a run summary's key
        # the JSON objects open around a pretty-printed record: a named one (`"train": {`) nests
        # keys in it (`train/loss`), an unnamed one (`{`) is the record's own
        self.objects: list[str | None] = []

    def offer(self, unit: tuple) -> list[tuple]:
        """A unit ``(line_no, seg, indent, texts, nums, row)`` (``texts`` None: no numbers) -> the
        units that are final now."""
        _, seg, _, texts, nums, _ = unit
        if texts is None:
            if self._nests(seg):
                return []
            section = _SECTION.match(tokens.pipes(seg).strip())
            if section is not None:           # a section row inside a block, or above one
                self.section = section.group(1)
                return [unit] if not self.items else []
            self.section = ""
            out = self.end() + [unit]
            self.above = unit if any(c.isalpha() for c in seg) else None
            return out
        kv = _key_value(texts, nums)
        if kv is None and self.items and _list_value(texts):
            return []                         # `- IoU per class: [0.34, 0.57]`: a list, in the block
        if kv is None:
            self.section = ""
            out = self.end() + [unit]
            self.above = unit
            return out
        key = f"{self.section}/{kv[0]}" if self.section else kv[0]
        # a run summary's key (`best loss`, `train_runtime`) after a record's keys opens a block of
        # its own: the record before it is no part of the summary (before: `loss: 0.3` then `best
        # loss: 0.2` joined, the whole a summary, and the log's last record lost)
        summary = classify(kv[0])[0] == "summary"
        out = self.end() if key in self.keys or len(self.items) >= self.MAX_LINES or (
            summary and self.items and not self.summary) else []
        if not self.items:
            self.summary = summary
            above, self.above = self.above, None
            self.head = "" if above is None or (above[3] is not None and not (
                self.heads is not None and self.heads(above[3], above[4]))) else above[1].strip()
        self.items.append((unit, key, kv[1]))
        self.keys.add(key)
        return out

    def _nests(self, seg: str) -> bool:
        """Whether a line of a pretty-printed JSON record opens or closes an object nested in it
        (``"train": {`` ... ``},``: its keys stay in the record, named ``train/...``); a record's
        own ``{`` and ``}`` end a block as any line without numbers does."""
        opened = _JSON_OPENS(seg)
        if opened is not None:
            del self.objects[:-self.MAX_DEPTH]      # (braces a log never closes: bounded)
            self.objects.append(opened.group(1))
            if opened.group(1) is None:
                return False
        elif not (self.objects and _JSON_CLOSES(seg)) or self.objects.pop() is None:
            return False
        self.section = (self.objects[-1] or "") if self.objects else ""
        return True

    def end(self) -> list[tuple]:
        """The block so far, as units (one joined line, or the one line it holds)."""
        items, self.items = self.items, []
        self.keys = set()
        if len(items) < 2:
            return [unit for unit, _, _ in items]
        line_no, _, indent, _, _, _ = items[0][0]
        joined = " | ".join([self.head] * bool(self.head) + [f"{key}: {value}" for _, key, value in items])
        texts, nums = tokens.split(joined)
        return [(line_no, joined, indent, texts, nums, False)]


_JSON_OPENS = re.compile(r'\s*(?:"([^"]+)"\s*:\s*)?\{\s*$').match
_JSON_CLOSES = re.compile(r"\s*\}\s*,?\s*$").match


def _list_value(texts: list[str]) -> bool:
    """Whether a line prints one key and a bracketed list of numbers."""
    return (len(texts) > 2 and texts[0].rstrip().endswith(("[", "(")) and texts[-1].strip() in ("]", ")")
            and all(t.strip() == "," for t in texts[1:-1]) and bool(tokens.key_before(texts[0], False)))


#: A person's note after a value in a pasted block (`"loss": NaN,   <-- here it breaks`, `# spike`).
_NOTE_AFTER = re.compile(r"[\s,;]*(?:<-+|\u2190|#|//)").match


def _key_value(texts: list[str], nums: list[str]) -> tuple[str, str] | None:
    """``(key, value)`` of a line that prints one named value and nothing after it, its name
    ending in digits too (improved-diffusion's `| loss_q0 | 0.572 |`, composer's `lr-X/group0: 1e-4`;
    not a counter's glued number, `epoch3 0.5`); a person's note after the value is no part of it."""
    if len(nums) > 1 and _NOTE_AFTER(texts[1]):
        texts, nums = texts[:2], nums[:1]   # (`"loss": NaN,  # nan from here`: the note's words are no value)
    if len(nums) == 2 and (texts[0][-1:].isalpha() or texts[0][-1:] == "_") and not any(c.isalnum() for c in texts[1]) \
            and not texts[2].strip(_AFTER_VALUE) and tokens.glued_names(texts, nums)[0] is None:   # (`epoch3 0.5`: a counter's)
        key = tokens.key_before(texts[0] + nums[0], glued=False)
        return (key, nums[1]) if key[:1].isalpha() and key.endswith(nums[0]) else None
    if len(nums) != 1 or (texts[1].strip(_AFTER_VALUE) and not _NOTE_AFTER(texts[1])) or tokens.noise(texts, nums)[0]:
        return None
    key = tokens.key_before(texts[0], glued=False)
    if not key or not key[0].isalpha() or "/" == texts[0].rstrip()[-1:]:
        return None
    before = texts[0]
    sign = "-" if tokens.signed(before) else ""
    return key, sign + nums[0]


class Reading:
    """Text lines -> records: tokenizing, records printed one key per line (:class:`Blocks`,
    with ``blocks``), templates watched until their counter shows (:class:`Template`; lines are
    held meanwhile, in order, at most ``HOLD_MAX_LINES``), the assembler. ``busy``: lines are
    held (the caller's fast path must not overtake them)."""

    def __init__(self, account: ReadAccount, user_keys: Mapping[str, str] | None = None,
                 pattern: re.Pattern | None = None, *, blocks: bool = False, rows: bool = False,
                 guess: Any = None):
        self.account = account
        self.rows = rows                      # every line is a row (JSON lines, a table)
        if guess is not None:
            pattern = guess.pattern
        self.reader = LineReader(user_keys, pattern, learn=pattern is None,
                                 names=guess.names if guess is not None else None)
        # Why a line gives nothing: no numbers, or (a pattern reads the lines) no match.
        self.unmatched = ("no numbers" if pattern is None else "not matched by --pattern" if guess is None
                          else "no progress line (the lines the loss is guessed from)")
        self.asm = Assembler(account)
        self.guessed = guess.template if guess is not None else ""
        self.blocks = Blocks(self._heads) if blocks and pattern is None else None
        self.held: deque = deque()
        self.busy = False
        self.carry = ""                       # a record a line cut at its end (see _several)
        self.wrapped: tuple[int, str, int] | None = None   # a line wrapped inside a record: (line, text, joins)
        self.carry_line = 0                   # ... and that line
        self.loss_wait: _LossWait | None = None

    def line(self, line_no: int, text: str) -> list[StepRecord]:
        """One physical line: the records it completes."""
        text = strip_prefix(text)
        out: list[StepRecord] = []
        joins = 0                                    # lines joined into the one held (see _wraps)
        if self.wrapped is not None:
            first, held, joins = self.wrapped
            self.wrapped = None
            whole = f"{held} {text.strip()}"
            if text.strip() and (held[-1] in ":=" or _open_braces(whole) >= 0):
                self.account.change(first, WRAPPED_JOINED)
                line_no, text = first, whole
            else:
                out += self._one(first, held)        # no continuation: the line as it was
                joins = 0
        if (joins < _WRAP_JOINS or (joins < _DICT_JOINS and _open_braces(text) > 0)) and _wraps(text):
            self.wrapped = (line_no, text.rstrip(), joins + 1)
            self.busy = True
            return out
        return out + self._one(line_no, text)

    def _one(self, line_no: int, text: str) -> list[StepRecord]:
        """One line, after joining what a wrap cut."""
        if self.carry:
            carry, self.carry = self.carry, ""
            if text.strip():
                text = carry + " " + text.lstrip(" \t")
                self.account.change(self.carry_line, CUT_JOINED)
            else:
                self.account.change(line_no, CUT_DROPPED)
        stripped = text.lstrip(" \t")
        indent = len(text) - len(stripped)
        units: list[tuple] = []
        if not stripped:
            units.append((line_no, "", indent, None, None, False))
        else:
            for seg in (segments(text) if several(text) else (text,)):
                seg = strip_prefix(seg)   # a coloured prefix shows once the colour codes are gone
                if self.reader.pattern is not None:
                    units.append((line_no, seg, indent, seg, None, self.rows))
                    continue
                got = self.reader.tokenize(seg)
                units.append((line_no, seg, indent, *(got if got is not None else (None, None)),
                              self.rows or self.reader.row))
        if self.blocks is not None:
            units = [u for unit in units for u in self.blocks.offer(unit)]
        out: list[StepRecord] = []
        for unit in units:
            out += self._take(unit)
        self.busy = bool(self.held) or bool(self.blocks and self.blocks.items) or bool(self.carry) \
            or self.wrapped is not None
        return out

    def lines(self, items: list) -> list[StepRecord]:
        """Lines as :class:`~.history.Histories` gives them back: ``(line_no, text)`` lines as
        printed, and histories, each read as its lines of one epoch, or, where the log printed
        records before it, a run summary of them (ignored)."""
        out: list[StepRecord] = []
        for item in items:
            if isinstance(item, tuple):
                out += self.line(*item)
            elif self.asm.made:
                self.account.ignore(item.line_no, "", HISTORY_SUMMARY)
            else:
                self.account.note(f"a history printed as arrays (line {item.line_no}): element k of each "
                                  f"array is epoch k, {len(item.epochs)} epochs")
                for text in item.epochs:
                    out += self.line(item.line_no, text)
        return out

    def _heads(self, texts: list[str], nums: list[str]) -> bool:
        """Whether a line may head a block of one-key lines: it prints no training record."""
        return _PLANS.get(("\x00".join(texts), self.reader._user_key, _integers(nums)), _NO_PLAN).kind != "record"

    def take(self, line_no: int, text: str, texts: list[str], nums: list[str]) -> list[StepRecord]:
        """A line already cut into its template ``texts`` and ``nums`` (a table's row)."""
        out = self._take((line_no, text, 0, texts, nums, self.rows))
        self.busy = bool(self.held)
        return out

    def _take(self, unit: tuple) -> list[StepRecord]:
        line_no, seg, indent, texts, nums, row = unit
        plan: Plan | None = None
        watched: Template | _LossWait | None = None
        if self.reader.pattern is not None and texts is not None:
            got = self.reader.parse(seg)
            if got is not None and not (self.guessed and self.asm.made and self._report(seg)):
                nums, plan = got
        elif texts is not None:
            plan, watched = self.reader.interpret(texts, nums)
            if watched is not None and watched.observe(nums):
                self.reader.decide(watched)
            if plan.kind == "record" and plan.loss_rank < len(LOSS_KINDS):
                watched = self._loss_wait(plan, watched)
            elif plan.kind == "multi":
                self._several(line_no, texts, nums, plan)
        item = (line_no, seg, indent, nums, plan, watched, row)
        if not self.held and (watched is None or watched.settled):
            return self._feed(item)
        self.held.append(item)
        if len(self.held) > HOLD_MAX_LINES:
            self._settle(self.held[0][5])
        return self._release()

    def _report(self, seg: str) -> bool:
        """A line of a report after the records, in another template than the progress lines the
        loss is guessed from (:func:`.plan.report_row`): no progress line."""
        texts, nums = tokens.split(seg)
        return report_row(nums) and tokens.fold(texts) != self.guessed

    def _several(self, line_no: int, texts: list[str], nums: list[str], plan: Plan) -> None:
        """A line that holds several records (:func:`.plan._repeated`): the account counts them,
        and a record the line cuts at its end goes on on the next line (``carry``)."""
        self.account.change(line_no, SEVERAL, len(plan.parts))
        if plan.head:
            self.account.change(line_no, HEAD_DROPPED)
        if plan.tail is not None:
            self.carry = "".join(texts[k] + nums[k] for k in range(plan.tail, len(nums))) + texts[-1]
            self.carry_line = line_no

    def _loss_wait(self, plan: Plan, watched):
        """What a record line waits for (see :class:`_LossWait`): its template, or the log's
        word on the loss."""
        wait = self.loss_wait
        if plan.loss_rank == 0:
            if wait is None or not wait.settled:
                self.asm.loss_printed_as(plan)       # before the lines held meanwhile
                self.loss_wait = wait = wait or _LossWait()
                wait.settled = True
            return watched
        if watched is not None or (wait is not None and wait.settled):
            return watched
        if wait is None:
            self.loss_wait = wait = _LossWait()
        wait.lines += 1
        wait.settled = wait.lines >= LEARN_LINES
        return wait

    def _settle(self, waiting) -> None:
        if isinstance(waiting, Template) and not waiting.settled:
            self.reader.decide(waiting)
        elif waiting is not None:
            waiting.settled = True

    def _release(self) -> list[StepRecord]:
        out: list[StepRecord] = []
        held = self.held
        while held and (held[0][5] is None or held[0][5].settled):
            out += self._feed(held.popleft())
        return out

    def _ends_block(self, seg: str, indent: int, plan: Plan | None) -> bool:
        """Whether this line ends the block under a step header: a blank line or a code fence
        once the block holds a line (between the header and its first line they are markup: a
        post's `Step 1200:`, a blank, then its fenced values), or a line at the header's margin
        that is none of its lines (:meth:`Assembler.goes_on`)."""
        asm = self.asm
        if not seg.strip() or FENCE(seg):
            return bool(asm.block)
        return indent <= asm.block_indent and not asm.goes_on(plan)

    def _feed(self, item: tuple) -> list[StepRecord]:
        line_no, seg, indent, nums, plan, watched, row = item
        asm, account = self.asm, self.account
        asm.row, asm.line_no = row, line_no
        out: list[StepRecord] = []
        if asm.block is not None and self._ends_block(seg, indent, plan):
            out += asm.close_block()      # the block under a step header ended
        asm.indent = indent
        if plan is None or plan.kind != "record":
            save = saved(seg)
            if save is not None:   # (a checkpoint's line: the rollback advice may name it)
                asm.saved(*save)
            if plan is not None and plan.kind in ("header", "epoch") and says_saved(seg):
                # it follows the step it holds and heads nothing: pix2pixHD's `saving the model at the
                # end of epoch 1, iters 1000` counts all iterations, its records' `iters` the epoch's
                account.ignore(line_no, seg, SAVE_LINE)
                return out
        if plan is None or plan.kind in ("nan", "ignore"):
            said = warning(seg) if seg.strip() else ""
            if said:
                asm.warning(said, line_no)
        if plan is None:
            if seg.strip():
                account.ignore(line_no, seg, self.unmatched if _DIGIT(seg) else "no numbers")
            elif asm.bar_drawn[0] == line_no - 1:
                asm.bar_drawn = (line_no, asm.bar_drawn[1])     # (a blank line after a bar's draw)
            return out
        if plan.kind == "ignore" and plan.counter and plan.step is not None:
            count = float(nums[plan.step])   # a record on the next line may be its step's (a bar may count
            if count == count and abs(count) < math.inf:   # in decimals: `1.5/90.0`; NaN or inf: no count)
                asm.bar_drawn = (line_no, int(count))
        if isinstance(watched, Template):
            plan = watched.for_line(plan)
            if plan.kind == "record":
                self.reader.last = plan
        try:
            out += asm.feed(nums, plan)
        except (ValueError, OverflowError) as e:
            account(line_no, seg, _unreadable(e))
            return out
        if asm.attached:
            asm.attached = False
        elif plan.kind not in ("record", "multi") and not (asm.block is not None and plan.metrics):
            account.ignore(line_no, seg, _REASONS.get(plan.kind, "no training metric"))
        elif asm.dropped:
            account.ignore(line_no, seg, asm.dropped)
            asm.dropped = ""
        return out

    def flush(self, final: bool = False) -> list[StepRecord]:
        """What can be released now (a followed file went idle: the block so far, the records
        held back for a warning that did not come). Lines behind a template still watched keep
        waiting for its lines, unless ``final`` (the log ended): then every template takes the
        plan its lines so far show, the best observed first."""
        out: list[StepRecord] = []
        if self.wrapped is not None:                 # no next line came to go on with it
            first, held, _ = self.wrapped
            self.wrapped = None
            out += self._one(first, held)
        units = self.blocks.end() if self.blocks is not None else []
        for unit in units:
            out += self._take(unit)
        if final:
            waiting = [item[5] for item in self.held if item[5] is not None]
            for waits in sorted(waiting, key=lambda w: -w.lines if isinstance(w, Template) else 0):
                self._settle(waits)          # the best observed first: others may take its counter
        out += self._release()
        self.busy = bool(self.held)
        return out + (self.asm.flush(final) if not self.held else [])

    def finish(self) -> list[StepRecord]:
        if self.carry:                        # the log ends inside a record a line cut
            self.carry = ""
            self.account.change(self.carry_line, CUT_DROPPED)
        return self.flush(final=True) + self.asm.finish()


def _template_match(texts: Sequence[str]) -> Callable[[str], re.Match | None]:
    """The fullmatch of a record template's lines: its ``texts`` with a number between each two.
    A number is held (matched possessively) where the text after it starts with none of what
    giving back part of it could serve (a digit, its fraction's '.', its exponent's e) or ends
    the line: then no match needs it given back, and the same lines match, with the same numbers.
    So is each run of blanks (a sixth faster on a 6-number line): a run is whole (_SPACES), so what
    follows it is a character no blank matches, a number (a digit first) or the line's end."""
    out = [_SPACES.sub(r"[ \\t]++", re.escape(texts[0]))]
    for i, t in enumerate(texts[1:], 2):
        held = t[0] not in ".eE0123456789" if t else i == len(texts)
        out.append((_TEMPLATE_NUMBER_HELD if held else _TEMPLATE_NUMBER) + _SPACES.sub(r"[ \\t]++", re.escape(t)))
    return re.compile("".join(out)).fullmatch


def _unreadable(e: Exception) -> str:
    """Why a line's number could not be read, in the reader's words rather than Python's (a NaN, an
    inf or a decimal where the line's form reads a count).

    >>> _unreadable(ValueError("cannot convert float NaN to integer"))
    "unreadable number: NaN where this line's form reads a count (a step, an epoch, a total)"
    """
    text = str(e)
    quoted = re.search(r"'([^']*)'", text)
    what = quoted.group(1) if quoted else "NaN" if "NaN" in text else "inf" if "infinity" in text else "a value"
    return f"unreadable number: {what} where this line's form reads a count (a step, an epoch, a total)"


def read(path, *, account: ReadAccount, lines: Iterable, user_keys: Mapping[str, str] | None = None,
         pattern: re.Pattern | None = None, guess: Any = None, **_) -> Iterator[StepRecord]:
    """Records of a text log from its ``(line_no, text)`` ``lines`` (a ``None`` text is an idle
    tick that releases the held-back record); ``user_keys``: {name printed in the log, or a
    number's position on the line (``"1"``): metric key or ``"step"``}; ``pattern``: a regular
    expression whose named groups (``step`` and metric keys) replace the grammar."""
    reading = Reading(account, user_keys, pattern, blocks=True, guess=guess)
    if guess is not None:
        pattern = guess.pattern
        account.note(f"{guess.said} (first: line {guess.line_no}); if it is no loss, name the loss with --keys"
                     if guess.said else
                     f"the log names no loss: the loss is a guess, number {guess.names['loss'].split()[0]} of "
                     f"its progress lines (first: line {guess.line_no}), {guess.which.format(step=guess.names['step'])}"
                     "; if it is no loss, name the loss with --keys")
    reader, asm = reading.reader, reading.asm
    record = asm.record
    histories = Histories(off=pattern is not None)
    held, may_open = histories.held, Histories.opens      # (the list is cleared in place)
    for line_no, text in lines:
        if text is None:
            if held:
                yield from reading.lines(histories.end())
            yield from reading.flush()
            continue
        text = strip_prefix(text)
        if held or ("[" in text and may_open(text)) or text[-1:] == ":":   # (a YAML list's name)
            items = histories.offer(line_no, text)
            if items != [(line_no, text)]:       # (a line given back as it came: as any line)
                yield from reading.lines(items)
                continue
        # The common case inline (a line of the last record template); Reading.line otherwise.
        last = reader.last
        m = last.match(text) if last is not None and last.match is not None \
            and asm.block is None and not reading.busy else None
        if m is not None and last is not None:
            asm.line_no = line_no
            try:
                out = record(m.groups(), last)
            except (ValueError, OverflowError) as e:
                account(line_no, text, _unreadable(e))
                continue
            if asm.dropped:
                account.ignore(line_no, text, asm.dropped)
                asm.dropped = ""
        else:
            try:
                out = reading.line(line_no, text)
            except (ValueError, OverflowError) as e:   # a number no rule expected: this line only, said
                account(line_no, text, _unreadable(e))
                continue
        if out:
            yield from out
    yield from reading.lines(histories.end())
    yield from reading.finish()


_OVERFLOW_LINES = LineReader()


def overflow_scale(text: str) -> tuple[bool, float | None]:
    """Whether a line announces an fp16 overflow skip, and the loss scale it leaves.

    >>> overflow_scale("[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 32768")
    (True, 32768.0)
    >>> overflow_scale("Gradient overflow.  Skipping step, loss scaler 0 reducing loss scale to 1024.0")
    (True, 1024.0)
    """
    got = _OVERFLOW_LINES.parse(text)
    if got is None or got[1].kind != "overflow":
        return bool("overflow" in text.lower() and "skip" in text.lower()), None
    nums, plan = got
    idx = plan.overflow_scale if plan.overflow_scale is not None else plan.overflow_attempted
    return True, (float(nums[idx]) if idx is not None else None)
