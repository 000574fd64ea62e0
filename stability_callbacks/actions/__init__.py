"""Act on findings: alert sinks (log, Slack, W&B, TensorBoard) behind a non-blocking dispatcher,
and rollback advice in each framework's native form.

Saving, interval bumps and halts are requests on :class:`~stability_callbacks.control.Control`
carried out by the integrations; this package only delivers and formats.
"""
from .dispatch import AlertDispatcher, build_sinks
from .log import LogFindings
from .sink import Alert, AlertSink, DeliveryError
from .slack import NotifySlack
from .tensorboard import WriteTensorBoard
from .wandb import NotifyWandb

#: The ``actions`` config section's sink names → their classes (``CONFIG_KEYS`` = allowed keys).
SINK_CLASSES = {"log": LogFindings, "slack": NotifySlack, "wandb": NotifyWandb, "tensorboard": WriteTensorBoard}

__all__ = ["SINK_CLASSES", "AlertDispatcher", "build_sinks", "Alert", "AlertSink", "DeliveryError",
           "LogFindings", "NotifySlack", "NotifyWandb", "WriteTensorBoard"]
