"""The generic metric-line reader: any text log whose lines print a step and training metrics.

Each physical line is normalised (split on ``\\r``, ANSI colour codes and ``> `` quoting
removed), then cut into text and numbers. The text between the numbers is the line's
*template*: the keys and their syntax (``key: v``, ``key=v``, ``key v``, ``|`` / ``,`` /
`` - `` separated fields, Python dict prints and JSON, nested fields, units and ``%`` after a
number). A template is interpreted once — which number is the step, which is the loss, whether
the line is an evaluation, a run summary, a DeepSpeed overflow — and the plan is cached, so an
ordinary line costs one regular-expression split, one dict lookup and a few ``float()`` calls.

Keys map onto ours through :data:`SYNONYMS` (then the machine names of
:func:`~stability_callbacks.replay.readers.tags.metric_key`); ``--keys`` adds the user's own.
The rules (the same the hand-written expected CSVs of ``tests/data/wild_logs`` follow):

- Evaluation never gives the training loss: a key naming a split (``val_loss``, ``eval/loss``,
  ``test loss``) is not ours, and a line that names a split outside its keys (``| valid | ...``,
  ``Validation: step 100 ...``) is not a record; ``train loss 2.1, val loss 2.3`` is one only in
  a log whose other records also say ``train loss`` (see ``Assembler._emit``). Run summaries
  (``train_runtime``, a best loss without a step) are not records.
- The step is the optimizer step as printed (``step``, ``iter``, ``iteration``, ``global_step``,
  ``num_updates``, ``current_steps``, ``Step 10/1000`` → 10). ``iter N step M``: micro-batches,
  one record per optimizer step with their mean loss. Only epoch + batch counters: step =
  (epoch - first epoch) × batches per epoch + batch. No step at all: 1, 2, 3… in order.
- DeepSpeed / apex / fairseq overflow lines fold into the next record (``skipped`` and the scale
  they reduced to, unless the record prints its own); at the end of the log each is a record.
- DeepSpeed's ``step=N, skipped=K`` count is cumulative: a record carries the delta.
- A warning that announces NaN (``loss is nan``) marks the step already printed (its loss, when
  its line printed none), never a new step. The same step printed identically twice is one row.

Memory is O(1) per line (plus at most ``MAX_TEMPLATES`` cached plans); records are emitted one
line late (an overflow or NaN warning may still concern them), or at once on an idle tick from a
followed file (``None`` in place of a line).
"""
from __future__ import annotations

import heapq
import re
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Mapping

from ... import keys
from ...record import StepRecord
from .source import SkipReport, numbered_lines, segments
from .tags import metric_key

# Numbers: digits with an optional fraction and exponent (the sign lives in the template, so
# a template does not change with it), and the non-finite words, which only lines that contain
# them pay for.
_NUM = r"\d+(?:\.\d+)?(?:[eE][-+]?\d+)?"
_NONFINITE = r"nan|NaN|NAN|[Ii]nfinity|inf|Inf|INF"
_SPLIT = re.compile(f"({_NUM})").split
# `nanxxx` (PaddleOCR), `nanms` (modded-nanogpt) are NaNs with text glued on; `INFO` is no inf.
_SPLIT_NONFINITE = re.compile(
    rf"({_NUM}|(?<![A-Za-z])(?:nan|NaN|NAN|(?:[Ii]nfinity|inf|Inf|INF)(?![A-Za-z])))").split
_NONFINITE_HINT = re.compile(_NONFINITE).search
# A learned template as one regular expression: the next line of the same shape is read by a
# single match (about twice as fast as splitting it), whitespace runs of any width.
_TEMPLATE_NUMBER = f"({_NUM}|{_NONFINITE})"
_SPACES = re.compile(r"(?:\\[ \t])+")

MAX_TEMPLATES = 4096

