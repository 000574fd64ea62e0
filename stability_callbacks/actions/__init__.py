"""Act on findings: alert sinks (log, Slack, generic webhook, Apprise, W&B, TensorBoard) behind a
non-blocking dispatcher, and rollback advice in each framework's native form.

Saving, interval bumps and halts are requests on :class:`~stability_callbacks.control.Control`
carried out by the integrations; this package only delivers and formats.
"""
from .apprise import NotifyApprise
from .dispatch import AlertDispatcher, build_sinks
from .log import LogFindings
from .sink import Alert, AlertSink, DeliveryError
from .slack import NotifySlack
from .tensorboard import WriteTensorBoard
from .wandb import NotifyWandb
from .webhook import NotifyWebhook

#: The ``actions`` config section: sink name → class, in delivery order. A sink's config keys
#: are its constructor's keyword-only parameters (``stability_callbacks.config.config_keys``).
SINK_CLASSES = {cls.name: cls for cls in (LogFindings, NotifySlack, NotifyWebhook, NotifyApprise,
                                          NotifyWandb, WriteTensorBoard)}

__all__ = ["SINK_CLASSES", "AlertDispatcher", "build_sinks", "Alert", "AlertSink", "DeliveryError",
           "LogFindings", "NotifySlack", "NotifyWebhook", "NotifyApprise", "NotifyWandb",
           "WriteTensorBoard"]
