"""Interpreting one line template: which number is the step, which the loss, what kind of line.

A :class:`Plan` is made once per template (:mod:`.tokens`) from the line's structure, with the
vocabulary (:mod:`.vocabulary`) breaking ties, and cached: every later line of the same shape is
read by it. Where the names leave the step open, the plan lists the integers that may count
(``Plan.counters``) and the reader watches them (:class:`~.generic.Template`), then makes the
plan again with the one that counted up (``hints``). The rules (docs/replay.md, The reader
grammar):

- The step counter: the user's (``--keys``, by name or position) first; a named step beats a
  named iteration (which becomes the micro-batch count beside a step); a run of bare integers
  at the start of a line (``420 | loss ...``, ``1|12|Loss: ...``) ends with the step; a bar's
  ``n/N`` counts batches within an epoch; a counter shown by its lines (``hints``).
- The loss (``LOSS_KINDS``): a name with a loss word and no split word; the loss itself, else a
  lone statistic of it (``avg loss``), else the sum of the terms printed (``box_loss``,
  ``Loss_D``), signed; the one unnamed value of a ``N: x`` line.
- Evaluation (a split named by a key, around the keys, or naming a counter) and run summaries
  are no records; statistics and unknown names are other numbers.
- DeepSpeed / apex / fairseq overflow lines, NaN warnings, epoch headers and step headers above
  an indented block have kinds of their own (:mod:`.assemble` gives them their meaning).
"""
from __future__ import annotations

import functools
import re
from dataclasses import dataclass, replace
from typing import Any, Callable, Mapping

from ... import keys
from . import tokens
from .vocabulary import (EVAL_SPLITS, EVALUATING, ITERATION_LIKE, MICRO_RANK, STEP_MARKERS, TRAIN_SPLITS, WHOLE_WORDS,
                         classify, discriminator, names_nothing, normalise_key)

# A split named outside any key (`| valid | epoch 1 | loss 2.3`, `Validation: step 100 ...`),
# not a key itself (litgpt's `val: n/a`) nor a file name (`eval.py:12`).
_EVAL_CONTEXT = re.compile(r"\b(?:val|valid|validation|validating|eval|evaluation|evaluating|"
                           r"test|testing|cv)\b(?!['\"]?\s*[:=]|\.py)", re.I)
# ... and a split that labels the line it opens (`valid: loss=3.2 acc=0.5`, `[Test]: loss 0.4`):
# `val: n/a` later on a line is a value of its own.
_EVAL_LABEL = re.compile(r"\W*(?:val|valid|validation|eval|evaluation|test|testing)\W*:\s*", re.I)
# `on training set` as a key: the name is printed before it (`'loss' on training set: 0.41`).
_ON_TRAINING_ALONE = re.compile(r"(?:on|for|over) (?:the )?(?:train|training)(?: (?:set|data|dataset|split))?",
                                re.I)
_TRAINING = re.compile(r"\b(?:train|training)\b", re.I)
_METRIC_NAMED = re.compile(r"\bevaluation metric\W*$", re.I)   # (MXNet's: the metric's name follows)
_SPLIT_QUALIFIED_LOSS = frozenset({"train loss", "training loss", "loss train"})
# `--lr 3e-4`, `Namespace(lr=...)`, `args.lr`: argument echoes, never metrics.
_ARG_ECHO = ("--", "namespace(", "args.", "argument", "config")
# `loss is nan at step 12`, `Detected NaN`: about the loss (`NaN found in input tensor` is not).
_NAN_WARNING = re.compile(r"\bloss\b.*\b(?:is|are|was|were|became|got|detected|found|"
                          r"encountered)\b|\bdetected\b|\bnon-?finite\s+loss", re.I)
# ... unless the line says there was none: `no NaN found`, `loss is not nan`, `without inf`.
_NO_NAN = re.compile(r"\b(?:no|not|never|without|zero)\b(?:\s+\w+){0,2}?\s+(?:nan|inf|infinity|non-?finite)\b"
                     # ... or a check's answer (`Loss is NaN: False`, `NaN in loss: 0`, `nan check passed`)
                     r"|\b(?:nan|inf|infinite|non-?finite)\b[^,;|\n]{0,12}?[:=?]\s*(?:false|0|no|none)\b"
                     r"|\b(?:nan|inf)\b\s+checks?\s+(?:passed|ok)\b", re.I)
_OVERFLOW = re.compile(r"overflow", re.I)
# a name of an integer that counts the loop (`Episode`, `update`, `iteration`), not a process
# (`[rank1]`, `GPU 3`) or an amount that grows (`tokens`, `samples`)
_LOOP_COUNT = re.compile(r"\b(?:episode|episodes|ep|iteration|iter|it|update|updates|round|generation|gen|rollout|"
                         r"cycle|trial|game|batch|step|steps|epoch)\b", re.I)
# A warning that a step's loss was not finite, or that a step was skipped (`WARNING: non-finite
# loss, skipping batch`, `loss is nan, setting to 0`, `skipping step 12: grad has inf`): it marks
# the record beside it whose loss prints 0 (see Assembler.warning).
_NONFINITE_LOSS = re.compile(r"\bloss\b.*\b(?:nan|inf|infinite|non-?finite|not finite)\b|"
                             r"\b(?:nan|inf|infinite|non-?finite|not finite)\b.*\bloss\b", re.I)
_SKIPPED = re.compile(r"\bskip(?:s|ping|ped)?\b(?:\s+\w+){0,3}?\s+(?:batch|step|update|iteration|iter)\b|"
                      r"\b(?:batch|step|update|iteration|iter)\b(?:\s+\w+){0,3}?\s+skipped\b", re.I)
# A value said not finite with no loss named (`NaN detected, skipping this batch`) is the loss's,
# unless the line blames the gradients or the loss scale (an fp16 overflow skip).
_NONFINITE = re.compile(r"\b(?:nan|inf|infinite|non-?finite|not finite)\b", re.I)
_GRADIENTS = re.compile(r"\bgrad|\boverflow|\bscale", re.I)
# MindSpore's `overflow, still update, loss scale adjust to 1024.0`: the step was applied.
_APPLIED = re.compile(r"\bstill updat|\bnot skip", re.I)
_KEYLESS = 5                  # the rank of a bare leading counter
_LEARNED = 6                  # the rank of a counter found by what its numbers do (hints)
_BAR = 9                      # the rank of a keyless `n/N` counter
UNNAMED = "(unnamed)"
_EACH = frozenset({"per", "each", "every"})
#: A step's names in the singular: after words that name nothing they still name the step (`Learning
#: iteration 100/1500`); a plural after them counts something (`max steps`, `total steps`).
_ONE_STEP = frozenset({"iteration", "iter", "step", "update"})
_KEY_WORDS = 5                # a longer name is prose ending in a key (_last_words)
# How a line's loss was found, best first: a log that prints the loss itself anywhere takes no
# statistic or sum of terms for it elsewhere (see Assembler.record).
LOSS_KINDS = ("exact", "statistic", "terms", "perplexity")
#: A training perplexity's names (a split word before them makes them an evaluation's).
_PERPLEXITY = frozenset({"ppl", "perplexity"})
#: A loss scale's exponent's name (`loss_scale_log2`, `log2_loss_scale`).
_SCALE_LOG2 = frozenset({"loss", "scale", "log2"})
# Words that make an unknown name a counter's (`n_updates`, `batch_idx`, `Update 12`): where
# several numbers of a line increase from line to line, they break the tie (then an unnamed one).
_COUNTER_WORDS = frozenset({"step", "steps", "iter", "iters", "iteration", "iterations", "it",
                            "update", "updates", "batch", "batches", "idx", "index",
                            "episode", "episodes", "round", "rounds", "n", "num", "global"})


