"""Skip step under DeepSpeed: decide inside the engine's step, on the global grad norm DeepSpeed
computes there, and let its own overflow path drop the update (its LR-scheduler step included).

The torch side (:class:`~stability_callbacks.integrations.torch.skip_step.SkipStep`) holds the
decision; this module routes it: ZeRO 1/2 through ``scaled_global_norm``, ZeRO 3 through
``_get_norm_groups`` (both wrapped on the optimizer instance), where the norm is replaced by
``inf`` when the flag is set. ZeRO 1/2/3 already test that norm on the host; bf16 ZeRO 1/2 do not,
and get that one test (one boolean) turned on. ZeRO-0 fp32 steps a plain torch optimizer, gated
like any other; ZeRO-0 with fp16/bf16 (DeepSpeed's FP16/BF16 optimizers) is not covered (one
warning).
"""
from __future__ import annotations

import math

import torch

from stability_callbacks.live import Guard, InstancePatches

from ..torch.skip_step import SkipStep

__all__ = ["skip_through_overflow", "gate_engine"]

_ONCE = Guard()   # process-wide: one warning per problem


def skip_through_overflow(skip: SkipStep, engine) -> bool:
    """Make ``engine``'s optimizer take ``skip``'s decision inside its step, on the norm it
    computes. Returns False (one warning) for an optimizer this cannot reach."""
    opt = engine.optimizer
    name = type(opt).__name__
    patches = InstancePatches(opt)

    def decide(norm) -> torch.Tensor | None:
        # A failure inside DeepSpeed's step skips nothing (logged once).
        return _ONCE.call("skip-decide", lambda: skip.decide(norm, scale=float(opt.loss_scale)))

    if name == "DeepSpeedZeroOptimizer" and hasattr(opt, "scaled_global_norm"):
        orig = opt.scaled_global_norm

        def scaled_global_norm(*args, **kwargs):
            norm = orig(*args, **kwargs)
            flag = decide(norm)
            return norm if flag is None else torch.where(flag > 0, torch.full_like(norm, math.inf), norm)

        patches.set("scaled_global_norm", scaled_global_norm)
        if getattr(opt, "dtype", None) == torch.bfloat16 and not opt.check_grad_overflow:
            # bf16 ZeRO 1/2 skip DeepSpeed's test of the norm (DeepSpeedZeroOptimizer.step:
            # `dtype != bf16 or check_grad_overflow`). Turn the test on; its other half, a scan
            # of every gradient for inf (check_overflow), is what the norm already tells.
            opt.check_grad_overflow = True
            patches.set("check_overflow", lambda *a, **k: None)
    elif name == "DeepSpeedZeroOptimizer_Stage3" and hasattr(opt, "_get_norm_groups"):
        from deepspeed.runtime.utils import combine_grad_norm_groups

        orig = opt._get_norm_groups

        def _get_norm_groups(*args, **kwargs):
            groups = orig(*args, **kwargs)
            flag = decide(combine_grad_norm_groups(groups))
            if flag is None:
                return groups
            return [torch.where(flag > 0, torch.full_like(g, math.inf), g) for g in groups]

        patches.set("_get_norm_groups", _get_norm_groups)
    elif isinstance(opt, torch.optim.Optimizer) and not engine.zero_optimization():
        return True   # ZeRO-0 fp32: the plain torch optimizer, gated like any other
    else:
        _ONCE.warn_once(f"skip-ds-{name}", "stability: policy.skip_step_on cannot reach DeepSpeed's "
                        "%s (ZeRO-0 with fp16/bf16); steps are not skipped", name)
        return False
    skip.decided_inside = True
    skip.patches.append(patches)
    return True


def gate_engine(adapter, engine, *, next_step) -> None:
    """The optimizer step of a run under a DeepSpeed ``engine`` (the hook, or HF / Lightning
    running on DeepSpeed), gated for skip step and an automatic rollback's LR window: the skip
    through DeepSpeed's overflow path, the LR window on the engine's optimizer
    (:meth:`~stability_callbacks.integrations.torch.adapter.SessionAdapter._gate_step`)."""
    if adapter.session.skip is not None:
        skip_through_overflow(adapter.session.skip, engine)
    adapter._gate_step(engine.optimizer, next_step=next_step)