# Normalised key (lower case, words separated by one space) -> metric key.
SYNONYMS: dict[str, str] = {}
for _key, _names in {
    keys.LOSS: ("loss", "lm loss", "lm loss avg", "train loss", "training loss", "loss train",
                "train lm loss", "total loss", "trl", "train loss step", "tr loss",
                "reduced train loss", "train/loss", "objective loss"),
    keys.GRAD_NORM: ("grad norm", "gnorm", "gradient norm", "grad l2 norm", "grad norm total",
                     "total grad norm", "global grad norm", "norm", "grad norm pre clip",
                     "total norm", "gradnorm", "grad", "g norm", "global norm", "grad norm l2",
                     "train grad norm", "optim total grad norm"),
    keys.LR: ("lr", "learning rate", "lr mul", "current lr", "train lr", "lr group0",
              "learning rate group0", "optim learning rate group0", "lr abs",
              "train learning rate", "lrate"),
    keys.LOSS_SCALE: ("loss scale", "scale", "loss scaler", "cur scale", "current loss scale",
                      "lossscale", "amp scale", "grad scale", "scaler", "train loss scale"),
    keys.SKIPPED: ("skipped", "number of skipped iterations", "skipped iterations",
                   "skipped steps", "num skipped", "skipped iters"),
    keys.PARAM_NORM: ("param norm", "parameter norm", "weight norm", "params norm"),
    keys.CONSUMED_SAMPLES: ("consumed samples",),
}.items():
    for _n in _names:
        SYNONYMS[_n] = _key

# Step counters, best first: an explicit optimizer-step count beats an iteration count, which
# becomes the micro-batch counter when both are printed (`iter 3704 step 463`).
STEP_NAMES = {"global step": 0, "num updates": 0, "current steps": 0, "updates": 0,
              "optimizer step": 0, "optimizer steps": 0, "train step": 1, "training step": 1,
              "step": 1, "steps": 1, "update": 1, "iteration": 2, "iter": 2, "iters": 2,
              "iterations": 2, "it": 3, "s": 3, "global iteration": 2, "batch step": 2}
_MICRO_PRIORITY = 2          # iteration-like counters turn into micro-batch counters
EPOCH_NAMES = frozenset({"epoch", "epochs", "ep", "train epoch"})
BATCH_NAMES = frozenset({"batch", "batch idx", "batch id", "batches", "mb", "batch nb", "bs idx"})

# A split named outside any key (`| valid | epoch 1 | loss 2.3`, `Validation: step 100 ...`),
# not a key itself (litgpt's `val: n/a`) nor a file name (`eval.py:12`).
_EVAL_CONTEXT = re.compile(r"\b(?:val|valid|validation|validating|eval|evaluation|evaluating|"
                           r"test|testing)\b(?!\s*[:=]|\.py)", re.I)
_EVAL_WORDS = frozenset({"val", "valid", "validation", "eval", "evaluation", "test", "dev",
                         "tel", "vl", "validating", "evaluating", "testing"})
_SUMMARY_WORDS = frozenset({"runtime", "best", "flos"})
_SPLIT_QUALIFIED_LOSS = frozenset({"train loss", "training loss", "loss train", "train lm loss"})
_NOT_A_KEY = re.compile(r"[^A-Za-z0-9]+")
_STEP_MARKERS = ("(optimizer.step)", "(step)")
# `--lr 3e-4`, `Namespace(lr=...)`, `args.lr`: argument echoes, never metrics.
_ARG_ECHO = ("--", "namespace(", "args.", "argument", "config")
_NAN_WARNING = re.compile(r"\b(?:is|are|was|were|detected|found|encountered|got|became|"
                          r"contains?|non-?finite)\b", re.I)
_OVERFLOW = re.compile(r"overflow", re.I)
_WORD_INSIDE_KEY = re.compile(r"\s+[A-Za-z][\w ]*[:=]\s*$")


def normalise_key(name: str) -> str:
    """``"Train_Loss"`` -> ``"train loss"``: lower case, words separated by single spaces.

    >>> normalise_key("optim/total-grad_norm"), normalise_key(" lm loss ")
    ('optim total grad norm', 'lm loss')
    """
    return " ".join(_NOT_A_KEY.split(name.lower())).strip()


