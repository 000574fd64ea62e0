"""Skip step (``policy.skip_step_on``): drop the update of a step whose global grad norm is
non-finite or an extreme outlier, leaving the weights, Adam's moments and its step count
untouched. The rule is the policy's (:meth:`~stability_callbacks.policy.Policy.review_skip`);
this module carries it out on the device, the same way on every rank.

The decision is one device op on the global grad norm, which is identical on every rank:
``skip = not isfinite(norm) or norm > threshold``, with ``threshold`` a device scalar the host
refills (``fill_``, no sync) from each record the Monitor saw (on accelerators a step or two
behind: the rule is "N x the baseline of the steps before"). How the update is then dropped:

====================================  ====================================================
fused torch optimizers                ``found_inf`` (the attribute ``GradScaler`` sets): the
(``Adam/AdamW/SGD(fused=True)``)      fused kernel leaves params and moments alone and takes
                                      its step count back. No host sync.
a ``GradScaler`` (AMP fp16)           the flag is OR-ed into the scaler's ``found_inf`` after
                                      ``unscale_``: the scaler's own skip (no new sync; the
                                      scaler also halves its scale, as for an overflow)
DeepSpeed ZeRO 1-3                    DeepSpeed's overflow path (``integrations.deepspeed.
                                      skip_step``): the norm it computes inside its step reads
                                      ``inf`` when the flag is set, so it skips the step, its
                                      LR-scheduler step included
other torch optimizers (foreach /      a host decision: one boolean per step
for-loop Adam, SGD, ...)               (``# host-sync:``), only while ``skip_step_on`` is on
====================================  ====================================================

Not covered (one warning): DeepSpeed ZeRO-0 with fp16/bf16 (its FP16/BF16 optimizers), LBFGS
(its step re-runs the closure). HF and Lightning still step their LR scheduler on a skipped
step (as Lightning does on an fp16 overflow); DeepSpeed does not.

:class:`GatedStep` is the one wrapper around an optimizer's ``step``: it applies the skip and,
for an automatic rollback's LR window, a factor on the LR of that one call.
"""
from __future__ import annotations

import math
from typing import Callable

import torch

from stability_callbacks import keys
from stability_callbacks.live import Guard, InstancePatches

from .optim_state import unwrap_optimizer

__all__ = ["SkipStep", "GatedStep", "gate_optimizer", "supports_found_inf"]

_ONCE = Guard()   # process-wide: one warning per problem


def supports_found_inf(optimizer) -> bool:
    """Whether ``optimizer.step`` honours a ``found_inf`` attribute on the device (fused
    torch optimizers: ``_step_supports_amp_scaling``)."""
    inner = unwrap_optimizer(optimizer)
    return bool(getattr(inner, "_step_supports_amp_scaling", False)) and all(
        g.get("fused") for g in getattr(inner, "param_groups", [{}]))


class SkipStep:
    """One run's skip-step decisions. ``decide(norm)`` before the optimizer step; the optimizer
    step is gated by :class:`GatedStep`, or by an engine's own overflow path, which then decides
    inside its step (``decided_inside``: DeepSpeed,
    :func:`~stability_callbacks.integrations.deepspeed.skip_step.gate_engine`, which keeps the
    instance patches it made in ``patches``); ``report(probe)`` puts the step's flag
    (``skipped_by_policy``) in its record; ``set_threshold`` takes the policy's rule for the next
    steps. State: one device scalar."""

    def __init__(self):
        self.threshold = math.inf
        self.flag: torch.Tensor | None = None      # this step's decision, float 0/1 on the device
        self.consumed = False                      # a GradScaler / an engine carries it out
        self.decided_inside = False                # decided inside an engine's step (DeepSpeed)
        self._device_threshold: torch.Tensor | None = None
        self._norm: torch.Tensor | None = None     # the real norm where the engine reports inf
        self.patches: list[InstancePatches] = []

    # ---------------------------------------------------------------------------- the decision
    def set_threshold(self, value: float | None) -> None:
        """The rule for the next steps (``Control.skip_threshold``; None: unchanged)."""
        if value is None or value == self.threshold:
            return
        self.threshold = float(value)
        if self._device_threshold is not None:
            self._device_threshold.fill_(self.threshold)   # a fill kernel: no host sync

    def decide(self, norm, *, scale: float = 1.0) -> torch.Tensor | None:
        """This step's decision from its global grad norm (a device tensor; ``scale``: the
        loss scale the norm still carries). Returns the flag (float 0/1, on the norm's device)."""
        if not isinstance(norm, torch.Tensor):
            return None   # a host float norm comes after the step (HF + DeepSpeed): too late
        n = norm.detach().reshape(())
        if self._device_threshold is None or self._device_threshold.device != n.device:
            self._device_threshold = torch.full((), self.threshold, dtype=torch.float32, device=n.device)
        if scale != 1.0:
            n = n / scale
        self.flag = (~torch.isfinite(n) | (n > self._device_threshold)).float()
        self._norm = n
        return self.flag

    def merge_into_scaler(self, scaler, optimizer) -> None:
        """After ``scaler.unscale_(optimizer)``, before ``scaler.step``: the flag joins the
        scaler's ``found_inf``, so the scaler skips the step (and halves its scale)."""
        if self.flag is None or scaler is None or not scaler.is_enabled():
            return
        state = scaler._per_optimizer_states.get(id(unwrap_optimizer(optimizer))) or \
            scaler._per_optimizer_states.get(id(optimizer))
        found = (state or {}).get("found_inf_per_device")
        if found:
            for t in found.values():
                torch.maximum(t, self.flag.to(t.device, non_blocking=True), out=t)
            self.consumed = True

    def report(self, probe) -> None:
        """Into this step's record: the flag, and (an engine that then reports inf) the norm."""
        if self.flag is not None:
            probe.set_extra(keys.SKIPPED_BY_POLICY, self.flag, op="max")
            if self.decided_inside and self._norm is not None:
                probe.set_grad_norm(self._norm)
        self.flag, self._norm, self.consumed = None, None, False

    def close(self) -> None:
        for p in self.patches:
            p.restore()
        self.patches.clear()


