"""Act on findings: alert sinks (log, Slack, generic webhook, Apprise, W&B, TensorBoard, Trackio) behind a
non-blocking dispatcher, and rollback advice in each framework's native form.

Saving, interval bumps and halts are requests on :class:`~stability_callbacks.control.Control`
carried out by the integrations; this package only delivers and formats.
"""
from .apprise import NotifyApprise
from .dispatch import AlertDispatcher
from .log import LogFindings
from .section import SINK_CLASSES, ActionsConfig, build_sinks
from .sink import Alert, AlertSink, DeliveryError
from .slack import NotifySlack
from .tensorboard import WriteTensorBoard
from .trackio import NotifyTrackio
from .wandb import NotifyWandb
from .webhook import NotifyWebhook

__all__ = ["SINK_CLASSES", "ActionsConfig", "AlertDispatcher", "build_sinks", "Alert", "AlertSink",
           "DeliveryError", "LogFindings", "NotifySlack", "NotifyWebhook", "NotifyApprise", "NotifyWandb",
           "WriteTensorBoard", "NotifyTrackio"]
