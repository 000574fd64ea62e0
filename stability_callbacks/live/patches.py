"""Methods replaced on one object's instance, and put back: how the integrations wrap a
framework's methods without touching its class."""
from __future__ import annotations

from typing import Any


class InstancePatches:
    """Methods replaced on one object's instance ``__dict__``, put back by :meth:`restore`.

    Instance attributes shadow the class's methods (``nn.Module.__setattr__`` stores plain
    functions there too, where ``Module.__call__`` finds ``forward``). An earlier instance-level
    wrap is kept and restored; otherwise the instance entry is removed and the class's shows.
    """

    def __init__(self, obj: Any):
        self.obj = obj
        self._originals: dict[str, Any] = {}

    def set(self, name: str, fn: Any) -> None:
        self._originals[name] = self.obj.__dict__.get(name)
        setattr(self.obj, name, fn)

    def restore(self) -> None:
        for name, prev in self._originals.items():
            if prev is None:
                self.obj.__dict__.pop(name, None)
            else:
                setattr(self.obj, name, prev)
        self._originals.clear()
