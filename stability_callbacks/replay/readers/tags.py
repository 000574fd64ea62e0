"""Names of columns and tags (TensorBoard tags, CSV / W&B headers, JSON keys) -> our metric keys.

One mapping for every reader whose source names its columns: a user ``tag_map`` ({source name:
metric key or None}, ``None`` drops the name) or ``--keys`` wins; then our own names
(:func:`ours`: ``stability/<key>``, ``train/stability/<key>`` through HF's reporters, our metric
keys as such); then the vocabulary (:mod:`.vocabulary`: HF ``train/loss``, Megatron's
``lm loss`` / ``learning-rate``, torchtitan's ``loss_metrics/global_avg_loss``, OLMo-core's
``train/CE loss``, Lightning's ``train_loss_step`` and ``lr-AdamW``, DeepSpeed's monitor).
"""
from __future__ import annotations

from typing import Mapping

from .vocabulary import classify, normalise_key, ours

__all__ = ["metric_key", "is_ours", "ours", "rank"]


def metric_key(name: str, tag_map: Mapping[str, str | None] | None = None,
               user: Mapping[str, str] | None = None) -> str | None:
    """The metric key for a source name, or ``None`` when it is not a metric we use (an
    evaluation, a statistic, a component of the loss, an unknown name).

    >>> metric_key("train/grad_norm"), metric_key("lr-AdamW"), metric_key("eval_loss")
    ('grad_norm', 'lr', None)
    >>> metric_key("my/loss", {"my/loss": "loss"}), metric_key("train/stability/adam/exp_avg_sq_max")
    ('loss', 'adam/exp_avg_sq_max')
    >>> metric_key("stability/finding/loss_spike"), metric_key("stability/step"), metric_key("train_loss_epoch")
    (None, None, None)
    """
    if tag_map and name in tag_map:
        return tag_map[name]
    from ... import keys
    got = ours(name)
    if got is not None or name.strip().startswith(keys.PREFIX) or f"/{keys.PREFIX}" in name:
        return got
    role, key, _ = classify(name, {normalise_key(k): v for k, v in user.items()} if user else None)
    return key if role == "metric" else None


def rank(name: str) -> int:
    """How a source name ranks among names of one key (lower wins; ours first)."""
    if is_ours(name):
        return -2
    return classify(name)[2]


def is_ours(name: str) -> bool:
    """True for a name one of our writers produced: it wins over a framework's alias of the
    same key (HF's ``train/loss`` is a mean over the logging interval; ``train/stability/loss``
    is the optimizer step's own value).

    >>> is_ours("train/stability/loss"), is_ours("train/loss")
    (True, False)
    """
    from ... import keys
    return keys.from_tag(name.strip()) is not None
