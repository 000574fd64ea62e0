"""The HF Trainer's train sampler, wrapped once in the shared
:class:`~..torch.auto_rollback.DataSkipSampler`: the automatic rollback skips data through it, the
data forensics records each step's indices through it (docs/design.md, Forensics).
"""
from __future__ import annotations

import logging
from typing import Callable

import torch

from stability_callbacks.forensics import StepIndices
from stability_callbacks.live import InstancePatches

from ..torch.auto_rollback import DataSkipSampler

__all__ = ["wrap_train_sampler"]

log = logging.getLogger("stability_callbacks")


def wrap_train_sampler(trainer, patches: InstancePatches, *, skips: Callable,
                       record: Callable[[], StepIndices | None], built: Callable | None = None) -> None:
    """Wrap ``trainer._get_train_sampler`` (private; transformers 5.23) on that instance: the
    sampler the Trainer builds becomes a :class:`DataSkipSampler` over it (``skips``: the
    rollback's data skips; ``record``: the run's index ring, both read at every iteration).
    One sampler serves every rank (accelerate deals its batches): ``samples_per_step`` is
    batch size x accumulation x world size, and the ring holds every rank's samples.

    ``built(sampler, problem)`` hears of each sampler built (None, and why, when the dataset
    has no length), the automatic rollback's :meth:`~.rollback.HFRollBack.built`.
    """
    orig = trainer._get_train_sampler
    first_seed: list[int] = []   # the order of the first build, kept by every rebuild (a rollback's)

    def _get_train_sampler(*args, **kwargs):
        base = orig(*args, **kwargs)
        if base is None or not hasattr(base, "__len__"):
            if built is not None:
                built(None, "the train dataset has no length (an IterableDataset)")
            return base
        try:
            sampler = _wrapped(base, trainer.args)
        except Exception as e:   # monitoring never takes training down: the Trainer's own sampler
            log.exception("stability: wrapping the Trainer's train sampler failed; its data cannot be "
                          "skipped or named")
            if built is not None:
                built(None, f"wrapping the Trainer's train sampler failed: {e!r}")
            return base
        if built is not None:
            built(sampler, None)
        return sampler

    def _wrapped(base, a) -> DataSkipSampler:
        if type(base) is torch.utils.data.RandomSampler and _seedable(a):
            # accelerate swaps a plain RandomSampler for its seeded one (the same order on every
            # rank and at every iteration, which a resume and a rollback need); behind this
            # wrapper it would not see it, so the swap happens here, as accelerate's
            # prepare_data_loader does it (data_seed, else torch's initial seed at the first
            # build: the order of a run without the wrapper).
            from accelerate.data_loader import SeedableRandomSampler

            if not first_seed:
                first_seed.append(a.data_seed if a.data_seed is not None else torch.random.initial_seed())
            base = SeedableRandomSampler(data_source=base.data_source, replacement=base.replacement,
                                         num_samples=base._num_samples, generator=base.generator,
                                         data_seed=first_seed[0])
        return DataSkipSampler(base, skips=skips, record=record, shared_by_ranks=a.world_size,
                               samples_per_step=a.per_device_train_batch_size * a.gradient_accumulation_steps
                               * a.world_size)

    patches.set("_get_train_sampler", _get_train_sampler)


def _seedable(args) -> bool:
    cfg = getattr(args, "accelerator_config", None)
    return bool(getattr(cfg, "use_seedable_sampler", True)) if cfg is not None else True
