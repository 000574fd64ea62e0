"""What a printed name means: one vocabulary (``vocabulary.json``, package data) for every reader.

Each entry of the file names who prints it. A name is classified on its own, never by the line
around it (docs/replay.md, The reader grammar): an unknown name, or a running statistic such as
``mean_token_accuracy``, is just another number of the line, never a reason to drop the line.

>>> classify("lm loss"), classify("val_loss"), classify("num_updates"), classify("base_lr")
(('metric', 'loss', 1), ('eval', 'loss', 0), ('step', None, 0), ('ignore', None, 1))
>>> classify("mean_token_accuracy")[0], classify("Train loss/train/total")[:2], classify("box_loss")[0]
('statistic', ('metric', 'loss'), 'component')
>>> classify("avg loss"), classify("Loss_G")[:2], classify("-- Loss")[:2]
(('statistic', 'loss', 0), ('component', 'loss'), ('metric', 'loss'))

Cost: one dict lookup per name, cached per template by the callers. State: none.
"""
from __future__ import annotations

import json
import re
from functools import lru_cache
from importlib import resources
from typing import Iterable, Mapping

from ... import keys

_DATA = json.loads(resources.files(__package__).joinpath("vocabulary.json").read_text("utf-8"))

#: Normalised name -> (role, our key or None, rank).
ENTRIES: dict[str, tuple[str, str | None, int]] = {}
for _e in _DATA["entries"]:
    _role = _e["is"]
    _key = _role if keys.is_known(_role) else None
    if _role == "term":                  # a term of the objective by name (pix2pix's `G_GAN`)
        _role, _key = "component", keys.LOSS
    ENTRIES[_e["name"]] = ("metric" if _key and _role != "component" else _role, _key, int(_e.get("rank", 1)))
#: Words that give their role to any name they are part of (`eval_loss`, `train_runtime`).
WORD_ROLES = {n: r for n, (r, _, _) in ENTRIES.items()
              if r in ("split", "summary", "statistic", "ignore", "amount") and " " not in n}
PREFIXES = frozenset(_DATA["prefixes"])
STEP_MARKERS: tuple[str, ...] = tuple(_DATA["step_markers"])
#: Key words of other scripts, replaced within a name; of other languages in ASCII letters, word
#: by word; and their phrases, in a name cut into words (vocabulary.json).
_NON_ASCII_WORDS: dict[str, str] = {k: f" {v} " for k, v in _DATA["non_ascii"].items()}
_NON_ASCII = re.compile("|".join(sorted(_NON_ASCII_WORDS, key=len, reverse=True)))
_ASCII_WORDS: dict[str, str] = _DATA["ascii_words"]
_PHRASES: dict[str, str] = _DATA["phrases"]
_PHRASE = re.compile(r"\b(?:" + "|".join(map(re.escape, _PHRASES)) + r")\b")
_PHRASE_STARTS = frozenset(p.split()[0] for p in _PHRASES)
_SEP = r"[ _/.\-]?"
_VALUE = "|".join(re.escape(w).replace(r"\ ", _SEP) for w in sorted(_DATA["value_terms"], key=len, reverse=True))
#: A reinforcement learner's name: a critic's term (``value_terms`` of vocabulary.json:
#: ``value_loss``, ``critic/vf_loss``, ``qf1_loss``, ``td_error``, ``ppo/loss/value``; after
#: `loss`, only with a slash: "the loss value is nan" is prose) or an episode's statistic
#: (``episode_terms``: ``ep_rew_mean``, ``charts/episodic_return``); a letter on either side
#: makes it another word (``ValueError`` is no name, ``myvalue_loss`` is none of these).
_EPISODE = "|".join(re.escape(w).replace(r"\ ", _SEP) for w in sorted(_DATA["episode_terms"], key=len, reverse=True))
_VALUE_TERM = re.compile(rf"(?<![a-z0-9])(?:(?:{_VALUE}){_SEP}loss|td{_SEP}error|loss/value|{_EPISODE})(?![a-z])")
# A longer name is prose around a number (`the loss values start being reported as nan`).
_KEY_MAX_WORDS = 4
# Words that make a name with `loss` in it a setting, not a value of the objective
# (`initial_loss_scale`, `loss_scale_window`, `loss_weight`), or prose.
_SETTING_WORDS = frozenset({"scale", "scaler", "window", "weight", "weights", "coef", "coeff",
                            "factor", "type", "fn", "func", "function", "threshold", "clip",
                            "hysteresis", "init", "initial", "min", "max", "log", "patience",
                            "delta", "tolerance", "tol",
                            # prose around a number: `loss is nan at step 12`
                            "is", "are", "was", "were", "be", "became", "becomes", "got", "at",
                            "of", "to", "the", "in", "for", "from", "and"})
