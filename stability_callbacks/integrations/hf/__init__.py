"""HF ``transformers.Trainer`` (and TRL's trainers built on it): add the callback the usual way,
``Trainer(..., callbacks=[StabilityCallback(config=..., run_dir=...)])``.

Everything that knows the HF Trainer is in this folder: the callback (:mod:`.callback`) and its
automatic rollback (:mod:`.reload`).
"""
from .callback import STATE_FILE, StabilityCallback

__all__ = ["StabilityCallback", "STATE_FILE"]
