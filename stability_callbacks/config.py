"""Configuration: YAML (or the same structure as a dict) → validated once → constructor args.

Every section maps onto constructors (DESIGN 2.5, with ``preflight`` and ``watchdog`` added):
``sampling`` → :class:`Sampling`, ``phase`` → ``PhaseTracker``, ``detectors.<name>`` → the
detector, ``policy`` → ``Policy``, ``actions.<sink>`` → the sink class, ``preflight`` →
``Preflight``, ``watchdog`` → ``HangWatchdog``.
The allowed keys are the keyword-only parameters of those constructors, and validation builds
the very objects the Monitor will use, so a bad value fails here with the key path and the
value (``detectors.loss_spike.z_threshold must be a positive number, got -1``), never later
from deep inside a training step. Nothing here reads the environment: ``${VAR}`` references
of the alert sinks are resolved when the sinks are built (``actions.build_sinks``).
"""
from __future__ import annotations

import copy
import dataclasses
import inspect
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

from .params import check, int_at_least

SECTIONS = ("sampling", "phase", "detectors", "policy", "actions", "preflight", "watchdog")
PRESETS_DIR = Path(__file__).resolve().parent / "configs"   # shipped in the wheel
#: The actions when the section is absent: findings go to Python logging.
DEFAULT_ACTIONS = {"log": {"min_severity": "info"}}


class ConfigError(ValueError):
    """A configuration problem; the message names the key path and the bad value."""


@dataclass(kw_only=True)
class Sampling:
    """How often the integrations sample (the ``sampling`` section).

    - ``every_n_steps``: feed the Monitor every n-th optimizer step.
    - ``adam_every_n_steps``: Adam ``exp_avg_sq`` max / L1 every n-th sampled step (one pass
      over the local optimizer state).
    - ``param_norm_every_n_steps``: the parameter L2 norm (one more pass); 0 = off.
    - ``loss_streams``: per-dataset loss names (``loss/<name>``), declared so every rank
      reduces the same ones.

    >>> Sampling(every_n_steps=0)
    Traceback (most recent call last):
    ...
    ValueError: every_n_steps must be an integer ≥ 1, got 0
    """

    every_n_steps: int = 1
    adam_every_n_steps: int = 1
    param_norm_every_n_steps: int = 0
    loss_streams: list[str] = field(default_factory=list)

    def __post_init__(self):
        int_at_least("every_n_steps", self.every_n_steps, 1)
        int_at_least("adam_every_n_steps", self.adam_every_n_steps, 1)
        int_at_least("param_norm_every_n_steps", self.param_norm_every_n_steps, 0)
        check("loss_streams", self.loss_streams, isinstance(self.loss_streams, list) and all(
            isinstance(x, str) and x for x in self.loss_streams), "a list of stream names")


def preset_path(name: str) -> Path:
    return PRESETS_DIR / f"{name}.yaml"


def load_config(source: str | Path | Mapping | None = None) -> dict[str, Any]:
    """Read and validate a config. ``source``: a YAML path, a preset name (``default``,
    ``pretrain-fp16``, ``pretrain-bf16``, ``finetune``), a dict, or ``None`` (defaults).

    >>> load_config({"policy": {"halt_on": "critical"}})["policy"]
    {'halt_on': 'critical'}
    >>> load_config({"detectors": {"loss_spike": {"z_treshold": 5}}})
    Traceback (most recent call last):
    ...
    stability_callbacks.config.ConfigError: detectors.loss_spike.z_treshold: unknown key (known: baseline_alpha, ..., z_threshold)
    """
    if source is None:
        raw: Any = {}
        origin = "config"
    elif isinstance(source, Mapping):
        raw, origin = copy.deepcopy(dict(source)), "config"
    else:
        path = Path(source)
        if not path.exists() and not path.suffix and preset_path(str(source)).exists():
            path = preset_path(str(source))
        origin = str(path)
        try:
            raw = yaml.safe_load(path.read_text()) or {}
        except FileNotFoundError:
            raise ConfigError(f"{path}: config file not found") from None
        except yaml.YAMLError as e:
            mark = getattr(e, "problem_mark", None)
            where = f" line {mark.line + 1}" if mark is not None else ""
            raise ConfigError(f"{path}{where}: not valid YAML: {getattr(e, 'problem', e)}") from None
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{origin}: expected a mapping of sections {SECTIONS}, got {type(raw).__name__}")
    try:
        return validate(raw)
    except ConfigError as e:
        raise ConfigError(f"{origin}: {e}" if origin != "config" else str(e)) from None


