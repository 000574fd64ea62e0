"""The configuration: YAML (a path, a preset name, or the same structure as a dict) plus
``section.key=value`` overrides → read ONCE into a typed tree of frozen dataclasses
(:class:`Config`), validated where the tree is built → each runtime object built once from its
section (docs/design.md, "Configuration").

Every section maps onto a constructor: ``sampling`` → :class:`Sampling` (read by the torch
session), ``phase`` → ``PhaseTracker``, ``detectors.<name>`` → the detector, ``policy`` →
``Policy``, ``actions.<sink>`` → the sink class, ``preflight`` → ``Preflight``, ``watchdog`` →
``HangWatchdog``, ``forensics`` → ``Forensics``, ``report`` → ``RunReport``. The allowed keys are
the keyword-only parameters of those constructors (:func:`~stability_callbacks.params.config_keys`),
and their defaults are the constructors' own: a :class:`Section` read for a key it was not given
answers the constructor's default, so nothing downstream re-defaults a value.

Validation builds each object once (its constructor checks its own values), so a bad value fails
here with the key path and the value (``detectors.loss_spike.z_threshold must be a positive
number, got -1``; an unknown key with a close match says ``did you mean``), never later from deep
inside a training step. The object built to validate is the one the run uses: a section's first
:meth:`Section.build` hands it out, a later one builds afresh. Who builds what, once per run:
the Monitor (phase, detectors, policy), the LiveRun (the sinks, forensics), the torch session
(watchdog, preflight). Nothing here reads the environment: ``${VAR}`` references of the alert
sinks are resolved when the sinks are built for a run (``actions.build_sinks``).

>>> cfg = Config.load("pretrain-fp16", overrides={"policy.halt_on": "critical"})
>>> cfg.policy.halt_on, cfg.policy.save_on          # given; the constructor's default
('critical', 'warning')
>>> cfg.policy.build().halt_on
'critical'
>>> Config.load(None, overrides={"policy.halt_onn": "critical"})
Traceback (most recent call last):
...
stability_callbacks.params.ConfigError: policy.halt_onn: unknown key (known: ...); did you mean halt_on?
"""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping

import yaml

from .alerts import SINK_CLASSES, ActionsConfig
from .detectors import DETECTORS
from .forensics import Forensics
from .outcome import RunReport
from .params import ConfigError, Section, check, close_match, config_keys, construct, int_at_least
from .phase import PhaseTracker
from .policy import Policy
from .preflight import Preflight
from .watchdog import HangWatchdog

__all__ = ["Config", "Section", "DetectorsConfig", "ActionsConfig", "Sampling", "load_config",
           "validate", "apply_overrides", "parse_overrides", "ConfigError", "SECTIONS", "PRESETS_DIR",
           "preset_path", "presets"]

SECTIONS = ("sampling", "phase", "detectors", "policy", "actions", "preflight", "watchdog", "forensics",
            "report")
PRESETS_DIR = Path(__file__).resolve().parent / "configs"   # shipped in the wheel
#: The actions when the section is absent: findings go to Python logging.
DEFAULT_ACTIONS = {"log": {"min_severity": "info"}}


@dataclass(frozen=True, kw_only=True)
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

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class DetectorsConfig:
    """The ``detectors`` section: each detector on (its :class:`Section`, in ``DETECTORS``'
    order, every one present: an absent detector runs with its defaults) and those turned off.
    A detector with ``defaults_from`` (``stream_loss_spike``) starts from the keys of the one it
    names that it accepts, then its own."""

    on: Mapping[str, Section]
    off: tuple[str, ...]
    given: Mapping[str, Any]

    @classmethod
    def checked(cls, raw: Mapping[str, Any]) -> "DetectorsConfig":
        given: dict[str, Any] = {}
        for name, kwargs in raw.items():
            if name not in DETECTORS:
                raise ConfigError(f"detectors.{name}: unknown detector (known: {', '.join(DETECTORS)})"
                                  + close_match(name, DETECTORS))
            if kwargs is False or (isinstance(kwargs, Mapping) and kwargs.get("enabled") is False):
                given[name] = False
                continue
            if kwargs is not None and not isinstance(kwargs, Mapping):
                raise ConfigError(f"detectors.{name} must be a mapping (or false to turn it off), got {kwargs!r}")
            kwargs = dict(kwargs or {})
            kwargs.pop("enabled", None)
            given[name] = kwargs
        on: dict[str, Section] = {}
        for name, det in DETECTORS.items():
            if given.get(name) is False:
                continue
            args = dict(given.get(name) or {})
            parent = given.get(det.defaults_from) if det.defaults_from else None
            if parent:   # e.g. streams judged like the main loss
                accepted = config_keys(det)
                args = {**{k: v for k, v in parent.items() if k in accepted}, **args}
            on[name] = Section.checked(f"detectors.{name}", det, args)
        return cls(types.MappingProxyType(on), tuple(n for n in given if given[n] is False),
                   types.MappingProxyType(given))

    def __getattr__(self, name: str) -> Section:
        if name.startswith("_"):
            raise AttributeError(name)
        on = object.__getattribute__(self, "on")
        if name in on:
            return on[name]
        raise AttributeError(f"detectors.{name}: {'off' if name in DETECTORS else 'no such detector'}")

    def build(self) -> list:
        """Every detector on, in order, each built once."""
        return [s.build() for s in self.on.values()]

    def to_dict(self) -> dict[str, Any]:
        return copy.deepcopy(dict(self.given))


