"""Per-parameter-tensor Adam statistics, summarised on the device: Adam's update norm, and which
tensors (layers) move away from their own history (docs/design.md, Metric keys).

The probe's one pass over the optimizer state (:func:`~.reductions.moment_stats`) leaves, per
parameter tensor *i*, this rank's part of ``S_i = sum(exp_avg_sq)`` and ``Q_i = sum(exp_avg^2)``.
They travel in the step's one collective as a :class:`~.packed.Block` (sums add up across ZeRO
partitions and FSDP2 shards; replicated state takes the max), and once reduced the device turns
them into, with ``n_i`` the tensor's element count and Adam's bias corrections
``c1 = 1 - beta1^t``, ``c2 = 1 - beta2^t`` of its param group:

- ``m_i = sqrt(Q_i) / c1``: the norm of the bias-corrected first moment;
- ``v_i = S_i / (n_i c2)``: the tensor's mean bias-corrected second moment;
- ``d_i = m_i / (sqrt(v_i) + eps)``: the norm of Adam's direction over the tensor, with the
  tensor's mean second moment in place of each element's (the exact per-element quotient would
  need a second pass and an elementwise temporary: 6-9x the floor on CPU, measured);
- ``update_norm = sqrt(sum_i (lr_i d_i)^2)``: the norm of the step Adam takes, weight decay
  excluded, ``lr_i`` the LR the step used for the tensor's group (the record's ``lr`` scaled by
  the group's share of the first group's LR; the groups' own LR when the record has none).

Each tensor keeps a baseline per statistic (``d``, ``m``, ``v``): a running mean of its logarithm
over the sampled steps before (the mean of all of them for the first ``1 / ALPHA``, then an EMA
with weight ``ALPHA``), so a ratio reads "this tensor against its own history" whatever its size
and LR. Only a fixed-size summary goes to the host: ``update_norm``, the geometric mean of the
ratios over the first and the second half of the tensors (optimizer order: embeddings and lower
layers first in the usual models), and the ``keys.LAYERS_TOP`` tensors with the largest update
ratio (a non-finite one first), each with its share of the update, ``(lr_i d_i)^2 /
update_norm^2`` (how much of the step the tensor carries: a bias of 2 numbers carries little).
Ratios come once a baseline has ``WARM_SAMPLES`` samples; a new process (a resume) or a rollback
starts the baselines afresh.
"""
from __future__ import annotations

import torch

from stability_callbacks import keys

from .optim_state import AdamState
from .packed import Block
from .reductions import MomentStats, host_to_device

__all__ = ["LayerSummary", "ALPHA", "WARM_SAMPLES", "SUMMARY_KEYS"]

ALPHA = 0.1          # the baselines' EMA weight (after the first 1 / ALPHA samples)
WARM_SAMPLES = 5     # samples in a baseline before its ratios are reported
_FLOOR = 1e-30       # zero statistics (a tensor that never moved) are logged as this

SUMMARY_KEYS = (keys.UPDATE_NORM, keys.LAYERS_LOWER_UPDATE_RATIO, keys.LAYERS_UPPER_UPDATE_RATIO,
                keys.LAYERS_LOWER_EXP_AVG_RATIO, keys.LAYERS_UPPER_EXP_AVG_RATIO) + tuple(
    keys.layer_top(k, f) for k in range(1, keys.LAYERS_TOP + 1) for f in keys.LAYER_TOP_FIELDS)


