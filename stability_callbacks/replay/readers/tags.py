"""Mapping of the names frameworks give their scalars to our metric keys (DESIGN 2.1).

Used by every reader whose source names its columns (TensorBoard tags, W&B/CSV headers, JSON
keys). A user ``tag_map`` ({source name: metric key}) wins over the built-in aliases; mapping a
name to ``None`` drops it.
"""
from __future__ import annotations

from typing import Mapping

from ... import keys

# Lower-cased source name -> metric key. Sources: HF Trainer (`train/loss`, `learning_rate`),
# Megatron TensorBoard (`lm loss`, `learning-rate`, `grad-norm`, `loss-scale`), gpt-neox
# (`train/lm_loss`), DeepSpeed monitor (`Train/Samples/train_loss`), Lightning's
# LearningRateMonitor (`lr-AdamW`), nanoGPT/llm.c (`train_loss`, `norm`).
ALIASES: dict[str, str] = {
    "loss": keys.LOSS, "train_loss": keys.LOSS, "train/loss": keys.LOSS, "lm loss": keys.LOSS,
    "lm-loss": keys.LOSS, "lm_loss": keys.LOSS, "train/lm_loss": keys.LOSS,
    "train/lm loss": keys.LOSS, "train/samples/train_loss": keys.LOSS,
    "training_loss": keys.LOSS, "trl": keys.LOSS,
    "grad_norm": keys.GRAD_NORM, "train/grad_norm": keys.GRAD_NORM, "grad-norm": keys.GRAD_NORM,
    "grad norm": keys.GRAD_NORM, "gradient_norm": keys.GRAD_NORM, "gnorm": keys.GRAD_NORM,
    "norm": keys.GRAD_NORM, "train/gradient_norm": keys.GRAD_NORM,
    "lr": keys.LR, "learning_rate": keys.LR, "train/learning_rate": keys.LR,
    "learning-rate": keys.LR, "learning rate": keys.LR, "train/lr": keys.LR,
    "train/samples/lr": keys.LR, "lr_mul": keys.LR,
    "loss_scale": keys.LOSS_SCALE, "loss-scale": keys.LOSS_SCALE, "loss scale": keys.LOSS_SCALE,
    "train/loss_scale": keys.LOSS_SCALE, "train/samples/loss_scale": keys.LOSS_SCALE,
    "skipped": keys.SKIPPED,
    "consumed_samples": keys.CONSUMED_SAMPLES, "consumed samples": keys.CONSUMED_SAMPLES,
}

# What loggers put in front of names: HF's TensorBoard/W&B callbacks log `train/<k>`.
_PREFIXES = keys.FRAMEWORK_PREFIXES


def metric_key(name: str, tag_map: Mapping[str, str | None] | None = None) -> str | None:
    """The metric key for a source name, or ``None`` when it is not a metric we use.

    Our own names (:func:`stability_callbacks.keys.from_tag`: ``stability/<key>``, and
    ``train/stability/<key>`` through HF's reporters) map back to the key they carry.

    >>> metric_key("train/grad_norm"), metric_key("lr-AdamW"), metric_key("eval_loss")
    ('grad_norm', 'lr', None)
    >>> metric_key("my/loss", {"my/loss": "loss"}), metric_key("train/stability/adam/exp_avg_sq_max")
    ('loss', 'adam/exp_avg_sq_max')
    >>> metric_key("stability/finding/loss_spike"), metric_key("stability/step")
    (None, None)
    """
    if tag_map and name in tag_map:
        return tag_map[name]
    n = name.strip()
    if n.startswith(keys.PREFIX) or any(n.startswith(p + keys.PREFIX) for p in _PREFIXES):
        return keys.from_tag(n)
    if keys.is_known(n):
        return n
    low = n.lower()
    if low in ALIASES:
        return ALIASES[low]
    for p in _PREFIXES:
        if low.startswith(p):
            rest = n[len(p):]
            if keys.is_known(rest):
                return rest
            if rest.lower() in ALIASES:
                return ALIASES[rest.lower()]
    if low.startswith("lr-") or low.startswith("lr/"):   # Lightning LearningRateMonitor
        return keys.LR
    return None


def is_ours(name: str) -> bool:
    """True for a name one of our writers produced: it wins over a framework's alias of the
    same key (HF's ``train/loss`` is a mean over the logging interval; ``train/stability/loss``
    is the optimizer step's own value).

    >>> is_ours("train/stability/loss"), is_ours("train/loss")
    (True, False)
    """
    return keys.from_tag(name.strip()) is not None
