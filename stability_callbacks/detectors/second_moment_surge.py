"""Adam's second moment (exp_avg_sq) abnormal: a jump, or still rising after the LR peak."""
from __future__ import annotations

import math

from .. import keys
from ..record import Finding, StepRecord
from ..stats import Latch, RobustLevel, bias_correction, finite_positive
from .base import Context, Detector, check, fmt, positive, positive_int

#: torch's Adam/AdamW default, assumed when the record does not say (replayed logs never do).
DEFAULT_BETA2 = 0.999
#: Steps after a grad-norm jump within which a jump of the second moment may be its echo (the
#: probe may sample Adam's state every few steps).
_ECHO_STEPS = 10


class SecondMomentSurge(Detector):
    """Two rules over Adam's ``exp_avg_sq``:

    - *jump*: the bias-corrected max or mean (``l1 / numel``) ``jump_ratio`` × above its robust
      baseline (max: ×``max_jump_ratio``);
    - *post-peak rise*: inside the warmup-end risk window, the gradients' mean square over the
      last ``window_steps`` stands ``post_peak_rise`` × above what it was over the first
      ``window_steps`` after the peak (BigScience 104B: the variance peaks at the LR peak, "also
      where we have the highest risk of divergence"; still rising there means the gradients are
      growing while the LR is at its highest). Later, a healthy run's gradients may well grow
      (the live suite's unclipped tiny models: x2-3 over hundreds of steps): a sustained rise is
      ``grad_norm_growth``'s call then. The loss confirms it: a rise while the loss fell by
      ``min_fall`` or more between the two windows is ``info`` (a slow seq2seq's gradients grow
      from their post-warmup low as it leaves its plateau and learns); a spike that follows
      inside the risk window is escalated all the same. Without a loss it stays a warning.

    Why bias-corrected: ``exp_avg_sq`` is an EMA of g² that starts at 0, so after ``t`` steps it
    holds only ``1 − beta2^t`` of its weight: with beta2 = 0.999 the raw value keeps rising for
    ~1/(1 − beta2) = 1000 steps even when the gradients do not change at all (×2 between steps
    20 and 40). Dividing by ``1 − beta2^t`` — what Adam itself does before using it — leaves
    the weighted mean of g², which rises only when the gradients do. ``adam/beta2`` and
    ``adam/step`` come with the record when the probe knows them; otherwise the jump rule
    assumes beta2 = 0.999 (torch's default) and t = the record's step (a beta2 below 0.999 only
    makes it quieter).

    Why a window for the post-peak rise: even bias-corrected, ``exp_avg_sq`` at step t is a mean
    over all the steps since the start (beta2 = 0.999 forgets over ~1000 steps), so right after
    a 100-step warmup it is the *warmup's* average, with the small gradients of its first steps
    in it, and it goes on rising for hundreds of steps as they are diluted — while the
    gradients stay as they were at the peak (a healthy WSD run read 2.0x at step 661 this way,
    its grad norm up only 9%). How the EMA is built undoes that: ``v_t = beta2^Δ·v_a + (1 −
    beta2)·Σ beta2^(t−k)·g_k²`` over the Δ updates since step a, so the mean of g² over exactly
    those updates is ``(v_t − beta2^Δ·v_a) / (1 − beta2^Δ)``. The rule compares these window
    means; it needs the optimizer's beta2 (the identity is exact with the right one and
    amplifies noise with a wrong one), so it runs only when the record carries ``adam/beta2``.

    Warning, one per episode (the jump re-arms once neither statistic is above its ratio; the
    post-peak rise fires once per run, and not for a window in which a jump was reported). A jump
    no larger than a grad-norm jump of g x up to ``_ECHO_STEPS`` before explains (1 + 2 (1 -
    beta2) g²: one step's g² in the EMA) is its echo: info, said (``details.echo_of``).
    O(1); state: 2 baselines, 12 scalars.
    """

    name = "second_moment_surge"
    kind = "second_moment_surge"
    signals = (keys.ADAM_V_MAX, keys.ADAM_V_L1)
    _state = ("base_max", "base_mean", "at_peak", "at_peak_window", "anchor", "jump", "jump_step",
              "post_peak", "loss_window", "at_peak_loss", "echo")

    def __init__(self, *, jump_ratio: float = 4.0, max_jump_ratio: float = 10.0,
                 post_peak_rise: float = 2.0, warm_samples: int = 10, baseline_alpha: float = 0.05,
                 window_steps: int = 20, min_fall: float = 0.05):
        self.jump_ratio = positive("jump_ratio", jump_ratio)
        self.max_jump_ratio = positive("max_jump_ratio", max_jump_ratio)
        self.post_peak_rise = positive("post_peak_rise", post_peak_rise)
        self.warm_samples = positive_int("warm_samples", warm_samples)
        self.window_steps = positive_int("window_steps", window_steps)
        self.min_fall = check("min_fall", min_fall, isinstance(min_fall, (int, float)) and 0 < min_fall < 1, "in (0, 1)")
        self.base_max = RobustLevel(positive("baseline_alpha", baseline_alpha))
        self.base_mean = RobustLevel(baseline_alpha)
        self.at_peak: float | None = None       # mean g² over the first window after the warmup ended
        self.at_peak_window: list | None = None # ... and its first and last step
        self.anchor: list | None = None         # [step, Adam update count, raw mean exp_avg_sq]
        self.jump = Latch()        # re-armed once neither statistic is above its jump ratio
        self.jump_step: int | None = None   # the last jump reported
        self.echo: list | None = None        # [step, ratio] of the last grad-norm jump (a jump of v may be its echo)
        self.post_peak = Latch()   # once per run
        self.loss_window = [0.0, 0]             # the loss since the anchor: [sum, points]
        self.at_peak_loss: float | None = None  # the loss's mean over the first window after the peak

    def update(self, record: StepRecord, ctx: Context) -> list[Finding]:
        m = record.metrics
        known_beta2 = m.get(keys.ADAM_BETA2)
        beta2, t = known_beta2 or DEFAULT_BETA2, m.get(keys.ADAM_STEP, record.step)
        c = bias_correction(beta2, t)
        vmax = m.get(keys.ADAM_V_MAX)
        if vmax is not None:
            vmax /= c
        l1, n = m.get(keys.ADAM_V_L1), m.get(keys.ADAM_V_NUMEL)
        vraw = l1 / n if l1 is not None and n is not None and finite_positive(l1) and finite_positive(n) else None
        vmean = vraw / c if vraw is not None else None
        out: list[Finding] = []
        for f in ctx.found:   # a grad-norm jump this step (grad_norm_spike runs before): its ratio
            if f.kind == "grad_norm_spike" and f.details.get("ratio"):
                self.echo = [record.step, float(f.details["ratio"])]
        jumps = []
        for label, v, base, ratio in (("max", vmax, self.base_max, self.max_jump_ratio),
                                      ("mean", vmean, self.base_mean, self.jump_ratio)):
            if v is None or not finite_positive(v):
                continue
            r = base.ratio(v) if base.n else 1.0
            if base.n >= self.warm_samples and r >= ratio:
                jumps.append((label, v, base.baseline, r))
            base.update(v, flagged=r >= ratio)
        if self.jump.update(on=bool(jumps), off=not jumps):
            self.jump_step = record.step
            label, v, b, r = jumps[0]
            echo = self._echo(record.step, r, beta2)
            out.append(self.finding(
                record.step, severity="info" if echo else "warning",
                signal=keys.ADAM_V_MAX if label == "max" else keys.ADAM_V_L1, value=v, baseline=b,
                message=(f"Adam's second moment surged at step {record.step}: exp_avg_sq {label} "
                         f"{fmt(v)} (bias-corrected) is {r:.1f}x its baseline {fmt(b)}. " + (echo or
                         "Gradients have grown sharply; a loss spike often follows.")),
                rule="jump", statistic=label, ratio=r, **({"echo_of": self.echo[0]} if echo and self.echo else {})))
        end = ctx.warmup_end_step
        if (vraw is not None and known_beta2 is not None and 0.0 < beta2 < 1.0 and end is not None
                and record.step > end):
            out += self._post_peak(record.step, t, vraw, beta2, end, bool(out) or not ctx.in_risk_window,
                                   m.get(keys.LOSS))
        return out

    def _echo(self, step: int, ratio: float, beta2: float) -> str:
        """The sentence that says a jump is the echo of a grad-norm jump (of ``g`` x, within
        ``_ECHO_STEPS`` before): an EMA of g² takes (1 - beta2) of each step's g², so one such step
        lifts it by up to 1 + (1 - beta2) g² at once (twice that, for the max's element and the
        sampling); "" where that does not explain it."""
        e = self.echo
        if e is None or not 0 <= step - e[0] <= _ECHO_STEPS:
            return ""
        most = 1.0 + 2.0 * (1.0 - beta2) * e[1] * e[1]
        if ratio > most:
            return ""
        return (f"It is the echo of the grad-norm jump at step {e[0]} ({e[1]:.3g}x): an EMA of g² takes "
                f"{1.0 - beta2:.3g} of each step's g², so that step alone lifts it up to {most:.3g}x; no surge "
                f"of its own (the grad norm's jump is what to watch).")

    def _post_peak(self, step: int, t: float, vraw: float, beta2: float, end: int, quiet: bool,
                   loss: float | None) -> list[Finding]:
        """Advance the windows; judge the one ending here unless ``quiet`` (a jump reported at
        this step, or outside the risk window)."""
        a, lw = self.anchor, self.loss_window
        if a is None or t <= a[1]:   # the first point after the peak (or the optimizer restarted)
            self.anchor, self.loss_window = [step, t, vraw], [0.0, 0]
            return []
        if loss is not None and math.isfinite(loss):
            lw[0], lw[1] = lw[0] + loss, lw[1] + 1
        a_step, a_t, a_v = a
        if step - a_step < self.window_steps:
            return []
        decay = beta2 ** (t - a_t)
        g2 = (vraw - decay * a_v) / (1.0 - decay)   # mean g² over the updates since the anchor
        loss_mean = lw[0] / lw[1] if lw[1] else None
        self.anchor, self.loss_window = [step, t, vraw], [0.0, 0]
        if self.at_peak is None:
            self.at_peak, self.at_peak_window, self.at_peak_loss = g2, [a_step + 1, step], loss_mean
            return []
        rising = (g2 >= self.at_peak * self.post_peak_rise and self.at_peak > 0.0 and not quiet
                  and (self.jump_step is None or self.jump_step <= a_step))
        if not self.post_peak.update(on=rising):
            return []
        first, last = self.at_peak_window or (end, end)
        ref = self.at_peak_loss
        learning = (ref is not None and loss_mean is not None
                    and ref - loss_mean >= self.min_fall * abs(ref))   # the loss fell meanwhile
        said = (f"The gradients are still growing right after the LR peak: their mean square (from "
                f"Adam's exp_avg_sq, beta2={beta2:g}) over steps {a_step + 1}-{step} is "
                f"{g2 / self.at_peak:.1f}x what it was over steps {first}-{last}, "
                f"right after the warmup ended (step {end}).")
        if learning:
            message = (f"{said} The loss fell meanwhile (mean {fmt(ref)} then, {fmt(loss_mean)} now): a "
                       f"model that is learning often grows its gradients, so this is only watched; a "
                       f"spike inside the warmup-end risk window will be escalated.")
        else:
            message = (f"{said} In BigScience's 104B runs this preceded the glitches; consider a lower "
                       f"peak LR or beta2=0.95.")
        return [self.finding(
            step, severity="info" if learning else "warning", signal=keys.ADAM_V_L1, value=g2,
            baseline=self.at_peak, threshold=self.at_peak * self.post_peak_rise, message=message,
            rule="post_peak_rise", beta2=beta2, adam_step=t, window=[a_step + 1, step],
            loss_then=ref, loss_now=loss_mean)]
