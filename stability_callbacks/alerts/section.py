"""The ``actions`` config section: sink name → sink class, its validation, and the dispatcher
built from it for a run.
"""
from __future__ import annotations

import logging
import types
from dataclasses import dataclass
from typing import Any, Mapping

from ..params import ConfigError, Section, close_match, config_keys, with_path
from .apprise import NotifyApprise
from .dispatch import AlertDispatcher
from .log import LogFindings
from .sink import AlertSink
from .slack import NotifySlack
from .tensorboard import WriteTensorBoard
from .trackio import NotifyTrackio
from .wandb import NotifyWandb
from .webhook import NotifyWebhook

__all__ = ["SINK_CLASSES", "ActionsConfig", "build_sinks"]

logger = logging.getLogger("stability_callbacks.actions")

#: The ``actions`` config section: sink name → class, in delivery order. A sink's config keys
#: are its constructor's keyword-only parameters (:func:`~stability_callbacks.params.config_keys`).
SINK_CLASSES = {cls.name: cls for cls in (LogFindings, NotifySlack, NotifyWebhook, NotifyApprise,
                                          NotifyWandb, WriteTensorBoard, NotifyTrackio)}


@dataclass(frozen=True)
class ActionsConfig:
    """The ``actions`` section: sink name -> its :class:`Section` (``false`` = off, dropped;
    ``null`` or ``{}`` = on with defaults). Each sink is built once to check its values; the
    environment is read when the sinks are built for a run
    (:meth:`build`, :func:`~stability_callbacks.alerts.build_sinks`)."""

    sinks: Mapping[str, Section]

    @classmethod
    def checked(cls, actions: Any) -> "ActionsConfig":
        if actions is None:
            return cls(types.MappingProxyType({}))
        if not isinstance(actions, Mapping):
            raise ConfigError(f"actions must be a mapping, got {actions!r}")
        out = {}
        for name, v in actions.items():
            if name not in SINK_CLASSES:
                raise ConfigError(f"actions.{name}: unknown sink (known: {', '.join(SINK_CLASSES)})"
                                  + close_match(name, SINK_CLASSES))
            if v is False:
                continue
            if v is not None and not isinstance(v, Mapping):
                raise ConfigError(f"actions.{name} must be a mapping (or false to turn it off), got {v!r}")
            out[name] = Section.checked(f"actions.{name}", SINK_CLASSES[name], v or {})
        return cls(types.MappingProxyType(out))

    def __contains__(self, name: str) -> bool:
        return name in self.sinks

    def build(self, **kwargs) -> AlertDispatcher:
        """The run's dispatcher (:func:`build_sinks`'s keyword arguments)."""
        return build_sinks(self, **kwargs)

    def to_dict(self) -> dict[str, Any]:
        return {name: s.to_dict() for name, s in self.sinks.items()}


def build_sinks(actions_config: "ActionsConfig | Mapping[str, Any] | None", *, is_rank0: bool, run_name: str,
                report_path: str | None = None, wandb_run=None, tb_writer=None, trackio_run=None,
                tensorboard_dir: str | None = None,
                advice_forms: tuple[str, ...] | None = None, off: Mapping[str, str] | None = None,
                only_messages: bool = False, quiet: bool = False) -> AlertDispatcher:
    """The dispatcher for the ``actions`` config section (docs/design.md, "Configuration").

    A missing section (or ``false``) = that sink off; ``{}`` or ``null`` = on with defaults.
    Validation is the config's (``actions.<sink>.<key>`` in every message); then each sink reads
    the environment (:meth:`AlertSink.resolve`). Every rank does both (a bad URL or unset
    variable fails everywhere, early, alike); only rank 0 gets sinks, the others a dispatcher
    that does nothing (docs/design.md, "Invariants").

    ``off``: sink name -> why this run leaves it out (said once, like a sink that resolves to
    off). ``only_messages``: leave out the sinks that write into rank 0's own tracker run
    (``run_bound``: W&B, TensorBoard, Trackio), for a crash alert sent from another rank.
    ``advice_forms``: the frameworks whose rollback form alerts carry (None: all).
    ``tensorboard_dir``: the TensorBoard sink's ``log_dir`` when the config names none and no
    writer is given (a run's folder). ``actions_config``: the config's section, each sink built
    once to check it and handed out here (a plain mapping is checked here first).
    """
    config = actions_config if isinstance(actions_config, ActionsConfig) else ActionsConfig.checked(actions_config)
    tb_dir = tensorboard_dir if tb_writer is None and "tensorboard" in config and (
        "log_dir" not in config.sinks["tensorboard"].args) else None
    runtime = {"wandb": {"run": wandb_run}, "tensorboard": {"writer": tb_writer, "log_dir": tb_dir},
               "trackio": {"run": trackio_run, "run_name": run_name}}
    sinks: list[AlertSink] = []
    for name, cls in SINK_CLASSES.items():
        if name not in config or (only_messages and cls.run_bound):
            continue
        path = f"actions.{name}"
        sink = config.sinks[name].build(**runtime.get(name, {}))
        why_off = (off or {}).get(name)
        if why_off is None:
            try:
                why_off = sink.resolve()
            except ValueError as e:
                raise ConfigError(with_path(path, str(e), config_keys(cls))) from None
        if why_off is None:
            sinks.append(sink)
        elif is_rank0 and not quiet:
            logger.info("stability alerts: %s is configured but off (%s)", path, why_off)
    if not is_rank0:
        for sink in sinks:
            sink.close()
        sinks = []
    return AlertDispatcher(sinks, run_name=run_name, report_path=report_path, advice_forms=advice_forms)
