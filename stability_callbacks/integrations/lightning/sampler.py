"""The Lightning train loader's sampler, wrapped once in the shared
:class:`~..torch.auto_rollback.DataSkipSampler`: the automatic rollback skips data through it, the
data forensics records each step's indices through it (docs/design.md, Forensics).
"""
from __future__ import annotations

from typing import Callable

import torch

from stability_callbacks.forensics import StepIndices

from ..torch.auto_rollback import DataSkipSampler, install_sampler

__all__ = ["install_train_sampler"]


def install_train_sampler(trainer, *, skips: Callable, record: Callable[[], StepIndices | None],
                          start_step: Callable[[], int] | None = None) -> DataSkipSampler:
    """Wrap the sampler of ``trainer.train_dataloader`` (at train start; under DDP the
    ``DistributedSampler`` Lightning put there: this rank's samples). Each iteration starts at
    the step the loop is at (Lightning iterates an epoch from its start, a resumed one too;
    ``start_step``: also leave out the data already trained, as a rollback needs). Raises
    ``ValueError`` saying why a loader cannot be wrapped."""
    loader = trainer.train_dataloader
    if not isinstance(loader, torch.utils.data.DataLoader):
        raise ValueError(f"the train loaders are a {type(loader).__name__}, not one DataLoader")
    if loader.batch_size is None:
        raise ValueError("the train DataLoader has its own batch_sampler (no batch_size)")
    return install_sampler(loader, skips=skips, start_step=start_step, record=record,
                           steps_before=lambda: trainer.global_step,
                           samples_per_step=loader.batch_size * trainer.accumulate_grad_batches)
