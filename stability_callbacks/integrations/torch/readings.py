"""Reading what torch already holds, without a host sync: the torch GradScaler's scale and
``found_inf``, the LR a step uses, and the global grad norm of FSDP-sharded grads. Each
integration calls the readers its hooks can reach (DeepSpeed's own values:
:mod:`stability_callbacks.integrations.deepspeed.readings`).
"""
from __future__ import annotations

import torch

from .optim_state import unwrap_optimizer

__all__ = ["grad_scaler_readings", "read_grad_scaler", "step_lr", "sharded_grad_norm"]


def grad_scaler_readings(scaler, optimizer):
    """``(scale, found_inf)`` of a torch ``GradScaler`` as device tensors, no sync.

    Call after ``scaler.unscale_(optimizer)`` (or ``scaler.step``) and **before**
    ``scaler.update()``, which forgets ``found_inf``; ``scale`` is then the scale this step
    used. ``found_inf`` is None when the scaler has not unscaled this optimizer yet (then a skip
    can still be seen afterwards as a scale decrease, see ``StepProbe.set_loss_scale``).
    Reads ``GradScaler._scale`` / ``_per_optimizer_states`` (private; torch has no public
    tensor accessor: ``get_scale()`` is an ``.item()``).
    """
    if scaler is None or not scaler.is_enabled():
        return None, None
    scale = getattr(scaler, "_scale", None)
    states = getattr(scaler, "_per_optimizer_states", {})
    found = states.get(id(unwrap_optimizer(optimizer)), {}).get("found_inf_per_device") if states else None
    if not found and optimizer is not None:
        found = states.get(id(optimizer), {}).get("found_inf_per_device")
    found_t = None
    if found:
        vals = list(found.values())
        found_t = vals[0] if len(vals) == 1 else torch.stack(
            [v.to(vals[0].device) for v in vals]).sum()
    return scale, found_t


def read_grad_scaler(probe, scaler, optimizer) -> tuple:
    """A torch GradScaler's loss scale and skip into ``probe``; returns ``(scale, found_inf)``.

    Before ``scaler.update()`` and after ``unscale_``: the scale this step used and
    ``found_inf``. Where ``found_inf`` is not (yet) there (after ``update()``, or a fused
    optimizer that unscales inside its step), a skip is a scale decrease (torch's GradScaler has
    no hysteresis). No scaler: nothing, ``(None, None)``.
    """
    scale, found_inf = grad_scaler_readings(scaler, optimizer)
    probe.set_loss_scale(scale, detect_decrease=found_inf is None)
    probe.set_skipped(found_inf)
    return scale, found_inf


def step_lr(optimizer) -> float:
    """The LR in the optimizer's first param group, as a float (read it where the framework has
    not yet stepped its scheduler: that is the LR this step uses)."""
    lr = optimizer.param_groups[0]["lr"]
    if isinstance(lr, torch.Tensor):
        lr = lr.item()   # host-sync: a tensor LR (capturable optimizers) only
    return float(lr)


def sharded_grad_norm(params) -> torch.Tensor | None:
    """Global grad norm of FSDP-sharded grads: local sum of squares, one all_reduce (SUM).

    FSDP shards are disjoint and the flat-parameter padding is zero, so the sum is exact.
    """
    import torch.distributed as dist

    grads = [p.grad for p in params if p.grad is not None and p.grad.numel() > 0]
    if grads:
        sq = torch.nn.utils.get_total_norm(grads, 2.0).to(torch.float64).square()
    else:
        dev = next((p.device for p in params), torch.device("cpu"))
        sq = torch.zeros((), dtype=torch.float64, device=dev)
    if dist.is_available() and dist.is_initialized():
        dist.all_reduce(sq)   # the FSDP grad norm's own collective (not the probe's)
    return sq.sqrt()
