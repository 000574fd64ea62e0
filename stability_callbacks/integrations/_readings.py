"""Reading what a framework already holds, without a host sync: the torch GradScaler's scale and
``found_inf``, DeepSpeed's loss scale, skipped steps and grad norm, the LR a step uses, and the
global grad norm of FSDP-sharded grads. Each integration calls the readers its hooks can reach.
"""
from __future__ import annotations

import logging

import torch

from stability_callbacks.live import Guard

from ._optim_state import unwrap_optimizer

__all__ = ["grad_scaler_readings", "read_grad_scaler", "deepspeed_readings", "DeepSpeedStep",
           "step_lr", "sharded_grad_norm"]

_ONCE = Guard()   # process-wide: one warning per problem


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


def deepspeed_readings(engine) -> dict:
    """Host values DeepSpeed already has after ``engine.step()``: no sync (ints and floats).

    ``loss_scale`` (None without fp16), ``skipped_steps`` (a running count: the integration
    diffs it), ``grad_norm`` (tensor, float or None: None at ZeRO-0 fp32, then compute it).
    """
    opt = getattr(engine, "optimizer", None)
    scale = None
    if getattr(engine, "fp16_enabled", lambda: False)():
        scale = getattr(opt, "cur_scale", None)
        if scale is None:
            scale = getattr(getattr(opt, "loss_scaler", None), "cur_scale", None)
        if scale is None and hasattr(engine, "_get_optimizer_loss_scale"):
            # ZeRO-0 fp16 (FP16_UnfusedOptimizer / FP16_Optimizer) keeps it in
            # loss_scale_config.cur_scale; the engine's own reader (engine.py:3771, what its
            # monitor logs) knows every optimizer. Private, hence the fallback only.
            scale = engine._get_optimizer_loss_scale()
    return {"loss_scale": None if scale is None else float(scale),
            "skipped_steps": int(getattr(engine, "skipped_steps", 0)),
            "grad_norm": engine.get_global_grad_norm()}



class DeepSpeedStep:
    """What DeepSpeed knows after an optimizer step, put into a probe: the fp16 loss scale, the
    optimizer steps skipped since the last reading (its scaler has hysteresis, so a skip need not
    move the scale) and, where asked, its global grad norm. Keeps the running skip count; no sync.
    """

    def __init__(self, engine):
        self.engine = engine
        self.skipped = int(getattr(engine, "skipped_steps", 0))

    def mark(self) -> None:
        """Count skips from here (before the step, or after a checkpoint load)."""
        self.skipped = int(getattr(self.engine, "skipped_steps", 0))

    def grad_norm_before_step(self, session) -> None:
        """Where DeepSpeed keeps no global grad norm (``get_global_grad_norm()`` is None), give
        ``session`` our own, taken before the step (the engine clips inside it). ZeRO-0 fp32:
        from ``p.grad``. ZeRO-1/2 with ``zero_optimization.compute_grad_norm: false``: from the
        optimizer's reduced gradient partitions (``scaled_global_norm``: the pass and all_reduce
        DeepSpeed skipped, so the saving is gone; one info says so) over the loss scale.
        Torch-autocast ZeRO-0 keeps scaled grads until inside the step: no norm (one warning).
        Call on every rank (the ZeRO norm is a collective)."""
        e = self.engine
        if getattr(e, "torch_autocast_z0_gradscaler", None) is not None:
            _ONCE.warn_once("autocast-norm", "stability: torch-autocast ZeRO-0 keeps scaled grads "
                            "until inside the step; the grad norm is not monitored")
        elif not (e.fp16_enabled() or e.bfloat16_enabled() or e.zero_optimization()):
            session.before_optimizer_step(params=e.module.parameters())
        elif e.zero_optimization() and not getattr(e, "zero_compute_grad_norm", lambda: True)():
            _ONCE.warn_once("ds-no-norm", "stability: DeepSpeed computes no grad norm "
                            "(zero_optimization.compute_grad_norm: false); the monitor computes it "
                            "(one pass over the gradient partitions and one all_reduce per step)",
                            level=logging.INFO)
            opt = e.optimizer
            session.before_optimizer_step(grad_norm=opt.scaled_global_norm(),
                                          scaled_by=float(opt.loss_scale))

    def read_into(self, probe, *, grad_norm: bool) -> None:
        r = deepspeed_readings(self.engine)
        if r["loss_scale"] is not None:   # only fp16 skips steps
            probe.set_loss_scale(r["loss_scale"])
            probe.set_skipped(float(r["skipped_steps"] - self.skipped))
        self.skipped = r["skipped_steps"]
        if grad_norm:
            probe.set_grad_norm(r["grad_norm"])


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
