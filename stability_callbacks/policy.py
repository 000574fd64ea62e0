"""Decide: severities + LR phase → requests on the :class:`~stability_callbacks.control.Control`.

Detectors only report; the policy escalates (``warmup_instability``), asks for saves, interval
bumps and halts, and writes the ``rollback_advice`` (PaLM / BigScience: go back to a checkpoint
before the onset and skip the batches since). Opt-in, it also acts on its own: the skip-step
rule (``skip_step_on``: the device-side threshold on the next steps' grad norm, and a
``step_skipped`` finding for every step it dropped) and automatic rollbacks (``auto_rollback``:
a :class:`~stability_callbacks.control.RollbackRequest` instead of a halt, announced by an
``auto_rollback`` finding). O(1) per update; state: 8 scalars, three short lists (recent
leading signals, known checkpoints, recent skips) and the rollbacks' standing requests.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Mapping

from . import keys
from .control import Control, DataSkips, RollbackRequest
from .detectors.base import Context, check, count, fmt, positive_int
from .params import in_interval, int_at_least, is_number, one_of
from .record import Finding, StepRecord, severity_rank

#: Findings that mean the current weights are damaged: never save over the last good checkpoint.
#: (Also a critical finding with ``details["damage"]``: skips escalated by non-finite grads, every
#: step failing although no update was applied.)
DAMAGE_KINDS = frozenset({"nonfinite", "divergence", "spike_unrecovered", "loss_scale_collapse"})
#: Events, not instabilities: never escalated, never a reason to save (nor is a run not learning:
#: its weights are worth no more checkpoints).
EVENT_KINDS = frozenset({"warmup_end", "warmup_instability", "resume", "preflight", "rollback_advice", "saves_resumed",
                         "step_skipped", "auto_rollback", "not_learning"})
#: ``skip_step_on``: never; non-finite grad norms; non-finite or extreme outliers.
SKIP_STEP_ON = ("never", "nonfinite", "grad_outlier")
#: ``warmup_escalation``: critical with the precursor signature (tr8's meaning) or always.
WARMUP_ESCALATION = ("signature", "any")
#: Unmistakable even in the first steps.
UNMISTAKABLE_KINDS = frozenset({"nonfinite", "stall", "data_repetition"})
#: Signals that lead a loss spike; their onsets locate the start of an episode.
LEADING_KINDS = frozenset({"grad_norm_spike", "second_moment_surge", "overflow_burst", "loss_spike",
                           "loss_scale_collapse", "grad_norm_growth", "precursor"})
#: Spikes whose onset a ``precursor`` lead sets (their message names the lead).
LED_BY_PRECURSOR = frozenset({"loss_spike", "grad_norm_spike"})

#: What the warmup-end escalation looks at: instabilities of training (not an LR event such as
#: ``lr_anomaly``, the cause of what follows it, nor findings about the data or the log).
ESCALATED_KINDS = frozenset({"loss_spike", "spike_unrecovered", "divergence", "level_shift", "nonfinite",
                             "grad_norm_spike", "grad_norm_growth", "second_moment_surge", "overflow_burst",
                             "loss_scale_collapse"})


@dataclass(frozen=True)
class SignatureLead:
    """One lead of the precursor signature (not the ``precursor`` detector,
    :class:`~stability_callbacks.detectors.Precursor`, whose finding is one of them): a leading
    signal that, seen *before* a loss spike in
    the warmup-end risk window, makes it the 104B pattern rather than a bad batch (tr8-104B: the
    grad norm and Adam's variance rose first; fp16 runs also lose loss scale). ``kinds``: the
    findings that count as its lead; ``what``: how the message names it."""

    name: str
    kinds: frozenset[str]
    what: str


#: The precursor signature, extensible by adding a :class:`SignatureLead`.
SIGNATURE_LEADS: tuple[SignatureLead, ...] = (
    SignatureLead("grad_norm", frozenset({"grad_norm_spike", "grad_norm_growth"}), "the grad norm rose first"),
    SignatureLead("adam_variance", frozenset({"second_moment_surge"}), "Adam's second moment rose first"),
    SignatureLead("loss_scale", frozenset({"loss_scale_collapse", "overflow_burst"}), "the fp16 loss scale was falling"),
    SignatureLead("update", frozenset({"precursor"}), "Adam's update or first moment rose first"),
)


def precursor_signature(leads: list, onset: int, window_steps: int,
                        precursors: tuple[SignatureLead, ...] = SIGNATURE_LEADS) -> list[SignatureLead]:
    """The precursors with a lead (``[step, kind, ...]``) in the ``window_steps`` steps before ``onset``.

    >>> [p.name for p in precursor_signature([[95, "grad_norm_spike"], [100, "second_moment_surge"]], 100, 20)]
    ['grad_norm']
    """
    return [p for p in precursors if any(onset - window_steps <= st < onset and kind in p.kinds
                                         for st, kind, *_ in leads)]


_MAX_CHECKPOINTS = 32


def save_interval_before(onset: int, cap: int) -> int | None:
    """A save interval that puts a checkpoint before step ``onset``: the largest of 1, 2, 5 x 10^k
    below ``onset``, at most ``cap``; None when nothing can come before it (step 1).

    >>> save_interval_before(22, 300), save_interval_before(40760, 300), save_interval_before(1, 300)
    (20, 300, None)
    """
    if onset <= 1:
        return None
    nice = [m * 10 ** k for k in range(len(str(onset))) for m in (1, 2, 5)]
    return min(cap, max(x for x in nice if x < onset))
_MAX_LEADS = 16
_SINCE_ROLLBACKS = ("skips", "data_skips")   # state keys a checkpoint from before them lacks
#: Points in a row at the loss's level from before a damage finding (within RESTORED_MARGIN of
#: it, or below) that resume the saves.
RESTORED_POINTS = 10
RESTORED_MARGIN = 0.1


@dataclass(frozen=True, kw_only=True)
class AutoRollback:
    """``policy.auto_rollback``: on a finding that would halt (any critical one), go back to the
    checkpoint the rollback advice names, skip the data of the episode and train on.

    - ``max_attempts``: automatic rollbacks per run; the next halt-level finding halts.
    - ``lr_factor``: LR multiplier after a rollback (1.0: unchanged), for ``lr_factor_steps``
      optimizer steps from the checkpoint on.
    - ``skip_extra_steps``: data steps skipped past the detection step (a margin: the bad
      pocket may reach further than what was seen).

    >>> AutoRollback(lr_factor=2.0)
    Traceback (most recent call last):
    ...
    ValueError: lr_factor must be in (0, 1], got 2.0
    """

    max_attempts: int = 2
    lr_factor: float = 1.0
    lr_factor_steps: int = 100
    skip_extra_steps: int = 0

    def __post_init__(self):
        positive_int("max_attempts", self.max_attempts)
        in_interval("lr_factor", self.lr_factor, 0.0, 1.0, high_open=False)
        int_at_least("lr_factor_steps", self.lr_factor_steps, 0)
        int_at_least("skip_extra_steps", self.skip_extra_steps, 0)


def _auto_rollback(value: Any) -> AutoRollback | None:
    """``policy.auto_rollback`` as given: null/false (off), a mapping of its keys, or the object."""
    if value is None or value is False or isinstance(value, AutoRollback):
        return value or None
    known = [f.name for f in fields(AutoRollback)]
    if not isinstance(value, Mapping):
        raise ValueError(f"auto_rollback must be a mapping of {', '.join(known)} (or null), got {value!r}")
    for k in value:
        if k not in known:
            raise ValueError(f"auto_rollback.{k}: unknown key (known: {', '.join(known)})")
    try:
        return AutoRollback(**value)
    except ValueError as e:
        raise ValueError(f"auto_rollback.{e}") from None


class Policy:
    """Turns findings into requests.

    - ``halt_on``: ``never`` (default) or ``critical``: stop on any critical finding.
    - ``save_on``: severity from which a finding asks for a save now (while the state is good).
    - ``bump_save_interval_to``: the save interval inside the warmup-end risk window and for
      ``bump_duration_steps`` after a warning (BigScience went to SAVE_INTERVAL=300).
    - ``startup_steps``: findings in the first steps are ``info`` unless unmistakable.
    - ``warmup_escalation``: ``signature`` (default): an instability in the warmup-end risk
      window is a ``warmup_instability`` warning, critical only with the precursor signature or
      a critical episode (:meth:`_escalate`); ``any``: always critical (halt on any instability
      right after warmup, for runs where a person looks before a spike plays out).
    - ``lead_window_steps``: how far back a leading signal (grad norm, Adam variance, overflow)
      moves the onset of an episode (BLOOM-176B: the grad norm led the loss by 5 steps; 104B: 1).
    - ``skip_step_on``: ``never`` (default), ``nonfinite`` or ``grad_outlier``: drop the update of
      a step whose global grad norm is non-finite (or, for ``grad_outlier``, above
      ``skip_grad_ratio`` x the ``grad_norm_spike`` detector's baseline, once that baseline is
      warm and start-up is over). Decided on the device before the optimizer step; every skip
      is a ``step_skipped`` finding, and the ``skip_escalate_count``-th within
      ``skip_window_steps`` steps is critical.
    - ``auto_rollback``: null (default) or :class:`AutoRollback`'s keys.
    """

    _state = ("bump_until", "escalation", "lr_jump_step", "leads", "checkpoints", "last_save_request",
              "skips", "data_skips", "damage", "startup_spike")

    def __init__(self, *, halt_on: str = "never", save_on: str = "warning",
                 bump_save_interval_to: int = 300, bump_duration_steps: int = 1000,
                 startup_steps: int = 20, lead_window_steps: int = 20, warmup_escalation: str = "signature",
                 escalation_gap_steps: int = 100, min_save_gap_steps: int = 10,
                 skip_step_on: str = "never", skip_grad_ratio: float = 10.0,
                 skip_escalate_count: int = 3, skip_window_steps: int = 100,
                 auto_rollback: Mapping | AutoRollback | None = None):
        self.halt_on = check("halt_on", halt_on, halt_on in ("never", "critical"), "'never' or 'critical'")
        self.save_on = check("save_on", save_on, save_on in ("never", "info", "warning", "critical"),
                             "one of never, info, warning, critical")
        self.bump_save_interval_to = positive_int("bump_save_interval_to", bump_save_interval_to)
        self.bump_duration_steps = positive_int("bump_duration_steps", bump_duration_steps)
        self.startup_steps = check("startup_steps", startup_steps,
                                   isinstance(startup_steps, int) and startup_steps >= 0, "an integer ≥ 0")
        self.lead_window_steps = positive_int("lead_window_steps", lead_window_steps)
        self.warmup_escalation = one_of("warmup_escalation", warmup_escalation, WARMUP_ESCALATION)
        self.escalation_gap_steps = positive_int("escalation_gap_steps", escalation_gap_steps)
        self.min_save_gap_steps = positive_int("min_save_gap_steps", min_save_gap_steps)
        self.skip_step_on = one_of("skip_step_on", skip_step_on, SKIP_STEP_ON)
        self.skip_grad_ratio = check("skip_grad_ratio", skip_grad_ratio,
                                     is_number(skip_grad_ratio) and skip_grad_ratio > 1, "a number > 1")
        self.skip_escalate_count = positive_int("skip_escalate_count", skip_escalate_count)
        self.skip_window_steps = positive_int("skip_window_steps", skip_window_steps)
        self.auto_rollback = _auto_rollback(auto_rollback)
        self.bump_until: int | None = None
        self.escalation: list | None = None   # [step, severity, onset] of the last warmup_instability
        self.lr_jump_step: int | None = None   # the last lr_anomaly
        #: The damage that stopped the saves: [the loss's level before it, points back at it in a
        #: row since, the finding's step] (None: none, or no level to come back to)
        self.damage: list | None = None
        self.last_save_request: int | None = None
        self.leads: list = []          # [[step, kind], ...] recent leading-signal onsets (a precursor's: + what moved)
        self.startup_spike: int | None = None   # the onset of a loss spike said inside the start-up, info only
        self.checkpoints: list = []    # [[step, path, good], ...] newest last
        self.skips: list = []          # steps skipped by skip_step_on, inside skip_window_steps
        self.data_skips = DataSkips()  # the automatic rollbacks' standing requests
        #: Whether every checkpoint the run writes is noted (a live run; not a replayed log): advice
        #: without a checkpoint before its onset then says that none was saved. Not state.
        self.checkpoints_seen = False

    # -- bookkeeping --------------------------------------------------------------------------
    def note_checkpoint(self, step: int, path: str | None, good: bool) -> None:
        """A checkpoint of ``step`` saved to ``path`` (``good``: the weights were good then). It
        replaces an earlier one of the same step, and one of an older step saved to the same
        path: that file now holds this step (a ``last.ckpt`` written at every save).

        >>> p = Policy()
        >>> for step in (10, 20):
        ...     p.note_checkpoint(step, "ckpt/last.ckpt", True)
        >>> p.note_checkpoint(20, "ckpt/step-20.ckpt", True)
        >>> p.checkpoints
        [[20, 'ckpt/step-20.ckpt', True]]
        """
        self.checkpoints = [c for c in self.checkpoints if c[0] != step and (path is None or c[1] != path)]
        self.checkpoints.append([int(step), path, bool(good)])
        self.checkpoints = self.checkpoints[-_MAX_CHECKPOINTS:]

    def forget_after(self, step: int) -> None:
        """A rollback to ``step``: the checkpoints after it belong to the abandoned future."""
        self.checkpoints = [c for c in self.checkpoints if c[0] <= step]
        self.leads = [lead for lead in self.leads if lead[0] <= step]
        self.skips = [s for s in self.skips if s <= step]

    # -- skip step --------------------------------------------------------------------------
    def review_skip(self, record: StepRecord, found: list[Finding], ctx: Context, control: Control,
                    grad_norm_spike=None) -> list[Finding]:
        """After the detectors saw ``record``: the skip-step rule for the next steps
        (``control.skip_threshold``, from ``grad_norm_spike``'s baseline) and, when the
        integration skipped this step (``skipped_by_policy``), its ``step_skipped`` finding. A
        ``nonfinite`` finding of a skipped step becomes ``info``: the weights never saw it."""
        if self.skip_step_on == "never":
            return []
        applied = control.skip_threshold
        control.skip_threshold = math.inf
        base = None
        if grad_norm_spike is not None and grad_norm_spike.base.n >= grad_norm_spike.cold_start_samples:
            base = grad_norm_spike.base.baseline
            if self.skip_step_on == "grad_outlier" and not ctx.in_startup:
                control.skip_threshold = self.skip_grad_ratio * base
        step, m = ctx.step, record.metrics
        if (m.get(keys.SKIPPED_BY_POLICY) or 0.0) < 1.0:
            return []
        if applied is not None and math.isfinite(applied):
            base = applied / self.skip_grad_ratio   # the baseline the skipped step was judged by
        for f in found:
            if f.kind == "nonfinite" and f.severity != "info":
                f.severity = "info"
                f.details["skipped_by_policy"] = True
                f.message = f"(Not applied: policy.skip_step_on skipped this step.) {f.message}"
        self.skips = [s for s in self.skips if step - s < self.skip_window_steps] + [step]
        n, count = len(self.skips), self.skip_escalate_count
        g, loss = m.get(keys.GRAD_NORM), m.get(keys.LOSS)
        if g is None or not math.isfinite(g):
            why = f"its grad norm was {g if g is not None else 'not finite'}"
            if loss is not None and not math.isfinite(loss):
                why += f" (loss {loss})"
        elif base is not None:
            why = f"its grad norm {fmt(g)} was {g / base:.1f}x the grad-norm baseline {fmt(base)}"
            if applied is not None and math.isfinite(applied):
                why += f" (skipped above {self.skip_grad_ratio:g}x = {fmt(applied)})"
        else:
            why = f"its grad norm was {fmt(g)}"
        head = (f"Step {step} was not applied (policy.skip_step_on = {self.skip_step_on}): {why}. "
                f"Adam's moments and step count are untouched; the step's batch is dropped.")
        if n == count:
            tail = (f" That is {n} skips since step {self.skips[0]} (within {self.skip_window_steps} "
                    f"steps): the weights or the data stream are going bad. Roll back to the last "
                    f"checkpoint before step {self.skips[0]} and skip the data since.")
        else:
            tail = (f" An isolated skip is harmless; {count} within {self.skip_window_steps} steps "
                    f"escalate to critical ({n} so far).")
        return [Finding(step=step, kind="step_skipped", severity="critical" if n == count else "warning",
                        message=head + tail, signal=keys.GRAD_NORM, value=g, baseline=base,
                        threshold=applied if applied is not None and math.isfinite(applied) else None,
                        onset_step=self.skips[0] if n == count else step,
                        details={"rule": self.skip_step_on, "skips_in_window": n,
                                 "damage": n == count and (g is None or not math.isfinite(g))})]

    # -- deciding -----------------------------------------------------------------------------
    def decide(self, findings: list[Finding], ctx: Context, control: Control,
               risk_window: tuple[int, int] | None) -> list[Finding]:
        """The step's findings -> the requests on ``control`` and the policy's own findings
        (the escalation, rollback advice, an automatic rollback), returned. One rule after
        another, each its own method: start-up findings are info (:meth:`_demote_in_startup`);
        leading signals are kept (:meth:`_note_lead`, :meth:`_drop_old_leads`) and name the spike
        they lead (:meth:`_led_by_precursor`); the warmup-end escalation and the bumped save
        interval (:meth:`_escalate_and_bump`); damage loses the good state and says where to go
        back to (:meth:`_advise_on_damage`); a halt or an automatic rollback
        (:meth:`_halt_or_roll_back`); a save (:meth:`_request_save`); the stop
        (:meth:`_request_stop`). ``control.alerts``: every finding of the step."""
        if not findings:   # the ordinary step: only the save interval (and the saves blocked) can change
            self._set_interval(ctx, control, risk_window)
            restored = self._restore(ctx, control) if self.damage is not None else []
            control.alerts = restored
            return restored
        for f in findings:
            self._demote_in_startup(f, ctx)
            self._note_lead(f, ctx)
            if f.kind == "loss_spike":
                onset = f.onset_step if f.onset_step is not None else f.step
                if f.severity == "info" and ctx.in_startup:
                    self.startup_spike = onset
                elif f.severity != "info" and onset == self.startup_spike:
                    self.startup_spike = None   # ... said at warning after all: an episode
        self._drop_old_leads(ctx)
        for f in findings:
            self._led_by_precursor(f)
        _one_event(findings)
        extra: list[Finding] = []
        escalation = self._escalate_and_bump(findings, ctx, risk_window)
        if escalation is not None:
            extra.append(escalation)
        extra += self._advise_on_damage(findings, ctx, control) or (
            self._restore(ctx, control) if self.damage is not None else [])
        halting, no_rollback, added = self._halt_or_roll_back(findings + extra, ctx, control)
        extra += added
        every = findings + extra
        self._request_save(every, ctx.step, control)
        self._set_interval(ctx, control, risk_window)
        if escalation is not None:   # said once the actions are decided: only what is done
            escalation.message = self._escalation_message(escalation, control,
                                                          saving=self.last_save_request == ctx.step)
        if halting and not control.stop:
            self._request_stop(every, ctx.step, control, no_rollback)
        control.alerts = every
        return extra

    @staticmethod
    def _demote_in_startup(f: Finding, ctx: Context) -> None:
        """During start-up (the first ``startup_steps``, or before a step succeeded) a finding is
        info, its severity kept in ``details["startup_severity"]`` and said in its message (its
        advice is for a warning): except the unmistakable ones, the events, and one whose detector
        knows its own start-up is over (``past_startup``)."""
        if (ctx.in_startup and f.kind not in UNMISTAKABLE_KINDS and f.kind not in EVENT_KINDS
                and not f.details.get("past_startup")):
            if f.severity != "info":
                f.details["startup_severity"] = f.severity
                f.message += (f" (Info, not {f.severity}: inside the run's start-up, where early transients are "
                              f"common; the advice is for it if it lasts.)")
                f.severity = "info"

    def _note_lead(self, f: Finding, ctx: Context) -> None:
        """A leading signal (:data:`LEADING_KINDS`, past start-up: start-up transients lead
        nothing) is kept as ``[onset, kind(, what moved)]``; a recovered spike ends its episode,
        so the leads before it start no later one."""
        if f.kind in LEADING_KINDS and not ctx.in_startup:
            lead = [f.onset_step if f.onset_step is not None else f.step, f.kind]
            if f.kind == "precursor":   # what moved, for the spike it leads to name
                lead.append(f.details.get("lead"))
            if lead not in self.leads:   # a precursor's persistence warning repeats its onset
                self.leads.append(lead)
        if f.kind == "spike_recovered":
            self.leads = [lead for lead in self.leads if lead[0] >= f.step]

    def _drop_old_leads(self, ctx: Context) -> None:
        """Leads older than ``lead_window_steps`` are dropped, except those leading a still-open
        loss spike; at most :data:`_MAX_LEADS` are kept."""
        step = ctx.step
        horizon = min(step, ctx.loss_spike_onset if ctx.loss_spike_onset is not None else step)
        self.leads = [lead for lead in self.leads if horizon - lead[0] <= self.lead_window_steps][-_MAX_LEADS:]

    def _escalate_and_bump(self, findings: list[Finding], ctx: Context,
                           risk_window: tuple[int, int] | None) -> Finding | None:
        """The serious findings (no event, warning or worse): the warmup-end escalation
        (:meth:`_escalate`, its finding returned) and the save interval bumped for
        ``bump_duration_steps``; an LR anomaly's step is remembered (what follows it is its effect)."""
        serious = [f for f in findings if f.kind not in EVENT_KINDS and severity_rank(f.severity) >= 1]
        if any(f.kind == "lr_anomaly" for f in findings):
            self.lr_jump_step = ctx.step
        escalation = self._escalate(serious, ctx, risk_window)
        if serious:
            self.bump_until = max(self.bump_until or 0, ctx.step + self.bump_duration_steps)
        return escalation

    def _advise_on_damage(self, findings: list[Finding], ctx: Context, control: Control) -> list[Finding]:
        """A critical finding that damaged the weights (:data:`DAMAGE_KINDS`, or ``details["damage"]``)
        while the state was good: the state is no longer good (no save from now on) and the
        rollback advice says where to go back to (returned, and on ``control.rollback``)."""
        damaged = [f for f in findings if f.severity == "critical"
                   and (f.kind in DAMAGE_KINDS or f.details.get("damage"))]
        if not (damaged and control.state_is_good):
            return []
        control.state_is_good = False
        control.rollback = self._rollback_advice(ctx.step, damaged[0], ctx)
        base = damaged[0].baseline if damaged[0].baseline is not None else ctx.loss_baseline
        self.damage = [base, 0, ctx.step] if base is not None and math.isfinite(base) and base > 0.0 else None
        return [control.rollback]

    def _restore(self, ctx: Context, control: Control) -> list[Finding]:
        """The saves blocked by a damage finding resume once the loss is back at its level from
        before it, ``RESTORED_POINTS`` points in a row at or below it (+``RESTORED_MARGIN``): the weights give the
        loss they gave before, so nothing the loss can show is damaged (a GAN's summed losses
        swinging back after a rise called a divergence; a NaN the scaler skipped). A saved
        checkpoint is then a good one again; an ``info`` says so."""
        d = self.damage
        x = ctx.loss
        if d is None or control.state_is_good:
            self.damage = None
            return []
        level = d[0] * (1.0 + RESTORED_MARGIN)
        d[1] = d[1] + 1 if x is not None and math.isfinite(x) and x <= level else 0
        if d[1] < RESTORED_POINTS:
            return []
        self.damage = None
        control.state_is_good = True
        control.rollback = None
        return [Finding(
            step=ctx.step, kind="saves_resumed", severity="info", signal=keys.LOSS, value=x, baseline=d[0],
            onset_step=d[2],
            message=(f"The loss is back at its level from before step {d[2]}: {RESTORED_POINTS} points in a row at "
                     f"or below {fmt(level)} (it was {fmt(d[0])}), the last {fmt(x)} at step {ctx.step}. "
                     f"Nothing the loss shows is damaged any more: saves resume (they had stopped at step {d[2]})."),
            details={"points": RESTORED_POINTS})]

    def _halt_or_roll_back(self, seen: list[Finding], ctx: Context,
                           control: Control) -> tuple[bool, str | None, list[Finding]]:
        """``(halting, why no automatic rollback, the findings added)`` for a critical step
        (``seen``: the step's findings so far): ``halt_on: critical`` halts; an automatic rollback
        (``auto_rollback``) is requested instead when one is possible, else the run halts, saying
        why. Either way the rollback advice says where to go back to."""
        added: list[Finding] = []
        critical = any(f.severity == "critical" for f in seen)
        halting = self.halt_on == "critical" and critical
        rolling = (self.auto_rollback is not None and critical and control.rollback_request is None
                   and not control.stop)
        if (halting or rolling) and control.rollback is None:   # a halt always says where to go back to
            trigger = next(f for f in seen if f.severity == "critical")
            control.rollback = self._rollback_advice(ctx.step, trigger, ctx)
            added.append(control.rollback)
        no_rollback = None
        if rolling and control.rollback is not None:
            request, no_rollback = self._rollback_request(ctx.step, control.rollback)
            if request is not None:
                control.rollback_request = request
                added.append(self._rollback_finding(request, control.rollback))
                halting = False
            else:
                halting = True
        return halting, no_rollback, added

    def _request_save(self, every: list[Finding], step: int, control: Control) -> None:
        """Save now for the first finding at ``save_on`` or worse (no event), while the state is
        good, no rollback is about to abandon this branch, and ``min_save_gap_steps`` passed
        since the last save asked for."""
        asking = next((f for f in every if f.kind not in EVENT_KINDS
                       and severity_rank(f.severity) >= severity_rank(self.save_on)), None)
        if (control.state_is_good and self.save_on != "never" and asking is not None
                and control.rollback_request is None   # this branch is about to be abandoned
                and (self.last_save_request is None or step - self.last_save_request >= self.min_save_gap_steps)):
            control.save_now = True
            control.save_reason = f"save now: {asking.kind} ({asking.severity}) at step {step}"
            self.last_save_request = step

    @staticmethod
    def _request_stop(every: list[Finding], step: int, control: Control, no_rollback: str | None) -> None:
        """Stop, naming the critical finding that halts (not the advice) and why: the policy's
        ``halt_on``, or why no automatic rollback could be made."""
        control.stop = True
        trigger = next((f for f in every if f.severity == "critical" and f.kind != "rollback_advice"),
                       every[0])
        control.stop_reason = (f"{trigger.kind} ({trigger.severity}) at step {step}; "
                               + (f"no automatic rollback: {no_rollback}" if no_rollback
                                  else "policy.halt_on = critical"))

    def _led_by_precursor(self, f: Finding) -> None:
        """A loss or grad-norm spike finding with a ``precursor`` lead in the ``lead_window_steps``
        before its onset: its onset moves to the lead (its own stays in
        ``details["spike_onset_step"]``: the warmup-end signature looks before it), and its
        message says what moved first."""
        if f.kind not in LED_BY_PRECURSOR:
            return
        onset = f.onset_step if f.onset_step is not None else f.step
        leads = [lead for lead in self.leads if lead[1] == "precursor"
                 and onset - self.lead_window_steps <= lead[0] < onset]
        if not leads:
            return
        lead_step, _, what = min(leads, key=lambda lead: lead[0])
        gap = onset - lead_step
        what = what or "the optimizer's state jumped"
        f.onset_step = lead_step
        f.details["precursor_step"] = lead_step
        f.details["spike_onset_step"] = onset
        against = "the loss" if f.kind == "loss_spike" else "the grad norm"
        f.message += (f" The optimizer moved first: {what} at step {lead_step}, {gap} step"
                      f"{'s' if gap != 1 else ''} before {against}; the episode began there, so a rollback "
                      f"goes to a checkpoint before step {lead_step}.")

    # -- the warmup-end escalation -----------------------------------------------------------
    def _escalate(self, serious: list[Finding], ctx: Context,
                  risk_window: tuple[int, int] | None) -> Finding | None:
        """The ``warmup_instability`` for this step's instabilities, if any (BigScience tr8-104B):

        - inside the risk window, an instability (:data:`ESCALATED_KINDS`) gets a ``warning``
          escalation: the card's action, a save now and the bumped save interval;
        - it is ``critical`` (halt-worthy) only when the instability is critical itself (a spike
          not recovered by its horizon, a divergence, NaN, a collapsed loss scale) or comes with
          the precursor signature (:data:`SIGNATURE_LEADS`: a lead of the grad norm or Adam's
          variance, or a falling loss scale, in the ``lead_window_steps`` before its onset);
        - a warning escalation is upgraded to critical when its episode turns critical later,
          inside the window or not; otherwise one escalation per ``escalation_gap_steps``;
        - none within ``lead_window_steps`` after an ``lr_anomaly``: the LR jump, not the warmup
          end, explains what follows it."""
        step = ctx.step
        triggers = [f for f in serious if f.kind in ESCALATED_KINDS]
        if not triggers or risk_window is None:
            return None
        if self.lr_jump_step is not None and step - self.lr_jump_step <= self.lead_window_steps:
            return None
        last = self.escalation
        scored = []
        for f in triggers:
            # The episode's own onset: a precursor lead moved a spike's onset_step to itself.
            onset = f.details.get("spike_onset_step", f.onset_step if f.onset_step is not None else f.step)
            signature = [] if f.kind in LEADING_KINDS - {"loss_spike"} else precursor_signature(
                self.leads, onset, self.lead_window_steps)
            critical = f.severity == "critical" or bool(signature) or self.warmup_escalation == "any"
            scored.append((critical, f, onset, signature))
        critical, first, onset, signature = max(scored, key=lambda t: t[0])
        begun = first.onset_step if first.onset_step is not None else onset   # a precursor's step, or the same
        if ctx.in_risk_window:
            if last is not None and step - last[0] < self.escalation_gap_steps and (last[1] == "critical" or not critical):
                return None
        elif not (critical and last is not None and last[1] == "warning" and onset == last[2]):
            return None   # outside the window only the upgrade of an escalated episode
        severity = "critical" if critical else "warning"
        self.escalation = [step, severity, onset]
        return Finding(
            step=step, kind="warmup_instability", severity=severity, signal=first.signal,
            value=first.value, baseline=first.baseline, threshold=first.threshold, onset_step=begun,
            message="",   # written once the actions of this step are decided (_escalation_message)
            details={"trigger": first.kind, "trigger_severity": first.severity, "risk_window": list(risk_window),
                     "spike_onset_step": onset,
                     "precursors": [p.name for p in signature], "upgrade": last is not None and last[2] == onset})

    def _escalation_message(self, f: Finding, control: Control, *, saving: bool) -> str:
        d = f.details
        start, end = d["risk_window"]
        trigger, onset, own = d["trigger"], f.onset_step, d["spike_onset_step"]
        window = f"the risk window (steps {start + 1}-{end}) where BigScience's 104B runs glitched"
        if f.step <= end:
            head = (f"{trigger} at step {f.step} came {count(f.step - start)} after the LR warmup ended "
                    f"(step {start}), inside {window}.")
        else:   # the upgrade of an episode that began inside the window
            head = (f"{trigger} at step {f.step}: the episode began at step {onset}, {count(onset - start)} "
                    f"after the LR warmup ended (step {start}), inside {window}.")
        acts = []
        if control.saves_carried_out is False:
            acts.append("this integration does not save on request, so no checkpoint is taken")
        elif not control.state_is_good:
            acts.append("no checkpoint is taken: the weights are damaged, the last good one is kept")
        else:
            if saving:
                acts.append("a checkpoint is saved now")
            user = control.user_save_interval_steps
            bumped = control.save_interval_steps
            if bumped and user is not None and user <= bumped:
                acts.append(f"your own save interval ({count(user)}) is already at least as frequent as "
                            f"the bumped one ({bumped}), so it stays")
            elif bumped:
                acts.append(f"checkpoints every {count(bumped)} until step {max(end, self.bump_until or 0)}")
        done = "; ".join(acts)
        done = f" {done[:1].upper()}{done[1:]}." if done else ""
        if f.severity == "critical":
            precursors = [p.what for p in SIGNATURE_LEADS if p.name in d["precursors"]]
            why = (f"It comes with the precursor signature ({', '.join(precursors)}) before its onset at "
                   f"step {own}" if precursors else f"The {trigger} is critical by itself"
                   if d["trigger_severity"] == "critical" else "policy.warmup_escalation = any makes it critical")
            return (f"{head}{done} {why}: the pattern of the 104B runs that did not recover. Roll back "
                    f"to a checkpoint before step {onset} and lower the peak LR, lengthen the warmup or "
                    f"use beta2=0.95.")
        after = ("a loss spike after it comes with it as a precursor, or the episode does not recover"
                 if trigger in LEADING_KINDS - {"loss_spike"} else
                 "the loss has not come back by the spike's horizon or diverges")
        return (f"{head}{done} It is a warning: no precursor came before it (a grad-norm, Adam-variance "
                f"or update lead, a falling loss scale) and nothing is critical yet; most instabilities here recover "
                f"by themselves. It becomes critical if {after}; then roll back to a checkpoint before "
                f"step {onset}.")

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

    def _rollback_advice(self, step: int, trigger: Finding, ctx: Context) -> Finding:
        """Onset = the earliest of the trigger's onset, an open loss spike, and the leading signals
        (grad norm, Adam variance, overflows) within ``lead_window_steps`` before it. An onset at
        the run's first step (``ctx.run_start``) has no checkpoint before it: train again from the
        initial weights."""
        onset = trigger.onset_step if trigger.onset_step is not None else trigger.step
        spike = ctx.loss_spike_onset
        if spike is not None and spike != self.startup_spike:
            # an open spike begins the episode, unless it opened inside the start-up and was never
            # more than info: the start-up's own level, no episode (kohya's average of its first
            # batches, "open" from step 2 to a NaN at 181: skip 180 steps, it said)
            onset = min(onset, spike)
        led_by = None
        for lead_step, kind, *_ in sorted(self.leads, key=lambda lead: (lead[0], lead[1])):
            if onset - self.lead_window_steps <= lead_step < onset:
                onset, led_by = lead_step, kind
        good = [c for c in self.checkpoints if c[0] < onset and c[2]]
        ckpt = good[-1] if good else None
        first_skip = onset
        details = {"checkpoint_step": ckpt[0] if ckpt else None, "checkpoint_path": ckpt[1] if ckpt else None,
                   "onset_step": onset, "skip_steps": [first_skip, step], "trigger": trigger.kind,
                   "led_by": led_by, "checkpoints_seen": self.checkpoints_seen,
                   "save_steps": (save_interval_before(onset, self.bump_save_interval_to)
                                  if ckpt is None and self.checkpoints_seen else None)}
        n = step - first_skip + 1
        skip = f"skip the batches of steps {first_skip}-{step} ({n} step{'s' if n != 1 else ''})"
        if ckpt:
            todo = f"Resume from the checkpoint of step {ckpt[0]}" + (f" ({ckpt[1]})" if ckpt[1] else "") + f" and {skip}"
        elif ctx.run_start is not None and onset <= ctx.run_start:   # nothing trained before it was saved
            details["from_start"] = True
            todo = (f"Nothing was trained before step {onset}, so no checkpoint comes before it: train again "
                    f"from the initial weights and {skip}")
        elif self.checkpoints_seen:
            save_steps = details["save_steps"]
            every = (f" with a save interval of {count(save_steps)} (so that one comes before step {onset})"
                     if isinstance(save_steps, int) and save_steps else "")
            todo = f"No checkpoint was saved before step {onset} (none that the monitor saw): train again from the start{every} and {skip}"
        else:
            named = ("the log names none" if not self.checkpoints else
                     f"the log names none before it: the first it names is step {self.checkpoints[0][0]}"
                     if self.checkpoints[0][0] >= onset else
                     "the log names none saved before it while the weights were good")
            todo = f"Resume from the newest checkpoint saved before step {onset} ({named}) and {skip}"
        lead_txt = f" ({led_by} led the loss)" if led_by else ""
        return Finding(
            step=step, kind="rollback_advice", severity="critical", signal=trigger.signal,
            onset_step=onset, details=details,
            message=(f"Roll back: {trigger.kind} at step {step}; the episode began at step {onset}{lead_txt}. "
                     f"{todo}. If it happens again at the same place, change the seed or the data order "
                     f"(PaLM, BigScience)."))

    def _rollback_request(self, step: int, advice: Finding) -> tuple[RollbackRequest | None, str | None]:
        """The automatic rollback the advice calls for, or why there is none."""
        ar, d = self.auto_rollback, advice.details
        assert ar is not None   # only called with policy.auto_rollback on
        if d.get("checkpoint_step") is None:
            return None, f"no good checkpoint before the onset (step {d['onset_step']}) is known"
        if self.data_skips.attempts >= ar.max_attempts:
            return None, (f"policy.auto_rollback.max_attempts ({ar.max_attempts}) automatic "
                          f"rollbacks are used up")
        first, last = d["skip_steps"]
        last += ar.skip_extra_steps
        skips = self.data_skips.after_rollback(checkpoint_step=d["checkpoint_step"], skip_steps=(first, last),
                                               lr_factor=ar.lr_factor, lr_factor_steps=ar.lr_factor_steps)
        return RollbackRequest(step=step, checkpoint_step=d["checkpoint_step"],
                               checkpoint_path=d["checkpoint_path"], skip_steps=(first, last),
                               lr_factor=ar.lr_factor, lr_factor_steps=ar.lr_factor_steps,
                               attempt=skips.attempts, max_attempts=ar.max_attempts,
                               reason=f"{d['trigger']} (critical) at step {step}; policy.auto_rollback",
                               skips=skips), None

    def _rollback_finding(self, r: RollbackRequest, advice: Finding) -> Finding:
        first, last = r.skip_steps
        where = f" ({r.checkpoint_path})" if r.checkpoint_path else ""
        extra = self.auto_rollback.skip_extra_steps if self.auto_rollback is not None else 0
        margin = f", {extra} of them past the detection as a margin" if extra else ""
        lr = (f", and the LR is scaled by {r.lr_factor:g} for {r.lr_factor_steps} steps"
              if r.skips.lr_window is not None else "")
        return Finding(
            step=r.step, kind="auto_rollback", severity="warning", signal=advice.signal,
            onset_step=advice.onset_step,
            message=(f"Rolling back automatically (attempt {r.attempt} of {r.max_attempts}): "
                     f"{advice.details['trigger']} at step {r.step}. Training goes back to the "
                     f"checkpoint of step {r.checkpoint_step}{where}; the data of steps {first}-{last} "
                     f"({count(last - first + 1)}{margin}) is skipped on every rank{lr}. The detectors "
                     f"restart from that checkpoint's state; the abandoned steps stay in the run log "
                     f"as a superseded branch (stability-callbacks timeline)."),
            details={"checkpoint_step": r.checkpoint_step, "checkpoint_path": r.checkpoint_path,
                     "skip_steps": [first, last], "lr_factor": r.lr_factor,
                     "lr_factor_steps": r.lr_factor_steps, "attempt": r.attempt,
                     "max_attempts": r.max_attempts, "trigger": advice.details["trigger"]})

    # -- state ----------------------------------------------------------------------------------
    def state_dict(self) -> dict:
        out = {k: getattr(self, k) for k in self._state}
        out["data_skips"] = self.data_skips.state_dict()
        return out

    def load_state_dict(self, d: dict) -> None:
        # States saved before skip step and automatic rollbacks existed lack their two keys only.
        if set(d) - set(self._state) or set(self._state) - set(d) - set(_SINCE_ROLLBACKS):
            raise ValueError(f"policy state keys {sorted(d)} do not match {sorted(self._state)}")
        for k in self._state:
            setattr(self, k, d.get(k, []) if k == "skips" else d.get(k))
        self.data_skips = DataSkips.from_state(d["data_skips"]) if "data_skips" in d else DataSkips()


def _one_event(findings: list[Finding]) -> None:
    """Criticals of different detectors at one step are one event read several ways, and their
    causes may differ (a loss of exactly 0 beside a NaN grad norm: a loss zeroed after an fp16
    overflow to one, a loss masked away to the other): each after the first says which finding to
    read first (``details["same_event_as"]``) — the non-finite values where there are any, the
    surest sign, else the first found."""
    serious = [f for f in findings if f.severity == "critical" and f.kind not in EVENT_KINDS]
    if len({f.kind for f in serious}) < 2:
        return
    first = next((f for f in serious if f.kind == "nonfinite"), serious[0])
    for f in serious:
        if f.kind != first.kind and "same_event_as" not in f.details:
            f.details["same_event_as"] = first.kind
            f.message += f" (One event with the {first.kind} finding at this step: read that one first.)"


__all__ = ["Policy", "AutoRollback", "SignatureLead", "DAMAGE_KINDS", "EVENT_KINDS", "SIGNATURE_LEADS", "SKIP_STEP_ON",
           "WARMUP_ESCALATION"]