@dataclass(frozen=True, eq=True)
class Config(Mapping):
    """A run's whole configuration, read once (:meth:`load`): one typed section per top-level
    key. ``config.policy.halt_on`` is the value; ``config.policy.build()`` the ``Policy``.
    As a mapping (what :func:`load_config` returned before it returned this), ``config["policy"]``
    is the section's arguments as given, as a plain dict (every section present).

    ``source``: what it was read from, as given (a preset name, a path as written, ``dict:``
    + a hash, or None for the defaults); ``overrides``: the ``section.key`` -> value applied.
    """

    sampling: Sampling
    phase: Section
    detectors: DetectorsConfig
    policy: Section
    actions: ActionsConfig
    preflight: Section
    watchdog: Section
    forensics: Section
    report: Section
    source: str | None = field(default=None, compare=False)
    overrides: Mapping[str, Any] = field(default_factory=dict, compare=False)

    @classmethod
    def load(cls, source: "str | Path | Mapping | Config | None" = None,
             overrides: Mapping[str, Any] | None = None) -> "Config":
        """Read ``source`` (a YAML path, a preset name: ``default``, ``pretrain-fp16``,
        ``pretrain-bf16``, ``finetune``; a dict; None = the defaults; a Config is returned as it
        is, with ``overrides`` applied on top of its own), apply ``overrides``
        (``{"policy.halt_on": "critical"}``) and validate: one read. A bad key or value is a
        :class:`ConfigError` naming the key path (and, after the file's name, where it came from)."""
        if isinstance(source, Config):
            if not overrides:
                return source
            raw, origin, given = source.to_dict(), "config", source.source
            overrides = {**source.overrides, **overrides}
        else:
            raw, origin, given = _read(source)
        raw = apply_overrides(raw, overrides or {})
        try:
            tree = validate(raw)
        except ConfigError as e:   # the file's name in front, unless the key came from an override
            overridden = any(str(e).startswith(str(k)) for k in overrides or {})
            raise ConfigError(f"{origin}: {e}" if origin != "config" and not overridden else str(e)) from None
        return dataclasses.replace(tree, source=given, overrides=types.MappingProxyType(dict(overrides or {})))

    # -- the mapping view: section name -> its arguments as given ---------------------------
    def __getitem__(self, name: str) -> Any:
        if name not in SECTIONS:
            raise KeyError(name)
        return getattr(self, name).to_dict()

    def __iter__(self) -> Iterator[str]:
        return iter(SECTIONS)

    def __len__(self) -> int:
        return len(SECTIONS)

    def to_dict(self) -> dict[str, Any]:
        """Every section's arguments as given: what :meth:`load` of the same dict reads back."""
        return {name: self[name] for name in SECTIONS}


def _read(source: Any) -> tuple[dict, str, str | None]:
    """``(raw mapping, origin for messages, source as given)``: the one read of a config."""
    if source is None:
        return {}, "config", None
    if isinstance(source, Mapping):
        raw = copy.deepcopy(dict(source))
        digest = hashlib.sha256(json.dumps(raw, sort_keys=True, default=str).encode()).hexdigest()[:12]
        return raw, "config", "dict:" + digest
    path = Path(source)
    if not path.exists() and not path.suffix and preset_path(str(source)).exists():
        path = preset_path(str(source))
    try:
        raw = yaml.safe_load(path.read_text()) or {}
    except FileNotFoundError:
        named = not path.suffix and len(path.parts) == 1   # a bare name: meant as a preset?
        raise ConfigError(f"{path}: no such config file, and no preset of that name (presets: "
                          f"{', '.join(presets())})" + close_match(str(source), presets()) if named
                          else f"{path}: config file not found") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" line {mark.line + 1}" if mark is not None else ""
        raise ConfigError(f"{path}{where}: not valid YAML: {getattr(e, 'problem', e)}") from None
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{path}: expected a mapping of sections {SECTIONS}, got {type(raw).__name__}")
    return dict(raw), str(path), str(source)


def preset_path(name: str) -> Path:
    return PRESETS_DIR / f"{name}.yaml"


def presets() -> list[str]:
    """The names of the presets shipped in the package."""
    return sorted(p.stem for p in PRESETS_DIR.glob("*.yaml"))


