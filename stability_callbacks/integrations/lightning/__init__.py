"""Lightning: ``Trainer(callbacks=[StabilityCallback(config=..., run_dir=...)])``.

Everything that knows Lightning is in this folder: the callback (:mod:`.callback`) and its
automatic rollback (:mod:`.reload`).
"""
from .callback import StabilityCallback

__all__ = ["StabilityCallback"]