_NOT_A_KEY = re.compile(r"[^A-Za-z0-9]+")
# Step counters below this rank are the optimizer's count; `iteration` / `it` beside a
# `step` count micro-batches (litgpt `iter 3704 step 463`).
MICRO_RANK = 2
ITERATION_LIKE = frozenset(n for n, (r, _, rank) in ENTRIES.items() if r == "step" and rank >= MICRO_RANK)


def normalise_key(name: str) -> str:
    """``"Train_Loss"`` -> ``"train loss"``: lower case, words separated by single spaces.

    >>> normalise_key("optim/total-grad_norm"), normalise_key(" lm loss "), normalise_key("训练次数")
    ('optim total grad norm', 'lm loss', 'train step')
    >>> normalise_key("損失"), normalise_key("эпоха"), normalise_key("Verlust"), normalise_key("taux d'apprentissage")
    ('loss', 'epoch', 'loss', 'lr')
    """
    name = name.lower()
    if not name.isascii():
        name = _NON_ASCII.sub(lambda m: _NON_ASCII_WORDS[m.group()], name)
    words = [w for w in _NOT_A_KEY.split(name) if w]
    if _ASCII_WORDS.keys() & words:
        words = [_ASCII_WORDS.get(w, w) for w in words]
    out = " ".join(words)
    return _PHRASE.sub(lambda m: _PHRASES[m.group()], out) if _PHRASE_STARTS.intersection(words) else out


def classify(name: str, user: Mapping[str, str] | None = None) -> tuple[str, str | None, int]:
    """``(role, our key, rank)`` of a printed name (see the module docstring and the roles of
    ``vocabulary.json``; ``eval`` carries ``"loss"`` for an evaluation loss; ``component`` is a
    named term of the loss such as ``box_loss``; ``other`` an unknown name). ``user``: the
    ``--keys`` map, normalised name -> ``"step"`` or a metric key, which wins."""
    return _classify(normalise_key(name), name.strip(), tuple(sorted(user.items())) if user else ())


@lru_cache(maxsize=8192)
def _classify(norm: str, raw: str, user: tuple) -> tuple[str, str | None, int]:
    got = _classify_whole(norm, raw, user)
    if got[0] == "other" and ("|" in raw or "\u2016" in raw) and NORM_BARS.fullmatch(raw):
        return "metric", keys.GRAD_NORM, 1
    if got[0] in ("other", "component") and _CAMEL.search(raw):
        # camelCase words (`trainLoss`, `valLoss`, `AvgCost`, `gradNorm`), lowered whole above
        split = _CAMEL.sub(" ", raw)
        words = _classify_whole(normalise_key(split), split, user)
        if words[0] != "other":
            return words
    if got[0] in ("other", "component") and "/" in raw.rstrip("/"):
        # a namespace of words that name nothing (ESPnet's chainer reporter `main/loss` beside `main/loss_ctc`,
        # Detectron's `json_stats: {"loss": ..}`): the loss, where its last part alone is
        space, tail = raw.rstrip("/").rsplit("/", 1)
        if names_nothing(space):
            whole = _classify_whole(normalise_key(tail), tail, user)
            if whole[:2] == ("metric", keys.LOSS):
                return whole
    return got


_CAMEL = re.compile(r"(?<=[a-z])(?=[A-Z])")
#: A norm's bars around the gradient (`||g||`, `|grad|`, `||grad||_2`, `‖∇‖`): the grad norm.
NORM_BARS = re.compile(r"(?:\|\|?|\u2016)\s*(?:g|grad|grads|gradient|gradients|\u2207)\s*(?:\|\|?|\u2016)(?:_2)?$", re.I)


def names_nothing(space: str) -> bool:
    """Whether a namespace's words name no role (no split, statistic, loss, step ...): ``main``, ``json_stats``."""
    return not any(WORD_ROLES.get(w) or _is_loss_word(w) for w in normalise_key(space).split())


