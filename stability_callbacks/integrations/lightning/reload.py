"""Automatic rollback under Lightning (the shared steps: :mod:`..torch.auto_rollback`).

The train loader's sampler is wrapped in a :class:`~..torch.auto_rollback.DataSkipSampler`
(:func:`~.sampler.install_train_sampler`, shared with the data forensics) that also starts after
the data already trained (Lightning restores the loop, not a map-style loader's position); a
rollback stops the fit loop, restores the checkpoint with the trainer's own checkpoint connector
and runs the fit loop again.
"""
from __future__ import annotations

from stability_callbacks.live import InstancePatches

from ..torch.auto_rollback import RollBack

__all__ = ["LightningRollBack"]


class LightningRollBack(RollBack):
    """Lightning: the train loader's sampler is wrapped (starting after the data already
    trained: Lightning restores the loop, not a map-style loader's position); a rollback stops
    the fit loop, restores the checkpoint with the trainer's checkpoint connector (model,
    optimizers, schedulers, loops, callbacks: what ``fit(ckpt_path=...)`` restores) and runs the
    fit loop again. Wraps ``trainer.fit_loop.run`` on that instance (until :meth:`close`)."""

    def __init__(self, session_of, trainer):
        super().__init__(session_of)
        self.trainer = trainer
        self._patches = InstancePatches(trainer.fit_loop)
        orig = trainer.fit_loop.run

        def run(*args, **kwargs):
            out = orig(*args, **kwargs)
            while self.pending is not None:
                try:
                    # Lightning's _CheckpointConnector.restore (private): the same restore
                    # Trainer._run does for fit(ckpt_path=...).
                    trainer._checkpoint_connector.restore(self.pending.checkpoint_path)
                except Exception as e:   # e.g. a weights-only checkpoint: a halt, not a crash
                    self.failed(e)
                    break
                trainer.should_stop = False
                # A new iterator over the train loader (fit_loop.setup_data made the first and
                # skips when the loader exists): the sampler starts at the restored step.
                if trainer.fit_loop._data_fetcher is not None:
                    iter(trainer.fit_loop._data_fetcher)
                out = orig(*args, **kwargs)
            return out

        self._patches.set("run", run)

    def close(self) -> None:
        """Restore ``trainer.fit_loop.run``."""
        self._patches.restore()
