"""Decide: severities + LR phase → requests on the :class:`~stability_callbacks.control.Control`.

Detectors only report; the policy escalates (``warmup_instability``), asks for saves, interval
bumps and halts, and writes the ``rollback_advice`` (PaLM / BigScience: go back to a checkpoint
before the onset and skip the batches since). O(1) per update; state: 8 scalars and two short
lists (recent leading signals, known checkpoints).
"""
from __future__ import annotations

from .control import Control
from .detectors.base import Context, check, positive_int
from .record import Finding, severity_rank

#: Findings that mean the current weights are damaged: never save over the last good checkpoint.
DAMAGE_KINDS = frozenset({"nonfinite", "divergence", "spike_unrecovered", "loss_scale_collapse"})
#: Events, not instabilities: never escalated, never a reason to save.
EVENT_KINDS = frozenset({"warmup_end", "warmup_instability", "resume", "preflight", "rollback_advice"})
#: Unmistakable even in the first steps.
UNMISTAKABLE_KINDS = frozenset({"nonfinite", "stall", "data_repetition"})
#: Signals that lead a loss spike; their onsets locate the start of an episode.
LEADING_KINDS = frozenset({"grad_norm_spike", "second_moment_surge", "overflow_burst", "loss_spike",
                           "loss_scale_collapse", "grad_norm_growth"})

_MAX_CHECKPOINTS = 32
_MAX_LEADS = 16


