"""Automatic rollback under the HF Trainer (the shared steps: :mod:`..torch.auto_rollback`).

The sampler the Trainer builds is wrapped in a :class:`~..torch.auto_rollback.DataSkipSampler`
(:func:`~.sampler.wrap_train_sampler`, shared with the data forensics); a rollback stops the
Trainer and re-enters ``train(resume_from_checkpoint=<checkpoint>)`` from the ``train`` wrapper
the callback installs (the Trainer cannot be rewound in the middle of its loop: its dataloader
iterator and step counters are locals).
"""
from __future__ import annotations

from typing import Any, Callable

from ..torch.auto_rollback import RollBack

__all__ = ["HFRollBack"]


class HFRollBack(RollBack):
    """HF Trainer: the sampler the Trainer builds is wrapped (:func:`~.sampler.wrap_train_sampler`,
    which reports each one it builds to :meth:`built`); a rollback stops the Trainer and
    re-enters ``train(resume_from_checkpoint=<checkpoint>)``, which restores model, optimizer,
    scheduler, RNG and ``global_step`` and skips the batches of the first ``S`` steps of the
    (skip-aware) data order. ``late``: met at train begin, the train loader built already."""

    def __init__(self, session_of, trainer, *, late: bool = False):
        super().__init__(session_of, "the callback met its Trainer after the train loader was built "
                         "(add it with Trainer(callbacks=[...]))" if late else "the training data was not seen yet")
        self.trainer = trainer

    def built(self, sampler, problem: str | None) -> None:
        """The Trainer built its train sampler (None, and why, when it cannot be wrapped)."""
        a = self.trainer.args
        self.sampler, self.sampler_problem = sampler, problem if problem is not None else (
            "ignore_data_skip=True: the Trainer would re-read the data it already trained on"
            if a.ignore_data_skip else
            "save_only_model=True: the checkpoints hold no optimizer or scheduler state to go back to"
            if getattr(a, "save_only_model", False) else None)

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

