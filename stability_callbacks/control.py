"""Requests from the policy to the integration (detect → decide → act; HF's TrainerControl idea).

The policy only flips fields here; an integration carries them out in its framework's own way
and then calls :meth:`Control.step_done`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .record import Finding


@dataclass
class Control:
    """What the integration should do after this step.

    - ``save_now``: save a checkpoint at this step (reset by :meth:`step_done`).
    - ``save_interval_steps``: the save interval to use now, or ``None`` for the user's own.
      Set while inside the warmup-end risk window or after an instability; ``None`` again after.
    - ``stop``: halt training gracefully (sticky). Decided identically on every rank because
      every rank feeds the Monitor the same reduced values.
    - ``alerts``: findings to hand to the alert sinks (reset by :meth:`step_done`).
    - ``state_is_good``: False once a critical finding says the current weights are damaged;
      an integration must then not save over the last good checkpoint (not even before a halt).
    - ``rollback``: the latest ``rollback_advice`` finding, if any (sticky).
    """

    save_now: bool = False
    save_interval_steps: int | None = None
    stop: bool = False
    alerts: list[Finding] = field(default_factory=list)
    state_is_good: bool = True
    rollback: Finding | None = None

    def save_due(self, step: int, last_saved_step: int | None = None) -> bool:
        """Whether an integration that saves by itself should save at ``step``: never while the
        state is damaged; otherwise on save-now, on the bumped interval, and once before a halt.

        >>> Control(save_interval_steps=50).save_due(100), Control(stop=True, state_is_good=False).save_due(7)
        (True, False)
        """
        if not self.state_is_good or step == last_saved_step:
            return False
        return self.save_now or self.stop or bool(self.save_interval_steps and step % self.save_interval_steps == 0)

    def step_done(self) -> None:
        """The integration has carried out the one-shot requests of this step."""
        self.save_now = False
        self.alerts = []