@dataclass(slots=True)
class Plan:
    """How to read every line of one template: indices into the line's numbers per role."""

    metrics: tuple[tuple[int, str, bool], ...] = ()   # (number index, metric key, negative)
    ranks: tuple[int, ...] = ()      # the vocabulary rank of each metric's printed name
    components: tuple[tuple[int, bool], ...] = ()   # (index, negative) of the terms summed
    discriminators: tuple[int, ...] = ()            # ... of them, a discriminator's (`Loss_D`, `D_real`)
    ppl_at: int | None = None        # a perplexity where nothing else gives the loss: its log
    scale_log2_at: int | None = None  # the loss scale's log2 where no scale is printed: 2 to it
    # into the loss where none is printed
    printed: tuple[tuple[str, str], ...] = ()   # (our key or "step", the name the line prints)
    step: int | None = None
    step_rank: int = 1
    step_total: int | None = None    # `Step 10/1000`: the 1000
    counter: bool = False            # the step is a bar's count, not a named step
    within_epoch: bool = False       # an iteration or bar count: counts batches of an epoch
    micro: int | None = None
    epoch: int | None = None
    per_epoch: int | None = None     # `Total Micro Batches 8`: batches per epoch declared
    kind: str = "record"             # record | epoch | header | overflow | nan | eval | summary | ignore | multi
    marker: bool = False             # the line says it stepped the optimizer
    cumulative_skips: bool = False   # DeepSpeed `step=N, skipped=K`
    prints_skipped: bool = False
    overflow_scale: int | None = None
    overflow_attempted: int | None = None
    overflow_applied: bool = False   # the line says the update went ahead: a scale, no skip
    loss_name: str = ""              # the loss as the line names it (normalised)
    loss_kind: str = ""              # one of LOSS_KINDS, "" without a loss
    loss_rank: int = len(LOSS_KINDS)  # its index in LOSS_KINDS
    mixed: bool = False              # `train loss` beside `val loss`: see Assembler.emit
    parts: tuple = ()                # kind multi: ((first number, end, plan), ...)
    head: int = 0                    # kind multi: numbers before the first record (its start cut)
    tail: int | None = None          # kind multi: the first number of a record the line cuts
    # (it goes on on the next line: text re-wrapped), the line's length where only the next
    # record's name is cut off; None where the line ends with a record
    score: int = 0                   # how close to a record (for the error message)
    named: tuple[str, ...] = ()      # the keys it printed, for the error message
    match: Callable[[str], re.Match | None] | None = None   # the template's fullmatch, once used
    values: Callable[[Any], dict] | None = None   # numbers -> metrics (:func:`_extractor`)
    loss_at: int | None = None       # the index of the loss among the line's numbers
    loss_window: int = 0             # `loss: 6.9733 (6.9704)`: a window statistic
    step_name: str = ""              # the step as the line prints it
    simple: bool = False             # a named step and nothing else to work out (the fast path)
    counters: tuple[tuple[int, str], ...] = ()   # (index, name) of integers that may be a counter: their behaviour
    # across the template's lines decides (:class:`~.generic.Template`); () once decided
    merged: str = ""                 # the template with whitespace runs and signs folded
    signs: tuple[int, ...] = ()      # the numbers printed with a minus sign (see `signed`)
    outer: tuple[int, ...] = ()      # integers before the step that may count its epochs: one
    # that goes up when the step restarts does (Assembler._outer_step)
    after_bar: bool = False          # the values follow a progress bar's redraw on the line: a
    # record printed by the loop's body while the bar shows the batches done before it
    others: tuple[tuple[int, str], ...] = ()   # (index, name) of the other integers beside the step
    # that may count instead (a step that stays: Assembler._stays)
    eval_at: int | None = None       # an evaluation's loss (a results table's row without a training loss)
    slash: bool = False              # a named count and its total, both integers: the template's
    # second line says which moves (:func:`count_after_slash`)


