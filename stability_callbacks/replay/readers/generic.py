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
  An overflow line saying the update went ahead (MindSpore's ``overflow, still update``) gives
  the scale and no skip.
- DeepSpeed's ``step=N, skipped=K`` count is cumulative: a record carries the delta.
- A warning that announces NaN (``loss is nan``) marks the step already printed (its loss, when
  its line printed none), never a new step. The same step printed again is one row (the mean
  loss; a progress bar redrawn for the same count: its last values). A step line above an
  indented block of metric lines (OLMo) makes one record; several records glued on one line
  (lost newlines) are read apart.

Memory is O(1) per line (plus at most ``MAX_TEMPLATES`` cached plans); records are emitted one
line late (an overflow or NaN warning may still concern them), or at once on an idle tick from a
followed file (``None`` in place of a line).
"""
from __future__ import annotations

import heapq
import operator
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Iterator, Mapping

from ... import keys
from ...record import StepRecord
from .source import SkipReport, numbered_lines, segments, strip_prefix
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
_TEMPLATE_NUMBER = f"({_NUM})"          # a line with a NaN goes the split way: same template
_SPACES = re.compile(r"(?:\\[ \t])+")

MAX_TEMPLATES = 4096

# Normalised key (lower case, words separated by one space) -> metric key.
SYNONYMS: dict[str, str] = {}
for _key, _names in {
    keys.LOSS: ("loss", "lm loss", "lm loss avg", "train loss", "training loss", "loss train",
                "train lm loss", "total loss", "trl", "train loss step", "tr loss", "l",
                "reduced train loss", "objective loss", "current loss", "closs", "xent",
                "avr loss", "step loss", "loss step", "train total loss", "loss value",
                "crossentropyloss", "cross entropy loss", "ce loss", "ce"),
    keys.GRAD_NORM: ("grad norm", "gnorm", "gradient norm", "grad l2 norm", "grad norm total",
                     "total grad norm", "global grad norm", "norm", "grad norm pre clip",
                     "total norm", "gradnorm", "g norm", "global norm", "grad norm l2",
                     "train grad norm", "optim total grad norm", "grad norm before clip"),
    keys.LR: ("lr", "learning rate", "learningrate", "lr mul", "current lr", "train lr", "lr group0",
              "learning rate group0", "optim learning rate group0", "lr abs", "optim0 lr0",
              "train learning rate", "lrate", "lr 0", "base lr", "lrm"),
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
              "optimizer step": 0, "optimizer steps": 0, "total iter": 0, "total iters": 0,
              "total iteration": 0, "train step": 1, "training step": 1,
              "step": 1, "steps": 1, "update": 1, "iteration": 2, "iter": 2, "iters": 2,
              "iterations": 2, "it": 3, "s": 3, "global iteration": 2, "batch step": 2}
_MICRO_PRIORITY = 2
_STEP_ADJECTIVES = frozenset({"completed", "current", "curr", "cur", "train", "training",
                              "optimizer", "opt", "global"})
# Counters that count batches within an epoch when an epoch is printed beside them (the
# step-like ones do only where the batches per epoch are declared).
_ITERATION_LIKE = frozenset({"iteration", "iter", "iters", "iterations", "it", "batch step"})
EPOCH_NAMES = frozenset({"epoch", "epochs", "ep", "train epoch"})
BATCH_NAMES = frozenset({"batch", "batch idx", "batch id", "batches", "mb", "batch nb", "bs idx"})
PER_EPOCH_NAMES = frozenset({"total micro batches", "total batches", "num batches",
                             "batches per epoch", "steps per epoch", "iters per epoch",
                             "num batches per epoch", "num update steps per epoch",
                             "total steps per epoch", "micro batches"})
# A counter glued to its name: `[ep6 it156/313]` before the number, `1epoch:train:1-1020batch`
# after it. Other letters glued to a number make a name (`rank0`, `x86_64`, `v1.2`).
_GLUED_BEFORE = {"ep": "epoch", "epoch": "epoch", "it": "it", "iter": "iter",
                 "iteration": "iteration", "step": "step"}
_GLUED_AFTER = {"epoch": "epoch", "batch": "batch", "batches": "batch"}
_TRAILING_WORD = re.compile(r"(?<![A-Za-z])([A-Za-z]+)$")
_LEADING_WORD = re.compile(r"([A-Za-z]+)(?![A-Za-z])")

# A split named outside any key (`| valid | epoch 1 | loss 2.3`, `Validation: step 100 ...`),
# not a key itself (litgpt's `val: n/a`) nor a file name (`eval.py:12`).
_EVAL_CONTEXT = re.compile(r"\b(?:val|valid|validation|validating|eval|evaluation|evaluating|"
                           r"test|testing)\b(?!['\"]?\s*[:=]|\.py)", re.I)
_EVAL_WORDS = frozenset({"val", "valid", "validation", "eval", "evaluation", "test", "dev",
                         "tel", "vl", "validating", "evaluating", "testing"})
# Run summaries and running statistics, never the step's own value.
_SUMMARY_WORDS = frozenset({"runtime", "best", "flos", "average", "avg", "mean"})
_SPLIT_QUALIFIED_LOSS = frozenset({"train loss", "training loss", "loss train", "train lm loss"})
_NOT_A_KEY = re.compile(r"[^A-Za-z0-9]+")
# Chinese key words (many posted logs print them): their English names, so that
# `训练次数：100, Loss：1.98` has a step and `整体测试集上的Loss: 262.6` is an evaluation.
_CJK_WORDS = {"迭代次数": " iteration ", "训练次数": " train step ", "训练步数": " train step ",
              "步数": " step ", "迭代": " iter ", "训练": " train ", "测试": " test ",
              "验证": " val ", "评估": " eval ", "损失": " loss ", "学习率": " lr "}
_CJK = re.compile("|".join(sorted(_CJK_WORDS, key=len, reverse=True)))
_STEP_MARKERS = ("(optimizer.step)", "(step)")
# `--lr 3e-4`, `Namespace(lr=...)`, `args.lr`: argument echoes, never metrics.
_ARG_ECHO = ("--", "namespace(", "args.", "argument", "config")
# `loss is nan at step 12`, `Detected NaN`: about the loss (`NaN found in input tensor` is not).
_NAN_WARNING = re.compile(r"\bloss\b.*\b(?:is|are|was|were|became|got|detected|found|"
                          r"encountered)\b|\bdetected\b|\bnon-?finite\s+loss", re.I)
_OVERFLOW = re.compile(r"overflow", re.I)
# MindSpore's `overflow, still update, loss scale adjust to 1024.0`: the step was applied.
_APPLIED = re.compile(r"\bstill updat|\bnot skip", re.I)
_WORD_INSIDE_KEY = re.compile(r"\s+[A-Za-z][\w ]*[:=]\s*$")
_QUOTES = " \t'\"\u2018\u2019\u201c\u201d"
_CUTS = ",|;[]{}()<>'\"=:\t\u2018\u2019\u201c\u201d"


def normalise_key(name: str) -> str:
    """``"Train_Loss"`` -> ``"train loss"``: lower case, words separated by single spaces.

    >>> normalise_key("optim/total-grad_norm"), normalise_key(" lm loss "), normalise_key("训练次数")
    ('optim total grad norm', 'lm loss', 'train step')
    """
    if not name.isascii():
        name = _CJK.sub(lambda m: _CJK_WORDS[m.group()], name)
    return " ".join(_NOT_A_KEY.split(name.lower())).strip()


def classify(name: str, user: Mapping[str, str] | None = None) -> tuple[str, str | None]:
    """What a key printed in a log is: ``("metric", key)``, ``("step", priority)``,
    ``("epoch", None)``, ``("batch", None)``, ``("per_epoch", None)``, ``("eval", "loss" or
    None)``, ``("summary", None)`` or ``("other", None)``.

    >>> classify("lm loss"), classify("val_loss"), classify("num_updates"), classify("gnorm")
    (('metric', 'loss'), ('eval', 'loss'), ('step', '0'), ('metric', 'grad_norm'))
    """
    norm = normalise_key(name)
    words = norm.split()
    if user and norm in user:
        target = user[norm]
        return ("step", "0") if target == "step" else ("metric", target)
    if not norm:
        return "other", None
    if _EVAL_WORDS.intersection(words):
        return "eval", "loss" if ("loss" in words or "ppl" in words) else None
    if norm in STEP_NAMES:
        return "step", str(STEP_NAMES[norm])
    if len(words) == 2 and words[0] in _STEP_ADJECTIVES:
        if words[1] in ("step", "iteration", "iter"):    # `completed step`, `Training Iteration`
            return "step", str(STEP_NAMES[words[1]])
        if words[1] == "epoch":                           # not `train_epochs` (a count)
            return "epoch", None
    if norm in EPOCH_NAMES:
        return "epoch", None
    if norm in BATCH_NAMES:
        return "batch", None
    if norm in PER_EPOCH_NAMES:
        return "per_epoch", None
    key = SYNONYMS.get(norm) or metric_key(name.strip())
    if key is not None:
        return "metric", key
    if _SUMMARY_WORDS.intersection(words):
        return "summary", None
    if len(words) > 1 and words[0] in ("train", "cur", "curr", "current", "fp16") \
            and SYNONYMS.get(norm[len(words[0]) + 1:]):    # `train_lr`, `cur_lr`, `Fp16 Grad Scale`
        return "metric", SYNONYMS[norm[len(words[0]) + 1:]]
    return "other", None


@dataclass(slots=True)
class Plan:
    """How to read every line of one template: indices into the line's numbers per role."""

    metrics: tuple[tuple[int, str, bool], ...] = ()   # (number index, metric key, negative)
    step: int | None = None          # a named step (or a keyless counter: `counter`)
    step_priority: int = 1
    step_total: int | None = None    # `Step 10/1000`: the 1000
    counter: bool = False            # the step is a batch counter, not a named step
    within_epoch: bool = False       # an iteration counter: counts batches of an epoch
    micro: int | None = None
    epoch: int | None = None
    per_epoch: int | None = None     # `Total Micro Batches 8`: batches per epoch declared
    kind: str = "record"             # record | epoch | header | overflow | nan | eval | skip | multi
    marker: bool = False             # the line says it stepped the optimizer
    cumulative_skips: bool = False   # DeepSpeed `step=N, skipped=K`
    prints_skipped: bool = False
    overflow_scale: int | None = None
    overflow_attempted: int | None = None
    overflow_applied: bool = False   # the line says the update went ahead: a scale, no skip
    loss_name: str = ""              # the loss as the line names it (normalised)
    mixed: bool = False              # `train loss` beside `val loss`: see Assembler._emit
    parts: tuple = ()                # kind multi: ((first number, end, plan), ...)
    score: int = 0                   # how close to a record (for the error message)
    named: tuple[str, ...] = ()      # the keys it printed, for the error message
    match: Callable[[str], re.Match | None] | None = None   # the template's fullmatch, once used
    values: Callable[[Any], tuple] | None = None   # numbers -> metric values (C-level, no negatives)
    names: tuple[str, ...] = ()      # the metric keys, in `values` order
    loss_at: int | None = None       # the index of the loss among the line's numbers
    loss_window: int = 0             # `loss: 6.9733 (6.9704)`: a window statistic (see make_plan)


def _loss_index(metrics) -> int | None:
    """Where the loss is among a line's numbers (``Plan.loss_at``)."""
    return next((i for i, k, _ in metrics if k == keys.LOSS), None)


def _key_before(piece: str, glued: bool) -> str:
    """The key a piece of text gives the number after it (``" | lm loss: "`` -> ``lm loss``).

    ``glued``: the piece starts right after a number, so its first token is that number's unit
    (``ms, mfu `` -> ``mfu``).
    """
    s = piece
    if s[-1:] in "-+" and s[-2:-1] in (" ", ":", "=", "\t", "'", '"', "[", "("):
        s = s[:-1]                             # the number's sign: `loss: -1.0000`
    if glued:
        i = 0
        while i < len(s) and not s[i].isspace() and s[i] not in _CUTS:
            i += 1
        s = s[i:]
    s = s.rstrip(_QUOTES + "[(~")
    s = s.rstrip(" \t:=").rstrip(_QUOTES)
    if s.endswith(")") and "(" in s:           # `elapsed time per iteration (ms):`
        s = s[:s.rfind("(")].rstrip()
    elif s.endswith("]") and "[" in s:         # `| [Loss] 51566519.44 | [step]    89 |`
        inner = s[s.rfind("[") + 1:-1].strip()
        if inner[:1].isalpha():
            return inner
    cut = -1
    for c in _CUTS:
        j = s.rfind(c)
        if j > cut:
            cut = j
    for sep in (" - ", "  "):                  # Keras ` - loss: `, torchtitan's double spaces
        j = s.rfind(sep)
        if j >= 0 and j + len(sep) - 1 > cut:
            cut = j + len(sep) - 1
    key = s[cut + 1:].strip()
    if key.endswith(" is") and ". " in piece:  # sentences (BigDL): `.../second. Loss is 1.26.`
        key = key[:-3].rstrip()                # (not a warning's `loss is nan at step 12`)
        key = key[key.rfind(". ") + 2:] if ". " in key else key
    return key


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
    durations (``09:30:39,305``, ``00:30<00:36``), dates (``2023-03-22``, ``07/21/2024``,
    ``10/30 22:18:02``) and the start of a range (``1-1020``)."""
    n = len(nums)
    noise = [False] * n
    for i in range(n):
        before, after = texts[i], texts[i + 1]
        if before and (before[-1].isalpha() or before[-1] in "_."):
            noise[i] = True
        if (after == ":" and i + 1 < n) or (before == ":" and i > 0):
            noise[i] = True
        if before in (",", ".") and i > 1 and noise[i - 1] and texts[i - 1] == ":":
            noise[i] = True
    for i in range(n - 1):
        sep = texts[i + 1]
        if sep not in ("/", "-"):
            continue
        if i + 2 < n and texts[i + 2] == sep:
            noise[i] = noise[i + 1] = noise[i + 2] = True              # a date
        elif sep == "-":
            noise[i] = True                                            # a range: its end counts
        elif i + 2 < n and texts[i + 2] in (" ", "T", "-") and texts[i + 3:i + 4] == [":"]:
            noise[i] = noise[i + 1] = True                             # 10/30 22:18:02
    return noise


def _glued_names(texts: list[str], nums: list[str]) -> list[str | None]:
    """Counter names glued to their number (``ep6``, ``it156``, ``1epoch``, ``1020batch``)."""
    out: list[str | None] = [None] * len(nums)
    for i, num in enumerate(nums):
        m = _TRAILING_WORD.search(texts[i])
        if m and m.group(1).lower() in _GLUED_BEFORE:
            out[i] = _GLUED_BEFORE[m.group(1).lower()]
        elif num.isdigit():
            m = _LEADING_WORD.match(texts[i + 1])
            if m and m.group(1).lower() in _GLUED_AFTER:
                out[i] = _GLUED_AFTER[m.group(1).lower()]
    return out


def _in_loss_group(texts: list[str], nums: list[str], i: int) -> bool:
    """Whether number ``i`` sits in a bracketed group named for losses (``[Losses: ...``)."""
    head = "".join(t + v for t, v in zip(texts[:i], nums[:i])) + texts[i]
    start = max(head.rfind(c) for c in "[({")
    return start >= 0 and "loss" in head[start:].lower().split(":")[0]


def make_plan(texts: list[str], nums: list[str], user: Mapping[str, str] | None = None,
              split: bool = True) -> Plan:
    """Interpret one template: ``texts`` are the pieces around the numbers ``nums`` of a line."""
    n = len(nums)
    joined = "#".join(texts)
    low = joined.lower()
    plan = Plan()
    noise = _noise(texts, nums)
    glued = _glued_names(texts, nums)
    prefixes = _paths(texts) if "{" in joined else [""] * n
    befores = list(texts[:n])
    for i in range(n - 1):
        if glued[i]:
            noise[i] = False
        elif nums[i][:1] in "nNiI" and _WORD_INSIDE_KEY.match(texts[i + 1]) \
                and not texts[i].rstrip(" '\"").endswith((":", "=")):
            # `number of nan iterations: 0`: a non-finite word inside the next key's name.
            noise[i] = True
            befores[i + 1] = befores[i] + nums[i] + texts[i + 1]
        elif noise[i] and (texts[i][-1:].isalpha() or texts[i][-1:] == "_"):
            # `optim0_lr0=5e-05`, `lr_group0: 1e-4`: digits inside the next key's name.
            befores[i + 1] = befores[i] + nums[i] + texts[i + 1]
    if glued and n and glued[-1]:
        noise[-1] = False

    # What each number is: (kind, what, name).
    roles: list[tuple[str, str | None, str]] = []
    eval_context = False
    for i in range(n):
        before = befores[i]
        has_total = i + 1 < n and texts[i + 1].strip() == "/" and not noise[i + 1]
        g = glued[i]
        if g:
            kind, what = classify(g, user)
            roles.append((kind, what, g))
            continue
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
        if len(name) == 1 and not before.rstrip(" \t").endswith(":"):
            name = ""             # one letter is a key only as `s:12`, `L: 0.0058` (llm.c, SparK)
        full = f"{prefixes[i]}/{name}" if prefixes[i] and name else name
        kind, what = classify(full, user)
        if kind == "other" and normalise_key(name) == "total" and _in_loss_group(texts, nums, i):
            kind, what = "metric", keys.LOSS       # `[Losses: x 0.1, cls 0.2, total 0.3]`
        if kind == "other" and has_total and "/" in name:
            kind, what = classify(name.split("/")[0], user)   # "global_step/max_steps": "601/2161"
        if kind in ("other", "metric") and prefixes[i] and name \
                and classify(prefixes[i], user)[0] == "eval":
            kind, what = "eval", None
        if kind == "other" and has_total and i + 3 < n and texts[i + 3].strip() == "/" \
                and texts[i + 2].replace(" ", "") == "][" and nums[i].isdigit():
            kind, what = "epoch", None      # `Train: [3/300][370/1251]`: nested counters, the
            #                                 outer one counts epochs (Swin, `Epoch: [e][b/N]`)
        if i == 0 and kind == "other" and not name and nums[0].isdigit() and n > 1 \
                and _key_before(texts[1], glued=False)[:1].isalpha():
            kind, what = "step", "5"                   # `420 | loss 4.06 | lr ...`, `0 train 10.9`
        roles.append((kind, what, name))

    if n == 2 and roles[0][:2] == ("step", "5") and normalise_key(roles[1][2]) == "train":
        roles[1] = ("metric", keys.LOSS, roles[1][2])   # build-nanogpt `0 train 10.93`: a split's loss
    metrics: list[tuple[int, str, bool]] = []
    steps: list[tuple[int, int, str]] = []
    seen_keys: set[str] = set()
    eval_loss = split_loss = summary = False
    named = []
    bar_label = None
    for i, (kind, what, name) in enumerate(roles):
        if name:
            named.append(name)
        total = i + 1 < n and roles[i + 1][0] == "total"
        if kind in ("step", "batch", "epoch") and texts[i + 1].startswith("%"):
            bar_label = (kind, what, name)       # `steps:  22%|███| 176/800`: the bar's count
            continue
        if kind == "other" and not name and total and bar_label is not None:
            kind, what, name = bar_label
            bar_label = None
        if kind == "metric" and what is not None and what not in seen_keys:
            seen_keys.add(what)
            negative = texts[i].endswith("-") and not texts[i].endswith("--")
            metrics.append((i, what, negative))
            if what == keys.LOSS:
                plan.loss_name = normalise_key(name)
                split_loss = plan.loss_name in _SPLIT_QUALIFIED_LOSS
            if what == keys.SKIPPED:
                plan.prints_skipped = True
        elif kind == "step" and what is not None:
            steps.append((int(what), i, normalise_key(name)))
        elif kind == "epoch" and plan.epoch is None:
            plan.epoch = i
        elif kind == "per_epoch" and plan.per_epoch is None:
            plan.per_epoch = i
        elif kind == "batch" or (kind == "other" and not name and total):
            if not any(p == 9 for p, _, _ in steps):
                steps.append((9, i, "batch" if kind == "batch" else ""))   # `100/500 [==>..]`
        elif kind == "eval" and what == "loss":
            eval_loss = True
        elif kind == "summary":
            summary = True
    if steps:
        steps.sort()
        prio, idx, name = steps[0]
        plan.step, plan.step_priority = idx, prio
        if idx + 1 < n and roles[idx + 1][0] == "total":
            plan.step_total = idx + 1
        plan.counter = prio == 9
        plan.within_epoch = prio == 9 or name in _ITERATION_LIKE
        if prio < _MICRO_PRIORITY:
            micro = [i for p, i, _ in steps[1:] if _MICRO_PRIORITY <= p <= 3
                     and not (i + 1 < n and roles[i + 1][0] == "total")]
            if micro:
                plan.micro = micro[0]
        if split:
            repeated = [i for p, i, nm in steps if nm == name and p == prio]
            multi = _periodic(repeated, n)
            if multi:
                plan.kind = "multi"
                plan.parts = tuple((a, b, make_plan(texts[a:b + 1], nums[a:b], user, split=False))
                                   for a, b in multi)
                return plan
    plan.metrics = tuple(metrics)
    plan.loss_at = at = _loss_index(metrics)
    if at is not None and at + 1 < len(nums) and texts[at + 1].strip() == "(" \
            and texts[at + 2].lstrip().startswith(")"):
        # `loss: 6.9733 (6.9704)`: torchvision's MetricLogger (and detectron2's printer) print
        # the median of the last 20 values, then the average; a median repeats while the
        # window turns over. Other `value (average)` prints (timm) show the step's own value:
        # treating those as a window only makes the frozen-loss rule wait longer.
        plan.loss_window = 20
    if metrics and not any(neg for _, _, neg in metrics):
        cols = [i for i, _, _ in metrics]
        plan.values = operator.itemgetter(*cols) if len(cols) > 1 else (lambda nums, i=cols[0]: (nums[i],))
        plan.names = tuple(k for _, k, _ in metrics)
    plan.named = tuple(named)
    plan.score = len(named) + 2 * len(metrics) + (2 if steps else 0)
    plan.marker = any(m in joined for m in _STEP_MARKERS)

    if _OVERFLOW.search(joined):
        # `OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 32768`,
        # `Gradient overflow.  Skipping step, ... reducing loss scale to 1024.0`, fairseq's
        # `overflow detected, setting loss scale to: 64`, `Grad overflow on iteration 3`.
        plan.step = None
        for i, (_, _, name) in enumerate(roles):
            words = normalise_key(name).split()
            if words and words[-1] == "to" and "hysteresis" not in words:
                plan.overflow_scale = i
            elif "attempted" in words:
                plan.overflow_attempted = i
            elif words and words[-1] in ("iteration", "iter", "step"):
                plan.step = i
        if "skip" in low or "scale" in low or plan.step is not None:
            plan.kind = "overflow"
            plan.overflow_applied = bool(_APPLIED.search(joined))
            return plan
        plan.step = None
    named_step = plan.step is not None and not plan.counter
    if summary and not named_step:
        plan.kind = "skip"    # a run summary (HF's `train_runtime`, a best loss), not a step
        return plan
    if eval_context:
        plan.kind = "eval"
        return plan
    plan.mixed = eval_loss and split_loss
    if not metrics:
        nonfinite = any(v[:1] in "nNiI" for v in nums)
        if nonfinite and _NAN_WARNING.search(joined):
            plan.kind = "nan"
        elif named_step and plan.micro is None:
            plan.kind = "header"      # OLMo's `[step=1/739328,epoch=0]` above its metric lines
        elif (plan.epoch is not None or plan.per_epoch is not None) and plan.step is None:
            plan.kind = "epoch"       # `Epoch 2/10` above Keras' batch lines
        else:
            plan.kind = "skip"
        return plan
    if "step=" in joined and "skipped=" in joined:
        plan.cumulative_skips = True          # the DeepSpeed engine's counts: global, cumulative
        plan.step_priority = 0
    if not named_step and not any(k in (keys.LOSS, keys.GRAD_NORM) for _, k, _ in metrics):
        plan.kind = "skip"   # an LR or a scale with no step: a config echo, an epoch summary
    return plan


def _periodic(positions: list[int], n: int) -> list[tuple[int, int]]:
    """Several records glued on one line (lost newlines): the step name repeats at a fixed
    period. The (first, end) number ranges of the records, or [] for one record. The last
    record places the step within a record (the first may have lost its start)."""
    if len(positions) < 2:
        return []
    period = positions[1] - positions[0]
    if any(b - a != period for a, b in zip(positions, positions[1:])):
        return []
    offset = positions[-1] - (n - period)
    if not 0 <= offset <= positions[0]:
        offset = positions[0]
    starts = [max(0, p - offset) for p in positions]
    return list(zip(starts, starts[1:] + [n]))


class LineReader:
    """Interpretation of single lines: ``(numbers, plan)`` or ``None`` for a line without
    numbers. Plans are cached per template; the last record template is tried first."""

    def __init__(self, user_keys: Mapping[str, str] | None = None,
                 pattern: re.Pattern | None = None):
        self.user = {normalise_key(k): v for k, v in (user_keys or {}).items()}
        self.pattern = pattern
        self._plans: dict[str, Plan] = {}
        self.last: Plan | None = None

    def parse(self, seg: str) -> tuple[tuple | list, Plan] | None:
        last = self.last
        if last is not None and last.match is not None:   # a record plan: compiled
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
            if plan.match is None:    # compiled for record templates only (others may be many)
                plan.match = re.compile(_TEMPLATE_NUMBER.join(
                    _SPACES.sub(r"[ \\t]+", re.escape(t)) for t in texts)).fullmatch
            self.last = plan
        return parts[1::2], plan

    def _parse_pattern(self, seg: str):
        m = self.pattern.search(seg) if self.pattern is not None else None
        if m is None:
            return None
        nums: list[str] = []
        metrics: list[tuple[int, str, bool]] = []
        step = None
        for name, value in m.groupdict().items():
            if value is None:
                continue
            if name == "step":
                step = len(nums)
            else:
                metrics.append((len(nums), name, False))
            nums.append(value.strip())
        return nums, Plan(metrics=tuple(metrics), step=step, loss_at=_loss_index(metrics))


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
        self.pending_losses: list[float] | None = None   # a repeated step's losses
        self.pending_undecided = False        # see _emit
        self.pending_loss_name = ""
        self.pending_last_step = 0
        self.loss_name: str | None = None     # how the log's plain records name their loss
        self.overflows: list[tuple] = []      # (step or None, scale left, skipped) since the last record
        self.cumulative_skips = 0
        self.epoch: int | None = None
        self.epoch_base: int | None = None
        self.per_epoch: int | None = None     # batches per epoch, where the log declares them
        self.header_step: int | None = None   # a step line above an indented block of metrics
        self.micro_losses: list[float] = []
        self.micro_step: int | None = None
        self.micro_metrics: dict[str, float] = {}

    def feed(self, nums, plan: Plan) -> list[StepRecord]:
        kind = plan.kind
        if kind == "record":
            return self._record(nums, plan)
        if kind == "overflow":
            idx = plan.overflow_scale if plan.overflow_scale is not None else plan.overflow_attempted
            # Hysteresis consumed without a reduction: the attempted scale stays.
            self._overflow(int(float(nums[plan.step])) if plan.step is not None else None,
                           float(nums[idx]) if idx is not None else None,
                           not plan.overflow_applied)
        elif kind == "nan":
            rec = self.pending
            if rec is not None and keys.LOSS not in rec.metrics and (
                    plan.step is None or int(float(nums[plan.step])) == rec.step):
                rec.metrics[keys.LOSS] = float("nan")
        elif kind == "epoch":
            self._epoch_context(nums, plan)
        elif kind == "header":
            self.header_step = self._step_of(nums, plan)
        elif kind == "multi":
            out = []
            for a, b, part in plan.parts:
                out += self.feed(nums[a:b], part)
            return out
        return []

    def _epoch_context(self, nums, plan: Plan) -> None:
        if plan.per_epoch is not None:
            self.per_epoch = int(float(nums[plan.per_epoch]))
        if plan.epoch is not None:
            text = nums[plan.epoch]
            if "." in text:
                return                        # HF's epoch fraction is no counter
            self.epoch = int(text)
            if self.epoch_base is None:       # Lightning counts epochs from 0, Keras from 1
                self.epoch_base = min(self.epoch, 1)

    def _step_of(self, nums, plan: Plan) -> int | None:
        """The step a record line stands for, or None (numbered in order).

        A step printed with an epoch beside it (on its line or in a header above) counts
        batches of the epoch when it is a batch counter or an iteration count with the batches
        per epoch printed (`Epoch: [1] [200/735]`, `[ep6 it156/313]`), or when the log declares
        the batches per epoch (`Total Micro Batches 8`): (epoch - first epoch) x that + it.
        A batch counter without the batches per epoch (`ep: 0, batch: 20`) gives no step (the
        record is numbered in order). A named step is taken as printed, unless it cannot be a
        global count (below the number of finished epochs: `Epoch 149 | Iter 1`).
        """
        if plan.epoch is None and plan.per_epoch is None \
                and (self.epoch is None or plan.step_priority == 0):
            if plan.step is None:
                return None
            text = nums[plan.step]
            return int(text) if text.isdigit() else int(float(text))
        self._epoch_context(nums, plan)
        if plan.step is None:
            return None
        value = int(float(nums[plan.step]))
        if self.epoch is None or plan.step_priority == 0:
            return value
        done = self.epoch - (self.epoch_base or 0)
        per_epoch = self.per_epoch
        if plan.within_epoch and plan.step_total is not None:
            per_epoch = int(float(nums[plan.step_total]))
        if per_epoch is not None and (plan.within_epoch or self.per_epoch is not None):
            return done * per_epoch + value
        return value if value >= done and not plan.counter else None

    def _record(self, nums, plan: Plan) -> list[StepRecord]:
        if plan.values is not None:
            metrics = dict(zip(plan.names, map(float, plan.values(nums))))
        else:
            metrics = {key: (-float(nums[i]) if negative else float(nums[i]))
                       for i, key, negative in plan.metrics}
        if plan.loss_at is not None:
            text = nums[plan.loss_at]
            if text[-1:] == "0" and "." in text and "e" not in text and "E" not in text:
                # `1.000000` reads back as 1.0: the printed digits the float loses (stall)
                metrics[keys.LOSS_RESOLUTION] = 10.0 ** (text.index(".") + 1 - len(text))
            if plan.loss_window:
                metrics[keys.LOSS_WINDOW] = plan.loss_window
        step = self._step_of(nums, plan)
        if step is None and plan.step is None:
            step = self.header_step
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
        metrics.pop(keys.LOSS_RESOLUTION, None)   # their mean is not printed
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
        elif plan.loss_name and self.loss_name is None:
            self.loss_name = plan.loss_name
        if step is None:
            step = self.last_step + 1
        if self.overflows:
            self._fold_overflows(metrics, plan)
        prev = self.pending
        if prev is not None and prev.step == step:
            if plan.counter:
                prev.metrics.update(metrics)  # a progress bar redrawn: its last postfix counts
            else:
                # The same step again: another rank, or another micro-batch of the step. One
                # record: the mean loss, the other keys as first printed.
                self._repeat(prev, metrics)
            return []
        self.pending_last_step = self.last_step
        self.last_step = step
        self.pending = StepRecord(step, metrics)
        self.pending_losses = None
        if plan.mixed:
            self.pending_undecided = self.loss_name is None
            self.pending_loss_name = plan.loss_name
        return [prev] if prev is not None else []

    def _overflow(self, step: int | None, scale: float | None, skipped: bool = True) -> None:
        """One overflow skip, told once however many ranks and lines print it: the same
        iteration again, or rank 0's unnumbered line giving the scale of a numbered one. An
        overflow whose update went ahead (``skipped`` false) only sets the scale."""
        last = self.overflows[-1] if self.overflows else None
        if last is not None and ((step is not None and last[0] == step)
                                 or (step is None and last[0] is not None and last[1] is None)):
            self.overflows[-1] = (last[0], scale if scale is not None else last[1], last[2])
        else:
            self.overflows.append((step, scale, skipped))

    def _fold_overflows(self, metrics: dict, plan: Plan) -> None:
        skips = sum(1 for _, _, skipped in self.overflows if skipped)
        if not plan.prints_skipped and skips:
            metrics[keys.SKIPPED] = float(skips)
        scale = next((x for _, x, _ in reversed(self.overflows) if x is not None), None)
        if keys.LOSS_SCALE not in metrics and scale is not None:
            metrics[keys.LOSS_SCALE] = scale
        self.overflows = []

    def _repeat(self, prev: StepRecord, metrics: dict) -> None:
        if keys.LOSS in metrics:
            if self.pending_losses is None:
                self.pending_losses = [prev.metrics[keys.LOSS]] if keys.LOSS in prev.metrics else []
            self.pending_losses.append(metrics[keys.LOSS])
            prev.metrics[keys.LOSS] = _mean(self.pending_losses)
            prev.metrics.pop(keys.LOSS_RESOLUTION, None)   # a mean is not printed
            metrics.pop(keys.LOSS_RESOLUTION, None)
        for k, v in metrics.items():
            prev.metrics.setdefault(k, v)

    def flush(self) -> list[StepRecord]:
        """The held-back record (a followed file went idle: no warning is coming for it)."""
        out = [self.pending] if self.pending is not None else []
        self.pending = None
        return out

    def finish(self) -> list[StepRecord]:
        out = self.flush()
        for step, scale, skipped in self.overflows:    # overflow lines no record followed
            self.last_step = step if step is not None else self.last_step + 1
            m = {keys.SKIPPED: 1.0} if skipped else {}
            if scale is not None:
                m[keys.LOSS_SCALE] = scale
            out.append(StepRecord(self.last_step, m))
        self.overflows = []
        return out


def read(path, *, on_skip: SkipReport, progress: bool = False, lines: Iterable | None = None,
         user_keys: Mapping[str, str] | None = None, pattern: re.Pattern | None = None, **_
         ) -> Iterator[StepRecord]:
    """Records of a text log. ``lines``: ``(line_no, text)`` pairs to read instead of the file
    (a ``None`` text is an idle tick that releases the held-back record); ``user_keys``:
    {name printed in the log: metric key or ``"step"``}; ``pattern``: a regular expression
    whose named groups (``step`` and metric keys) replace the automatic reading."""
    reader = LineReader(user_keys, pattern)
    asm = Assembler()
    for line_no, text in (lines if lines is not None else numbered_lines(path, progress=progress)):
        if text is None:
            yield from asm.flush()
            continue
        text = strip_prefix(text)
        # The common case inline (a line of the last record template); feed_line otherwise.
        last = reader.last
        m = last.match(text) if last is not None and last.match is not None and asm.header_step is None else None
        if m is not None and last is not None:
            try:
                out = asm.feed(m.groups(), last)
            except (ValueError, OverflowError) as e:
                on_skip(line_no, text, f"unreadable number: {e}")
                continue
        else:
            out = feed_line(reader, asm, line_no, text, on_skip)
        if out:
            yield from out
    yield from asm.finish()


def feed_line(reader: LineReader, asm: Assembler, line_no: int, text: str,
              on_skip: SkipReport) -> list[StepRecord]:
    """One physical line through ``reader`` into ``asm``: the records it completes."""
    out: list[StepRecord] = []
    text = strip_prefix(text)
    if asm.header_step is not None and text[:1] not in (" ", "\t"):
        asm.header_step = None      # the indented block under a step line ended
    for seg in (segments(text) if ("\r" in text or "\x1b" in text or "\b" in text) else (text,)):
        seg = strip_prefix(seg)     # a coloured prefix shows once the colour codes are gone
        got = reader.parse(seg)
        if got is None:
            continue
        try:
            out += asm.feed(*got)
        except (ValueError, OverflowError) as e:
            on_skip(line_no, seg, f"unreadable number: {e}")
    return out


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
