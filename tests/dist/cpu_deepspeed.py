"""Import before DeepSpeed initialises on a CPU test box.

DeepSpeed's CPU accelerator JIT-builds a shared-memory all-reduce op (deepspeed/comm/torch.py
build_shm_op) at the first init_distributed: ~2.5 min of C++ on 2 cores in a fresh environment.
gloo does the same job for the tests, so the op is declared unavailable.

Also the fp16 pieces of the DeepSpeed tests on this CPU: :func:`allow_fp16` and the planted
overflow :class:`GradBlowUp`.
"""
import deepspeed.ops
import torch

deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def allow_fp16() -> None:
    """DeepSpeed refuses fp16 on this CPU (mkldnn has no fp16); the engine's fp16 paths (loss
    scaler, overflow skips) run fine once allowed."""
    from deepspeed.accelerator import get_accelerator

    type(get_accelerator()).is_fp16_supported = lambda self: True


class GradBlowUp(torch.autograd.Function):
    """Identity forward; the backward multiplies the gradient by 1e30 (inf in fp16): a planted
    fp16 overflow with a finite loss, as a real overflow cascade looks."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return g * 1e30
