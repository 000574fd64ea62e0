"""Automatic rollback under the HF Trainer (the shared steps: :mod:`..torch.rollback`).

The sampler the Trainer builds is wrapped in a :class:`~..torch.rollback.DataSkipSampler`; a
rollback stops the Trainer and re-enters ``train(resume_from_checkpoint=<checkpoint>)`` from the
``train`` wrapper the callback installs (the Trainer cannot be rewound in the middle of its loop:
its dataloader iterator and step counters are locals).
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from stability_callbacks.live import InstancePatches

from ..torch.rollback import DataSkipSampler, RollBack

__all__ = ["HFRollBack"]


class HFRollBack(RollBack):
    """HF Trainer: the sampler the Trainer builds is wrapped; a rollback stops the Trainer and
    re-enters ``train(resume_from_checkpoint=<checkpoint>)``, which restores model, optimizer,
    scheduler, RNG and ``global_step`` and skips the batches of the first ``S`` steps of the
    (skip-aware) data order. ``late``: met at train begin, the train loader built already."""

    def __init__(self, session_of, trainer, patches: InstancePatches, *, late: bool = False):
        super().__init__(session_of, "the callback met its Trainer after the train loader was built "
                         "(add it with Trainer(callbacks=[...]))" if late else "the training data was not seen yet")
        self.trainer = trainer
        orig = trainer._get_train_sampler   # private (transformers 5.23 Trainer._get_train_sampler)

        def _get_train_sampler(*args, **kwargs):
            base = orig(*args, **kwargs)
            if base is None or not hasattr(base, "__len__"):
                self.sampler, self.sampler_problem = None, "the train dataset has no length (an IterableDataset)"
                return base
            a = trainer.args
            if type(base) is torch.utils.data.RandomSampler and _seedable(a):
                # accelerate swaps a plain RandomSampler for its seeded one (the same order on every
                # rank and at every iteration, which a resume and a rollback need); behind this
                # wrapper it would not see it, so the swap happens here.
                from accelerate.data_loader import SeedableRandomSampler

                base = SeedableRandomSampler(data_source=base.data_source, replacement=base.replacement,
                                             num_samples=base._num_samples,
                                             data_seed=a.data_seed if a.data_seed is not None else a.seed)
            self.sampler = DataSkipSampler(base, skips=self.skips, samples_per_step=(
                a.per_device_train_batch_size * a.gradient_accumulation_steps * a.world_size))
            self.sampler_problem = (
                "ignore_data_skip=True: the Trainer would re-read the data it already trained on"
                if a.ignore_data_skip else
                "save_only_model=True: the checkpoints hold no optimizer or scheduler state to go back to"
                if getattr(a, "save_only_model", False) else None)
            return self.sampler

        patches.set("_get_train_sampler", _get_train_sampler)

    def reentering(self, train: Callable[..., Any]) -> Callable[..., Any]:
        """``train`` (the Trainer's own), re-entered after it returns while a rollback is pending:
        ``resume_from_checkpoint`` is then the checkpoint gone back to (the loop reads it at train
        begin, and the callback restores its state from it)."""
        def call(*args, **kwargs):
            out = train(*args, **kwargs)
            while (path := self.reenter()) is not None:
                self.session.alive()   # reloading is progress, not a hang
                kwargs = {**dict(zip(("resume_from_checkpoint", "trial", "ignore_keys_for_eval"), args)),
                          **kwargs, "resume_from_checkpoint": path}
                args = ()
                out = train(**kwargs)
            return out
        return call

    def reenter(self) -> str | None:
        """After ``train()`` returned: the checkpoint to resume from, when a rollback is pending
        (the abandoned branch's checkpoints moved aside first)."""
        if self.pending is None:
            return None
        t = self.trainer
        from accelerate.optimizer import AcceleratedOptimizer

        if isinstance(t.optimizer, AcceleratedOptimizer):   # train() wraps it again
            t.optimizer = t.optimizer.optimizer
        return self.pending.checkpoint_path


def _seedable(args) -> bool:
    cfg = getattr(args, "accelerator_config", None)
    return bool(getattr(cfg, "use_seedable_sampler", True)) if cfg is not None else True
