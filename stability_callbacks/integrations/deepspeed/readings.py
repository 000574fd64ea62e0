"""Reading what a DeepSpeed engine already holds after a step, without a host sync: its fp16 loss
scale, the steps it skipped and its global grad norm, and our own grad norm where it keeps none.
"""
from __future__ import annotations

import logging

from stability_callbacks.live import Guard

__all__ = ["deepspeed_readings", "DeepSpeedStep"]

_ONCE = Guard()   # process-wide: one warning per problem


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
            # loss_scale_config.cur_scale; the engine's own reader (what its monitor logs) knows
            # every optimizer. Private, hence the fallback only.
            scale = engine._get_optimizer_loss_scale()
    return {"loss_scale": None if scale is None else float(scale),
            "skipped_steps": int(getattr(engine, "skipped_steps", 0)),
            "grad_norm": engine.get_global_grad_norm()}


class DeepSpeedStep:
    """What DeepSpeed knows after an optimizer step, put into a probe: the fp16 loss scale, the
    optimizer steps skipped since the last reading (its scaler has hysteresis, so a skip need not
    move the scale) and, with ``grad_norm``, its global grad norm. Keeps the running skip count;
    no sync. The :class:`~stability_callbacks.integrations.torch.session.EngineStep` of a run on
    DeepSpeed (the hook's, or HF's and Lightning's under their DeepSpeed strategy).
    """

    def __init__(self, engine, *, grad_norm: bool = True):
        self.engine = engine
        self.grad_norm = grad_norm
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

    def read_into(self, probe) -> None:
        """After the step: the loss scale and skip (fp16), and DeepSpeed's grad norm unless
        ``grad_norm`` is False (another hook reads it: HF's ``_get_grad_norm``)."""
        r = deepspeed_readings(self.engine)
        if r["loss_scale"] is not None:   # only fp16 skips steps
            probe.set_loss_scale(r["loss_scale"])
            probe.set_skipped(float(r["skipped_steps"] - self.skipped))
        self.skipped = r["skipped_steps"]
        if self.grad_norm:
            probe.set_grad_norm(r["grad_norm"])