# long: one pass over a template's roles, then the step, the loss and the kind placed on the
# Plan from the tables that pass fills (metrics, statistics, steps, components); split, those
# tables would travel between the pieces as one more structure, and a reader rule would be
# touched by a rename (issue 35 changes no reader rule).
def make_plan(texts: list[str], nums: list[str], user: Mapping[str, str] | None = None,
              split: bool = True, hints: Mapping[int, str] | None = None) -> Plan:
    """Interpret one template: ``texts`` are the pieces around the numbers ``nums`` of a line.
    ``hints``: {number index: ``"step"``} from what the template's numbers did across its lines
    (:class:`~.generic.Template`); without them, integers that may be a counter are listed in
    ``Plan.counters`` for the caller to watch."""
    n = len(nums)
    joined = "#".join(texts)
    plan = Plan(signs=tuple(i for i in range(n) if _negative(texts[i])))
    roles, eval_context = _roles(texts, nums, user, "{" in joined, hints)
    metrics: dict[str, tuple[int, int, str, bool]] = {}   # key -> (rank, index, name, negative)
    statistics: list[tuple[int, int, str]] = []   # (words beyond the loss, index, name)
    steps: list[tuple[int, int, str]] = []
    comps: list[tuple[int, bool]] = []
    eval_loss = summary = False
    eval_at = 0
    named = []
    bar_label = None
    ppl: int | None = None
    scale_log2: int | None = None
    for i, (role, key, rank, name) in enumerate(roles):
        if name:
            named.append(name)
        total = i + 1 < n and roles[i + 1][0] == "total"
        if role in ("step", "batch", "epoch") and texts[i + 1].startswith("%"):
            bar_label = (role, key, rank, name)   # `steps:  22%|███| 176/800`: the bar's count
            continue
        if role == "other" and not name and total and bar_label is not None:
            role, key, rank, name = bar_label
            bar_label = None
        if role == "metric" and key is not None:
            negative = _negative(texts[i])
            if key not in metrics or rank < metrics[key][0]:
                metrics[key] = (rank, i, name, negative)
        elif role == "component":
            comps.append((i, _negative(texts[i])))
        elif role == "statistic" and key == keys.LOSS:
            statistics.append((len(normalise_key(name).split()), i, name))
        elif role == "step":
            steps.append((rank, i, normalise_key(name)))
        elif role == "epoch" and plan.epoch is None:
            plan.epoch = i
        elif role == "per_epoch" and plan.per_epoch is None:
            plan.per_epoch = i
        elif role == "batch" or (role == "other" and not name and total):
            if not any(p == _BAR for p, _, _ in steps):
                steps.append((_BAR, i, "batch" if role == "batch" else ""))   # `100/500 [==>..]`
        elif role == "eval" and key == keys.LOSS:
            eval_at = i if not eval_loss else eval_at
            eval_loss = True
        elif role == "summary":
            summary = True
        elif role == "other" and ppl is None and _PERPLEXITY.intersection(normalise_key(name).split()[-1:]):
            ppl = i
        elif role == "other" and scale_log2 is None and _SCALE_LOG2.issubset(
                w if w != "lg" else "log2" for w in normalise_key(name).split()):   # (guided-diffusion's `lg_loss_scale`)
            scale_log2 = i
    ordered = sorted(((i, k, neg) for k, (_, i, _, neg) in metrics.items()))
    last_value = max((i for i, _, _ in ordered), default=-1)
    if plan.epoch is not None:
        # A bar after the values of a line that names its epoch is the epoch's progress.
        steps = [s for s in steps if not (s[0] == _BAR and s[1] > last_value >= 0)]
    if steps:
        steps.sort()
        prio, idx, name = steps[0]
        plan.step, plan.step_rank = idx, prio
        if idx + 1 < n and roles[idx + 1][0] == "total":
            plan.step_total = idx + 1
        plan.counter = prio == _BAR
        plan.within_epoch = prio == _BAR or name in ITERATION_LIKE or (
            prio in (_KEYLESS, _LEARNED) and plan.epoch is not None)
        if prio < MICRO_RANK:
            micro = [i for p, i, _ in steps[1:] if MICRO_RANK <= p <= 3
                     and not (i + 1 < n and roles[i + 1][0] == "total")]
            if micro:
                plan.micro = micro[0]
    if split and n >= 2:
        repeated = _repeated(texts, nums, user)
        if repeated is not None:
            plan.kind = "multi"
            plan.parts, plan.head, plan.tail = repeated
            return plan
    if keys.LOSS not in metrics and not comps:
        # `loss/pi: 0.01  loss/v: 3.2` with no loss: not streams of a loss the line prints (ours,
        # per data set, come beside it) but its terms (an actor-critic's policy and value losses)
        comps = [(i, neg) for k, (_, i, _, neg) in sorted(metrics.items(), key=lambda kv: kv[1][1])
                 if k.startswith(keys.LOSS_STREAM_PREFIX)]
        for k in [k for k in metrics if k.startswith(keys.LOSS_STREAM_PREFIX)]:
            del metrics[k]
        ordered = sorted(((i, k, neg) for k, (_, i, _, neg) in metrics.items()))
    if keys.LOSS in metrics:
        plan.loss_kind = LOSS_KINDS[0]
    elif statistics:
        # `Update 12: avg loss 1.234`: a statistic of the loss where the line prints no other
        # (the plainest name: `avg loss` over `avg box_loss`).
        i = min(statistics)[1]
        metrics[keys.LOSS] = (1, i, roles[i][3], _negative(texts[i]))
        ordered = sorted(((i, k, neg) for k, (_, i, _, neg) in metrics.items()))
        plan.loss_kind = LOSS_KINDS[1]
    plan.metrics = tuple(ordered)
    plan.ranks = tuple(metrics[k][0] for _, k, _ in ordered)
    printed = [(k, _said(k, metrics[k][2], plan.loss_kind)) for _, k, _ in ordered]
    if keys.LOSS in metrics:
        plan.loss_name = normalise_key(metrics[keys.LOSS][2])
    elif comps:
        # Terms of the objective and no total: their sum (one term alone is the loss it names) —
        # unless one of them alone names a total (`actor/total_loss` beside `actor/pg_loss` and an
        # entropy: the total is the loss, summed with its own parts it was more than twice itself)
        totals = [(i, neg) for i, neg in comps if WHOLE_WORDS.intersection(normalise_key(roles[i][3]).split())]
        comps = totals if len(totals) == 1 else comps
        plan.components = tuple(comps)
        plan.discriminators = tuple(i for i, _ in comps if discriminator(roles[i][3]))
        plan.loss_kind = LOSS_KINDS[2]
        printed.append((keys.LOSS, " + ".join(roles[i][3] for i, _ in comps)
                        + (" (the sum of the terms printed)" if len(comps) > 1 else "")))
    elif ppl is not None and plan.step is not None:
        # a perplexity is e^(the mean cross-entropy): where a line with its own counter prints no
        # loss, its log is (a lone `ppl: 4998` under `Evaluating perplexity` is an evaluation's)
        plan.ppl_at, plan.loss_kind = ppl, LOSS_KINDS[3]
        printed.append((keys.LOSS, f"log({roles[ppl][3]}) (the log prints a perplexity, e^loss, and no loss)"))
    if scale_log2 is not None and keys.LOSS_SCALE not in metrics:
        # `loss_scale_log2: 15` (a loss scale kept as its exponent): the scale is 2 to it
        plan.scale_log2_at = scale_log2
        printed.append((keys.LOSS_SCALE, f"2^{roles[scale_log2][3]} (the log prints the scale's log2)"))
    if plan.step is not None:
        plan.step_name = roles[plan.step][3] or ("a bar's count" if plan.counter else UNNAMED)
        plan.after_bar = plan.counter and _after_bar(texts, plan.step, [i for i, _, _ in ordered])
        printed.append(("step", plan.step_name))
    plan.printed = tuple(printed)
    plan.prints_skipped = keys.OVERFLOW_SKIPPED in metrics
    plan.loss_at = at = metrics[keys.LOSS][1] if keys.LOSS in metrics else None
    if at is not None and at + 1 < n and texts[at + 1].strip() == "(" \
            and texts[at + 2].lstrip().startswith(")"):
        # `loss: 6.9733 (6.9704)`: torchvision's MetricLogger (and detectron2's) print the median
        # of the last 20 values, then the average; a median repeats while the window turns over.
        plan.loss_window = 20
    elif at is not None and at + 1 < n and texts[at + 1].replace(" ", "") == ",v_num=":
        # `.., loss=0.216, v_num=0]`: Lightning 1.x's bar puts the mean of the last 20 training losses
        # (its running loss) first, before the version number and the metrics logged to the bar
        plan.loss_window = 20
    if ordered and not any(neg for _, _, neg in ordered):
        plan.values = _extractor(tuple((i, k) for i, k, _ in ordered))
    plan.named = tuple(named)
    plan.score = len(named) + 2 * (len(ordered) + len(plan.components)) + (2 if steps else 0)
    plan.marker = any(m in joined for m in STEP_MARKERS)
    plan = _kind(plan, texts, nums, roles, joined, summary, eval_context, eval_loss)
    if eval_loss and plan.kind == "eval" and plan.step is not None:
        plan.eval_at = eval_at        # (read where the line is a table's row: Assembler.feed)
        plan.printed += ((keys.EVAL_LOSS, roles[eval_at][3]),)
    if eval_loss and plan.kind == "record" and plan.loss_at is not None:
        # an evaluation's loss on a training record's line (a results table's `Validation Loss`): read
        # beside the record, as its own signal (an evaluation gone NaN, weights that stopped changing)
        plan.metrics += ((eval_at, keys.EVAL_LOSS, _negative(texts[eval_at])),)
        plan.printed += ((keys.EVAL_LOSS, roles[eval_at][3]),)
        plan.values = _extractor(tuple((i, k) for i, k, _ in plan.metrics)) if plan.values is not None else None
    plan.loss_rank = LOSS_KINDS.index(plan.loss_kind) if plan.loss_kind else len(LOSS_KINDS)
    if plan.kind == "record" and plan.step is not None and plan.epoch is None:
        plan.outer = tuple(i for i in range(plan.step) if roles[i][0] == "other"
                           and nums[i].isdigit() and not roles[i][3].lower().startswith(_ARG_ECHO))
    if plan.kind == "record" and plan.step is not None:
        plan.others = tuple((i, roles[i][3]) for i in range(n) if i != plan.step and roles[i][0] == "other"
                            and nums[i].isdigit() and _LOOP_COUNT.search(roles[i][3]))
    plan.simple = (plan.kind == "record" and plan.step is not None and plan.epoch is None
                   and not plan.outer and plan.loss_rank in (0, len(LOSS_KINDS))
                   and plan.per_epoch is None and plan.micro is None and not plan.cumulative_skips
                   and not plan.mixed and not plan.components and not plan.counter)
    if plan.kind == "record" and plan.step is None and hints is None:
        plan.counters = tuple((i, name) for i, (role, _, _, name) in enumerate(roles)
                              if role == "other" and nums[i].isdigit()
                              and not name.lower().startswith(_ARG_ECHO) and not _DURATION.match(texts[i + 1]))
    at, at_total = plan.step, plan.step_total
    plan.slash = (plan.kind == "record" and at is not None and at_total is not None and plan.epoch is None and hints is None
                  and nums[at].isdigit() and nums[at_total].isdigit() and not texts[at + 1].startswith("%"))
    return plan


