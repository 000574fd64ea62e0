"""The optimizer moving before the loss does: Adam's update or first moment jumping against its
own history, or one layer's state departing from the others (docs/design.md, Metric keys)."""
from __future__ import annotations

import math

from .. import keys
from ..record import Finding, StepRecord
from ..stats import RobustLevel, bias_correction, finite_positive
from .base import Context, Detector, check, count, fmt, positive, positive_int

#: torch's Adam/AdamW default beta1, assumed when the record does not say.
DEFAULT_BETA1 = 0.9
#: Findings at this step that already explain a jump of the optimizer's state (a grad-norm jump
#: enters the first moment at once): a precursor must come before them, not with them.
_EXPLAINED_BY = frozenset({"grad_norm_spike", "loss_spike", "nonfinite"})
#: Findings after a precursor's onset that confirm it led something: the loss or the grad norm moved.
_CONFIRMED_BY = _EXPLAINED_BY | {"divergence"}


class Precursor(Detector):
    """Marin's 32B runs (marin-community/marin#1368): Adam's update norm doubled *before* each
    loss spike, the grad norm only after; the first moment grew ~2x while the second moment stayed
    flat; the lower layers moved most. Four rules, each against the signal's own history:

    - *update*: the update norm ``update_norm = lr x d``, ``d`` Adam's direction norm. ``d`` has a
      robust baseline (the LR factored out: a warmup raises the update norm by design); the update
      is judged against ``baseline(d) x`` the LR of the previous sample, so the LR's own change
      since then counts (a burst) while a schedule's slow change stays below ``jump_ratio``;
    - *first moment*: ``||exp_avg|| / (1 - beta1^t)`` (bias-corrected: the raw EMA fills up over
      the first ~1/(1 - beta1) steps) against its robust baseline;
    - *layer*: the tensor with the largest update ratio (the probe's ``layers/top1``: its direction
      over its own history) at ``layer_ratio`` x and ``split_ratio`` x the geometric mean of all
      the tensors' ratios (one layer departs from the others), carrying at least ``min_share`` of
      the update (``layers/top1/update_share``: a bias of 2 numbers moving freely as the loss
      nears zero cannot lead the model alone; without the key, a log written before it, the
      rule does not weigh);
    - *split*: the lower or the upper half of the tensors (optimizer order) at ``split_ratio`` x
      its history and ``split_ratio`` x the other half.

    A global jump counts at ``jump_ratio`` x its baseline and ``z_threshold`` sigma above it, or at
    ``max_ratio`` x whatever the noise. The precursor earns its warning: ``info`` at its onset,
    however large, and a ``warning`` only once the loss or the grad norm confirms it (a loss or
    grad-norm spike, a divergence or a NaN) within ``confirm_steps`` after the onset: a healthy
    run's optimizer state jumps now and then and nothing follows. Nothing while a loss spike is
    open or with a grad-norm or loss spike at the same step (an after-effect, not a lead). The
    policy registers the onset as a lead (docs/design.md, Findings): a loss or grad-norm spike
    within ``policy.lead_window_steps`` gets its onset from it. O(1); state: 2 baselines, a
    scalar, the open episode, the lead awaiting its confirmation (8 scalars).
    """

    name = "precursor"
    kind = "precursor"
    signals = (keys.UPDATE_NORM, keys.ADAM_M_NORM, keys.layer_top(1, "update_ratio"),
               keys.LAYERS_LOWER_UPDATE_RATIO)
    _state = ("base_d", "base_m", "prev_lr", "episode", "pending")

    def __init__(self, *, jump_ratio: float = 2.0, z_threshold: float = 6.0, max_ratio: float = 4.0,
                 large_ratio: float = 8.0, layer_ratio: float = 4.0, split_ratio: float = 2.0,
                 close_ratio: float = 1.5, warm_samples: int = 10, persist_samples: int = 5,
                 baseline_alpha: float = 0.05, min_share: float = 0.1, confirm_steps: int = 20):
        self.jump_ratio = positive("jump_ratio", jump_ratio)
        self.z_threshold = positive("z_threshold", z_threshold)
        self.max_ratio = positive("max_ratio", max_ratio)
        self.large_ratio = positive("large_ratio", large_ratio)
        self.layer_ratio = positive("layer_ratio", layer_ratio)
        self.split_ratio = positive("split_ratio", split_ratio)
        self.close_ratio = positive("close_ratio", close_ratio)
        self.warm_samples = positive_int("warm_samples", warm_samples)
        # persist_samples: accepted, no longer used (a precursor that lasted 5 samples was a warning;
        # since issue 33 only the loss or the grad norm make it one); configurations keep loading
        positive_int("persist_samples", persist_samples)
        self.baseline_alpha = positive("baseline_alpha", baseline_alpha)
        self.min_share = check("min_share", min_share, isinstance(min_share, (int, float)) and 0 <= min_share <= 1,
                               "in [0, 1]")
        self.confirm_steps = positive_int("confirm_steps", confirm_steps)
        self.base_d = self._baseline()
        self.base_m = self._baseline()
        self.prev_lr: float | None = None
        self.episode: list | None = None   # [onset step, samples so far]
        # the last onset awaiting the loss or the grad norm: [step, signal, value, baseline,
        # threshold, rule, ratio, what moved]
        self.pending: list | None = None

    def _baseline(self) -> RobustLevel:
        # No trend: the optimizer's state falls fast over the first tens of steps (a fresh Adam
        # moves every weight by ~lr; the mean gradient shrinks), and a trend learned there
        # would carry the baseline on down below a level that has since flattened out.
        return RobustLevel(self.baseline_alpha, trend_alpha=0.0)

    def on_segment(self, start_step: int, reason: str) -> None:
        # A resume or rollback: the probe's per-tensor baselines start afresh, and the optimizer
        # state may be new (a fresh Adam starts with |d| = sqrt(numel)).
        self.base_d, self.base_m = self._baseline(), self._baseline()
        self.prev_lr, self.episode, self.pending = None, None, None

    def update(self, record: StepRecord, ctx: Context) -> list[Finding]:
        m = record.metrics
        if (m.get(keys.OVERFLOW_SKIPPED) or 0.0) >= 1.0:
            return []
        step = record.step
        jumps = self._global(m, step) + self._layers(m, ctx.tensor_names)
        out = self._confirm(step, ctx)
        if self.episode is not None:
            if max((j["ratio"] for j in jumps), default=0.0) < self.close_ratio:
                self.episode = None
            else:
                self.episode[1] += 1
            return out
        abnormal = [j for j in jumps if j["abnormal"]]
        if not abnormal or ctx.loss_spike_open or any(f.kind in _EXPLAINED_BY for f in ctx.found):
            return out
        top = max(abnormal, key=lambda j: j["ratio"])
        self.episode = [step, 1]
        f = self._finding(step, top, abnormal, severity="info", onset=step,
                          tail=(" A jump this large usually reaches the loss within a step or two; keep a recent "
                                "checkpoint at hand." if top["ratio"] >= self.large_ratio else
                                " Marin's 32B runs saw the update norm double before each loss spike; watching for "
                                "the loss and the grad norm."))
        self.pending = [step, f.signal, f.value, f.baseline, f.threshold, top["rule"], top["ratio"], f.details["lead"]]
        return out + [f]

    def _confirm(self, step: int, ctx: Context) -> list[Finding]:
        """The warning of the pending lead, when the loss or the grad norm now confirms it."""
        p = self.pending
        if p is None:
            return []
        onset, signal, value, baseline, threshold, rule, ratio, what = p
        if step - onset > self.confirm_steps:
            self.pending = None
            return []
        # (a jump near the loss's floor, measured against it, is a hard batch, not the loss moving:
        # a classifier near zero loss, its output bias free to move, confirms nothing by it)
        by = next((f for f in ctx.found if f.kind in _CONFIRMED_BY and not f.details.get("near_floor")
                   and "floor" not in f.details), None)
        near_floor = any(f.kind in _CONFIRMED_BY for f in ctx.found) and by is None
        if step <= onset or (by is None and (near_floor or not ctx.loss_spike_open)):
            return []
        self.pending = None
        moved = (f"{by.kind} at step {step}" if by is not None else f"the loss spike open at step {step}")
        gap = step - onset
        return [self.finding(
            step, severity="warning", signal=signal, value=value, baseline=baseline, threshold=threshold,
            onset_step=onset,
            message=(f"The optimizer moved before the loss, and the loss or the grad norm followed: {what} at step "
                     f"{onset}, then {moved}, {count(gap)} later. The episode began at step {onset}: "
                     f"keep a checkpoint from before it at hand."),
            rule=rule, ratio=ratio, lead=what, confirmed_by=by.kind if by is not None else "loss_spike",
            confirmed=True)]

    # -- the rules -------------------------------------------------------------------------------
    def _global(self, m, step: int) -> list[dict]:
        out = []
        u, lr = m.get(keys.UPDATE_NORM), m.get(keys.LR)
        if u is not None and finite_positive(u):
            known_lr = lr is not None and finite_positive(lr)
            d = u / lr if known_lr else u
            lr_rise = lr / self.prev_lr if known_lr and self.prev_lr else 1.0
            out += self._judge(self.base_d, d, lr_rise, rule="update", signal=keys.UPDATE_NORM,
                               value=u, baseline_scale=self.prev_lr if known_lr and self.prev_lr else 1.0)
            if known_lr:
                self.prev_lr = lr   # the LR of the last sample (adam_every_n_steps apart)
        mn = m.get(keys.ADAM_M_NORM)
        if mn is not None and finite_positive(mn):
            beta1 = m.get(keys.ADAM_BETA1) or DEFAULT_BETA1
            t = m.get(keys.ADAM_STEP, step)
            c = bias_correction(beta1, t)
            out += self._judge(self.base_m, mn / c, 1.0, rule="first_moment", signal=keys.ADAM_M_NORM,
                               value=mn / c, baseline_scale=1.0)
        return out

    def _judge(self, base: RobustLevel, x: float, factor: float, *, rule: str, signal: str, value: float,
               baseline_scale: float) -> list[dict]:
        """``x`` against ``base`` (times ``factor``: the LR's rise since the last sample), then
        ``x`` into ``base``."""
        if base.n < self.warm_samples:
            base.update(x)
            return []
        ratio = base.ratio(x) * factor
        z = base.z(x) + math.log(factor) / base.scale
        abnormal = ratio >= self.max_ratio or (ratio >= self.jump_ratio and z >= self.z_threshold)
        expected = base.baseline * baseline_scale
        base.update(x, flagged=abnormal or self.episode is not None)
        return [{"rule": rule, "signal": signal, "ratio": ratio, "abnormal": abnormal, "value": value,
                 "baseline": expected, "lr_rise": factor}]

    def _layers(self, m, names: list | None) -> list[dict]:
        out = []
        lo, up = m.get(keys.LAYERS_LOWER_UPDATE_RATIO), m.get(keys.LAYERS_UPPER_UPDATE_RATIO)
        halves = lo is not None and up is not None and finite_positive(lo) and finite_positive(up)
        overall = math.sqrt(lo * up) if halves else 1.0
        r1, tensor = m.get(keys.layer_top(1, "update_ratio")), m.get(keys.layer_top(1, "tensor"))
        if r1 is not None and finite_positive(r1):
            share = m.get(keys.layer_top(1, "update_share"))
            carries = share is None or not share < self.min_share   # NaN: a non-finite tensor leads
            out.append({"rule": "layer", "signal": keys.layer_top(1, "update_ratio"), "ratio": r1,
                        "abnormal": r1 >= self.layer_ratio and r1 >= self.split_ratio * overall and carries,
                        "share": share,
                        "value": r1, "baseline": 1.0, "tensor": tensor, "name": _name(names, tensor),
                        "exp_avg_ratio": m.get(keys.layer_top(1, "exp_avg_ratio")),
                        "exp_avg_sq_ratio": m.get(keys.layer_top(1, "exp_avg_sq_ratio")), "overall": overall})
        if halves:
            high, low, which = (lo, up, "lower") if lo >= up else (up, lo, "upper")
            out.append({"rule": "split", "signal": keys.LAYERS_LOWER_UPDATE_RATIO if which == "lower"
                        else keys.LAYERS_UPPER_UPDATE_RATIO, "ratio": high, "value": high, "baseline": 1.0,
                        "abnormal": high >= self.split_ratio and high >= self.split_ratio * low,
                        "half": which, "other": low})
        return out

    # -- the finding -------------------------------------------------------------------------------
    def _finding(self, step: int, top: dict, jumps: list[dict], *, severity: str, onset: int,
                 tail: str) -> Finding:
        what = describe(top)
        others = [describe(j) for j in jumps if j is not top and j["abnormal"]]
        also = f" Also: {'; '.join(others)}." if others else ""
        return self.finding(
            step, severity=severity, signal=top["signal"], value=top["value"], baseline=top["baseline"],
            threshold=top["baseline"] * (self.layer_ratio if top["rule"] == "layer" else self.jump_ratio),
            onset_step=onset,
            message=f"The optimizer moved before the loss: {what} at step {step}.{also}{tail}",
            rule=top["rule"], ratio=top["ratio"], lead=what,
            **({"tensor_name": top["name"]} if top.get("name") else {}),
            rules={j["rule"]: round(j["ratio"], 4) for j in jumps})


