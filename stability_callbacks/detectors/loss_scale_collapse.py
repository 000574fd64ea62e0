"""The fp16 loss scale falling toward its minimum (warn before DeepSpeed's hard exit)."""
from __future__ import annotations

import math

from .. import keys
from ..record import Finding, StepRecord
from ..stats import Latch
from .base import Context, Detector, positive, positive_int


class LossScaleCollapse(Detector):
    """Critical when, after start-up, the loss scale stands ``min_halvings`` halvings below its
    post-start-up peak, or within ``floor_halvings`` halvings of ``min_scale``. The start-up
    search (a scale halving from 2^32 on every step) and the periodic halve-then-regrow of
    healthy dynamic scaling are not a collapse: the peak decays by one halving every
    ``peak_decay_steps`` steps so a long healthy run never accumulates drops.
    Values ≤ 0 (``loss scale: -1.0`` in some builds) are print artefacts and ignored.
    O(1); state: 3 scalars.
    """

    name = "loss_scale_collapse"
    kind = "loss_scale_collapse"
    signals = (keys.LOSS_SCALE,)
    _state = ("peak", "peak_step", "latch")

    def __init__(self, *, min_halvings: int = 6, min_scale: float = 1.0, floor_halvings: int = 2,
                 peak_decay_steps: int = 200):
        self.min_halvings = positive_int("min_halvings", min_halvings)
        self.min_scale = positive("min_scale", min_scale)
        self.floor_halvings = positive_int("floor_halvings", floor_halvings)
        self.peak_decay_steps = positive_int("peak_decay_steps", peak_decay_steps)
        self.peak: float | None = None       # log2 of the peak scale
        self.peak_step: int | None = None
        self.latch = Latch()   # re-armed once the scale is back within half the halvings

    def update(self, record: StepRecord, ctx: Context) -> list[Finding]:
        s = record.metrics.get(keys.LOSS_SCALE)
        if s is None or not math.isfinite(s) or s <= 0 or ctx.in_startup:
            return []
        step, ls = record.step, math.log2(s)
        if self.peak is not None and self.peak_step is not None:
            decay = (step - self.peak_step) // self.peak_decay_steps
            if decay > 0:
                self.peak = max(ls, self.peak - decay)
                self.peak_step = step
        if self.peak is None or ls >= self.peak:
            self.peak, self.peak_step = ls, step
        drop = self.peak - ls
        near_floor = ls - math.log2(self.min_scale) <= self.floor_halvings
        if not self.latch.update(on=drop >= self.min_halvings or near_floor,
                                 off=drop < self.min_halvings / 2 and not near_floor):
            return []
        peak = 2.0 ** self.peak
        return [self.finding(
            step, severity="critical", value=s, baseline=peak, threshold=peak / 2 ** self.min_halvings,
            onset_step=self.peak_step,
            message=(f"The fp16 loss scale collapsed to {s:g} at step {step}, {drop:.0f} halvings below "
                     f"{peak:g} at step {self.peak_step}; at {self.min_scale:g} DeepSpeed/Megatron stop "
                     f"the run. Gradients overflow on almost every step: roll back to a checkpoint "
                     f"before step {self.peak_step}, and consider bf16 or a lower LR."),
            halvings=drop)]