def count_after_slash(plan: Plan) -> Plan:
    """The plan of a template whose number after a slash moved from its first line to its second
    while the number before it stayed (WeNet's ``TRAIN Batch 0/20``, ``Batch 0/40``: ``epoch/batch``):
    no count and its total, which stays while the count moves, but the epoch and the count within it."""
    return replace(plan, epoch=plan.step, step=plan.step_total, step_total=None, counter=False, within_epoch=True,
                   step_rank=_LEARNED, simple=False, outer=(), others=(), slash=False, match=None,
                   step_name=f"{plan.step_name} /N")


@functools.lru_cache(maxsize=1024)
def _extractor(columns: tuple[tuple[int, str], ...]) -> Callable[[Any], dict]:
    """A template's numbers -> its metrics, ``{key: float(numbers[index])}`` for its ``columns``
    (index, key), compiled once: a dict display whose keys are constants costs half of building
    it from pairs (~280 ns for 5 values, not ~540). The same dict: the same keys in the same
    order, each value the same float (a key twice keeps its first place and its last value, as
    any dict built in order does). The text compiled is only ``repr`` of keys and integers.

    >>> _extractor(((1, "loss"), (3, "lr")))(["7", "2.5", "x", "1e-4"])
    {'loss': 2.5, 'lr': 0.0001}
    """
    body = ", ".join(f"{key!r}: f(n[{i}])" for i, key in columns)
    return eval(f"lambda n, f=float: {{{body}}}")   # noqa: S307 - repr of str keys and ints only


#: A time unit glued to the number before it (`12s - loss: 0.5`, Keras 1's `verbose=2` epoch line;
#: `340ms`): a duration, never a counter.
_DURATION = re.compile(r"(?:s|ms|us|sec|secs|min|mins|h|hr|hrs)\b")


def _negative(before: str) -> bool:
    """Whether the number after the text ``before`` is printed with a minus sign (``loss -0.5``,
    ``loss: -0.5``; not a separator word: ``step 3 -- 0.5``)."""
    return before.endswith("-") and not before.endswith("--")


def signed(plan: Plan, signs: tuple[int, ...]) -> Plan:
    """``plan`` for a line of its template whose numbers ``signs`` print a minus sign: a
    template learned across its lines folds the signs (:func:`.tokens.fold`), so its plan, made
    from its first line, carries that line's signs (a loss that went below zero later read as
    above it). A copy, with no compiled match (the caller compiles the line's own)."""
    if signs == plan.signs:
        return plan
    neg = set(signs)
    metrics = tuple((i, k, i in neg) for i, k, _ in plan.metrics)
    return replace(plan, signs=signs, metrics=metrics, components=tuple((i, i in neg) for i, _ in plan.components),
                   match=None, values=None if any(n for _, _, n in metrics) else plan.values)


def _after_bar(texts: list[str], step: int, values: list[int]) -> bool:
    """Whether a line's values come after a tqdm bar's redraw (``10%|#  | 10/100 [00:01<00:09,
    9.9it/s]{'loss': 2.3}``): the bar's graphic before its count, its bracket closed before the
    first value (a postfix, ``[..., loss=2.3]``, is the bar's own)."""
    if not values or "%|" not in texts[step].replace(" ", ""):
        return False
    first = min(values)
    return any("]" in texts[k] for k in range(step + 1, first + 1))


def choose_counter(plan_roles: list[tuple[int, str]], ups: Mapping[int, int] | None = None) -> int:
    """The step among integers that all increase from line to line (``(index, printed name)``):
    a name of a counter's words first (``n_updates``, ``batch_idx``), then any other name
    (Marian's ``Up. 14000``), then an unnamed one; of unnamed ones, the one that went up on most
    lines (``ups``: {index: lines}; a table's `epoch  iter` columns: the iteration); the
    leftmost of equals."""
    def rank(item):
        i, name = item
        words = set(normalise_key(name).split())
        kind = 0 if words & _COUNTER_WORDS else 1 if name else 2
        return kind, -(ups or {}).get(i, 0) if kind == 2 else 0, i
    return min(plan_roles, key=rank)[0]


def _said(key: str, name: str, loss_kind: str) -> str:
    """How the account names a printed key: a statistic taken for the loss says so."""
    if key == keys.LOSS and loss_kind == LOSS_KINDS[1]:
        return f"{name} (a statistic of the loss: the log prints no other)"
    return name or UNNAMED


def slot_roles(texts: list[str], nums: list[str]) -> list[tuple[str, str | None, int, str]]:
    """``(role, our key, rank, printed name)`` of every number of a line, as a plan sees them
    (``noise``, ``total``, ``step``, ``metric``, ``other``, ...)."""
    return _roles(texts, nums, None, "{" in "".join(texts))[0]