def classify(name: str, user: Mapping[str, str] | None = None) -> tuple[str, str | None]:
    """What a key printed in a log is: ``("metric", key)``, ``("step", priority)``,
    ``("epoch", None)``, ``("batch", None)``, ``("eval", None)``, ``("summary", None)`` or
    ``("other", None)``.

    >>> classify("lm loss"), classify("val_loss"), classify("num_updates"), classify("gnorm")
    (('metric', 'loss'), ('eval', 'loss'), ('step', '0'), ('metric', 'grad_norm'))
    """
    norm = normalise_key(name)
    if user and norm in user:
        target = user[norm]
        return ("step", "0") if target == "step" else ("metric", target)
    if not norm:
        return "other", None
    words = norm.split()
    if _EVAL_WORDS.intersection(words):
        return "eval", "loss" if ("loss" in words or "ppl" in words) else None
    if norm in STEP_NAMES:
        return "step", str(STEP_NAMES[norm])
    if norm in EPOCH_NAMES:
        return "epoch", None
    if norm in BATCH_NAMES:
        return "batch", None
    key = SYNONYMS.get(norm) or metric_key(name.strip())
    if key is not None:
        return "metric", key
    if norm.startswith("train ") and SYNONYMS.get(norm[6:]):
        return "metric", SYNONYMS[norm[6:]]
    if any(w in _SUMMARY_WORDS for w in words):
        return "summary", None
    return "other", None


@dataclass(slots=True)
class Plan:
    """How to read every line of one template: indices into the line's numbers per role."""

    metrics: tuple[tuple[int, str, bool], ...] = ()   # (number index, metric key, negative)
    step: int | None = None
    micro: int | None = None
    epoch: int | None = None
    counter: int | None = None
    counter_total: int | None = None
    kind: str = "record"             # record | epoch | overflow | nan | eval | skip
    marker: bool = False             # the line says it stepped the optimizer
    cumulative_skips: bool = False   # DeepSpeed `step=N, skipped=K`
    prints_skipped: bool = False
    overflow_scale: int | None = None
    overflow_attempted: int | None = None
    loss_name: str = ""              # the loss as the line names it (normalised)
    mixed: bool = False              # `train loss` beside `val loss`: see Assembler._emit
    score: int = 0                   # how close to a record (for the error message)
    named: tuple[str, ...] = ()      # the keys it printed, for the error message
    match: object = None             # the template's own regular expression (fullmatch)


def _key_before(piece: str, glued: bool) -> str:
    """The key a piece of text gives the number after it (``" | lm loss: "`` -> ``lm loss``).

    ``glued``: the piece starts right after a number, so its first token is that number's unit
    (``ms, mfu `` -> ``mfu``).
    """
    s = piece
    if glued:
        i = 0
        while i < len(s) and not s[i].isspace() and s[i] not in ",|;[]{}()'\"":
            i += 1
        s = s[i:]
    s = s.rstrip(" \t'\"[(")
    s = s.rstrip(" \t:=").rstrip(" \t'\"")
    if s.endswith(")") and "(" in s:           # `elapsed time per iteration (ms):`
        s = s[:s.rfind("(")].rstrip()
    elif s.endswith("]") and "[" in s:         # `| [Loss] 51566519.44 | [step]    89 |`
        inner = s[s.rfind("[") + 1:-1].strip()
        if inner[:1].isalpha():
            return inner
    cut = -1
    for c in ",|;[]{}()<>'\"=:\t":
        j = s.rfind(c)
        if j > cut:
            cut = j
    for sep in (" - ", "  "):                  # Keras ` - loss: `, torchtitan's double spaces
        j = s.rfind(sep)
        if j >= 0 and j + len(sep) - 1 > cut:
            cut = j + len(sep) - 1
    return s[cut + 1:].strip()


_PATH_TOKENS = re.compile(r"""['"]?([\w./ -]+?)['"]?\s*[:=]\s*\{|\{|\}""")


def _paths(texts: list[str]) -> list[str]:
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


