"""TensorBoard: findings as text and scalars, metrics as scalars.

Writes through the integration's writer (torch ``SummaryWriter``, HF
``TensorBoardCallback.tb_writer``, anything with ``add_scalar``/``add_text``) or, given
``log_dir``, through a small writer on the ``tensorboard`` package itself (no torch needed).
"""
from __future__ import annotations

import time
from typing import Mapping

from .. import keys
from ..params import text
from .sink import Alert, MetricSink, alert_text


class WriteTensorBoard(MetricSink):
    """Per finding: text ``stability/findings`` and scalar ``stability/finding/<kind>`` =
    severity code (1 info, 2 warning, 3 critical) at the finding's step; metrics as scalars
    ``stability/<key>`` (the key scheme of :mod:`~stability_callbacks.keys`, which ``replay``
    reads back).

    Keys: ``log_dir`` (used when the integration has no writer; default
    ``<run_dir>/tensorboard``), ``min_severity`` (info), ``rate_limit_s`` (0), ``metrics`` (True),
    ``metrics_every_n_steps`` (1), ``queue_size``. ``writer`` (not a config key) is the
    integration's writer. Without a writer or ``log_dir`` the sink is off: there is nowhere to
    write.
    """

    name = "tensorboard"

    def __init__(self, writer=None, *, log_dir: str | None = None, min_severity: str = "info",
                 rate_limit_s: float = 0.0, metrics: bool = True, metrics_every_n_steps: int = 1,
                 queue_size: int = 4096):
        super().__init__(min_severity=min_severity, rate_limit_s=rate_limit_s, queue_size=queue_size,
                         metrics=metrics, metrics_every_n_steps=metrics_every_n_steps)
        self.log_dir = None if log_dir is None else text("log_dir", log_dir)
        if writer is not None and not (hasattr(writer, "add_scalar") and hasattr(writer, "add_text")):
            raise ValueError(f"writer must have add_scalar and add_text, got {writer!r}")
        self._writer = writer
        self._owns_writer = False

    def resolve(self) -> str | None:
        if self._writer is None and self.log_dir is None:
            return "no TensorBoard writer and no log_dir"
        return None

    def _get_writer(self):
        if self._writer is None:   # created lazily: a constructor has no side effects
            self._writer = EventWriter(self.log_dir)
            self._owns_writer = True
        return self._writer

    def deliver(self, alert: Alert) -> None:
        f = alert.finding
        w = self._get_writer()
        if self.metrics:
            w.add_scalar(keys.finding_tag(f.kind), keys.SEVERITY_CODE[f.severity], f.step)
        w.add_text(keys.FINDING_TEXT, alert_text(alert, markdown=False).replace("\n", "  \n"), f.step)
        w.flush()   # findings are rare and should show up while the run is still going

    def write_metrics(self, step: int, metrics: Mapping[str, float]) -> None:
        w = self._get_writer()
        for tag, v in keys.charted(metrics).items():
            w.add_scalar(tag, v, step)

    def close(self) -> None:
        if self._writer is None:
            return
        if self._owns_writer:
            self._writer.close()
        else:
            self._writer.flush()   # the integration closes its own writer


class EventWriter:
    """The two ``SummaryWriter`` methods we need, on ``tensorboard``'s own event file writer.

    Scalars are legacy ``simple_value`` (``EventAccumulator.Scalars``); text uses the text
    plugin under ``<tag>/text_summary`` exactly like torch's ``add_text``.
    """

    def __init__(self, log_dir: str):
        from tensorboard.summary.writer.event_file_writer import EventFileWriter
        self._file = EventFileWriter(log_dir)

    def add_scalar(self, tag: str, value: float, global_step: int) -> None:
        from tensorboard.compat.proto import event_pb2, summary_pb2
        summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(tag=tag,
                                                                       simple_value=value)])
        self._file.add_event(event_pb2.Event(wall_time=time.time(), step=int(global_step),
                                             summary=summary))

    def add_text(self, tag: str, text: str, global_step: int) -> None:
        from tensorboard.compat.proto import event_pb2, summary_pb2, tensor_pb2, tensor_shape_pb2
        from tensorboard.plugins.text import plugin_data_pb2
        metadata = summary_pb2.SummaryMetadata(plugin_data=summary_pb2.SummaryMetadata.PluginData(
            plugin_name="text", content=plugin_data_pb2.TextPluginData(version=0).SerializeToString()))
        tensor = tensor_pb2.TensorProto(
            dtype="DT_STRING", string_val=[text.encode("utf-8")],
            tensor_shape=tensor_shape_pb2.TensorShapeProto(
                dim=[tensor_shape_pb2.TensorShapeProto.Dim(size=1)]))
        summary = summary_pb2.Summary(value=[summary_pb2.Summary.Value(
            tag=tag + "/text_summary", metadata=metadata, tensor=tensor)])
        self._file.add_event(event_pb2.Event(wall_time=time.time(), step=int(global_step),
                                             summary=summary))

    def flush(self) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()
