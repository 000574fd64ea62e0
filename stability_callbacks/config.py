"""Configuration: YAML (or the same structure as a dict) → validated once → constructor args.

Validation builds the very objects the Monitor will use, so a bad value fails here with the
key path and the value (``detectors.loss_spike.z_threshold must be a positive number, got -1``),
never later from deep inside a training step.
"""
from __future__ import annotations

import copy
import inspect
from pathlib import Path
from typing import Any, Mapping

import yaml

SECTIONS = ("sampling", "phase", "detectors", "policy", "actions")
SINKS = ("log", "slack", "wandb", "tensorboard")
_SAMPLING = {"every_n_steps": 1, "adam_every_n_steps": 1, "param_norm_every_n_steps": 0,
             "loss_streams": []}
PRESETS_DIR = Path(__file__).resolve().parent / "configs"   # shipped in the wheel


class ConfigError(ValueError):
    """A configuration problem; the message names the key path and the bad value."""


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
    stability_callbacks.config.ConfigError: detectors.loss_spike.z_treshold: unknown key (known: baseline_alpha, cold_start_rise, cold_start_samples, fast_recovery_steps, horizon_steps, large_rise, max_threshold_rise, min_rise, persist_samples, recover_fraction, signal, z_threshold)
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

    unknown = sorted(set(raw) - set(SECTIONS))
    if unknown:
        raise ConfigError(f"{unknown[0]}: unknown section (known: {', '.join(SECTIONS)})")
    out: dict[str, Any] = {}
    sampling = _section(raw, "sampling")
    for k, v in sampling.items():
        if k not in _SAMPLING:
            raise ConfigError(f"sampling.{k}: unknown key (known: {', '.join(_SAMPLING)})")
        if k == "loss_streams":   # per-dataset loss names, declared so ranks reduce them alike
            if not (isinstance(v, list) and all(isinstance(x, str) and x for x in v)):
                raise ConfigError(f"sampling.loss_streams must be a list of stream names, got {v!r}")
            continue
        if not isinstance(v, int) or isinstance(v, bool) or v < (0 if k == "param_norm_every_n_steps" else 1):
            raise ConfigError(f"sampling.{k} must be an integer ≥ {0 if k == 'param_norm_every_n_steps' else 1}, got {v!r}")
    out["sampling"] = {**_SAMPLING, **sampling}
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
    actions = _section(raw, "actions") if "actions" in raw else {"log": {"min_severity": "info"}}
    from .actions import SINK_CLASSES
    for name, v in actions.items():
        if name not in SINKS:
            raise ConfigError(f"actions.{name}: unknown sink (known: {', '.join(SINKS)})")
        if v is not None and v is not False and not isinstance(v, Mapping):
            raise ConfigError(f"actions.{name} must be a mapping (or false to turn it off), got {v!r}")
        known = sorted(SINK_CLASSES[name].CONFIG_KEYS)
        for k in (v or {}):
            if k not in known:
                raise ConfigError(f"actions.{name}.{k}: unknown key (known: {', '.join(known)})")
    out["actions"] = {k: dict(v or {}) for k, v in actions.items() if v is not False}
    return out


def _section(raw: Mapping, name: str) -> dict:
    v = raw.get(name)
    if v is None:
        return {}
    if not isinstance(v, Mapping):
        raise ConfigError(f"{name} must be a mapping, got {v!r}")
    return dict(v)


def _checked(path: str, cls, kwargs: dict) -> dict:
    """Build ``cls(**kwargs)`` once to validate; errors name ``path.key`` and the value."""
    params = inspect.signature(cls.__init__).parameters
    known = sorted(p for p in params if p != "self" and params[p].kind == inspect.Parameter.KEYWORD_ONLY)
    for k in kwargs:
        if k not in known:
            raise ConfigError(f"{path}.{k}: unknown key (known: {', '.join(known)})")
    try:
        cls(**kwargs)
    except (ValueError, TypeError) as e:
        msg = str(e)
        key = msg.split()[0] if msg else ""
        raise ConfigError(f"{path}.{msg}" if key in kwargs else f"{path}: {msg}") from None
    return kwargs
