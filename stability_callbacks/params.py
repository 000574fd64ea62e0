"""Constructor parameters: the one vocabulary of every class whose constructor is the config.

Each check returns the value it was given (``self.z = positive("z", z)``) or raises
``ValueError("<name> must be <what>, got <value!r>")``. Constructors name only their own key;
:func:`construct` builds an object from a mapping of its keys and puts the key path in front
(``detectors.loss_spike.z_threshold must be a positive number, got -2``): the utility every
config section uses (the schema itself, which sections exist, is :mod:`stability_callbacks.config`).
Torch-free, no state.

>>> positive("z_threshold", 6.0)
6.0
>>> int_at_least("every_n_steps", 0, 1)
Traceback (most recent call last):
...
ValueError: every_n_steps must be an integer ≥ 1, got 0
>>> one_of("min_severity", "loud", ("info", "warning", "critical"))
Traceback (most recent call last):
...
ValueError: min_severity must be one of ('info', 'warning', 'critical'), got 'loud'
"""
from __future__ import annotations

import copy
import difflib
import inspect
import math
import re
import types
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

__all__ = ["check", "is_number", "positive", "positive_int", "at_least", "int_at_least",
           "in_interval", "one_of", "flag", "text", "ConfigError", "config_keys", "construct",
           "with_path", "close_match", "Section"]


def check(name: str, value: Any, ok: bool, want: str) -> Any:
    """The primitive: ``value`` when ``ok``, else ``ValueError`` naming ``name``, ``want`` and the value."""
    if not ok:
        raise ValueError(f"{name} must be {want}, got {value!r}")
    return value


def is_number(value: Any) -> bool:
    """A finite int or float (``bool`` is not a number here: ``true`` in YAML is a typo)."""
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def positive(name: str, value: Any):
    """A finite number > 0."""
    return check(name, value, is_number(value) and value > 0, "a positive number")


def positive_int(name: str, value: Any) -> int:
    """An integer > 0."""
    return check(name, value, _is_int(value) and value > 0, "a positive integer")


def at_least(name: str, value: Any, minimum: float):
    """A finite number ≥ ``minimum``."""
    return check(name, value, is_number(value) and value >= minimum, f"a number ≥ {minimum:g}")


def int_at_least(name: str, value: Any, minimum: int) -> int:
    """An integer ≥ ``minimum``."""
    return check(name, value, _is_int(value) and value >= minimum, f"an integer ≥ {minimum}")


def in_interval(name: str, value: Any, low: float, high: float, *, low_open: bool = True,
                high_open: bool = True):
    """A finite number in the interval, written as in maths: ``(0, 1]`` = ``0 < v <= 1``."""
    ok = is_number(value) and (value > low if low_open else value >= low) and (
        value < high if high_open else value <= high)
    want = f"in {'(' if low_open else '['}{low:g}, {high:g}{')' if high_open else ']'}"
    return check(name, value, ok, want)


def one_of(name: str, value: Any, choices: Sequence[Any]):
    """One of ``choices``."""
    choices = tuple(choices)
    want = (" or ".join(repr(c) for c in choices) if len(choices) == 2
            else f"one of {choices!r}")
    return check(name, value, value in choices, want)


def flag(name: str, value: Any) -> bool:
    """``true`` or ``false`` (not 0/1, not "yes")."""
    return check(name, value, isinstance(value, bool), "true or false")


def text(name: str, value: Any) -> str:
    """A non-empty string."""
    return check(name, value, isinstance(value, str) and bool(value.strip()), "a non-empty string")


# -- Building an object from a mapping of its keys ------------------------------------------
class ConfigError(ValueError):
    """A configuration problem; the message names the key path and the bad value."""


def config_keys(cls) -> dict[str, inspect.Parameter]:
    """The config keys of ``cls``: the keyword-only parameters of its constructor (runtime
    objects such as a W&B run or a TensorBoard writer are positional-or-keyword, not config)."""
    params = inspect.signature(cls).parameters
    return {k: p for k, p in params.items() if p.kind == inspect.Parameter.KEYWORD_ONLY}


def construct(path: str, cls, kwargs: Mapping[str, Any], **runtime):
    """``cls(**kwargs, **runtime)``; an unknown or missing key, or a bad value, raises
    :class:`ConfigError` naming ``path.key`` (and the value: the constructor's own message).

    >>> from stability_callbacks.config import Sampling
    >>> construct("sampling", Sampling, {"every_n_steps": 0})
    Traceback (most recent call last):
    ...
    stability_callbacks.params.ConfigError: sampling.every_n_steps must be an integer ≥ 1, got 0
    """
    params = config_keys(cls)
    for k in kwargs:
        if k not in params:
            raise ConfigError(f"{path}.{k}: unknown key (known: {', '.join(sorted(params))})"
                              + close_match(k, params))
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


def close_match(name: str, known) -> str:
    """``"; did you mean X?"`` when one of ``known`` is close to ``name`` (difflib), else ``""``.

    >>> close_match("z_treshold", ["z_threshold", "horizon_steps"])
    '; did you mean z_threshold?'
    """
    found = difflib.get_close_matches(str(name), [str(k) for k in known], n=1)
    return f"; did you mean {found[0]}?" if found else ""


@dataclass(frozen=True)
class Section:
    """One section of the config (or one detector's, one sink's): the keyword arguments of the
    class it builds, as given and checked. ``section.key`` is the value given, else the
    constructor's default (its one source); :meth:`build` makes the object.

    >>> from stability_callbacks.watchdog import HangWatchdog
    >>> s = Section.checked("watchdog", HangWatchdog, {"hang_min_s": 60})
    >>> s.hang_min_s, s.hang_factor
    (60, 10.0)
    """

    path: str
    cls: type
    args: Mapping[str, Any]
    #: The object built to validate the section, until the first :meth:`build` takes it.
    _made: list = field(default_factory=list, compare=False, repr=False)

    @classmethod
    def checked(cls, path: str, target: type, args: Mapping[str, Any]) -> "Section":
        """The section, validated by building its object once (kept for the first :meth:`build`)."""
        args = types.MappingProxyType(copy.deepcopy(dict(args)))
        section = cls(path, target, args)
        section._made.append(construct(path, target, args))
        return section

    def __getattr__(self, key: str) -> Any:
        if key.startswith("_"):   # copy, pickle and dataclass machinery: no config key
            raise AttributeError(key)
        args = object.__getattribute__(self, "args")
        if key in args:
            return args[key]
        params = config_keys(object.__getattribute__(self, "cls"))
        if key not in params:
            raise AttributeError(f"{self.path} has no key {key!r}")
        return params[key].default

    def build(self, **runtime) -> Any:
        """The object: the one built to validate, the first time (and only without runtime
        arguments, which it was built without); afresh after that."""
        runtime = {k: v for k, v in runtime.items() if v is not None}   # None: the constructor's default
        if self._made and not runtime:
            return self._made.pop()
        return construct(self.path, self.cls, self.args, **runtime)

    def to_dict(self) -> dict[str, Any]:
        """The arguments as given (a plain, deep-copied dict)."""
        return copy.deepcopy(dict(self.args))


