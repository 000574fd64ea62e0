"""Metric keys of a :class:`~stability_callbacks.record.StepRecord` (docs/design.md, Metric keys).

A missing key is skipped, never an error; non-finite values are data.
"""

LOSS = "loss"
GRAD_NORM = "grad_norm"            # global, pre-clip, unscaled
LR = "lr"                          # the LR used by this optimizer step
LOSS_SCALE = "loss_scale"
OVERFLOW_SKIPPED = "skipped"       # 1.0 if the optimizer step was skipped for overflow
SKIPPED_BY_POLICY = "skipped_by_policy"   # 1.0 if policy.skip_step_on dropped the step's update
ADAM_V_MAX = "adam/exp_avg_sq_max"
ADAM_V_L1 = "adam/exp_avg_sq_l1"
ADAM_V_NUMEL = "adam/exp_avg_sq_numel"
ADAM_BETA2 = "adam/beta2"          # the optimizer's beta2 (the largest, if param groups differ)
ADAM_STEP = "adam/step"            # Adam updates applied so far, this one included: t in 1 - beta2^t
ADAM_M_NORM = "adam/exp_avg_norm"  # ||exp_avg||_2 over every parameter (raw, not bias-corrected)
ADAM_BETA1 = "adam/beta1"          # the optimizer's beta1 (the largest, if param groups differ)
PARAM_NORM = "param_norm"
UPDATE_NORM = "update_norm"        # the norm of Adam's step lr * m_hat / (sqrt(v_hat) + eps), v_hat
                                   # each tensor's mean (docs/design.md, Metric keys)
CONSUMED_SAMPLES = "consumed_samples"
BATCH_FINGERPRINT = "batch_fingerprint"   # a hash of the batch's token ids (resume auditor)
LOSS_STREAM_PREFIX = "loss/"       # per-dataset losses: loss/cm4, loss/pmd
LOSS_RESOLUTION = "loss_resolution"  # a printed loss's last digit: 1e-4 for `2.3456`, 1e-6 for `1.000000`
LOSS_WINDOW = "loss_window"        # the steps a printed loss summarises (a window median: 20)
EVAL_LOSS = "eval_loss"            # an evaluation's loss printed on a training record's line (a results table's row)
LOSS_TERMS_ZERO = "loss_terms_zero"  # of a loss read as the sum of its printed terms, how many are 0, or a
                                     # discriminator's within 0.1% of the sum, 1% once it doubled (absent: none): a player that has won

# Per-parameter-tensor Adam statistics, summarised (docs/design.md, Metric keys). A tensor's
# "ratio" is its value over its own baseline (a running geometric mean of its earlier samples):
# update = its Adam direction ||m_hat / (sqrt(v_hat) + eps)|| (the LR factored out), exp_avg =
# ||m_hat||, exp_avg_sq = its mean v_hat. Tensors are numbered in the optimizer's order.
LAYERS_LOWER_UPDATE_RATIO = "layers/lower/update_ratio"     # geometric mean over the first half
LAYERS_UPPER_UPDATE_RATIO = "layers/upper/update_ratio"     # ... over the second half
LAYERS_LOWER_EXP_AVG_RATIO = "layers/lower/exp_avg_ratio"
LAYERS_UPPER_EXP_AVG_RATIO = "layers/upper/exp_avg_ratio"
LAYERS_TOP = 3                     # the tensors whose update ratio is largest, largest first
LAYER_TOP_FIELDS = ("tensor", "update_ratio", "exp_avg_ratio", "exp_avg_sq_ratio",
                    "update_share")   # ... and its part of the update's squared norm


def layer_top(rank: int, field: str) -> str:
    """``layers/top<rank>/<field>`` (rank from 1): the rank-th tensor by update ratio; ``tensor``
    is its index in the optimizer's order (``optim_state.tensor_names`` names it).

    >>> layer_top(1, "update_ratio")
    'layers/top1/update_ratio'
    """
    return f"layers/top{rank}/{field}"


