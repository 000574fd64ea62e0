"""Outliers of the global grad norm — often the leading signal of a loss spike."""
from __future__ import annotations

import math
from typing import Sequence

from .. import keys
from ..record import Finding, StepRecord
from ..stats import RobustLevel
from .base import Columns, Context, Detector, fmt, positive, positive_int


#: Jumps of ``large_ratio`` x the loss did not follow, before the repeat window, that make a jump
#: no higher than them the grad norm's own tail (two: one could be chance).
_TAIL_SEEN = 2


class GradNormSpike(Detector):
    """An episode opens when the grad norm is ``z_threshold`` σ and ``min_ratio`` × above its
    robust baseline (with a short history: ``cold_start_ratio`` ×; at ``max_ratio`` × with
    three quarters of ``z_threshold`` σ: a noise estimate widened by a turbulent stretch does not
    hide a 5x spike, while a grad norm that swings by orders of magnitude from batch to batch, as
    a classifier's near zero loss does — its batches' few hard examples —, has 5-10x blips at
    3-4σ) and closes when it falls
    below ``close_ratio`` ×. Info when isolated; warning when it is the ``repeat_count``-th
    onset within ``repeat_window_steps`` (healthy runs have pairs of blips; a train of them is
    an optimizer going bad), or when it is ``large_ratio`` × its baseline: a jump by orders of
    magnitude (rewards scaled x1000 in a policy gradient: the grad norm 1800x) is no blip,
    whatever the loss does. Near the loss's floor (``loss_spike``'s: a classifier near zero
    loss, its gradient the few examples a batch still gets wrong), a jump that stays within the
    largest grad norm of the run's ordinary points (what it was before training fitted them) is
    a hard batch, not the optimizer going bad nor the weights blowing up: info, said so. A jump
    by orders of magnitude no higher than two or more the run showed and came back from before
    the repeat window, the loss not spiking meanwhile, is the grad norm's own heavy tail (a
    mixture density's likelihood gradients): info (``details.seen_before``); the first ones
    warn. Zero norms (a print artefact of some builds) and skipped fp16 steps are ignored.
    O(1) amortized; state: the baseline, 6 scalars and the recent spikes.

    >>> d = GradNormSpike()
    >>> [f.kind for s, g in enumerate([1.0, 1.1, 20.0], 1)
    ...  for f in d.update(StepRecord(s, {"grad_norm": g}), Context(s))]
    ['grad_norm_spike']
    """

    name = "grad_norm_spike"
    kind = "grad_norm_spike"
    signals = (keys.GRAD_NORM,)
    _state = ("base", "open", "onsets", "peak", "episode", "recent", "tail")

    def __init__(self, *, baseline_alpha: float = 0.05, z_threshold: float = 6.0,
                 min_ratio: float = 2.0, cold_start_samples: int = 20, cold_start_ratio: float = 3.0,
                 max_ratio: float = 5.0, close_ratio: float = 1.5, repeat_window_steps: int = 200, repeat_count: int = 3,
                 large_ratio: float = 100.0):
        self.z_threshold = positive("z_threshold", z_threshold)
        self.min_ratio = positive("min_ratio", min_ratio)
        self.cold_start_samples = positive_int("cold_start_samples", cold_start_samples)
        self.cold_start_ratio = positive("cold_start_ratio", cold_start_ratio)
        self.max_ratio = positive("max_ratio", max_ratio)
        self.close_ratio = positive("close_ratio", close_ratio)
        self.repeat_window_steps = positive_int("repeat_window_steps", repeat_window_steps)
        self.repeat_count = positive_int("repeat_count", repeat_count)
        self.large_ratio = positive("large_ratio", large_ratio)
        # cold, the level is the median (then a Theil-Sen line) of every point seen: a heavy-tailed
        # grad norm's high draws, judged abnormal against one low first point, kept the level there
        self.base = RobustLevel(positive("baseline_alpha", baseline_alpha), cold_start_samples=self.cold_start_samples)
        self.open = False
        self.onsets: list[int] = []   # recent onset steps, inside the repeat window
        self.peak = 0.0                # the largest grad norm of the ordinary points
        self.episode = [0.0, False]    # the open spike's largest ratio, and whether the loss spiked meanwhile
        self.recent: list[list] = []   # [close step, ratio] of spikes the loss did not follow, in the window
        self.tail = [0, 0.0]           # ... before the window, of large_ratio x and more: how many, the largest ratio

    # update(): the run of one record (Detector._update_alone); the rule is written as replay's loop
    update = Detector._update_alone

    def update_run(self, run: Sequence[StepRecord], ctxs: Sequence[Context], cols: Columns | None = None) -> None:
        cols = cols or Columns.of(run)   # the grad norm, its log where 0 < it < inf, skipped steps (Columns)
        for record, ctx, g, lg, skipped in zip(run, ctxs, cols.grad, cols.grad_log, cols.skipped):
            if lg is None or skipped or g is None:   # (g is None only where lg is: for the types)
                continue
            b = self.base
            if b.n == 0:
                b.update(g)
                continue
            f = b.level + b.damping * b.trend + b.bias   # b.forecast, less a call
            d = lg - f   # b.ratio(g), from the forecast and the log worked out once; never past a float's
            ratio = math.exp(d if d < 700.0 else 700.0)   # range (a baseline of 1e-300: no overflow, still huge)
            if b.n < self.cold_start_samples:
                abnormal = ratio >= self.cold_start_ratio
            elif ratio >= self.min_ratio:
                z = (lg - f) / b.scale   # b.z(g)
                abnormal = z >= self.z_threshold or (ratio >= self.max_ratio and z >= 0.75 * self.z_threshold)
            else:
                abnormal = False
            if self.open:
                ep = self.episode
                if ratio > ep[0]:
                    ep[0] = ratio
                if ctx.loss_spike_open:
                    ep[1] = True
                if ratio < self.close_ratio:
                    self.open = False
                    b.update_log(lg)
                    if not ep[1]:
                        self.recent.append([record.step, ep[0]])
                else:
                    b.update_log(lg, flagged=True)
            elif not abnormal:
                b.update_log(lg)
                if g > self.peak:
                    self.peak = g
            else:
                ctx.found.append(self._onset(record, ctx, g, lg, ratio))

    def _onset(self, record: StepRecord, ctx: Context, g: float, lg: float, ratio: float) -> Finding:
        """An abnormal grad norm ``g`` (its log ``lg``) opens a spike at ``record``: said."""
        b = self.base
        self.open = True
        self.episode = [ratio, bool(ctx.loss_spike_open)]
        self._fold(record.step)
        self.onsets = [s for s in self.onsets if record.step - s <= self.repeat_window_steps]
        if not b.cold:   # a train of spikes counts warm ones: cold, the noise is not known yet
            self.onsets.append(record.step)
        repeat = len(self.onsets) >= self.repeat_count
        prev = self.onsets[-2] if len(self.onsets) > 1 else None
        base = b.baseline
        b.update_log(lg, flagged=True)
        large = ratio >= self.large_ratio
        if (repeat or large) and g <= self.peak and ctx.loss_baseline is not None and \
                ctx.loss_floor_log > math.log(ctx.loss_baseline):   # near the loss's floor: a hard batch
            return self.finding(
                record.step, severity="info", value=g, baseline=base, threshold=base * self.min_ratio,
                message=(f"Grad norm jumped to {fmt(g)} at step {record.step}, {ratio:.1f}x its baseline "
                         f"{fmt(base)}, but no higher than it stood earlier in the run ({fmt(self.peak)}): the loss "
                         f"is near its floor, where the few examples a batch still gets wrong make the gradient; "
                         f"a hard batch, not the optimizer going bad."),
                ratio=ratio, repeat_of=prev if repeat else None, near_floor=True)
        if large and not repeat and self.tail[0] >= _TAIL_SEEN and ratio <= self.tail[1]:
            return self.finding(
                record.step, severity="info", value=g, baseline=base, threshold=base * self.min_ratio,
                message=(f"Grad norm jumped to {fmt(g)} at step {record.step}, {ratio:.1f}x its baseline {fmt(base)}, "
                         f"no higher than the {self.tail[0]} jumps of {self.large_ratio:g}x and more this run showed and "
                         f"came back from earlier, the loss unmoved (up to {self.tail[1]:.3g}x): its grad norm is "
                         f"heavy-tailed (a likelihood's gradients, rare hard batches). A jump beyond them, or one the "
                         f"loss follows, is news."),
                ratio=ratio, seen_before=self.tail[0])
        tail = (f" It repeats ({len(self.onsets)} spikes since step {self.onsets[0]}): the optimizer state may be going bad: "
                f"keep a checkpoint from before the first." if repeat else
                " A jump by orders of magnitude is no blip: something upstream changed scale (the data, the "
                "rewards, the loss's weighting) or the weights are blowing up; check the step's batch." if large else
                " Isolated grad-norm spikes are common; a loss spike often follows within a few steps.")
        return self.finding(
            record.step, severity="warning" if repeat or large else "info", value=g, baseline=base,
            threshold=base * (self.cold_start_ratio if b.n <= self.cold_start_samples else self.min_ratio),
            message=(f"Grad norm jumped to {fmt(g)} at step {record.step}, {ratio:.1f}x its baseline "
                     f"{fmt(base)}.{tail}"),
            ratio=ratio, repeat_of=prev if repeat else None)

    def _fold(self, step: int) -> None:
        """Spikes the loss did not follow that closed before the repeat window into the run's
        tail, where they were jumps of ``large_ratio`` x and more (amortized O(1): each spike is
        folded once)."""
        recent, tail = self.recent, self.tail
        while recent and step - recent[0][0] > self.repeat_window_steps:
            _, ratio = recent.pop(0)
            if ratio >= self.large_ratio:
                tail[0] += 1
                tail[1] = max(tail[1], ratio)