def _classify_whole(norm: str, raw: str, user: tuple) -> tuple[str, str | None, int]:
    if user:
        target = dict(user).get(norm)
        if target is not None:
            return ("step", None, -1) if target == "step" else ("metric", target, -1)
    if not norm:
        return "other", None, 0
    words = norm.split()
    if any(WORD_ROLES.get(w) == "split" for w in words):
        training = training_words(words)
        if training is None:
            return "eval", "loss" if ("loss" in words or "ppl" in words or _cross_entropy_word(words[-1])) else None, 0
        norm, words = " ".join(training), training
    elif _ON_TRAINING.search(norm):
        words = training_words(words) or words
        norm = " ".join(words)
    if len(words) > 2 and _SPAN_OPEN.intersection(words):
        words = _over_a_span(words)
        norm = " ".join(words)
    lossy = (len(words) <= _KEY_MAX_WORDS and (any(_is_loss_word(w) for w in words) or (
        # BasicSR's (and mmediting's) loss dict: `l_pix`, `l_g_percep`, `l_d_real`, each a term
        words[0] == "l" and len(words) > 1 and raw[:2] in ("l_", "L_")))
             and not _SETTING_WORDS.intersection(words))
    got = _lookup(norm, words)
    if got is not None:
        return ("statistic", keys.LOSS, 0) if got[0] == "statistic" and lossy else got
    key = ours(raw)                       # our own tags and metric keys
    if key is not None:
        return "metric", key, 1
    if "/" in raw and not raw.endswith("/"):
        # a namespace's grad norm or LR (verl's `actor/grad_norm`, `actor/lr`): the key its last part names
        tail = _classify(normalise_key(raw.rsplit("/", 1)[1]), raw.rsplit("/", 1)[1], ())
        if tail[0] == "metric" and tail[1] in (keys.GRAD_NORM, keys.LR):
            return tail
    for w in words:
        role = WORD_ROLES.get(w)
        if role is not None:
            # `avg loss`, `loss (avg)`: a statistic of the loss (the loss where the log prints
            # no other: see plan.make_plan).
            return role, keys.LOSS if role == "statistic" and lossy else None, 0
    bare = [w for w in words if w not in PREFIXES] or words
    if _cross_entropy_word(bare[-1]) and len(bare) <= _KEY_MAX_WORDS:
        # a cross-entropy named with its qualifier (Keras' `categorical_crossentropy`, Trax's
        # `WeightedCategoryCrossEntropy`): as `crossentropy`, the loss where the log prints no other
        return "metric", keys.LOSS, 2
    if bare[0] == "lr" and len(bare) > 1 and "lr-" in raw.lower():
        return "metric", keys.LR, 1       # Lightning / composer LR monitors: `lr-AdamW/pg1`
    if bare[0] in ("lr", "learning") and len(bare) > 1 and all(_LR_PART.fullmatch(w) for w in bare[1:]):
        return "metric", keys.LR, 1       # a parameter group's LR: `lr_group0`, `lr/pg1`, `lr_backbone`
    if bare[-1] == "lr" and len(bare) > 1 and all(_LR_PART.fullmatch(w) and w != "rate" for w in bare[:-1]):
        return "metric", keys.LR, 1       # ... named before it: `backbone_lr`, `head_lr`, `pg0_lr`
    if lossy:
        # A name with a loss word that the vocabulary does not know: `Loss` under any prefix is
        # the loss; with other words (`box_loss`, `loss_cls`, `Loss_D`, `lossG`) a term of the
        # objective.
        uniq = list(dict.fromkeys(bare))   # (a loss's namespace repeats the word: `Loss/total_loss`)
        if len(uniq) == 1 and uniq[0] == "loss":
            return "metric", keys.LOSS, 1
        if len(uniq) == 2 and "loss" in uniq and WHOLE_WORDS.intersection(uniq):
            return "metric", keys.LOSS, 1   # `loss_total`, `loss_sum`, `Loss/total_loss`: the terms' total, no term
        return "component", keys.LOSS, 0
    return "other", None, 0


#: A loss named with the span it was taken over (`average loss over the window`, `mean loss of the
#: batch`, `loss per token`, `total training loss for this epoch`): the words before it name it, the
#: phrase names no other quantity (a phrase that does, `loss of generator`, is kept).
_SPAN_OPEN = frozenset({"of", "over", "for", "per", "in", "across", "during", "since"})
_SPAN_WORDS = frozenset({"the", "a", "an", "this", "that", "each", "every", "last", "current", "past", "recent",
                         "whole", "all", "window", "batch", "batches", "minibatch", "epoch", "epochs", "step",
                         "steps", "iteration", "iterations", "iter", "iters", "interval", "token", "tokens", "sample",
                         "samples", "example", "examples", "update", "updates", "period", "log", "run"})