class LayerSummary:
    """The per-tensor baselines of one run (device tensors, the same on every rank) and the
    :class:`~.packed.Block` of each sampled step."""

    def __init__(self):
        self.samples = 0                          # sampled steps summarised so far
        self._log_base: torch.Tensor | None = None   # [tensors, 3]: log d, log m, log v
        self._consts: tuple | None = None          # (layout, numel, group index) on the device

    def reset(self) -> None:
        """Forget the baselines (a new segment: resume or rollback)."""
        self.samples, self._log_base = 0, None

    def block(self, stats: MomentStats | None, state: AdamState | None, *, num_tensors: int,
              step, lr: float | None, device) -> Block:
        """This step's block: this rank's per-tensor sums and how to summarise them once reduced.
        ``stats``/``state`` None (this rank's pass failed or is off), or no ``step`` (Adam's update
        count, a host number or device tensor): the block carries zeros with its flag down, and
        the summary is left out of the record on every rank. ``lr``: the record's LR.

        Every rank counts the sample and keeps the same baselines (they move only on a step where
        every rank sent its values), so every rank gets the same summary."""
        size, names = 2 * num_tensors, list(SUMMARY_KEYS)
        warm = self.samples >= WARM_SAMPLES
        alpha = max(ALPHA, 1.0 / (self.samples + 1))
        self.samples += 1
        if stats is None or state is None or stats.per_tensor is None or step is None:
            return Block(size, None, "sum", _nothing, names, [False] * len(names))
        hyper = _group_hyper(state, step, lr, device)
        numel, group = self._layout(state, device)
        present = [True] + [warm and num_tensors >= 2] * 4 + [
            warm and k < num_tensors for k in range(keys.LAYERS_TOP) for _ in keys.LAYER_TOP_FIELDS]

        def summarize(reduced: torch.Tensor, every_rank: torch.Tensor) -> torch.Tensor:
            return self._summarize(reduced.reshape(num_tensors, 2), every_rank, hyper, numel, group, alpha)

        return Block(size, stats.per_tensor.reshape(-1), "sum" if state.partitioned else "max", summarize,
                     names, present)

    def _layout(self, state: AdamState, device):
        layout = (tuple(state.tensor_numel), tuple(state.tensor_group), str(device))
        if self._consts is None or self._consts[0] != layout:
            self._consts = (layout,
                            host_to_device(torch.tensor(state.tensor_numel, dtype=torch.float64), device),
                            host_to_device(torch.tensor(state.tensor_group, dtype=torch.long), device))
        return self._consts[1], self._consts[2]

    def _summarize(self, r: torch.Tensor, ok: torch.Tensor, hyper: torch.Tensor, numel: torch.Tensor,
                   group: torch.Tensor, alpha: float) -> torch.Tensor:
        lr, c1, c2, eps = hyper[group].unbind(1)
        m = r[:, 1].sqrt() / c1
        v = r[:, 0] / (numel * c2)
        d = m / (v.sqrt() + eps)
        sq = (lr * d).square()
        total = sq.sum()
        update_norm = total.sqrt()
        share = sq / total.clamp_min(1e-300)   # each tensor's part of the update's squared norm
        logx = torch.stack([d, m, v], 1).clamp_min(_FLOOR).log()
        base = torch.full_like(logx, torch.nan) if self._log_base is None else self._log_base
        log_ratio = logx - base
        # The baselines move only on finite values, and not on a step some rank had no values for.
        keep = torch.isfinite(logx) & ok
        fresh = torch.where(torch.isfinite(base), base + alpha * (logx - base), logx)
        self._log_base = torch.where(keep, fresh, base)
        t = r.shape[0]
        half = (t + 1) // 2
        lower, upper = log_ratio[:half, :2].mean(0).exp(), log_ratio[half:, :2].mean(0).exp()
        k = min(keys.LAYERS_TOP, t)
        order = torch.topk(log_ratio[:, 0], k).indices
        top = torch.cat([order.to(torch.float64)[:, None], log_ratio[order].exp(), share[order, None]], 1)
        if k < keys.LAYERS_TOP:
            top = torch.cat([top, top.new_zeros(keys.LAYERS_TOP - k, top.shape[1])])
        return torch.cat([update_norm.reshape(1), torch.stack([lower[0], upper[0], lower[1], upper[1]]),
                          top.reshape(-1)])


def _nothing(reduced: torch.Tensor, every_rank: torch.Tensor) -> torch.Tensor:
    return torch.zeros(len(SUMMARY_KEYS), dtype=torch.float64, device=reduced.device)


def _group_hyper(state: AdamState, step, lr: float | None, device) -> torch.Tensor:
    """``[groups, 4]`` on the device: per param group the LR this step used, Adam's bias
    corrections ``1 - beta1^t``, ``1 - beta2^t`` (1 where the group has ``bias_correction``
    off: DeepSpeed's FusedAdam option) and eps. Host floats travel in one non-blocking copy; a
    device ``step`` or LR (capturable / fused Adam) stays on the device."""
    rows, dev_lrs = [], {}
    for i, g in enumerate(state.groups):
        b1, b2 = (tuple(g.get("betas", (0.9, 0.999))) + (0.999,))[:2]
        glr = g.get("lr", 0.0)
        if isinstance(glr, torch.Tensor):
            dev_lrs[i] = glr
            glr = 0.0
        rows.append([float(glr), float(b1), float(b2), float(g.get("eps", 1e-8)),
                     1.0 if g.get("bias_correction", True) else 0.0])
    host = host_to_device(torch.tensor(rows, dtype=torch.float64), device)
    glr, b1, b2, eps, on = host.unbind(1)
    if dev_lrs:
        glr = torch.stack([dev_lrs[i].detach().to(device, torch.float64).reshape(()) if i in dev_lrs
                           else glr[i] for i in range(len(rows))])
    if isinstance(step, torch.Tensor):
        t = step.detach().to(device, torch.float64).reshape(())
    else:
        t = float(step)
    c1 = torch.where(on > 0, 1 - b1.pow(t), torch.ones_like(b1))
    c2 = torch.where(on > 0, 1 - b2.pow(t), torch.ones_like(b2))
    if lr is not None:
        # The LR this step used: the record's for the first group, the others in proportion.
        # The groups hold the scheduler's next LR by now (0 after a decay to 0: then all alike).
        share = torch.where(glr[0] > 0, glr / glr[0].clamp_min(1e-300), torch.ones_like(glr))
        glr = lr * share
    return torch.stack([glr, c1, c2, eps], 1)
