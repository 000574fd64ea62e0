"""How a multi-process test worker ends: every rank done, the process group destroyed, and the
process left without the interpreter's teardown (docs/integrations.md, Launchers).

gloo's worker threads release each collective's work after the caller has its result; a work
whose tensors Python made (the HF Trainer's loss gather, the probe's packed record) needs the GIL
to be released. If that release comes while the interpreter is finalizing, the thread is ended
inside C++ and the process aborts: ``terminate called without an active exception``, SIGABRT,
after the run itself ended well (pytorch/pytorch#190489; the mechanism: pytorch/pytorch#179291).
``destroy_process_group`` joins those threads only when it drops the group's last reference, and
a DDP model's reducer keeps one: under the HF Trainer the race stays (1 abort in 120 launches,
under load). ``os._exit`` after the files are written and the streams flushed leaves no teardown
to race with.
"""
from __future__ import annotations

import os
import sys

import torch


def leave(code: int = 0):
    """Barrier, destroy the process group, flush, and exit with ``code`` now."""
    dist = torch.distributed
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
