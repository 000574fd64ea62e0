"""Metric keys of a :class:`~stability_callbacks.record.StepRecord` (DESIGN 2.1).

A missing key is skipped, never an error; non-finite values are data.
"""

LOSS = "loss"
GRAD_NORM = "grad_norm"            # global, pre-clip, unscaled
LR = "lr"                          # the LR used by this optimizer step
LOSS_SCALE = "loss_scale"
SKIPPED = "skipped"                # 1.0 if the optimizer step was skipped for overflow
ADAM_V_MAX = "adam/exp_avg_sq_max"
ADAM_V_L1 = "adam/exp_avg_sq_l1"
ADAM_V_NUMEL = "adam/exp_avg_sq_numel"
ADAM_BETA2 = "adam/beta2"          # the optimizer's beta2 (the largest, if param groups differ)
ADAM_STEP = "adam/step"            # Adam updates applied so far, this one included: t in 1 - beta2^t
PARAM_NORM = "param_norm"
UPDATE_NORM = "update_norm"
CONSUMED_SAMPLES = "consumed_samples"
BATCH_FINGERPRINT = "batch_fingerprint"   # a hash of the batch's token ids (resume auditor)
LOSS_STREAM_PREFIX = "loss/"       # per-dataset losses: loss/cm4, loss/pmd
LOSS_RESOLUTION = "loss_resolution"  # a printed loss's last digit: 1e-4 for `2.3456`, 1e-6 for `1.000000`

ALL = (LOSS, GRAD_NORM, LR, LOSS_SCALE, SKIPPED, ADAM_V_MAX, ADAM_V_L1, ADAM_V_NUMEL, ADAM_BETA2,
       ADAM_STEP, PARAM_NORM, UPDATE_NORM, CONSUMED_SAMPLES, BATCH_FINGERPRINT, LOSS_RESOLUTION)


def is_known(key: str) -> bool:
    """True for a contract key or a per-stream loss (``loss/<name>``)."""
    return key in ALL or (key.startswith(LOSS_STREAM_PREFIX) and len(key) > len(LOSS_STREAM_PREFIX))


def loss_streams(metrics) -> list[str]:
    """The per-stream loss keys present in ``metrics``, sorted."""
    return sorted(k for k in metrics if k.startswith(LOSS_STREAM_PREFIX))