def _over_a_span(words: list[str]) -> list[str]:
    for k in range(1, len(words) - 1):
        if words[k] in _SPAN_OPEN and any(_is_loss_word(w) for w in words[:k]) \
                and all(w in _SPAN_WORDS for w in words[k + 1:]):
            return words[:k]
    return words


#: What follows `lr` in the name of one parameter group's LR (`lr_group0`, `lr/pg1`, `lr_0`,
#: `lr (group 0)`, `learning_rate_1`, `lr_backbone`, `lr_head`); never a setting (`lr_decay`,
#: `lr_min`, `lr_warmup`, `lr_scale`).
_LR_PART = re.compile(r"rate|(?:pg|group|groups|param|params|g)?\d*|backbone|head|heads|encoder|decoder|base|"
                      r"body|neck|classifier|embed|embeddings|model|net")


#: Split words that name the act of evaluating, not a split: with the training split named
#: beside them (`Evaluation metric train-loss`, `evaluation metric 'loss' on training set`) the
#: value is the training set's.
EVALUATING = frozenset({"eval", "evaluation", "evaluating"})
TRAINING = frozenset({"train", "training"})
#: A split named alone, as a value's whole name (`train 0.52 | valid 0.61`, `train/val loss`).
TRAIN_SPLITS = TRAINING | {"trn", "learn"}   # (CatBoost names its training set `learn`)
EVAL_SPLITS = frozenset({"val", "valid", "validation", "eval", "test", "dev"})
_ON_TRAINING = re.compile(r"\b(?:on|for|over) (?:the )?(?:train|training)(?: (?:set|data|dataset|split))?$")
_METRIC_WORDS = frozenset({"metric", "metrics"})


def training_words(words: list[str]) -> list[str] | None:
    """The words of a name that names the training split beside words of evaluating (MXNet's
    `Evaluation metric train-loss`, `loss on training set`): ``train`` and the name, without
    the evaluating words; None where the name names another split (`val`, `test`) or no
    training split (an evaluation's)."""
    if not TRAINING.intersection(words) or any(WORD_ROLES.get(w) == "split" and w not in EVALUATING
                                               for w in words):
        return None
    norm = _ON_TRAINING.sub("", " ".join(w for w in words if w not in EVALUATING and w not in _METRIC_WORDS))
    rest = [w for w in norm.split() if w not in TRAINING]
    return ["train", *rest] if rest else None


#: Words that make `loss_<word>` the whole loss, not one of its terms.
WHOLE_WORDS = frozenset({"total", "sum", "overall", "all", "combined", "full"})   # a total's words


def _cross_entropy_word(word: str) -> bool:
    """A word naming a cross-entropy, alone or glued to its qualifiers (``crossentropy``,
    ``weightedcategorycrossentropy``: CamelCase is lowered whole)."""
    return word.endswith("crossentropy")


def _is_loss_word(word: str) -> bool:
    """``loss`` and words built on it (``lossg``, ``gloss``), not the plural (a group's name:
    ``[Losses: ...]``)."""
    return "loss" in word and word != "losses"


def ours(name: str) -> str | None:
    """Our own names: ``stability/<key>`` (and ``train/stability/<key>`` through HF's
    reporters), and our metric keys as such (``adam/exp_avg_sq_max``, ``loss/cm4``)."""
    n = name.strip()
    if n.startswith(keys.PREFIX) or any(n.startswith(p + keys.PREFIX) for p in keys.FRAMEWORK_PREFIXES):
        return keys.from_tag(n)
    if keys.is_known(n) and n != keys.EVAL_LOSS:   # (HF's `eval_loss` is an evaluation's line, no record's)
        return n
    for p in keys.FRAMEWORK_PREFIXES:
        if n.startswith(p) and keys.is_known(n[len(p):]):
            return n[len(p):]
    return None


def _lookup(norm: str, words: list[str]) -> tuple[str, str | None, int] | None:
    """The entry of a name, or of the name without a printer's prefix words (`cur_lr`)."""
    got = ENTRIES.get(norm)
    if got is not None:
        return got
    for i in range(1, len(words)):
        if words[i - 1] not in PREFIXES:
            break
        got = ENTRIES.get(" ".join(words[i:]))
        if got is not None:
            return got
    return None


