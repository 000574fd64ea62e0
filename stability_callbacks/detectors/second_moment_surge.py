"""Adam's second moment (exp_avg_sq) abnormal: a jump, or still rising after the LR peak."""
from __future__ import annotations

from .. import keys
from ..record import Finding, StepRecord
from ..stats import RobustLevel, finite_positive
from .base import Context, Detector, fmt, positive, positive_int


class SecondMomentSurge(Detector):
    """Two rules over ``adam/exp_avg_sq_max`` and the mean ``l1 / numel``:

    - *jump*: either statistic ``jump_ratio`` × above its robust baseline (max: ×``max_jump_ratio``);
    - *post-peak rise*: after warmup, the mean stands ``post_peak_rise`` × above its value at the
      end of warmup (BigScience 104B: the variance peaked at warmup end; still rising after
      it means the optimizer is heading for trouble).

    Warning, one per episode (re-armed when back under 1.5×). O(1); state: 2 baselines, 3 scalars.
    """

    name = "second_moment_surge"
    kind = "second_moment_surge"
    signals = (keys.ADAM_V_MAX, keys.ADAM_V_L1)
    _state = ("base_max", "base_mean", "at_peak", "open", "post_peak_fired")

    def __init__(self, *, jump_ratio: float = 4.0, max_jump_ratio: float = 10.0,
                 post_peak_rise: float = 2.0, warm_samples: int = 10, baseline_alpha: float = 0.05):
        self.jump_ratio = positive("jump_ratio", jump_ratio)
        self.max_jump_ratio = positive("max_jump_ratio", max_jump_ratio)
        self.post_peak_rise = positive("post_peak_rise", post_peak_rise)
        self.warm_samples = positive_int("warm_samples", warm_samples)
        self.base_max = RobustLevel(positive("baseline_alpha", baseline_alpha))
        self.base_mean = RobustLevel(baseline_alpha)
        self.at_peak: float | None = None
        self.open = False
        self.post_peak_fired = False

    def update(self, record: StepRecord, ctx: Context) -> list[Finding]:
        m = record.metrics
        vmax = m.get(keys.ADAM_V_MAX)
        l1, n = m.get(keys.ADAM_V_L1), m.get(keys.ADAM_V_NUMEL)
        vmean = l1 / n if finite_positive(l1) and finite_positive(n) else None
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
        if jumps and not self.open:
            self.open = True
            label, v, b, r = jumps[0]
            out.append(self.finding(
                record.step, severity="warning", signal=keys.ADAM_V_MAX if label == "max" else keys.ADAM_V_L1,
                value=v, baseline=b,
                message=(f"Adam's second moment surged at step {record.step}: exp_avg_sq {label} "
                         f"{fmt(v)} is {r:.1f}x its baseline {fmt(b)}. Gradients have grown sharply; "
                         f"a loss spike often follows. A checkpoint is being saved."),
                rule="jump", statistic=label, ratio=r))
        elif not jumps and self.open:
            self.open = False
        if vmean is not None and ctx.phase not in (None, "warmup"):
            if self.at_peak is None:
                self.at_peak = vmean
            elif (not self.post_peak_fired and vmean >= self.at_peak * self.post_peak_rise
                  and not out):
                self.post_peak_fired = True
                out.append(self.finding(
                    record.step, severity="warning", signal=keys.ADAM_V_L1, value=vmean,
                    baseline=self.at_peak, threshold=self.at_peak * self.post_peak_rise,
                    message=(f"Adam's mean exp_avg_sq is still rising after the LR peak: {fmt(vmean)} "
                             f"at step {record.step}, {vmean / self.at_peak:.1f}x its value at the end "
                             f"of warmup. In BigScience's 104B runs this preceded the glitches; "
                             f"consider a lower peak LR or beta2=0.95."),
                    rule="post_peak_rise"))
        return out
