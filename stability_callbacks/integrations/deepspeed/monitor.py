"""The stability scalars into DeepSpeed's own monitor: the ``monitor`` section of a ``ds_config``
(``tensorboard``, ``wandb``, ``csv_monitor``, ``comet``) writes them where the engine writes its
own ``Train/Samples/*`` events.
"""
from __future__ import annotations

from stability_callbacks import keys
from stability_callbacks.live import RunListener

__all__ = ["engine_monitor_writer", "EngineMonitorWriter"]


def engine_monitor_writer(engine) -> "EngineMonitorWriter | None":
    """The listener for ``engine``'s monitor, or None when its ``ds_config`` enables none."""
    monitor = getattr(engine, "monitor", None)
    if monitor is None or not getattr(monitor, "enabled", False):
        return None
    return EngineMonitorWriter(engine)


class EngineMonitorWriter(RunListener):
    """``engine.monitor.write_events([(tag, value, x), ...])`` for every record the run observes
    (``stability/<key>``) and every finding (``stability/finding/<kind>`` = 1 info, 2 warning,
    3 critical), on rank 0 (the monitor writes only there).

    The x-axis is DeepSpeed's own, the samples trained (``engine.global_samples``, which every
    ``Train/Samples/*`` event uses; the record's ``consumed_samples``): W&B drops a point whose
    step is below the run's last one, so a second axis in the same run would lose points. One
    ``write_events`` per record (DeepSpeed's TensorBoard monitor flushes at each).
    """

    def __init__(self, engine):
        self.engine = engine
        self._last: tuple[int, float] | None = None   # (step, samples) of the last record

    def _samples(self, step: int) -> float:
        if self._last is not None and self._last[0] == step:
            return self._last[1]
        return float(self.engine.global_samples)

    def on_record(self, record) -> None:
        x = record.metrics.get(keys.CONSUMED_SAMPLES)
        x = float(self.engine.global_samples) if x is None else x
        self._last = (record.step, x)
        self.engine.monitor.write_events([(tag, v, x) for tag, v in keys.charted(record.metrics).items()])

    def on_finding(self, finding) -> None:
        self.engine.monitor.write_events([(keys.finding_tag(finding.kind), keys.SEVERITY_CODE[finding.severity],
                                           self._samples(finding.step))])