def value_term(texts: Iterable[str]) -> str | None:
    """The first reinforcement learner's name in ``texts`` (a log's first lines: a critic's
    term, an episode's statistic), as printed, or None: a loss printed beside one is built from
    returns, an objective whose level moves with them (:meth:`Monitor.declare_objective`).

    >>> value_term(["| train/value_loss | 81.2 |"]), value_term(["ppo/loss/value: 3.1"])
    ('value_loss', 'loss/value')
    >>> value_term(["|    ep_rew_mean      | 22.4 |"]), value_term(["charts/episodic_return=9"])
    ('ep_rew_mean', 'episodic_return')
    >>> value_term(["ValueError: loss is nan", "loss: 2.31 value: 4", "rewards/chosen: 0.3"]) is None
    True
    """
    for text in texts:
        m = _VALUE_TERM.search(text.lower())
        if m is not None:
            return text[m.start():m.end()]
    return None


#: Words that name a discriminator's and a generator's term (``Loss_D``, ``errG``, ``d_loss``,
#: CycleGAN's ``D_A`` / ``G_A``, ``disc_loss``, ``gen_loss``).
_PLAYERS = (frozenset({"d", "disc", "discriminator", "errd", "lossd", "dloss", "netd"}),
            frozenset({"g", "gen", "generator", "errg", "lossg", "gloss", "netg"}))


def discriminator(name: str) -> bool:
    """Whether a printed name is a discriminator's term (``Loss_D``, ``errD``, ``D_real``, ``D_A``)."""
    return bool(_PLAYERS[0] & set(normalise_key(name).split()))


def adversarial(names: Iterable[str]) -> str | None:
    """The printed loss, where it is the sum of a discriminator's and a generator's terms (a
    GAN's: two players whose losses pull against each other, their sum no objective anyone
    minimises), or None.

    >>> adversarial(["Loss_D + Loss_G (the sum of the terms printed)"]), adversarial(["D_A + G_A + cycle_A (...)"])
    ('Loss_D + Loss_G', 'D_A + G_A + cycle_A')
    >>> adversarial(["loss"]), adversarial(["box_loss + cls_loss (the sum of the terms printed)"])
    (None, None)
    """
    for name in names:
        terms = name.split(" (")[0]
        parts = [set(normalise_key(t).split()) for t in terms.split(" + ")]
        if len(parts) > 1 and all(any(p & words for p in parts) for words in _PLAYERS):
            return terms
    return None


def binary_name(name: str) -> bool:
    """Whether a cross-entropy's printed name says it is binary (one logit per example).

    >>> binary_name("train/bce_loss"), binary_name("BCEWithLogitsLoss"), binary_name("binary_crossentropy"), binary_name("ce")
    (True, True, True, False)
    """
    return bool(_BINARY_CE.union(("binary", "binarycrossentropy")).intersection(normalise_key(name).split()))


#: Words of a loss that is a cross-entropy, never below zero (a Gaussian NLL is not one); the
#: binary ones first.
_BINARY_CE = frozenset({"bce", "bcewithlogits", "bcewithlogitsloss", "bceloss"})
_CROSS_ENTROPY = _BINARY_CE | {"crossentropy", "crossentropyloss", "xent", "ce", "ctc", "ctcloss"}   # (CTC: a
#: log-loss of discrete label sequences, never below zero either)


def cross_entropy_name(names: Iterable[str]) -> str | None:
    """The printed name of a loss that is a cross-entropy, among the names the loss was read
    from (one name, not a sum of terms), or None.

    >>> cross_entropy_name(["train/CrossEntropyLoss"]), cross_entropy_name(["ce_loss"]), cross_entropy_name(["loss"])
    ('train/CrossEntropyLoss', 'ce_loss', None)
    >>> cross_entropy_name(["cross_entropy"]), cross_entropy_name(["nll"]), cross_entropy_name(["ce + kl (the sum)"])
    ('cross_entropy', None, None)
    >>> cross_entropy_name(["train WeightedCategoryCrossEntropy"]), cross_entropy_name(["loss_ctc"])
    ('train WeightedCategoryCrossEntropy', 'loss_ctc')
    """
    for name in names:
        if "+" in name:
            continue
        norm = normalise_key(name)
        if any(w in _CROSS_ENTROPY or _cross_entropy_word(w) for w in norm.split()) or "cross entropy" in norm:
            return name
    return None