def _noise(texts: list[str], nums: list[str]) -> list[bool]:
    """Numbers that are no values: parts of names (``rank0``, ``v1.2``), times of day and
    durations (``09:30:39,305``, ``00:30<00:36``), dates (``2023-03-22``, ``07/21/2024``)."""
    n = len(nums)
    noise = [False] * n
    for i in range(n):
        before, after = texts[i], texts[i + 1]
        if before[-1:].isalpha() or before[-1:] in "_.":
            noise[i] = True
        if (after == ":" and i + 1 < n) or (before == ":" and i > 0):
            noise[i] = True
        if (after == "-" and i + 1 < n) or (before == "-" and i > 0):
            noise[i] = True
        if before in (",", ".") and i > 1 and noise[i - 1] and texts[i - 1] == ":":
            noise[i] = True
    for i in range(n - 1):
        if texts[i + 1] != "/":
            continue
        if i + 2 < n and texts[i + 2] == "/":
            noise[i] = noise[i + 1] = noise[i + 2] = True          # 07/21/2024
        elif i + 2 < n and texts[i + 2] in (" ", "T", "-") and noise[i + 2] \
                and texts[i + 3:i + 4] == [":"]:
            noise[i] = noise[i + 1] = True                         # 10/30 22:18:02
    return noise


def make_plan(texts: list[str], nums: list[str], user: Mapping[str, str] | None = None) -> Plan:
    """Interpret one template: ``texts`` are the pieces around the numbers ``nums`` of a line."""
    n = len(nums)
    joined = "#".join(texts)
    low = joined.lower()
    plan = Plan(match=re.compile(_TEMPLATE_NUMBER.join(
        _SPACES.sub(r"[ \\t]+", re.escape(t)) for t in texts)).fullmatch)
    noise = _noise(texts, nums)
    prefixes = _paths(texts) if "{" in joined else [""] * n
    befores = list(texts[:n])
    for i in range(n - 1):
        # `number of nan iterations: 0`: a non-finite word inside the next key's name.
        if nums[i][:1] in "nNiI" and _WORD_INSIDE_KEY.match(texts[i + 1]) \
                and not texts[i].rstrip(" '\"").endswith((":", "=")):
            noise[i] = True
            befores[i + 1] = befores[i] + nums[i] + texts[i + 1]
    roles: list[tuple[str, str | None, str]] = []
    eval_context = False
    for i in range(n):
        before = befores[i]
        if noise[i]:
            roles.append(("noise", None, ""))
            continue
        if i > 0 and before.strip() == "/" and not noise[i - 1]:
            roles.append(("total", None, ""))
            continue
        name = _key_before(before, glued=i > 0)
        rest = before[:before.rfind(name)] if name else before
        if _EVAL_CONTEXT.search(rest):
            eval_context = True
        if name.startswith("-") or name.lower().startswith(_ARG_ECHO):
            roles.append(("other", None, name))
            continue
        full = f"{prefixes[i]}/{name}" if prefixes[i] and name else name
        kind, what = classify(full, user)
        if kind in ("other", "metric") and prefixes[i] and name \
                and classify(prefixes[i], user)[0] == "eval":
            kind, what = "eval", None
        roles.append((kind, what, name))

    metrics: list[tuple[int, str, bool]] = []
    steps: list[tuple[int, int, bool]] = []
    seen_keys: set[str] = set()
    eval_loss = split_loss = summary = False
    named = []
    for i, (kind, what, name) in enumerate(roles):
        if name:
            named.append(name)
        if kind == "metric" and what not in seen_keys:
            seen_keys.add(what)
            negative = texts[i].endswith("-") and not texts[i].endswith("--")
            metrics.append((i, what, negative))
            if what == keys.LOSS:
                plan.loss_name = normalise_key(name)
                split_loss = plan.loss_name in _SPLIT_QUALIFIED_LOSS
            if what == keys.SKIPPED:
                plan.prints_skipped = True
        elif kind == "step" and not texts[i + 1].startswith("%"):
            # `iter[ 14/ 15]` counts batches of an epoch, not micro-batches of a step
            has_total = i + 1 < n and roles[i + 1][0] == "total"
            steps.append((int(what), i, has_total))
        elif kind == "epoch" and plan.epoch is None:
            plan.epoch = i
        elif kind == "batch" and plan.counter is None:
            plan.counter = i
            if i + 1 < n and roles[i + 1][0] == "total":
                plan.counter_total = i + 1
        elif kind == "eval" and what == "loss":
            eval_loss = True
        elif kind == "summary":
            summary = True
        elif kind == "other" and not name and plan.counter is None and i + 1 < n \
                and roles[i + 1][0] == "total" and not texts[i + 1].startswith("%"):
            plan.counter, plan.counter_total = i, i + 1    # `100/500 [====>...]`
    if steps:
        steps.sort()
        plan.step = steps[0][1]
        if steps[0][0] < _MICRO_PRIORITY:
            micro = [i for p, i, has_total in steps if p >= _MICRO_PRIORITY and not has_total]
            if micro:
                plan.micro = micro[0]
    if summary and not steps:
        plan.kind = "skip"    # a run summary (HF's `train_runtime`, a best loss), not a step
    plan.metrics = tuple(metrics)
    plan.named = tuple(named)
    plan.score = len(named) + 2 * len(metrics) + (2 if steps else 0)
    plan.marker = any(m in joined for m in _STEP_MARKERS)

    if _OVERFLOW.search(joined) and ("skip" in low or "scale" in low):
        plan.kind = "overflow"
        for i, (kind, what, name) in enumerate(roles):
            words = normalise_key(name).split()
            if words and words[-1] == "to" and "hysteresis" not in words:
                plan.overflow_scale = i
            elif "attempted" in words:
                plan.overflow_attempted = i
        return plan
    if plan.kind == "skip":
        return plan
    if eval_context:
        plan.kind = "eval"
        return plan
    plan.mixed = eval_loss and split_loss
    if not metrics:
        nonfinite = any(v[:1] in "nNiI" for v in nums)
        if nonfinite and _NAN_WARNING.search(joined):
            plan.kind = "nan"
        elif plan.epoch is not None and plan.step is None:
            plan.kind = "epoch"
        else:
            plan.kind = "skip"
        return plan
    if "step=" in joined and "skipped=" in joined:
        plan.cumulative_skips = True
    if plan.step is None and not any(k in (keys.LOSS, keys.GRAD_NORM) for _, k, _ in metrics):
        plan.kind = "skip"   # an LR or a scale with no step: a config echo, not a record
    return plan


