"""Adam's second moment (exp_avg_sq) abnormal: a jump, or still rising after the LR peak."""
from __future__ import annotations

import math

from .. import keys
from ..record import Finding, StepRecord
from ..stats import Latch, RobustLevel, finite_positive
from .base import Context, Detector, fmt, positive, positive_int

#: torch's Adam/AdamW default, assumed when the record does not say (replayed logs never do).
DEFAULT_BETA2 = 0.999


def bias_correction(beta2: float, t: float) -> float:
    """``1 − beta2^t``: the total weight Adam's zero-initialised ``exp_avg_sq`` has gathered
    after ``t`` updates (``expm1`` keeps it exact for beta2 near 1).

    >>> round(bias_correction(0.999, 20), 4), round(bias_correction(0.999, 1000), 3)
    (0.0198, 0.632)
    """
    return -math.expm1(t * math.log(beta2))


class SecondMomentSurge(Detector):
    """Two rules over ``adam/exp_avg_sq_max`` and the mean ``l1 / numel``, both judged on the
    *bias-corrected* second moment ``v / (1 − beta2^t)``:

    - *jump*: either statistic ``jump_ratio`` × above its robust baseline (max: ×``max_jump_ratio``);
    - *post-peak rise*: after the LR warmup ended, the mean stands ``post_peak_rise`` × above
      its value at the end of warmup (BigScience 104B: the variance peaked at warmup end; still
      rising after it means the gradients are growing and the optimizer is heading for trouble).

    Why bias-corrected: ``exp_avg_sq`` is an EMA of g² that starts at 0, so after ``t`` steps it
    holds only ``1 − beta2^t`` of its weight: with beta2 = 0.999 the raw value keeps rising for
    ~1/(1 − beta2) = 1000 steps even when the gradients do not change at all (×2 between steps
    20 and 40). Dividing by ``1 − beta2^t`` — what Adam itself does before using it — leaves
    the weighted mean of g², which rises only when the gradients do. ``adam/beta2`` and
    ``adam/step`` come with the record when the probe knows them; otherwise beta2 = 0.999
    (torch's default) and t = the record's step (the optimizer step in a fresh or resumed run;
    an optimizer reset mid-run or a different beta2 makes the early values wrong, and a beta2
    below 0.999 only makes the rule quieter).

    Warning, one per episode (the jump re-arms once neither statistic is above its ratio; the
    post-peak rise fires once per run, and not for the ~1/(1 − beta2) steps a reported jump
    stays in the average). O(1); state: 2 baselines, 4 scalars.
    """

    name = "second_moment_surge"
    kind = "second_moment_surge"
    signals = (keys.ADAM_V_MAX, keys.ADAM_V_L1)
    _state = ("base_max", "base_mean", "at_peak", "jump", "jump_step", "post_peak")

    def __init__(self, *, jump_ratio: float = 4.0, max_jump_ratio: float = 10.0,
                 post_peak_rise: float = 2.0, warm_samples: int = 10, baseline_alpha: float = 0.05):
        self.jump_ratio = positive("jump_ratio", jump_ratio)
        self.max_jump_ratio = positive("max_jump_ratio", max_jump_ratio)
        self.post_peak_rise = positive("post_peak_rise", post_peak_rise)
        self.warm_samples = positive_int("warm_samples", warm_samples)
        self.base_max = RobustLevel(positive("baseline_alpha", baseline_alpha))
        self.base_mean = RobustLevel(baseline_alpha)
        self.at_peak: float | None = None
        self.jump = Latch()        # re-armed once neither statistic is above its jump ratio
        self.jump_step: int | None = None   # the last jump reported
        self.post_peak = Latch()   # once per run

    def update(self, record: StepRecord, ctx: Context) -> list[Finding]:
        m = record.metrics
        beta2, t = m.get(keys.ADAM_BETA2, DEFAULT_BETA2), m.get(keys.ADAM_STEP, record.step)
        c = bias_correction(beta2, t) if 0.0 < beta2 < 1.0 and t >= 1 else 1.0
        vmax = m.get(keys.ADAM_V_MAX)
        if vmax is not None:
            vmax /= c
        l1, n = m.get(keys.ADAM_V_L1), m.get(keys.ADAM_V_NUMEL)
        vmean = l1 / n / c if finite_positive(l1) and finite_positive(n) else None
        out: list[Finding] = []
        jumps = []
        for label, v, base, ratio in (("max", vmax, self.base_max, self.max_jump_ratio),
                                      ("mean", vmean, self.base_mean, self.jump_ratio)):
            if not finite_positive(v):
                continue
            r = base.ratio(v) if base.n else 1.0
            if base.n >= self.warm_samples and r >= ratio:
                jumps.append((label, v, base.baseline, r))
            base.update(v, flagged=r >= ratio)
        if self.jump.update(on=bool(jumps), off=not jumps):
            self.jump_step = record.step
            label, v, b, r = jumps[0]
            out.append(self.finding(
                record.step, severity="warning", signal=keys.ADAM_V_MAX if label == "max" else keys.ADAM_V_L1,
                value=v, baseline=b,
                message=(f"Adam's second moment surged at step {record.step}: exp_avg_sq {label} "
                         f"{fmt(v)} (bias-corrected) is {r:.1f}x its baseline {fmt(b)}. Gradients "
                         f"have grown sharply; a loss spike often follows. A checkpoint is being saved."),
                rule="jump", statistic=label, ratio=r))
        end = ctx.warmup_end_step
        # A reported jump stays in exp_avg_sq for ~1/(1 - beta2) steps: not a second event.
        after_jump = self.jump_step is not None and record.step - self.jump_step <= 1.0 / (1.0 - min(beta2, 0.9999))
        if vmean is not None and end is not None and record.step > end:
            if self.at_peak is None:
                self.at_peak = vmean
            elif self.post_peak.update(on=vmean >= self.at_peak * self.post_peak_rise and not out
                                       and not after_jump):
                out.append(self.finding(
                    record.step, severity="warning", signal=keys.ADAM_V_L1, value=vmean,
                    baseline=self.at_peak, threshold=self.at_peak * self.post_peak_rise,
                    message=(f"Adam's mean exp_avg_sq (bias-corrected) is still rising after the LR "
                             f"peak: {fmt(vmean)} at step {record.step}, {vmean / self.at_peak:.1f}x its "
                             f"value at the end of warmup (step {end}), so the gradients themselves "
                             f"are growing. In BigScience's 104B runs this preceded the glitches; "
                             f"consider a lower peak LR or beta2=0.95."),
                    rule="post_peak_rise", beta2=beta2, adam_step=t))
        return out