def _roles(texts, nums, user, nested, hints=None) -> tuple[list[tuple[str, str | None, int, str]], bool]:
    """``(role, our key, rank, printed name)`` of every number, and whether a split is named
    around the keys. The user's names and positions (``--keys``) come before every rule."""
    n = len(nums)
    is_noise, glued, befores = _pieces(texts, nums)
    prefixes = tokens.paths(texts) if nested else None
    stats_dicts = nested and _STATS_DICT.search("".join(texts)) is not None
    roles: list[tuple[str, str | None, int, str]] = []
    eval_context = False
    inner, inner_role = -1, ("total", None, 0, "")   # the number after `a/` a name's second part names
    opens = _opening(befores)
    for i in range(n):
        before, g = befores[i], glued[i]
        said = _user_role(user, i, before, prefixes[i] if prefixes else "") if user else None
        if said is not None:
            roles.append(said)
            continue
        if hints and i in hints:   # (a statistic's summary's mean: the name of its key, see below)
            name = g or tokens.key_before(before, glued=i > 0)
            roles.append(("step", None, _LEARNED, prefixes[i] if stats_dicts and prefixes and name in _MEAN_FIELDS
                          else name))
            continue
        if g:
            roles.append((*classify(g, user), g))
            continue
        if is_noise[i]:
            roles.append(("noise", None, 0, ""))
            # (a split named before a time: DeepSpeech's `Epoch 0 | Validation | Elapsed Time: 0:00:01 | ..`)
            eval_context = eval_context or _evaluation_named(before, "", opens[i])
            continue
        if i > 0 and before.strip() == "/" and not is_noise[i - 1]:
            roles.append(inner_role if i == inner else ("total", None, 0, ""))
            continue
        name, rest = _name_and_rest(before, i > 0)
        eval_context = eval_context or _evaluation_named(rest, name, opens[i])
        if name.startswith("-") or name.lower().startswith(_ARG_ECHO):
            roles.append(("other", None, 0, name))
            continue
        if len(name) == 1 and not before.rstrip(" \t").endswith(":"):
            name = ""             # one letter is a key only as `s:12`, `L: 0.0058` (llm.c, SparK)
        name = _last_words(name, user)
        if stats_dicts and prefixes and prefixes[i] and name in _STATISTIC_FIELDS:
            roles.append(_statistic_field(prefixes[i], name, user))
            continue
        role, key, rank = _named_in(name, prefixes[i] if prefixes else "", user)
        has_total = i + 1 < n and texts[i + 1].strip() == "/" and not is_noise[i + 1]
        if role == "other" and normalise_key(name) == "total" and tokens.in_loss_group(texts, i):
            role, key, rank = "metric", keys.LOSS, 1     # `[Losses: x 0.1, cls 0.2, total 0.3]`
        elif role in ("other", "eval") and has_total and "/" in name:   # `global_step/max_steps: 601/2161`, `e/b: 3/120`
            (role, key, rank), inner, inner_role = _slash_named(name, i, user)
        elif role in ("metric", "component", "other") and prefixes and prefixes[i] and name \
                and classify(prefixes[i], user)[0] == "eval":
            role, key = "eval", None
        elif role == "other" and has_total and i + 3 < n and texts[i + 3].strip() == "/" \
                and texts[i + 2].replace(" ", "") == "][" and nums[i].isdigit():
            role = "epoch"        # `Train: [3/300][370/1251]`: nested counters, the outer one
        elif role == "eval" and key is None and nums[i].isdigit() and _counts_a_split(name):
            eval_context = True   # `test epoch: 1, loss: ..`, `Test: [ 0/30] .. Loss: ..`
        roles.append((role, key, rank, name))   # counts epochs (`Epoch: [e][b/N]` names it)
    _index_after_name(texts, nums, roles)
    _loss_array(texts, nums, roles)
    _players(roles)
    _bare_counters(texts, nums, roles)
    _counter_in_prose(texts, nums, roles, user)
    return roles, eval_context


def _opening(befores: list[str]) -> list[bool]:
    """Per number of a line: whether only numbers and marks come before its text, so that a
    label there opens the line (`[012] valid: loss=`); kept as the line is walked (linear)."""
    out, worded = [], False
    for before in befores:
        out.append(not worded)
        worded = worded or any(c.isalpha() for c in before)
    return out


def _name_and_rest(before: str, glued: bool) -> tuple[str, str]:
    """A number's name and the text before the name (``glued``: not the line's first number)."""
    name = tokens.key_before(before, glued=glued)
    rest = before[:before.rfind(name)] if name else before
    if _ON_TRAINING_ALONE.fullmatch(name):   # `evaluation metric 'loss' on training set: 0.41`
        rest, name = _named_before(rest, name, glued)
    return name, rest


def _pieces(texts: list[str], nums: list[str]) -> tuple[list[bool], list[str | None], list[str]]:
    """Per number of a line: whether it is noise, the counter name glued to it, and the text its
    key is read from (:func:`.tokens.befores`; names printed after their values moved before)."""
    is_noise = tokens.noise(texts, nums)
    glued = tokens.glued_names(texts, nums)
    for i, g in enumerate(glued):
        if g:
            is_noise[i] = False
    befores = tokens.befores(texts, nums, is_noise, glued)
    tokens.names_after(texts, befores, [bool(g) or is_noise[i] or any(
        c.isalpha() for c in tokens.key_before(befores[i], glued=i > 0)) for i, g in enumerate(glued)])
    return is_noise, glued, befores


#: The fields of a statistic's summary printed as a dict (``{"num": 64, "mean": 1.2, "std": 0.3}``),
#: and those that are its value.
_STATISTIC_FIELDS = frozenset({"num", "count", "n", "mean", "avg", "std", "min", "max", "sum", "value"})
_MEAN_FIELDS = frozenset({"mean", "avg", "value"})
_STATS_DICT = re.compile(r"""\{\s*["']?(?:num|count|n)["']?\s*:\s*,\s*["']?(?:mean|avg)["']?\s*:""")   # (the numbers cut out)


#: The text between a name's index and its value: brackets, `@`, `=`, `:`, spaces.
_INDEX_GAP = re.compile(r"[\]\)]?\s*[:=]?\s*")


#: Short names of an epoch and of a batch or iteration within it (`e/b`, `ep/it`).
_EPOCH_ABBREV = frozenset({"e", "ep"})
_BATCH_ABBREV = frozenset({"b", "i", "it", "itr", "bt"})


def _slash_named(name: str, i: int, user) -> tuple[tuple[str, str | None, int], int, tuple]:
    """The role of number ``i`` printed as ``x/y`` under a name with a slash, the number its
    second part names (-1: none: a count's total) and that number's role. Each part of the
    name names its number where the parts are two counters (``e/b: 3/120``, ``Epoch/Iter``:
    an epoch and a batch within it) or two splits (``train/val loss = 2.2 / 2.3``: the training
    loss and an evaluation's); else the first part names the number and a total follows
    (``global_step/max_steps: 601/2161``, ``iter/total``)."""
    words = name.split()
    at = next((k for k, w in enumerate(words) if "/" in w), None)
    parts = words[at].split("/") if at is not None else []
    if at is not None and len(parts) == 2:
        first, second = (normalise_key(p) for p in parts)
        if at == len(words) - 1 and (first in _EPOCH_ABBREV or classify(first, user)[0] == "epoch") and \
                (second in _BATCH_ABBREV or classify(second, user)[0] in ("step", "batch")):
            return ("epoch", None, 0), i + 1, ("batch", None, 0, parts[1])
        rest = " ".join(words[:at] + words[at + 1:])
        if rest and first in TRAIN_SPLITS and second in EVAL_SPLITS:
            return classify(f"{parts[0]} {rest}", user), i + 1, ("eval", classify(rest, user)[1], 0, f"{parts[1]} {rest}")
    return classify(name.split("/")[0], user), -1, ("total", None, 0, "")