class LineReader:
    """Interpretation of single lines: ``(numbers, plan)`` or ``None`` for a line without
    numbers. Plans are cached per template; the last record template is tried first."""

    def __init__(self, user_keys: Mapping[str, str] | None = None,
                 pattern: re.Pattern | None = None):
        self.user = {normalise_key(k): v for k, v in (user_keys or {}).items()}
        self.pattern = pattern
        self._plans: dict[str, Plan] = {}
        self._last: Plan | None = None

    def parse(self, seg: str) -> tuple[tuple | list, Plan] | None:
        last = self._last
        if last is not None:
            m = last.match(seg)
            if m is not None:
                return m.groups(), last
        if self.pattern is not None:
            return self._parse_pattern(seg)
        parts = (_SPLIT_NONFINITE if _NONFINITE_HINT(seg) else _SPLIT)(seg)
        if len(parts) == 1:
            return None
        texts = parts[0::2]
        tkey = "\x00".join(texts)
        plan = self._plans.get(tkey)
        if plan is None:
            if len(self._plans) >= MAX_TEMPLATES:
                self._plans.clear()
            plan = self._plans[tkey] = make_plan(texts, parts[1::2], self.user)
        if plan.kind == "record":
            self._last = plan
        return parts[1::2], plan

    def _parse_pattern(self, seg: str):
        m = self.pattern.search(seg)
        if m is None:
            return None
        nums, metrics, step = [], [], None
        for name, value in m.groupdict().items():
            if value is None:
                continue
            if name == "step":
                step = len(nums)
            else:
                metrics.append((len(nums), name, False))
            nums.append(value.strip())
        return nums, Plan(metrics=tuple(metrics), step=step)


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
        return bool(_OVERFLOW.search(text) and "skip" in text.lower()), None
    nums, plan = got
    idx = plan.overflow_scale if plan.overflow_scale is not None else plan.overflow_attempted
    return True, (float(nums[idx]) if idx is not None else None)


def _mean(values: list[float]) -> float:
    """The mean, exact when every value is the same (a step repeated by every rank)."""
    first = values[0]
    if all(v == first for v in values):
        return first
    return sum(values) / len(values)


