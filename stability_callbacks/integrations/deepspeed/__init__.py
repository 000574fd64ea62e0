"""DeepSpeed engine hook for hand-written loops: ``with attach(engine, config=...) as hook:``.

Everything that knows DeepSpeed is in this folder: the hook (:mod:`.hook`), what the engine holds
after a step (:mod:`.readings`, also read by the HF and Lightning callbacks under DeepSpeed), skip
step through its overflow path (:mod:`.skip_step`) and rollback (:mod:`.reload`).
"""
from ..torch.auto_rollback import ROLLED_BACK_DIR
from .hook import CLIENT_STATE_KEY, StabilityHook, attach
from .reload import roll_back_latest

__all__ = ["attach", "StabilityHook", "roll_back_latest", "CLIENT_STATE_KEY", "ROLLED_BACK_DIR"]