def _index_after_name(texts, nums, roles) -> None:
    """A metric's name, then an integer, then an unnamed number with a fraction (``Loss [100]:
    2.31``, ``loss@100 = 2.31``, ``loss(100): 2.31``, ``train loss 100 2.31``): the integer is an
    index — a step, the caller watches whether it counts — and the name is the value's, which a
    loss printed as an integer right before its own value never is."""
    n = len(nums)
    for i in range(n - 1):
        role, key, rank, name = roles[i]
        nxt = roles[i + 1]
        if not (name and nums[i].isdigit() and nxt[0] == "other" and not nxt[3]
                and not nums[i + 1].lstrip("-+").isdigit() and _INDEX_GAP.fullmatch(texts[i + 1])
                and (texts[i].rstrip()[-1:] in ("[", "(", "@") or texts[i][-1:].isalnum() or texts[i][-1:] == " ")):
            continue
        if role == "metric" and key is not None:
            roles[i], roles[i + 1] = ("other", None, 0, ""), (role, key, rank, name)
        elif role == "step" and rank == _LEARNED:   # the index, learned a step: the name is the value's
            named = classify(name)
            if named[0] == "metric" and named[1] is not None:
                roles[i], roles[i + 1] = ("step", None, _LEARNED, ""), (*named, name)


def _statistic_field(prefix: str, name: str, user) -> tuple[str, str | None, int, str]:
    """The role of a field of a statistic's summary printed as a dict (``"Loss/G/loss": {"num":
    64, "mean": 1.2, "std": 0.3}``, StyleGAN's stats.jsonl): the mean is the value the enclosing
    key names, the others its statistics."""
    if name in _MEAN_FIELDS:
        return (*classify(prefix, user), prefix)
    return "other", None, 0, f"{prefix}/{name}"


def _players(roles) -> None:
    """A GAN's two players named by their letters alone (``Iter: 100, D: 0.51, G: 1.52``): both
    printed and no loss named, each is a term of the loss (a discriminator's and a generator's),
    as ``D_loss`` and ``G_loss`` are; one letter alone names nothing."""
    at = {name.upper(): i for i, (role, _, _, name) in enumerate(roles) if role == "other" and name in ("D", "d", "G", "g")}
    if len(at) == 2 and set(at) == {"D", "G"} and not any(key == keys.LOSS for _, key, _, _ in roles):
        # (not beside a loss the line names: DCGAN's `Loss_D: .. Loss_G: .. D(x): 0.8 D(G(z)): 0.2`)
        for i in at.values():
            roles[i] = ("component", keys.LOSS, 0, roles[i][3])


_ARRAY_SEPARATOR = re.compile(r"\s*,?\s*-?")


def _loss_array(texts, nums, roles) -> None:
    """The loss printed as an array (``loss: [0.52, 0.31, 0.11]``, torch's ``tensor([..])``
    unwrapped): its terms, unnamed. Where the first or the last is the sum of the others, within
    the print's rounding (``[total, cls, box]``, YOLO's ``box obj cls total``), that one is the
    loss; else the loss is their sum, said as such (``loss[1] + loss[2] + loss[3]``), as for
    any terms printed without their total."""
    n = len(nums)
    for i in range(n - 1):
        role, key, rank, name = roles[i]
        if key != keys.LOSS or role not in ("metric", "component") or not texts[i].rstrip(" -").endswith(("[", "(")):
            continue
        last = i
        while last + 1 < n and roles[last + 1][0] == "other" and not roles[last + 1][3] \
                and _ARRAY_SEPARATOR.fullmatch(texts[last + 1]):
            last += 1
        if last == i or not texts[last + 1].lstrip().startswith(("]", ")")):
            continue
        after = texts[last + 1].lstrip()[1:].lstrip()
        if last + 1 < n and after.startswith("(") and after.rstrip().endswith((":", "=")) \
                and after.count(",") == last - i:
            # `Loss [10, 200](epoch, iter): 0.523`: the list is the counts the parenthesis names, and
            # the value after the colon is the loss's (the counts were summed as its terms)
            names = [w.strip() for w in after[1:after.index(")")].split(",")] if ")" in after else []
            for k, said in zip(range(i, last + 1), names if len(names) == last - i + 1 else [""] * (last - i + 1)):
                roles[k] = (*classify(said), said) if said else ("other", None, 0, "")
            roles[last + 1] = (role, key, rank, name)
            return
        members = range(i, last + 1)
        values = [-float(nums[k]) if _negative(texts[k]) else float(nums[k]) for k in members]
        slack = sum(0.5 * 10.0 ** -len(nums[k].partition(".")[2]) if "e" not in nums[k].lower() else 1e-6 * abs(v)
                    for k, v in zip(members, values))
        total = (i if abs(values[0] - sum(values[1:])) <= slack else
                 last if abs(values[-1] - sum(values[:-1])) <= slack else None)
        for k in members:
            said = f"{name}[{k - i + 1}]" + (" (the sum of the others in its array)" if k == total else "")
            roles[k] = (("component", keys.LOSS, 0, said) if total is None else
                        ("metric", keys.LOSS, min(rank, 1), said) if k == total else ("other", None, 0, said))
        return


def _named_before(rest: str, phrase: str, glued: bool) -> tuple[str, str]:
    """``(text before the name, name)`` of a key that is a phrase about the split alone (``on
    training set``): the name printed before it, with the phrase (``loss on training set``)."""
    named = tokens.key_before(rest, glued=glued)
    return (rest[:rest.rfind(named)], f"{named} {phrase}") if named else (rest, phrase)


def _named_in(name: str, prefix: str, user) -> tuple[str, str | None, int]:
    """The role of a name inside a dict whose enclosing keys are ``prefix`` (``train/loss``); a step or
    an epoch under a label that names nothing is one (`json_stats: {"iter": 20, ..}`)."""
    if not prefix or not name:
        return classify(name, user)
    got = classify(f"{prefix}/{name}", user)
    if got[0] == "other" and names_nothing(prefix):
        own = classify(name, user)
        if own[0] in ("step", "epoch"):
            return own
    return got


def _evaluation_named(rest: str, name: str, opens_line: bool) -> bool:
    """Whether the text before a number's name names an evaluation split around it (`val loss`,
    `Test: [ 0/30] .. Loss`), or opens the line with one as its label (`valid: loss=3.2`)."""
    return bool(_EVAL_CONTEXT.search(rest) or (opens_line and _EVAL_LABEL.fullmatch(rest))) \
        and not _training_named(rest, name)


def _training_named(rest: str, name: str) -> bool:
    """Whether the split words around a key only say it was evaluated, on the training split
    (`[7] Evaluation metric train-loss:`): the training set's value, no evaluation's. MXNet's
    trainers (GluonTS's) print every metric so, the training one under its own name and a
    validation's with its split (`Evaluation metric 'epoch_loss'=`, `'validation_epoch_loss'=`)."""
    return all(m.group(0).lower() in EVALUATING for m in _EVAL_CONTEXT.finditer(rest)) \
        and bool(_TRAINING.search(rest) or _TRAINING.search(name) or _METRIC_NAMED.search(rest))