class Assembler:
    """Turns interpreted lines into records (the rules of the module docstring).

    ``feed`` returns the records that are final; ``flush`` releases the held-back one;
    ``finish`` the rest at the end of the log. State: O(1) (the held-back record, the
    micro-batch losses of one optimizer step, the overflow count since the last record).
    """

    def __init__(self):
        self.last_step = 0
        self.pending: StepRecord | None = None
        self.pending_losses: list[float] = []
        self.pending_undecided = False        # see _emit
        self.pending_loss_name = ""
        self.pending_last_step = 0
        self.loss_name: str | None = None     # how the log's plain records name their loss
        self.overflows = 0
        self.overflow_scale: float | None = None
        self.cumulative_skips = 0
        self.epoch: int | None = None
        self.epoch_total: int | None = None
        self.epoch_base: int | None = None
        self.micro_losses: list[float] = []
        self.micro_step: int | None = None
        self.micro_metrics: dict[str, float] = {}

    def feed(self, nums, plan: Plan) -> list[StepRecord]:
        kind = plan.kind
        if kind == "record":
            return self._record(nums, plan)
        if kind == "overflow":
            self.overflows += 1
            idx = plan.overflow_scale if plan.overflow_scale is not None else plan.overflow_attempted
            if idx is not None:
                self.overflow_scale = float(nums[idx])   # hysteresis consumed: the scale stays
        elif kind == "nan":
            rec = self.pending
            if rec is not None and keys.LOSS not in rec.metrics and (
                    plan.step is None or int(float(nums[plan.step])) == rec.step):
                rec.metrics[keys.LOSS] = float("nan")
        elif kind == "epoch":
            self._set_epoch(nums[plan.epoch])
        return []

    def _set_epoch(self, text: str) -> None:
        if "." in text:
            return                            # HF's epoch fraction is no counter
        self.epoch = int(text)
        if self.epoch_base is None:           # Lightning counts epochs from 0, Keras from 1
            self.epoch_base = min(self.epoch, 1)

    def _step_of(self, nums, plan: Plan) -> int | None:
        if plan.step is not None:
            return int(float(nums[plan.step]))
        if plan.epoch is not None:
            self._set_epoch(nums[plan.epoch])
        if plan.counter is not None:
            counter = int(float(nums[plan.counter]))
            if self.epoch is None:
                return counter
            if plan.counter_total is not None:
                self.epoch_total = int(float(nums[plan.counter_total]))
            if self.epoch_total is not None:
                return (self.epoch - self.epoch_base) * self.epoch_total + counter
        return None

    def _record(self, nums, plan: Plan) -> list[StepRecord]:
        metrics = {key: (-float(nums[i]) if negative else float(nums[i]))
                   for i, key, negative in plan.metrics}
        step = self._step_of(nums, plan)
        if plan.cumulative_skips and keys.SKIPPED in metrics:
            total, last = int(metrics[keys.SKIPPED]), self.cumulative_skips
            metrics[keys.SKIPPED] = float(total - last if total >= last else total)
            self.cumulative_skips = total
        if plan.micro is not None and step is not None:
            return self._micro(step, metrics, plan)
        return self._emit(step, metrics, plan)

    def _micro(self, step: int, metrics: dict, plan: Plan) -> list[StepRecord]:
        # litgpt counts the optimizer step on the micro-batch that takes it: a record is the
        # micro-batches since the previous step, at the new step number; micro-batches after
        # the last optimizer step of the log make none.
        loss = metrics.pop(keys.LOSS, None)
        if loss is not None:
            self.micro_losses.append(loss)
        self.micro_metrics.update(metrics)
        stepped = plan.marker or (self.micro_step is not None and step > self.micro_step)
        self.micro_step = step
        if not stepped:
            return []
        out = self.micro_metrics
        if self.micro_losses:
            out[keys.LOSS] = _mean(self.micro_losses)
        self.micro_losses, self.micro_metrics = [], {}
        return self._emit(step, out, plan)

    def _emit(self, step: int | None, metrics: dict, plan: Plan) -> list[StepRecord]:
        if plan.mixed or self.pending_undecided:
            # A line printing a split-named training loss beside an evaluation loss
            # (`train loss 2.1, val loss 2.3`) is a record where the log's plain records name
            # their loss the same way (deit, Lightning), and an evaluation report where they
            # name it otherwise (nanoGPT's `step N: train loss .., val loss ..` beside
            # `iter N: loss ..`). Undecided until a plain record shows the log's naming.
            if plan.mixed and self.loss_name is not None and plan.loss_name != self.loss_name:
                return []
            if self.pending_undecided and not plan.mixed:
                if plan.loss_name and plan.loss_name != self.pending_loss_name:
                    self.pending, self.pending_undecided = None, False
                    self.last_step = self.pending_last_step
        if not plan.mixed and plan.loss_name:
            self.loss_name = plan.loss_name
        if step is None:
            step = self.last_step + 1
        if self.overflows:
            if not plan.prints_skipped:
                metrics[keys.SKIPPED] = float(self.overflows)
            if keys.LOSS_SCALE not in metrics and self.overflow_scale is not None:
                metrics[keys.LOSS_SCALE] = self.overflow_scale
            self.overflows, self.overflow_scale = 0, None
        prev = self.pending
        if prev is not None and prev.step == step:
            # The same step again: another rank, or another micro-batch of the step. One
            # record: the mean loss, the other keys as first printed.
            if keys.LOSS in metrics:
                self.pending_losses.append(metrics[keys.LOSS])
                prev.metrics[keys.LOSS] = _mean(self.pending_losses)
            for k, v in metrics.items():
                prev.metrics.setdefault(k, v)
            return []
        self.pending_last_step = self.last_step
        self.last_step = step
        self.pending = StepRecord(step, metrics)
        self.pending_losses = [metrics[keys.LOSS]] if keys.LOSS in metrics else []
        self.pending_undecided = plan.mixed and self.loss_name is None
        self.pending_loss_name = plan.loss_name
        return [prev] if prev is not None else []

    def flush(self) -> list[StepRecord]:
        """The held-back record (a followed file went idle: no warning is coming for it)."""
        out = [self.pending] if self.pending is not None else []
        self.pending = None
        return out

    def finish(self) -> list[StepRecord]:
        out = self.flush()
        while self.overflows:                 # overflow lines no record followed
            self.overflows -= 1
            self.last_step += 1
            m = {keys.SKIPPED: 1.0}
            if self.overflow_scale is not None:
                m[keys.LOSS_SCALE] = self.overflow_scale
            out.append(StepRecord(self.last_step, m))
        return out


