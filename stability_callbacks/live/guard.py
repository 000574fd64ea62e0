"""The one guard that keeps monitoring from taking training down (docs/design.md, Invariants)."""
from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Any, Callable, Iterator

log = logging.getLogger("stability_callbacks")


class Guard:
    """The single home of "monitoring never takes training down" (docs/design.md, Invariants).

    Every monitoring call that could fail runs as ``with guard(part, what):``. A failure is
    logged once per part, with its traceback, and swallowed: that part goes quiet and the rest
    carries on. ``fatal=True`` marks a failure that leaves nothing to monitor (a failed start):
    ``guard.off`` turns True and the integration stops calling in. Exceptions of the types in
    ``passthrough`` are the user's to see (a bad config before step one) and propagate.
    ``warn_once`` is the same promise for problems that are not exceptions.

    >>> guard = Guard()
    >>> for _ in range(3):
    ...     with guard("ratio", "computing a ratio"):
    ...         1 / 0
    >>> sorted(guard.failed), guard.off
    (['ratio'], False)
    """

    def __init__(self):
        self.failed: set[str] = set()
        self.off = False
        self._warned: set[str] = set()

    @contextmanager
    def __call__(self, part: str, what: str | None = None, *, fatal: bool = False,
                 passthrough: tuple[type[BaseException], ...] = ()) -> Iterator[None]:
        try:
            yield
        except passthrough:
            raise
        except Exception:   # monitoring never takes training down
            self.off = self.off or fatal
            if part not in self.failed:
                self.failed.add(part)
                log.exception("stability: %s failed; %s", what or part,
                              "monitoring is off for this run" if fatal
                              else "monitoring continues without it")

    def call(self, part: str, fn: Callable[[], Any], default: Any = None) -> Any:
        """``fn()``, or ``default`` when it raised (logged once per part)."""
        with self(part):
            return fn()
        return default

    def warn_once(self, key: str, msg: str, *args, level: int = logging.WARNING) -> None:
        if key not in self._warned:
            self._warned.add(key)
            log.log(level, msg, *args)