def _last_words(name: str, user) -> str:
    """A name longer than a key (prose before it: `Start Training /path/run_iter30k Epoch`):
    its shortest tail that names something (`Epoch`), else the whole. A file's path ends the
    prose: no key holds one (`train/loss` is a key, `/runs/trial` and `runs/a/b` are paths), so
    the words after the last path are the name, however few the words before it."""
    if "/" in name:
        words = name.split()
        last = max((i for i, w in enumerate(words) if w.startswith("/") or w.count("/") >= 2), default=-1)
        if 0 <= last < len(words) - 1:
            name = " ".join(words[last + 1:])
    if len(name) < 2 * _KEY_WORDS or sum(map(name.count, " /_-.")) < _KEY_WORDS \
            or len(normalise_key(name).split()) <= _KEY_WORDS:
        words = name.split()
        if len(words) > 1 and words[-2].lower() not in _EACH and classify(name, user)[0] == "other":
            if classify(words[-1], user)[0] == "epoch":
                return words[-1]        # `Starting epoch 3`, `Begin epoch 3` (not `steps per epoch`)
            if len(words) == 2 and words[0].istitle() and words[-1] in _ONE_STEP:
                return words[-1]        # rsl_rl's `Learning iteration 100/1500`
        return name                     # (the counts first: most names are short)
    words = name.split()
    for k in range(1, min(_KEY_WORDS, len(words))):
        tail = " ".join(words[-k:])
        if classify(tail, user)[0] != "other":
            return tail
    return name


#: Words around a split and a counter that name no quantity: a report's nouns and prepositions
#: (MaxText's `eval metrics after step: 99, loss=4.242`).
_REPORT_WORDS = frozenset({"metrics", "metric", "results", "result", "stats", "statistics", "after", "at", "for",
                           "of", "on", "in", "with"})


def _counts_a_split(name: str) -> bool:
    """Whether a name is a split word alone or with a counter's word (``Test``, ``test epoch``,
    ``val_step``, ``eval metrics after step``, PaddlePaddle's ``Test with Pass`` and ``Test samples=``): the number it names counts an evaluation's lines."""
    from .vocabulary import WORD_ROLES
    words = normalise_key(name).split()
    return any(WORD_ROLES.get(w) == "split" for w in words) and all(
        WORD_ROLES.get(w) in ("split", "amount") or w in _COUNTER_WORDS or w in ("epoch", "ep", "pass") or w in _REPORT_WORDS
        for w in words)


def _counter_in_prose(texts, nums, roles, user) -> None:
    """``discriminator loss at step 100: 0.69``: the key before the counter names the value after
    it (``NAME at COUNTER N: v``), whose own key is empty."""
    for i in range(len(nums) - 1):
        name = roles[i][3]
        low = f" {name.lower()} "
        if " at " not in low or roles[i + 1][3] or not nums[i].isdigit() \
                or texts[i + 1].strip() not in (":", "=", "is", "was"):
            continue
        cut = name.lower().rfind(" at ")
        value_name, counter_name = name[:cut].strip(), name[cut + 4:].strip()
        if classify(counter_name, user)[0] in ("step", "epoch", "batch"):
            roles[i] = (*classify(counter_name, user), counter_name)
            roles[i + 1] = (*classify(value_name, user), value_name)


def _user_role(user: Mapping[str, str], i: int, before: str, prefix: str):
    """The role ``--keys`` gives number ``i``: by its position (``step=1``: the first number of
    the line) or by the name printed before it, or None."""
    target = user.get(str(i + 1))
    name = ""
    if target is None:
        name = tokens.key_before(before, glued=i > 0)
        target = user.get(normalise_key(name))
        if target is None and prefix and name:
            target = user.get(normalise_key(f"{prefix}/{name}"))
        if target is None:
            return None
    if target == "step":
        return "step", None, -1, name or f"#{i + 1}"
    return "metric", target, -1, name or f"#{i + 1}"


def _bare_counters(texts, nums, roles) -> None:
    """A run of bare integers that opens a line ends with its step (``420 | loss 4.06``,
    ``1|12|Loss: 1.04``), the number before it an epoch; a ``N: x`` line (``N,x``, ``N x``) is
    a step and one unnamed value (the loss)."""
    n = len(nums)

    def bare(i):
        return roles[i][0] == "other" and not roles[i][3]

    sep = "#"
    if n == 2:     # the separator, without the value's sign (`100,-2.5`, `100 -2.5`)
        sep = (texts[1][:-1] if tokens.signed(texts[1], alone=True) else texts[1]).strip()
    if n == 2 and bare(0) and bare(1) and nums[0].isdigit() and not texts[0].strip() \
            and not texts[2].strip() and (sep in (":", "|", ",", ";") or (
                not sep and not nums[1].isdigit())):
        # `100: 2.5`, and a table of two columns without a header (`100,2.5`, `100\t2.5`)
        roles[0], roles[1] = ("step", None, _KEYLESS, ""), ("metric", keys.LOSS, 1, "")
        return
    run = 0
    while run < n and bare(run) and nums[run].isdigit() and len(texts[run].strip(" [")) <= 1 \
            and not _DURATION.match(texts[run + 1]):   # (`12s - loss: ..`: a duration)
        run += 1
    if 0 < run < n and roles[run][3][:1].isalpha():
        roles[run - 1] = ("step", None, _KEYLESS, "")
        if run > 1:               # `333 154 Loss=..`, `1|12|Loss: ..`: an epoch, then the count
            roles[run - 2] = ("epoch", None, 0, "")


def report_row(nums) -> bool:
    """A row of a report printed after training (sklearn's ``classification_report``: ``   3
    0.83  0.85  0.84  1010``, ``macro avg  0.87  0.87  0.87  10000``): scores in [0, 1], a
    count of samples last (the support), a class number first or none."""
    if len(nums) < 2 or not nums[-1].isdigit() or int(nums[-1]) < 10:
        return False
    scores = nums[1:-1] if nums[0].isdigit() else nums[:-1]
    return bool(scores) and all("." in v and 0.0 <= float(v) <= 1.0 for v in scores)


def warning(line: str) -> str:
    """What a warning line says of the step beside it: ``"nan"`` (its loss was not finite),
    ``"skip"`` (it was skipped), both (``"nan skip"``), or ``""`` (none, or prose that says there
    was none: ``no NaN found``)."""
    if _NO_NAN.search(line):
        return ""
    nan = _NONFINITE_LOSS.search(line) or (_NONFINITE.search(line) and not _GRADIENTS.search(line))
    said = ("nan " if nan else "") + ("skip" if _SKIPPED.search(line) else "")
    return said.strip()