def _name(names: list | None, tensor: float | None) -> str | None:
    """The name of tensor number ``tensor`` (a float from the record), when the run knows it."""
    if names is None or tensor is None or not math.isfinite(tensor) or not 0 <= int(tensor) < len(names):
        return None
    return names[int(tensor)]


def describe(j: dict) -> str:
    """One jump as the lead of a sentence: "the update norm of the lower layers rose 2.1x"."""
    r = j["ratio"]
    if j["rule"] == "update":
        lr = (f", the LR itself {j['lr_rise']:.1f}x what it was at the sample before"
              if j["lr_rise"] >= 1.25 else "")
        return (f"Adam's update norm rose {r:.1f}x ({fmt(j['value'])} vs {fmt(j['baseline'])} expected "
                f"from its history{lr})")
    if j["rule"] == "first_moment":
        return (f"Adam's first moment (||exp_avg||, bias-corrected) rose {r:.1f}x ({fmt(j['value'])} vs "
                f"its baseline {fmt(j['baseline'])})")
    if j["rule"] == "split":
        return (f"the update norm of the {j['half']} layers rose {r:.1f}x against their own history "
                f"(the {'upper' if j['half'] == 'lower' else 'lower'} layers: {j['other']:.2f}x)")
    tensor = j.get("tensor")
    index = int(tensor) if tensor is not None and math.isfinite(tensor) else None
    if j.get("name"):
        name = j["name"] + (f" (parameter tensor #{index} in the optimizer's order)" if index is not None else "")
    elif index is not None:
        name = f"parameter tensor #{index} (in the optimizer's order)"
    else:
        name = "one parameter tensor"
    moments = ""
    if j.get("exp_avg_ratio") is not None and j.get("exp_avg_sq_ratio") is not None:
        moments = f"; its first moment {j['exp_avg_ratio']:.1f}x, its second moment {j['exp_avg_sq_ratio']:.1f}x"
    return (f"the update of {name} rose {r:.1f}x against its own history, "
            f"{r / j['overall']:.1f}x the tensors' typical ratio{moments}")