class Policy:
    """Turns findings into requests.

    - ``halt_on``: ``never`` (default) or ``critical``: stop on any critical finding.
    - ``save_on``: severity from which a finding asks for a save now (while the state is good).
    - ``bump_save_interval_to``: the save interval inside the warmup-end risk window and for
      ``bump_duration_steps`` after a warning (BigScience went to SAVE_INTERVAL=300).
    - ``startup_steps``: findings in the first steps are ``info`` unless unmistakable.
    - ``lead_window_steps``: how far back a leading signal (grad norm, Adam variance, overflow)
      moves the onset of an episode (BLOOM-176B: the grad norm led the loss by 5 steps; 104B: 1).
    """

    _state = ("bump_until", "last_escalation", "leads", "checkpoints", "last_save_request")

    def __init__(self, *, halt_on: str = "never", save_on: str = "warning",
                 bump_save_interval_to: int = 300, bump_duration_steps: int = 1000,
                 startup_steps: int = 20, lead_window_steps: int = 20,
                 escalation_gap_steps: int = 100, min_save_gap_steps: int = 10):
        self.halt_on = check("halt_on", halt_on, halt_on in ("never", "critical"), "'never' or 'critical'")
        self.save_on = check("save_on", save_on, save_on in ("never", "info", "warning", "critical"),
                             "one of never, info, warning, critical")
        self.bump_save_interval_to = positive_int("bump_save_interval_to", bump_save_interval_to)
        self.bump_duration_steps = positive_int("bump_duration_steps", bump_duration_steps)
        self.startup_steps = check("startup_steps", startup_steps,
                                   isinstance(startup_steps, int) and startup_steps >= 0, "an integer ≥ 0")
        self.lead_window_steps = positive_int("lead_window_steps", lead_window_steps)
        self.escalation_gap_steps = positive_int("escalation_gap_steps", escalation_gap_steps)
        self.min_save_gap_steps = positive_int("min_save_gap_steps", min_save_gap_steps)
        self.bump_until: int | None = None
        self.last_escalation: int | None = None
        self.last_save_request: int | None = None
        self.leads: list = []          # [[step, kind], ...] recent leading-signal onsets
        self.checkpoints: list = []    # [[step, path, good], ...] newest last

    # -- bookkeeping --------------------------------------------------------------------------
    def note_checkpoint(self, step: int, path: str | None, good: bool) -> None:
        self.checkpoints = [c for c in self.checkpoints if c[0] != step]
        self.checkpoints.append([int(step), path, bool(good)])
        self.checkpoints = self.checkpoints[-_MAX_CHECKPOINTS:]

    def forget_after(self, step: int) -> None:
        """A rollback to ``step``: the checkpoints after it belong to the abandoned future."""
        self.checkpoints = [c for c in self.checkpoints if c[0] <= step]
        self.leads = [lead for lead in self.leads if lead[0] <= step]

    # -- deciding -----------------------------------------------------------------------------
    def decide(self, findings: list[Finding], ctx: Context, control: Control,
               risk_window: tuple[int, int] | None) -> list[Finding]:
        step = ctx.step
        if not findings:   # the ordinary step: only the save interval can change
            self._set_interval(ctx, control, risk_window)
            control.alerts = []
            return []
        extra: list[Finding] = []
        for f in findings:
            if ctx.in_startup and f.kind not in UNMISTAKABLE_KINDS and f.kind not in EVENT_KINDS:
                if f.severity != "info":
                    f.details["startup_severity"] = f.severity
                    f.severity = "info"
            if f.kind in LEADING_KINDS and not ctx.in_startup:   # start-up transients lead nothing
                self.leads.append([f.onset_step if f.onset_step is not None else f.step, f.kind])
        # Leads older than the window are dropped, except those leading a still-open loss spike.
        horizon = min(step, ctx.loss_spike_onset if ctx.loss_spike_onset is not None else step)
        self.leads = [lead for lead in self.leads if horizon - lead[0] <= self.lead_window_steps][-_MAX_LEADS:]

        serious = [f for f in findings if f.kind not in EVENT_KINDS and severity_rank(f.severity) >= 1]
        if serious and ctx.in_risk_window and risk_window is not None and (
                self.last_escalation is None or step - self.last_escalation >= self.escalation_gap_steps):
            self.last_escalation = step
            first = serious[0]
            extra.append(Finding(
                step=step, kind="warmup_instability", severity="critical", signal=first.signal,
                value=first.value, baseline=first.baseline, onset_step=first.onset_step,
                message=(f"{first.kind} at step {step} came {step - risk_window[0]} steps after the LR "
                         f"warmup ended (step {risk_window[0]}): the window where BigScience's 104B runs "
                         f"glitched and never recovered. Escalating: checkpoints every "
                         f"{self.bump_save_interval_to} steps; if the loss does not come back, roll back "
                         f"and lower the peak LR, lengthen warmup or use beta2=0.95."),
                details={"trigger": first.kind, "risk_window": list(risk_window)}))
        if serious:
            self.bump_until = max(self.bump_until or 0, step + self.bump_duration_steps)

        damaged = [f for f in findings if f.kind in DAMAGE_KINDS and f.severity == "critical"]
        if damaged and control.state_is_good:
            control.state_is_good = False
            control.rollback = self._rollback_advice(step, damaged[0], ctx.loss_spike_onset)
            extra.append(control.rollback)
        halting = self.halt_on == "critical" and any(f.severity == "critical" for f in findings + extra)
        if halting and control.rollback is None:   # a halt always says where to go back to
            trigger = next(f for f in findings + extra if f.severity == "critical")
            control.rollback = self._rollback_advice(step, trigger, ctx.loss_spike_onset)
            extra.append(control.rollback)

        every = findings + extra
        asking = next((f for f in every if f.kind not in EVENT_KINDS
                       and severity_rank(f.severity) >= severity_rank(self.save_on)), None)
        if (control.state_is_good and self.save_on != "never" and asking is not None
                and (self.last_save_request is None or step - self.last_save_request >= self.min_save_gap_steps)):
            control.save_now = True
            control.save_reason = f"save now: {asking.kind} ({asking.severity}) at step {step}"
            self.last_save_request = step
        self._set_interval(ctx, control, risk_window)
        if halting and not control.stop:
            control.stop = True
            trigger = next((f for f in every if f.severity == "critical" and f.kind != "rollback_advice"),
                           every[0])
            control.stop_reason = (f"{trigger.kind} ({trigger.severity}) at step {step}; "
                                   f"policy.halt_on = critical")
        control.alerts = every
        return extra

    def _set_interval(self, ctx: Context, control: Control, risk_window: tuple[int, int] | None) -> None:
        """The bumped save interval (and why) inside the risk window and after a warning."""
        if ctx.in_risk_window and risk_window is not None:
            control.save_interval_steps = self.bump_save_interval_to
            control.save_interval_reason = (f"inside the warmup-end risk window (steps "
                                            f"{risk_window[0] + 1}-{risk_window[1]})")
        elif self.bump_until is not None and ctx.step <= self.bump_until:
            control.save_interval_steps = self.bump_save_interval_to
            control.save_interval_reason = (f"for {self.bump_duration_steps} steps after a warning "
                                            f"(until step {self.bump_until})")
        else:
            control.save_interval_steps = control.save_interval_reason = None

    def _rollback_advice(self, step: int, trigger: Finding, open_spike_onset: int | None) -> Finding:
        """Onset = the earliest of the trigger's onset, an open loss spike, and the leading signals
        (grad norm, Adam variance, overflows) within ``lead_window_steps`` before it."""
        onset = trigger.onset_step if trigger.onset_step is not None else trigger.step
        if open_spike_onset is not None:
            onset = min(onset, open_spike_onset)
        led_by = None
        for lead_step, kind in sorted(self.leads):
            if onset - self.lead_window_steps <= lead_step < onset:
                onset, led_by = lead_step, kind
        good = [c for c in self.checkpoints if c[0] < onset and c[2]]
        ckpt = good[-1] if good else None
        first_skip = onset
        details = {"checkpoint_step": ckpt[0] if ckpt else None, "checkpoint_path": ckpt[1] if ckpt else None,
                   "onset_step": onset, "skip_steps": [first_skip, step], "trigger": trigger.kind,
                   "led_by": led_by}
        where = (f"the checkpoint of step {ckpt[0]}" + (f" ({ckpt[1]})" if ckpt[1] else "")
                 if ckpt else f"the last checkpoint saved before step {onset}")
        lead_txt = f" ({led_by} led the loss)" if led_by else ""
        return Finding(
            step=step, kind="rollback_advice", severity="critical", signal=trigger.signal,
            onset_step=onset, details=details,
            message=(f"Roll back: {trigger.kind} at step {step}; the episode began at step {onset}{lead_txt}. "
                     f"Resume from {where} and skip the batches of steps {first_skip}-{step} "
                     f"({step - first_skip + 1} steps; Megatron: --skip-train-iteration-range "
                     f"{first_skip}-{step}). If it happens again at the same place, change the seed or "
                     f"the data order (PaLM, BigScience)."))

    # -- state ----------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {k: getattr(self, k) for k in self._state}

    def load_state_dict(self, d: dict) -> None:
        if set(d) != set(self._state):
            raise ValueError(f"policy state keys {sorted(d)} do not match {sorted(self._state)}")
        for k in self._state:
            setattr(self, k, d[k])


__all__ = ["Policy", "DAMAGE_KINDS", "EVENT_KINDS"]
