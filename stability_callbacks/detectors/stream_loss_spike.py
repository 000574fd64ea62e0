"""Loss spikes of per-dataset losses (``loss/<stream>``): IDEFICS-80B's cm4 and pmd spiked
sometimes together, sometimes alone."""
from __future__ import annotations

import inspect

from .. import keys
from ..record import Finding, StepRecord
from .base import Context, Detector
from .loss_spike import LossSpike

_CONTRACT_KEYS = frozenset(keys.ALL)


class StreamLossSpike(Detector):
    """One :class:`LossSpike` per ``loss/<stream>`` key, created when the stream first appears,
    with the same settings (``loss_spike``'s unless configured apart). Its findings are
    ``loss_spike`` / ``spike_recovered`` / ``spike_unrecovered`` with the stream as the signal,
    and a main-loss ``loss_spike`` of the same step names the streams spiking with it. It runs
    last, after the main loss has been judged. O(#streams); state: one LossSpike per stream.

    >>> d = StreamLossSpike()
    >>> [(f.kind, f.signal) for s, x in enumerate([3.0] * 30 + [6.0], 1)
    ...  for f in d.update(StepRecord(s, {"loss": 2.0, "loss/cm4": x}), Context(s))]
    [('loss_spike', 'loss/cm4')]
    """

    name = "stream_loss_spike"
    kind = "loss_spike"
    kinds = LossSpike.kinds
    signals = ()   # stream keys are open-ended: looks at every record (a key-set check when none)
    defaults_from = "loss_spike"
    _state = ("streams",)

    def __init__(self, **loss_spike_kwargs):
        LossSpike(**loss_spike_kwargs)   # validates, naming the key
        self.loss_spike_kwargs = loss_spike_kwargs
        self.streams: dict[str, LossSpike] = {}

    # The keyword arguments are LossSpike's (its signal excepted): the config validates them.
    # (through __dict__: inspect reads a function's __signature__, which typeshed does not declare)
    __init__.__dict__["__signature__"] = inspect.Signature(
        [p for p in inspect.signature(LossSpike.__init__).parameters.values() if p.name != "signal"])

    def wants(self, present: frozenset[str]) -> bool:
        # its streams, and once it has one every record: a main-loss spike names the streams spiking with it
        return bool(self.streams) or any(k.startswith(keys.LOSS_STREAM_PREFIX) for k in present)

    def on_segment(self, start_step: int, reason: str) -> None:
        for d in self.streams.values():
            d.on_segment(start_step, reason)

    def update(self, record: StepRecord, ctx: Context) -> list[Finding]:
        m = record.metrics
        if not self.streams and _CONTRACT_KEYS.issuperset(m):
            return []
        out: list[Finding] = []
        for k in keys.loss_streams(m):
            det = self.streams.get(k)
            if det is None:
                det = self.streams[k] = LossSpike(signal=k, **self.loss_spike_kwargs)
            out += det.update(record, ctx)
        spiking = sorted(k for k, d in self.streams.items() if d.open)
        if spiking:
            for f in ctx.found:
                if f.kind == "loss_spike" and f.signal == keys.LOSS:
                    f.details["streams"] = spiking
                    f.message += f" Streams spiking with it: {', '.join(spiking)}."
        return out

    def state_dict(self) -> dict:
        return {"streams": {k: d.state_dict() for k, d in self.streams.items()}}

    def load_state_dict(self, d: dict) -> None:
        if set(d) != set(self._state):
            raise ValueError(f"{self.name}: state keys {sorted(d)} do not match {sorted(self._state)}")
        self.streams = {}
        for k, s in d["streams"].items():
            det = self.streams[k] = LossSpike(signal=k, **self.loss_spike_kwargs)
            det.load_state_dict(s)
