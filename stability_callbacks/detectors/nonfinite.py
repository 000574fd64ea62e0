"""NaN / Inf in the loss, a per-stream loss, the grad norm or the Adam statistics."""
from __future__ import annotations

import math

from .. import keys
from ..record import Finding, StepRecord
from .base import Context, Detector

_WATCHED = (keys.LOSS, keys.GRAD_NORM, keys.ADAM_V_MAX, keys.ADAM_V_L1, keys.PARAM_NORM)


class NonFinite(Detector):
    """Critical on the first non-finite value of an episode; re-armed after a finite step.

    A non-finite grad norm on a step the fp16 scaler skipped is an ordinary overflow (see
    ``overflow_burst``), not a NaN. O(#keys) per update; state: 1 flag.

    >>> d = NonFinite()
    >>> [f.kind for f in d.update(StepRecord(3, {"loss": float("nan")}), Context(3))]
    ['nonfinite']
    """

    name = "nonfinite"
    kind = "nonfinite"
    signals = ()   # looks at every record
    _state = ("active",)

    def __init__(self):
        self.active = False

    def update(self, record: StepRecord, ctx: Context) -> list[Finding]:
        m = record.metrics
        skipped = (m.get(keys.SKIPPED) or 0.0) >= 1.0
        bad = [k for k in _WATCHED if k in m and not math.isfinite(m[k])
               and not (skipped and k == keys.GRAD_NORM)]
        bad += [k for k in keys.loss_streams(m) if not math.isfinite(m[k])]
        if not bad:
            self.active = False
            return []
        if self.active:
            return []
        self.active = True
        what = ", ".join(f"{k}={m[k]}" for k in bad)
        return [self.finding(
            record.step, severity="critical", signal=bad[0], value=m[bad[0]],
            message=(f"Non-finite values at step {record.step}: {what}. The weights may already be "
                     f"damaged: do not save over the last good checkpoint; roll back to the last "
                     f"checkpoint before this step and skip the batches since."),
            keys=bad)]