def _kind(plan: Plan, texts, nums, roles, joined, summary, eval_context, eval_loss) -> Plan:
    metrics = plan.metrics
    if all(v.lstrip("+-")[:1] in "nNiI" for v in nums) \
            and _NO_NAN.search("".join(t + v for t, v in zip(texts, nums)) + texts[-1]):
        plan.kind = "ignore"          # a check's answer (`Loss is NaN: False, Loss is Inf: False`): no value
        return plan
    if _OVERFLOW.search(joined):
        # `OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 32768`,
        # `Gradient overflow.  Skipping step, ... reducing loss scale to 1024.0`, fairseq's
        # `overflow detected, setting loss scale to: 64`, `Grad overflow on iteration 3`.
        step = None
        for i, (_, _, _, name) in enumerate(roles):
            words = normalise_key(name).split()
            if words and words[-1] == "to" and "hysteresis" not in words:
                plan.overflow_scale = i
            elif "attempted" in words:
                plan.overflow_attempted = i
            elif words and words[-1] in ("iteration", "iter", "step"):
                step = i
        low = joined.lower()
        if "skip" in low or "scale" in low or step is not None:
            plan.step = step
            plan.kind = "overflow"
            plan.overflow_applied = bool(_APPLIED.search(joined))
            return plan
    values = [i for i, _, _ in metrics] + [i for i, _ in plan.components]
    if values and plan.step is None and all(nums[i].lstrip("+-")[:1] in "nNiI" for i in values) \
            and warning("".join(t + v for t, v in zip(texts, nums)) + texts[-1]) == "nan skip":
        plan.kind = "nan"             # `WARNING: non-finite loss (nan), skipping batch`: no record
        # (one that prints a step is that step's record: its NaN is read there)
        return plan
    named_step = plan.step is not None and not plan.counter
    if summary and not named_step:
        plan.kind = "summary"     # a run summary (HF's `train_runtime`, a best loss), not a step
        return plan
    if eval_context:
        plan.kind = "eval"
        return plan
    plan.mixed = eval_loss and plan.loss_name in _SPLIT_QUALIFIED_LOSS
    if not metrics and not plan.components and plan.ppl_at is None:
        if plan.counter and len(nums) == 2 and plan.step_total == 1 and not any(c.isalnum() for c in joined):
            plan.epoch, plan.step, plan.step_total, plan.counter = plan.step, None, None, False
            plan.kind = "epoch"       # `[3/20]` alone on its line, above an epoch's lines
            return plan
        if any(v[:1] in "nNiI" for v in nums) and _NAN_WARNING.search(joined) \
                and not _NO_NAN.search("".join(t + v for t, v in zip(texts, nums))):
            plan.kind = "nan"
        elif eval_loss or (any(r[0] == "eval" for r in roles)
                           and not any(normalise_key(r[3]) in TRAIN_SPLITS for r in roles)):
            plan.kind = "eval"        # `step 30 | val loss 2.5`, `Epoch 3: val_acc 0.91`: an evaluation
            # (beside a value named by the training split alone, `train 0.52 | valid 0.61`: no)
        elif plan.step is not None and plan.micro is None and roles[plan.step][3] \
                and not roles[plan.step][3].startswith("#"):
            plan.kind = "header"      # OLMo's `[step=1/739328,epoch=0]`, composer's `[batch=1/20]:`
        elif (plan.epoch is not None or plan.per_epoch is not None) and plan.step is None:
            plan.kind = "epoch"       # `Epoch 2/10` above Keras' batch lines
        else:
            plan.kind = "ignore"
        return plan
    if "step=" in joined and "skipped=" in joined:
        plan.cumulative_skips = True          # the DeepSpeed engine's counts: global, cumulative
        plan.step_rank = 0
    if not named_step and not plan.components and plan.ppl_at is None \
            and not any(k in (keys.LOSS, keys.GRAD_NORM) for _, k, _ in metrics):
        plan.kind = "ignore"  # an LR or a scale with no step: a config echo, an epoch summary
    return plan


def _repeated(texts: list[str], nums: list[str], user) -> tuple[tuple, int, int | None] | None:
    """Records of one template printed several times on one line (text re-wrapped by e-mail or
    a forum: ``step 10 | loss 2.9 step 20 | loss 2.8 step``): ``(parts, head, tail)`` (see
    :class:`Plan`), or None. The text between the numbers repeats with a period ``p`` (two
    records at least, whitespace folded); a record starts where the line does when the line's
    first words end the piece that separates records, else the line ends with a whole record
    (its start was cut: the numbers before, ``head``, are dropped). A record must read as one:
    a record plan with a loss. What the line cuts at its end (``tail``) is the next line's."""
    n = len(nums)
    folded = [" ".join(t.split()) for t in texts]
    lead = _lead(folded[0])
    named = next((k for k in range(1, n) if _letters(folded[k:k + 1])), n)   # the first piece with a name
    # a period: the pieces between numbers repeat, and a name repeats (among the pieces compared,
    # or the line's first words open the piece at the period: `{'loss':` and `} {'loss':`)
    period = next((p for p in range(1, min(n, _MAX_PERIOD + 1))
                   if (named < n - p or (p > 1 and _letters([lead]) and _lead(folded[p]) == lead))
                   and all(folded[k] == folded[k + p] for k in range(1, n - p))), 0)
    if not period:
        return None
    starts = bool(folded[0]) and _lead(folded[period]) == lead
    first = 0 if starts else n % period
    whole = (n - first) // period
    end = first + whole * period
    cut = folded[n] if end == n else ""
    tail = end if end < n else n if _letters([cut]) and folded[period].startswith(cut) else None
    if whole < 1 or (whole == 1 and not first and tail is None):
        return None
    if not starts and (whole < 2 or _letters(folded[n:])):
        return None                     # cut at both ends: where a record starts is a guess
    sub = [texts[first + period] if first + period < n else folded[period]] \
        + texts[first + 1:first + period] + [""]
    made = make_plan(sub, nums[first:first + period], user, split=False)
    if made.kind != "record" or not made.loss_kind:
        return None
    parts = [(a, a + period, made) for a in range(first, end, period)]
    if tail is not None and tail < n and _read_upto(made) < n - tail and not _letters(folded[n:]):
        parts.append((tail, n, made))   # the numbers it lacks (the next record's timestamp) read nothing
        tail = None
    return tuple(parts), first, tail


def _read_upto(plan: Plan) -> int:
    """The last index of a number a record plan reads."""
    used = [i for i, _, _ in plan.metrics] + [i for i, _ in plan.components] + list(plan.outer) + [
        i for i in (plan.step, plan.step_total, plan.epoch, plan.per_epoch, plan.micro, plan.ppl_at,
                    plan.scale_log2_at) if i is not None]
    return max(used, default=0)


#: The most numbers a record printed several times on one line may hold (the search for the
#: period stays linear in the line: a few passes over its pieces).
_MAX_PERIOD = 64
_PUNCTUATION_LEAD = re.compile(r"^\W+")


def _lead(piece: str) -> str:
    """The words that open a record: a piece without the punctuation that closes the record
    before it (``} {'loss':`` -> ``loss':``, ``% iter`` -> ``iter``)."""
    return _PUNCTUATION_LEAD.sub("", piece)


def _letters(pieces: list[str]) -> bool:
    return any(c.isalpha() for piece in pieces for c in piece)