def validate(raw: Mapping) -> dict[str, Any]:
    from .detectors import DETECTORS
    from .phase import PhaseTracker
    from .policy import Policy
    from .preflight import Preflight
    from .watchdog import HangWatchdog

    unknown = sorted(set(raw) - set(SECTIONS))
    if unknown:
        raise ConfigError(f"{unknown[0]}: unknown section (known: {', '.join(SECTIONS)})")
    out: dict[str, Any] = {}
    out["sampling"] = dataclasses.asdict(construct("sampling", Sampling, _section(raw, "sampling")))
    out["phase"] = _checked("phase", PhaseTracker, _section(raw, "phase"))
    detectors = _section(raw, "detectors")
    out["detectors"] = {}
    for name, kwargs in detectors.items():
        if name not in DETECTORS:
            raise ConfigError(f"detectors.{name}: unknown detector (known: {', '.join(DETECTORS)})")
        if kwargs is False or (isinstance(kwargs, Mapping) and kwargs.get("enabled") is False):
            out["detectors"][name] = False
            continue
        kwargs = dict(kwargs or {})
        kwargs.pop("enabled", None)
        out["detectors"][name] = _checked(f"detectors.{name}", DETECTORS[name], kwargs)
    out["policy"] = _checked("policy", Policy, _section(raw, "policy"))
    out["actions"] = validate_actions(raw["actions"] if "actions" in raw else DEFAULT_ACTIONS)
    preflight = {"enabled": False} if raw.get("preflight") is False else _section(raw, "preflight")
    out["preflight"] = _checked("preflight", Preflight, preflight)
    out["watchdog"] = _checked("watchdog", HangWatchdog, _section(raw, "watchdog"))
    return out


def validate_actions(actions: Any) -> dict[str, dict]:
    """The ``actions`` section: sink name → its keyword arguments (``false`` = off, dropped;
    ``null`` or ``{}`` = on with defaults). Every sink is built once to check its values; the
    environment is not read here (that happens when the sinks are built for a run)."""
    from .actions import SINK_CLASSES

    if actions is None:
        return {}
    if not isinstance(actions, Mapping):
        raise ConfigError(f"actions must be a mapping, got {actions!r}")
    out = {}
    for name, v in actions.items():
        if name not in SINK_CLASSES:
            raise ConfigError(f"actions.{name}: unknown sink (known: {', '.join(SINK_CLASSES)})")
        if v is False:
            continue
        if v is not None and not isinstance(v, Mapping):
            raise ConfigError(f"actions.{name} must be a mapping (or false to turn it off), got {v!r}")
        out[name] = _checked(f"actions.{name}", SINK_CLASSES[name], dict(v or {}))
    return out


def config_keys(cls) -> dict[str, inspect.Parameter]:
    """The config keys of ``cls``: the keyword-only parameters of its constructor (runtime
    objects such as a W&B run or a TensorBoard writer are positional-or-keyword, not config)."""
    params = inspect.signature(cls).parameters
    return {k: p for k, p in params.items() if p.kind == inspect.Parameter.KEYWORD_ONLY}


def construct(path: str, cls, kwargs: Mapping[str, Any], **runtime):
    """``cls(**kwargs, **runtime)``; an unknown or missing key, or a bad value, raises
    :class:`ConfigError` naming ``path.key`` (and the value: the constructor's own message).

    >>> construct("sampling", Sampling, {"every_n_steps": 0})
    Traceback (most recent call last):
    ...
    stability_callbacks.config.ConfigError: sampling.every_n_steps must be an integer ≥ 1, got 0
    """
    params = config_keys(cls)
    for k in kwargs:
        if k not in params:
            raise ConfigError(f"{path}.{k}: unknown key (known: {', '.join(sorted(params))})")
    for k, p in params.items():
        if p.default is inspect.Parameter.empty and k not in kwargs:
            raise ConfigError(f"{path}.{k}: required key missing")
    try:
        return cls(**kwargs, **runtime)
    except (ValueError, TypeError) as e:
        raise ConfigError(with_path(path, str(e), params)) from None


def with_path(path: str, message: str, keys=()) -> str:
    """``message`` from a constructor (``"z_threshold must be ..."``, ``"urls[0]: ..."``) with the
    key path in front: ``path.z_threshold must be ...``; ``path: message`` when it names no key."""
    m = re.match(r"([A-Za-z_]\w*)(?=[\s:.\[])", message)
    if m and m.group(1) in keys:
        return f"{path}.{message}"
    return f"{path}: {message}"


def _section(raw: Mapping, name: str) -> dict:
    v = raw.get(name)
    if v is None:
        return {}
    if not isinstance(v, Mapping):
        raise ConfigError(f"{name} must be a mapping, got {v!r}")
    return dict(v)


def _checked(path: str, cls, kwargs: dict) -> dict:
    """Build ``cls(**kwargs)`` once to validate; return the arguments as given."""
    construct(path, cls, kwargs)
    return kwargs
