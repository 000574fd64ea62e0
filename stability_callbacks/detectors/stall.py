"""A frozen loss: exactly constant, or exactly zero, for many steps."""
from __future__ import annotations

from .. import keys
from ..record import Finding, StepRecord
from ..stats import Latch
from .base import Context, Detector, positive_int


class Stall(Detector):
    """Critical when the loss is bit-for-bit the same (or exactly 0.0) for ``num_samples``
    consecutive points: a dead graph, a frozen data loader, a broken logging path.
    O(1); state: 3 scalars.
    """

    name = "stall"
    kind = "stall"
    signals = (keys.LOSS,)
    _state = ("last", "count", "latch")

    def __init__(self, *, num_samples: int = 16):
        self.num_samples = positive_int("num_samples", num_samples)
        self.last: float | None = None
        self.count = 0
        self.latch = Latch()   # re-armed when the loss moves

    def update(self, record: StepRecord, ctx: Context) -> list[Finding]:
        x = record.metrics.get(keys.LOSS)
        if x is None or x != x:   # missing or NaN: not a stall
            return []
        moved = not (x == self.last or x == 0.0)
        self.count = 1 if moved else self.count + 1
        self.last = x
        if not self.latch.update(self.count >= self.num_samples, moved):
            return []
        what = "exactly zero" if x == 0.0 else f"frozen at exactly {x!r}"
        return [self.finding(
            record.step, severity="critical", value=x,
            message=(f"The loss has been {what} for {self.count} logged steps up to step "
                     f"{record.step}: the model is not training (dead graph, frozen data loader, or "
                     f"a broken loss path). Stop and inspect the last batches and the gradients."),
            samples=self.count)]