def read(path, *, on_skip: SkipReport, progress: bool = False, lines: Iterable | None = None,
         user_keys: Mapping[str, str] | None = None, pattern: re.Pattern | None = None, **_
         ) -> Iterator[StepRecord]:
    """Records of a text log. ``lines``: ``(line_no, text)`` pairs to read instead of the file
    (a ``None`` text is an idle tick that releases the held-back record); ``user_keys``:
    {name printed in the log: metric key or ``"step"``}; ``pattern``: a regular expression
    whose named groups (``step`` and metric keys) replace the automatic reading."""
    reader = LineReader(user_keys, pattern)
    parse = reader.parse
    asm = Assembler()
    feed = asm.feed
    source = lines if lines is not None else numbered_lines(path, progress=progress)
    for line_no, text in source:
        if text is None:
            yield from asm.flush()
            continue
        for seg in (segments(text) if ("\r" in text or "\x1b" in text or "\b" in text)
                    else (text,)):
            got = parse(seg)
            if got is None:
                continue
            try:
                out = feed(*got)
            except (ValueError, OverflowError) as e:
                on_skip(line_no, seg, f"unreadable number: {e}")
                continue
            if out:
                yield from out
    yield from asm.finish()


@dataclass(order=True)
class _Near:
    score: int
    line_no: int = field(compare=False)
    text: str = field(compare=False)
    named: tuple = field(compare=False, default=())


class ClosestLines:
    """The lines that came closest to a record (most keyed numbers), for the error message."""

    def __init__(self, size: int = 3):
        self.size = size
        self.heap: list[_Near] = []

    def offer(self, line_no: int, text: str, plan: Plan) -> None:
        near = _Near(plan.score, -line_no, text.strip()[:200], plan.named)
        if len(self.heap) < self.size:
            heapq.heappush(self.heap, near)
        elif near > self.heap[0]:
            heapq.heapreplace(self.heap, near)

    def lines(self) -> list[tuple[int, str, tuple]]:
        return [(-n.line_no, n.text, n.named) for n in sorted(self.heap, reverse=True)]
