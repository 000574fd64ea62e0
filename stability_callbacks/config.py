"""The configuration schema: YAML (or the same structure as a dict) → validated once →
constructor args. Which sections exist and what builds each; the utility that builds an object
from a mapping of its keys is :mod:`stability_callbacks.params`. This module sits above every
section it checks (detectors, phase, policy, actions, preflight, watchdog, forensics, report) and none
imports it.

Every section maps onto constructors (docs/design.md, "Configuration"):
``sampling`` → :class:`Sampling`, ``phase`` → ``PhaseTracker``, ``detectors.<name>`` → the
detector, ``policy`` → ``Policy``, ``actions.<sink>`` → the sink class, ``preflight`` →
``Preflight``, ``watchdog`` → ``HangWatchdog``, ``forensics`` → ``Forensics``, ``report`` →
``RunReport``.
The allowed keys are the keyword-only parameters of those constructors, and validation builds
the very objects the Monitor will use, so a bad value fails here with the key path and the
value (``detectors.loss_spike.z_threshold must be a positive number, got -1``), never later
from deep inside a training step. Nothing here reads the environment: ``${VAR}`` references
of the alert sinks are resolved when the sinks are built (``actions.build_sinks``).
"""
from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

from .actions import validate_actions
from .detectors import DETECTORS
from .forensics import Forensics
from .outcome import RunReport
from .params import ConfigError, check, checked, construct, int_at_least
from .phase import PhaseTracker
from .policy import Policy
from .preflight import Preflight
from .watchdog import HangWatchdog

__all__ = ["load_config", "validate", "ConfigError", "Sampling", "SECTIONS", "PRESETS_DIR", "preset_path",
           "presets"]

SECTIONS = ("sampling", "phase", "detectors", "policy", "actions", "preflight", "watchdog", "forensics",
            "report")
PRESETS_DIR = Path(__file__).resolve().parent / "configs"   # shipped in the wheel
#: The actions when the section is absent: findings go to Python logging.
DEFAULT_ACTIONS = {"log": {"min_severity": "info"}}


@dataclass(kw_only=True)
class Sampling:
    """How often the integrations sample (the ``sampling`` section).

    - ``every_n_steps``: feed the Monitor every n-th optimizer step.
    - ``adam_every_n_steps``: Adam's moments (``exp_avg_sq`` max / L1, ``exp_avg``'s norm, the
      update norm, the layers' ratios) every n-th sampled step: one pass over the local optimizer
      state. Default 1, from its cost (docs/configuration.md): a sample costs about
      ``236 / (tokens per rank per step x ranks the state is sharded over)`` of an H100 step, so
      large (sharded) models pay <= 0.1% every step; raise it for an unsharded state with few
      tokens per step (8 K tokens, one GPU: 6 keeps it under 0.5%).
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


def presets() -> list[str]:
    """The names of the presets shipped in the package."""
    return sorted(p.stem for p in PRESETS_DIR.glob("*.yaml"))


def load_config(source: str | Path | Mapping | None = None) -> dict[str, Any]:
    """Read and validate a config. ``source``: a YAML path, a preset name (``default``,
    ``pretrain-fp16``, ``pretrain-bf16``, ``finetune``), a dict, or ``None`` (defaults).

    >>> load_config({"policy": {"halt_on": "critical"}})["policy"]
    {'halt_on': 'critical'}
    >>> load_config({"detectors": {"loss_spike": {"z_treshold": 5}}})
    Traceback (most recent call last):
    ...
    stability_callbacks.params.ConfigError: detectors.loss_spike.z_treshold: unknown key (known: baseline_alpha, ..., z_threshold)
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
            named = not path.suffix and len(path.parts) == 1   # a bare name: meant as a preset?
            raise ConfigError(f"{path}: no such config file, and no preset of that name (presets: "
                              f"{', '.join(presets())})" if named else f"{path}: config file not found") from None
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
    """``raw`` checked section by section (each constructor built once); the arguments as given,
    every section present."""
    unknown = sorted(set(raw) - set(SECTIONS))
    if unknown:
        raise ConfigError(f"{unknown[0]}: unknown section (known: {', '.join(SECTIONS)})")
    out: dict[str, Any] = {}
    out["sampling"] = dataclasses.asdict(construct("sampling", Sampling, _section(raw, "sampling")))
    out["phase"] = checked("phase", PhaseTracker, _section(raw, "phase"))
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
        out["detectors"][name] = checked(f"detectors.{name}", DETECTORS[name], kwargs)
    out["policy"] = checked("policy", Policy, _section(raw, "policy"))
    out["actions"] = validate_actions(raw["actions"] if "actions" in raw else DEFAULT_ACTIONS)
    preflight = {"enabled": False} if raw.get("preflight") is False else _section(raw, "preflight")
    out["preflight"] = checked("preflight", Preflight, preflight)
    out["watchdog"] = checked("watchdog", HangWatchdog, _section(raw, "watchdog"))
    out["forensics"] = checked("forensics", Forensics, _section(raw, "forensics"))
    out["report"] = checked("report", RunReport, _section(raw, "report"))
    return out


def _section(raw: Mapping, name: str) -> dict:
    v = raw.get(name)
    if v is None:
        return {}
    if not isinstance(v, Mapping):
        raise ConfigError(f"{name} must be a mapping, got {v!r}")
    return dict(v)
