"""Import before DeepSpeed initialises on a CPU test box.

DeepSpeed's CPU accelerator JIT-builds a shared-memory all-reduce op (deepspeed/comm/torch.py
build_shm_op) at the first init_distributed: ~2.5 min of C++ on 2 cores in a fresh environment.
gloo does the same job for the tests, so the op is declared unavailable.
"""
import deepspeed.ops

deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
