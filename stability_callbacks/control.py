"""Requests in, actions out (detect → decide → act; HF's TrainerControl idea).

The policy only flips fields of :class:`Control`, each request with its reason; an integration
carries them out in its framework's own way, reports each thing it did as an :class:`Action`
(a run-log line and a listener event), and then calls :meth:`Control.step_done`, the one place
where one-shot requests are reset.

Two requests outlive a step: the skip-step rule (``skip_threshold``, applied on the device
before every optimizer step) and the standing data skips and LR scaling of the automatic
rollbacks (:class:`DataSkips`, part of the policy's state, so a checkpoint carries them).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .record import Finding

#: What an integration did (the ``action`` field of a run-log ``action`` line).
ACTIONS = ("save", "save_blocked", "save_interval", "stop", "rollback")


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
    - ``skip_threshold``: the skip-step rule for the next optimizer steps (``policy.skip_step_on``):
      None = never skip; otherwise skip a step whose global grad norm is non-finite or above this
      value (``inf``: non-finite only). Decided on the device, identically on every rank.
    - ``rollback_request``: go back to a checkpoint now (:class:`RollbackRequest`;
      ``policy.auto_rollback``). Reset by :meth:`rollback_done` once carried out or refused.
    - ``saves_carried_out`` / ``user_save_interval_steps``: what the integration told it: whether
      it carries out save requests, and the save interval of its own (HF: ``save_steps``), so
      that a message never claims a save or an interval bump that does not happen (None:
      unknown, as in a replay).
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
    skip_threshold: float | None = None
    rollback_request: "RollbackRequest | None" = None
    saves_carried_out: bool | None = None
    user_save_interval_steps: int | None = None

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
            return f"bumped save interval ({interval} step{'' if interval == 1 else 's'}){why}"
        return None

    @property
    def damage(self) -> str:
        """Why saves are blocked, as a sentence part (while ``state_is_good`` is False)."""
        advice = self.rollback
        if advice is not None and advice.details.get("trigger"):
            return f"the weights are damaged ({advice.details['trigger']} at step {advice.step})"
        return "the weights are damaged"

    def halt(self, reason: str) -> None:
        """Stop training (sticky), for ``reason``: what an integration requests when it cannot
        carry out another request (an automatic rollback it must refuse or that failed)."""
        self.stop, self.stop_reason = True, reason

    def step_done(self) -> None:
        """The integration has carried out the one-shot requests of this step."""
        self.save_now = False
        self.save_reason = None

    def rollback_done(self) -> None:
        """The integration has carried out (or could not carry out) the rollback request."""
        self.rollback_request = None


@dataclass
class Action:
    """One thing an integration did: a run-log ``action`` line (docs/design.md, Run log) and what
    listeners receive. ``action`` is one of :data:`ACTIONS`; ``path`` for a save or the checkpoint
    a rollback loaded; ``interval`` for a save-interval change (None: back to the user's own);
    ``details`` for a rollback (``checkpoint_step``, ``skip_steps``, ``lr_factor``, ...).

    >>> Action(21, "save", "before the halt", path="ckpt/checkpoint-21").to_json()
    {'type': 'action', 'step': 21, 'action': 'save', 'reason': 'before the halt', 'path': 'ckpt/checkpoint-21'}
    """

    step: int
    action: str
    reason: str
    path: str | None = None
    interval: int | None = None
    details: dict | None = None

    def __post_init__(self):
        if self.action not in ACTIONS:
            raise ValueError(f"action must be one of {', '.join(ACTIONS)}, got {self.action!r}")

    def to_json(self) -> dict:
        out = {"type": "action", "step": self.step, "action": self.action, "reason": self.reason}
        if self.path is not None:
            out["path"] = self.path
        if self.action == "save_interval":
            out["interval"] = self.interval
        if self.details:
            out.update(self.details)
        return out


@dataclass
class DataSkips:
    """The standing requests of automatic rollbacks: the data the run no longer reads and the LR
    scaling in force (part of the policy's state, so every checkpoint carries them).

    A *data step* numbers the batches as a run without skips reads them: data step ``d`` is what
    optimizer step ``d`` reads there (``G`` samples per step: samples ``[(d-1)·G, d·G)`` of the
    data order; per rank, micro-batches ``[(d-1)·GA, d·GA)`` of the rank's loader).

    - ``ranges``: ``[[first, last], ...]`` data steps never read again (inclusive, sorted,
      disjoint). Optimizer step ``s`` reads the ``s``-th data step outside them.
    - ``lr_window``: ``[first_step, last_step, factor]``: optimizer steps run with the LR
      scaled by ``factor``, or None.
    - ``attempts``: automatic rollbacks carried out so far.

    >>> skips = DataSkips().after_rollback(checkpoint_step=20, skip_steps=(25, 35), lr_factor=0.5,
    ...                                    lr_factor_steps=10)
    >>> skips.ranges, skips.lr_window, [skips.data_step(s) for s in (24, 25, 26)]
    ([[25, 35]], [21, 30, 0.5], [24, 36, 37])
    >>> skips.after_rollback(checkpoint_step=30, skip_steps=(39, 40)).ranges   # data steps 50-51
    [[25, 35], [50, 51]]
    """

    ranges: list = field(default_factory=list)
    lr_window: list | None = None
    attempts: int = 0

    def data_step(self, step: int) -> int:
        """The data step optimizer step ``step`` reads."""
        d = int(step)
        for first, last in self.ranges:
            if d < first:
                break
            d += last - first + 1
        return d

    def skipped(self, data_step: int) -> bool:
        return any(first <= data_step <= last for first, last in self.ranges)

    def lr_factor_at(self, step: int) -> float:
        """The LR factor for optimizer step ``step`` (1.0 outside the window)."""
        w = self.lr_window
        return float(w[2]) if w is not None and w[0] <= step <= w[1] else 1.0

    def after_rollback(self, *, checkpoint_step: int, skip_steps: tuple[int, int],
                       lr_factor: float = 1.0, lr_factor_steps: int = 0) -> "DataSkips":
        """The standing requests once the run went back to ``checkpoint_step`` and skips the data
        of optimizer steps ``skip_steps`` (numbered as the abandoned branch counted them)."""
        first, last = (self.data_step(s) for s in skip_steps)
        ranges = sorted([list(r) for r in self.ranges] + [[first, last]])
        merged: list = []
        for a, b in ranges:
            if merged and a <= merged[-1][1] + 1:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        window = None
        if lr_factor != 1.0 and lr_factor_steps > 0:
            window = [checkpoint_step + 1, checkpoint_step + lr_factor_steps, float(lr_factor)]
        return DataSkips(merged, window, self.attempts + 1)

    def state_dict(self) -> dict[str, Any]:
        return {"ranges": [list(r) for r in self.ranges], "lr_window": self.lr_window,
                "attempts": self.attempts}

    @classmethod
    def from_state(cls, d: dict[str, Any]) -> "DataSkips":
        return cls([list(r) for r in d["ranges"]], d["lr_window"], int(d["attempts"]))


@dataclass
class RollbackRequest:
    """Go back now (``policy.auto_rollback``): load the checkpoint of ``checkpoint_step``
    (``checkpoint_path``), then train on with ``skips`` installed (the data of ``skip_steps``
    skipped, the LR scaled by ``lr_factor`` for ``lr_factor_steps`` steps). Decided at ``step``;
    ``attempt`` of ``max_attempts``; ``reason`` names the trigger. ``skips`` replaces the
    checkpoint's own (older) standing requests once it is loaded."""

    step: int
    checkpoint_step: int
    checkpoint_path: str | None
    skip_steps: tuple[int, int]
    lr_factor: float
    lr_factor_steps: int
    attempt: int
    max_attempts: int
    reason: str
    skips: DataSkips

    def action(self, what: str | None = None) -> Action:
        """The run-log ``action`` line of carrying it out."""
        return Action(self.step, "rollback", what or self.reason, path=self.checkpoint_path,
                      details={"checkpoint_step": self.checkpoint_step,
                               "skip_steps": list(self.skip_steps), "lr_factor": self.lr_factor,
                               "lr_factor_steps": self.lr_factor_steps, "attempt": self.attempt})
