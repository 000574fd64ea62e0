"""Requests in, actions out (detect → decide → act; HF's TrainerControl idea).

The policy only flips fields of :class:`Control`, each request with its reason; an integration
carries them out in its framework's own way, reports each thing it did as an :class:`Action`
(a run-log line and a listener event), and then calls :meth:`Control.step_done`, the one place
where one-shot requests are reset.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .record import Finding

#: What an integration did (the ``action`` field of a run-log ``action`` line).
ACTIONS = ("save", "save_blocked", "save_interval", "stop")


@dataclass
class Control:
    """What the integration should do after this step, and why.

    - ``save_now``: save a checkpoint at this step (reset by :meth:`step_done`);
      ``save_reason`` says which finding asked.
    - ``save_interval_steps``: the save interval to use now, or ``None`` for the user's own.
      Set while inside the warmup-end risk window or after an instability; ``None`` again after.
      ``save_interval_reason`` says which of the two.
    - ``stop``: halt training gracefully (sticky); ``stop_reason`` names the trigger. Decided
      identically on every rank because every rank feeds the Monitor the same reduced values.
    - ``alerts``: the findings of the latest update, for the alert sinks (replaced by every
      update; :class:`~stability_callbacks.live.LiveRun` delivers them itself).
    - ``state_is_good``: False once a critical finding says the current weights are damaged;
      an integration must then not save over the last good checkpoint (not even before a halt).
    - ``rollback``: the latest ``rollback_advice`` finding, if any (sticky).
    """

    save_now: bool = False
    save_reason: str | None = None
    save_interval_steps: int | None = None
    save_interval_reason: str | None = None
    stop: bool = False
    stop_reason: str | None = None
    alerts: list[Finding] = field(default_factory=list)
    state_is_good: bool = True
    rollback: Finding | None = None

    def save_request(self, step: int, last_saved_step: int | None = None, *,
                     interval: int | None = None) -> str | None:
        """Why an integration that saves by itself should save at ``step`` (None: no save): once
        before a halt, on save-now, on the bumped interval (``interval``: the one to test when not
        ``save_interval_steps``). Whether the weights may be saved is ``state_is_good``'s
        answer: a request while they are damaged is a blocked save.

        >>> Control(save_interval_steps=50, save_interval_reason="inside the risk window").save_request(100)
        'bumped save interval (50 steps): inside the risk window'
        >>> Control(save_now=True, save_reason="save now: loss_spike (warning) at step 7").save_request(7, 7) is None
        True
        """
        if step == last_saved_step:
            return None
        if self.stop:
            return f"before the halt: {self.stop_reason}" if self.stop_reason else "before the halt"
        if self.save_now:
            return self.save_reason or "save now"
        interval = interval or self.save_interval_steps
        if interval and step % interval == 0:
            why = f": {self.save_interval_reason}" if self.save_interval_reason else ""
            return f"bumped save interval ({interval} steps){why}"
        return None

    @property
    def damage(self) -> str:
        """Why saves are blocked, as a sentence part (while ``state_is_good`` is False)."""
        advice = self.rollback
        if advice is not None and advice.details.get("trigger"):
            return f"the weights are damaged ({advice.details['trigger']} at step {advice.step})"
        return "the weights are damaged"

    def step_done(self) -> None:
        """The integration has carried out the one-shot requests of this step."""
        self.save_now = False
        self.save_reason = None


@dataclass
class Action:
    """One thing an integration did: a run-log ``action`` line (extends DESIGN 2.3) and what
    listeners receive. ``action`` is one of :data:`ACTIONS`; ``path`` for a save; ``interval``
    for a save-interval change (None: back to the user's own).

    >>> Action(21, "save", "before the halt", path="ckpt/checkpoint-21").to_json()
    {'type': 'action', 'step': 21, 'action': 'save', 'reason': 'before the halt', 'path': 'ckpt/checkpoint-21'}
    """

    step: int
    action: str
    reason: str
    path: str | None = None
    interval: int | None = None

    def __post_init__(self):
        if self.action not in ACTIONS:
            raise ValueError(f"action must be one of {', '.join(ACTIONS)}, got {self.action!r}")

    def to_json(self) -> dict:
        out = {"type": "action", "step": self.step, "action": self.action, "reason": self.reason}
        if self.path is not None:
            out["path"] = self.path
        if self.action == "save_interval":
            out["interval"] = self.interval
        return out