def load_config(source: "str | Path | Mapping | Config | None" = None,
                overrides: Mapping[str, Any] | None = None) -> Config:
    """Read and validate a config: :meth:`Config.load`. Returns the :class:`Config` tree, which
    is also a read-only mapping of section name -> its arguments as given (what this function
    returned before the tree existed).

    >>> load_config({"policy": {"halt_on": "critical"}})["policy"]
    {'halt_on': 'critical'}
    >>> load_config({"detectors": {"loss_spike": {"z_treshold": 5}}})
    Traceback (most recent call last):
    ...
    stability_callbacks.params.ConfigError: detectors.loss_spike.z_treshold: unknown key (known: baseline_alpha, ..., z_threshold); did you mean z_threshold?
    """
    return Config.load(source, overrides)


def validate(raw: Mapping) -> Config:
    """``raw`` checked section by section (each object built once, kept for the run), every
    section present."""
    if not isinstance(raw, Mapping):
        raise ConfigError(f"config: expected a mapping of sections {SECTIONS}, got {type(raw).__name__}")
    unknown = sorted(set(raw) - set(SECTIONS))
    if unknown:
        raise ConfigError(f"{unknown[0]}: unknown section (known: {', '.join(SECTIONS)})"
                          + close_match(unknown[0], SECTIONS))
    sampling = construct("sampling", Sampling, _section(raw, "sampling"))   # in the file's order of
    phase = Section.checked("phase", PhaseTracker, _section(raw, "phase"))   # sections: the first error
    detectors = DetectorsConfig.checked(_section(raw, "detectors"))
    policy = Section.checked("policy", Policy, _section(raw, "policy"))
    actions = ActionsConfig.checked(raw["actions"] if "actions" in raw else DEFAULT_ACTIONS)
    preflight = {"enabled": False} if raw.get("preflight") is False else _section(raw, "preflight")
    return Config(sampling=sampling, phase=phase, detectors=detectors, policy=policy, actions=actions,
                  preflight=Section.checked("preflight", Preflight, preflight),
                  watchdog=Section.checked("watchdog", HangWatchdog, _section(raw, "watchdog")),
                  forensics=Section.checked("forensics", Forensics, _section(raw, "forensics")),
                  report=Section.checked("report", RunReport, _section(raw, "report")))


def _section(raw: Mapping, name: str) -> dict:
    v = raw.get(name)
    if v is None:
        return {}
    if not isinstance(v, Mapping):
        raise ConfigError(f"{name} must be a mapping, got {v!r}")
    return dict(v)


# -- overrides: section.key=value -------------------------------------------------------------
def parse_overrides(items: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """``--set`` arguments (``section.key=value``, repeatable) -> ``{"section.key": value}``,
    each value read as a YAML scalar (``7`` an int, ``false`` a bool, ``null`` None, ``critical``
    a string, ``[a, b]`` a list).

    >>> parse_overrides(["policy.halt_on=critical", "detectors.loss_spike.z_threshold=7",
    ...                  "detectors.not_learning=false"])
    {'policy.halt_on': 'critical', 'detectors.loss_spike.z_threshold': 7, 'detectors.not_learning': False}
    """
    out: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {item}: expected section.key=value")
        try:
            out[key.strip()] = yaml.safe_load(value) if value.strip() else None
        except yaml.YAMLError as e:
            raise ConfigError(f"--set {item}: the value is not valid YAML: {getattr(e, 'problem', e)}") from None
    return out


def apply_overrides(raw: Mapping, overrides: Mapping[str, Any]) -> dict:
    """``raw`` with each ``section.key[.key...]`` of ``overrides`` set (a copy). The section, the
    detector's and the sink's names are checked here (with a close match); the keys by the
    validation that follows, as those of a YAML file. A key set inside a section that is off
    (``false``) turns it on with that key.

    >>> apply_overrides({"policy": {"save_on": "info"}}, {"policy.halt_on": "critical"})
    {'policy': {'save_on': 'info', 'halt_on': 'critical'}}
    >>> apply_overrides({}, {"policy": 1})
    Traceback (most recent call last):
    ...
    stability_callbacks.params.ConfigError: policy: an override names section.key (e.g. policy.halt_on=critical)
    """
    out = copy.deepcopy(dict(raw))
    for dotted, value in overrides.items():
        parts = str(dotted).split(".")
        if len(parts) < 2 or not all(parts):
            raise ConfigError(f"{dotted}: an override names section.key (e.g. policy.halt_on=critical)")
        if parts[0] not in SECTIONS:
            raise ConfigError(f"{dotted}: unknown section {parts[0]!r} (known: {', '.join(SECTIONS)})"
                              + close_match(parts[0], SECTIONS))
        named: Mapping[str, Any] | None = (DETECTORS if parts[0] == "detectors"
                                           else SINK_CLASSES if parts[0] == "actions" else None)
        if named is not None and parts[1] not in named:
            what = "detector" if parts[0] == "detectors" else "sink"
            raise ConfigError(f"{dotted}: unknown {what} {parts[1]!r} (known: {', '.join(named)})"
                              + close_match(parts[1], named))
        node = out
        for part in parts[:-1]:
            if not isinstance(node.get(part), Mapping):   # absent, null, or false: on, with this key
                node[part] = {}
            else:
                node[part] = dict(node[part])
            node = node[part]
        node[parts[-1]] = value
    return out