class GatedStep:
    """The one wrapper around ``owner.step`` (the object the framework calls ``step()`` on):
    runs the closure first (Lightning decides inside it), then skips the update when ``skip``
    says so, and runs the step with the LR scaled by ``lr_factor()`` (an automatic rollback's LR
    window; the scheduler's own value is restored right after the call). Idempotent per owner.
    """

    def __init__(self, owner, *, skip: SkipStep | None = None,
                 lr_factor: Callable[[], float] | None = None):
        self.owner, self.skip, self.lr_factor = owner, skip, lr_factor
        self.inner = unwrap_optimizer(owner)
        self.fused = supports_found_inf(owner)
        if skip is not None and isinstance(self.inner, torch.optim.LBFGS):
            _ONCE.warn_once("skip-lbfgs", "stability: policy.skip_step_on cannot gate LBFGS (its "
                            "step re-runs the closure); steps are not skipped")
            self.skip = None
        self._patches = InstancePatches(owner)
        orig = owner.step

        def step(*args, **kwargs):
            return self._step(orig, args, kwargs)

        step._stability_gate = self
        if hasattr(orig, "_wrapped_by_lr_sched"):   # torch's LR scheduler checks its own wrap is there
            step._wrapped_by_lr_sched = orig._wrapped_by_lr_sched
        self._patches.set("step", step)

    @classmethod
    def install(cls, owner, **kwargs) -> "GatedStep":
        gate = getattr(getattr(owner, "step", None), "_stability_gate", None)
        return gate if gate is not None else cls(owner, **kwargs)

    def _step(self, orig, args, kwargs):
        closure = kwargs.pop("closure", None)
        if closure is None and args:
            closure, args = args[0], args[1:]
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        skip = self.skip
        flag = skip.flag if skip is not None and not skip.consumed and not skip.decided_inside else None
        if flag is not None and not self.fused:
            if bool(flag):   # host-sync: one boolean per step; non-fused optimizers, skip_step_on only
                return loss
            flag = None
        factor = self.lr_factor() if self.lr_factor is not None else 1.0
        groups = self.inner.param_groups
        saved = [g["lr"] for g in groups] if factor != 1.0 else None
        if saved is not None:
            for g in groups:
                g["lr"] = g["lr"] * factor
        if flag is not None:
            self.inner.found_inf = flag
        try:
            out = orig(*args, **kwargs)
        finally:
            if flag is not None:
                self.inner.__dict__.pop("found_inf", None)
            if saved is not None:
                for g, lr in zip(groups, saved):
                    g["lr"] = lr
        return loss if closure is not None else out

    def close(self) -> None:
        self._patches.restore()


def gate_optimizer(skip: SkipStep | None, owner, *,
                   lr_factor: Callable[[], float] | None = None) -> GatedStep | None:
    """Gate ``owner.step`` (what the framework calls) for the skip-step rule and an automatic
    rollback's LR window. None when neither feature is on."""
    if skip is None and lr_factor is None:
        return None
    return GatedStep.install(owner, skip=skip, lr_factor=lr_factor)