LAYER_KEYS = (LAYERS_LOWER_UPDATE_RATIO, LAYERS_UPPER_UPDATE_RATIO, LAYERS_LOWER_EXP_AVG_RATIO,
              LAYERS_UPPER_EXP_AVG_RATIO) + tuple(layer_top(k, f) for k in range(1, LAYERS_TOP + 1)
                                                  for f in LAYER_TOP_FIELDS)

ALL = (LOSS, GRAD_NORM, LR, LOSS_SCALE, OVERFLOW_SKIPPED, SKIPPED_BY_POLICY, ADAM_V_MAX, ADAM_V_L1, ADAM_V_NUMEL, ADAM_BETA2,
       ADAM_STEP, ADAM_M_NORM, ADAM_BETA1, PARAM_NORM, UPDATE_NORM, CONSUMED_SAMPLES, BATCH_FINGERPRINT,
       LOSS_RESOLUTION, LOSS_WINDOW, LOSS_TERMS_ZERO, EVAL_LOSS)   # LAYER_KEYS apart: the probe's summary, no log column maps to them


def is_known(key: str) -> bool:
    """True for a contract key (the per-tensor summary included) or a per-stream loss
    (``loss/<name>``)."""
    return key in ALL or key in LAYER_KEYS or (key.startswith(LOSS_STREAM_PREFIX) and len(key) > len(LOSS_STREAM_PREFIX))


def loss_streams(metrics) -> list[str]:
    """The per-stream loss keys present in ``metrics``, sorted."""
    return sorted(k for k in metrics if k.startswith(LOSS_STREAM_PREFIX))


# -- What we write to framework loggers and sinks (TensorBoard, W&B, CSV exports), and read back.
# HF's reporters put `train/` in front of everything `trainer.log` sends (`train/stability/loss`);
# Lightning's loggers and our own sinks write the names as they are.
PREFIX = "stability/"                  # stability/<metric key>: a signal as the Monitor saw it
FINDING_PREFIX = PREFIX + "finding/"   # stability/finding/<kind> = SEVERITY_CODE of the finding
FINDING_TEXT = PREFIX + "findings"     # TensorBoard text of each finding (`.../text_summary`)
STEP_AXIS = PREFIX + "step"            # W&B x-axis of our scalars: the optimizer step
SEVERITY_CODE = {"info": 1.0, "warning": 2.0, "critical": 3.0}
NOT_CHARTED = frozenset({BATCH_FINGERPRINT})   # an integer hash, not worth a chart
FRAMEWORK_PREFIXES = ("train/",)


def signal_tag(key: str) -> str:
    """``stability/<key>`` (a key already under the prefix is left as it is)."""
    return key if key.startswith(PREFIX) else PREFIX + key


def finding_tag(kind: str) -> str:
    """``stability/finding/<kind>``: one scalar per finding, its value the severity code."""
    return FINDING_PREFIX + kind


def charted(metrics) -> dict[str, float]:
    """The scalars a sink or framework logger records for one step's metrics.

    >>> charted({"loss": 2.5, "adam/exp_avg_sq_max": 0.1, "batch_fingerprint": 7.0})
    {'stability/loss': 2.5, 'stability/adam/exp_avg_sq_max': 0.1}
    """
    return {signal_tag(k): float(v) for k, v in metrics.items()
            if k.removeprefix(PREFIX) not in NOT_CHARTED}


def from_tag(tag: str) -> str | None:
    """The metric key one of our writers encoded in ``tag``, or None (not ours, or not a
    signal: findings, the step axis).

    >>> from_tag("train/stability/adam/exp_avg_sq_max"), from_tag("stability/loss/cm4")
    ('adam/exp_avg_sq_max', 'loss/cm4')
    >>> from_tag("stability/finding/loss_spike"), from_tag("stability/step"), from_tag("train/loss")
    (None, None, None)
    """
    for p in FRAMEWORK_PREFIXES:
        if tag.startswith(p + PREFIX):
            tag = tag[len(p):]
            break
    if not tag.startswith(PREFIX):
        return None
    key = tag[len(PREFIX):]
    return key if is_known(key) and key not in NOT_CHARTED else None
