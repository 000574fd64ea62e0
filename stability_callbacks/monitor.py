"""The one streaming Monitor that live callbacks and offline replay both feed.

``update(record)`` runs the phase tracker, every detector and the policy, and returns the
findings of that step; ``control`` holds the requests for the integration. Every part is
O(1) per update. A detector that raises is logged once and switched off: monitoring never
takes training down.
"""
from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any, Mapping, Sequence

from . import keys
from .config import Config
from .control import Control
from .detectors import Columns, Context, Detector, GradNormGrowth, GradNormSpike, LossSpike, NotLearning, Stall
from .cycles import EpochProfile, Restarts
from .phase import PhaseTracker
from .policy import Policy
from .record import Finding, StepRecord

log = logging.getLogger("stability_callbacks")

#: The detectors a record's keys feed: those before the main loss spike, it (if fed), those after.
_Plan = tuple[tuple[Detector, ...], LossSpike | None, tuple[Detector, ...]]

STATE_VERSION = 19  # 2: latches and EW means are statistics objects; streams are a detector;
                    # 3: baselines keep their bias and cold start, divergence its swing horizon;
                    # 4: loss_spike keeps its right tail, not_learning its chance level per point;
                    # 5: divergence keeps its run of rising epochs and where its scale closes,
                    # not_learning its still stretch's trend, grad_norm_spike its ordinary peak
                    # 6: second_moment_surge keeps the loss over its post-peak windows
                    # 7: not_learning keeps its noise over ~1,000 points (the flat rule's)
                    # 8: grad_norm_spike keeps the jumps the loss did not follow (its own tail)
                    # 9: not_learning keeps the grad norm's level (a vanished one is still)
                    # 10: divergence keeps the noise of the loss's first points (a scale, or none)
                    # 11: second_moment_surge keeps the last grad-norm jump (a jump of v may be its echo)
                    # 12: loss_spike keeps whether every point was below zero (a likelihood's)
                    # 13: lr_anomaly keeps the schedule's typical change in the LR's own units
                    # 14: a loss spike keeps whether its warning was said inside the start-up,
                    #     divergence the points of the spike open (its low kept over one or two)
                    # 15: loss_spike keeps whether its loss is a game's (its messages say so)
                    # 16: a loss spike keeps how little its cold noise's few points tell it; the
                    #     Monitor keeps the loss through this epoch and the one before; a spike
                    #     near the floor whether its warning waits for the next point, and the loss
                    #     its last warning quoted
                    # 17: stall keeps the grad norm beside the last loss (a repeat beside another
                    #     gradient is no freeze); the policy a start-up spike's onset (no episode's)
                    # 18: stall keeps an evaluation's loss repeated, the zeros from the start counted, the
                    #     loss's own moves per point and whether it is an objective; nonfinite an
                    #     evaluation's loss episode (eval_loss) and a non-finite run to the log's end
                    # 19: the phase tracker keeps the ramp under way (the LR it rose from, its samples, its
                    #     smallest rise: a coarse print's staircase is one warmup); a spike episode its
                    #     lowest loss since the onset

#: The records :meth:`Monitor.update_many` runs one detector at a time over, at most: long enough
#: for a detector's code to stay hot, short enough for their contexts to stay in the cache.
_COLUMN_RUN = 256
_LR, _LOSS = keys.LR, keys.LOSS   # (read at every step: a global, not a module's attribute)
_CONTEXT_FIELDS = tuple(f.name for f in dataclasses.fields(Context))

class Monitor:
    """Feed it one :class:`StepRecord` per optimizer step; read findings and ``control``.

    >>> m = Monitor({"phase": {"warmup_steps": 5}})
    >>> found = []
    >>> for s in range(1, 41):
    ...     loss = 9.0 if s == 30 else 3.0 - s / 100
    ...     found += m.update(StepRecord(s, {"loss": loss, "lr": 1e-4 * min(s, 5) / 5}))
    >>> [(f.step, f.kind, f.severity) for f in found]
    [(5, 'warmup_end', 'info'), (30, 'loss_spike', 'warning'), (31, 'spike_recovered', 'info')]
    >>> m.control.save_now   # the policy asked for a save at step 30; the integration resets it
    True
    """

    def __init__(self, config: "Config | str | Mapping | None" = None, *,
                 overrides: Mapping[str, Any] | None = None):
        #: The configuration (:class:`~stability_callbacks.config.Config`), read once; its
        #: phase, policy and detectors are built here, once.
        self.config = Config.load(config, overrides)
        self.phase: PhaseTracker = self.config.phase.build()
        self.policy: Policy = self.config.policy.build()
        self.detectors: list[Detector] = self.config.detectors.build()
        self._loss_spike = next((d for d in self.detectors if isinstance(d, LossSpike)), None)
        self._grad_norm_spike = next((d for d in self.detectors if isinstance(d, GradNormSpike)), None)
        if self.policy.skip_step_on == "grad_outlier" and self._grad_norm_spike is None:
            raise ValueError("policy.skip_step_on: grad_outlier needs detectors.grad_norm_spike (its baseline)")
        self.control = Control()
        self.last_step: int | None = None
        self.segment = 0
        self.segment_start = 0
        self.resume_step: int | None = None
        #: The run's first step when it began from nothing: the first record of a run that starts
        #: at step 0 or 1 (no segment began before it). Nothing was trained before it, so no
        #: checkpoint can precede it (the nonfinite message and the rollback advice both say so).
        self.run_start: int | None = None
        #: The records are epochs, nothing finer (a replayed log says so as it is read): a step
        #: horizon counted in optimizer steps is met by any epoch after the first.
        self.steps_are_epochs = False
        #: ... or each step is a record's rank in the log (it prints no counter): the log's first
        #: record need not be the run's first step.
        self.steps_by_order = False
        self.success_seen = False
        #: The loss through this epoch and the one before, where records say their epoch, and
        #: where the LR's cycles began (:mod:`stability_callbacks.cycles`).
        self.epochs = EpochProfile()
        self.restarts = Restarts()
        self.phase_at_last_step: str | None = None
        #: The parameter tensors' names in the optimizer's order, when a live run knows them.
        self.tensor_names: list[str | None] | None = None
        self._broken: set[str] = set()
        self._plans: dict[frozenset, _Plan] = {}
        self._shapes: set[frozenset] = set()   # the sets of keys seen since the plans were last made afresh
        # One Context, refilled at every step: building a new one is a third of the Monitor's own
        # cost per step. Nothing keeps it past the step (``found`` is the step's own list).
        self._ctx = Context(0)
        # update_many's: a context per record of a run
        self._contexts = [Context(0) for _ in range(_COLUMN_RUN)]
        # update()'s columns of its one record, refilled at every step (nothing keeps them past it)
        self._cols = Columns([None], [None], [None], [None], [False])

    # -- feeding ------------------------------------------------------------------------------
    def set_warmup_steps(self, warmup_steps: int | None) -> None:
        self.phase.declare_warmup(warmup_steps)

    def set_num_outputs(self, n: int | None) -> None:
        """The model's output size, declared by a live run (not_learning's chance level)."""
        for d in self.detectors:
            if isinstance(d, NotLearning):
                d.declare_outputs(n)

    def declare_objective(self) -> None:
        """The loss is an objective whose level moves with its targets, not towards a floor (a
        reinforcement learner's, built from returns that grow as the policy improves: a critic's
        regression on them, a TD error, a return-weighted policy term): judged from now on as a
        loss that went below zero is (:class:`LossSpike`'s additive scale), its level rules
        standing aside. A replayed log whose names say so declares it. Such an objective can be
        exactly 0 (GRPO's at its start): :class:`Stall` does not read zeros from the start as a
        loss cut from the model unless the LR or the grad norm says so."""
        if self._loss_spike is not None:
            self._loss_spike.declare_objective()
        for d in self.detectors:
            if isinstance(d, Stall):
                d.objective = True

    def declare_game(self) -> None:
        """The loss is players' losses pulling against each other (a GAN's discriminator and
        generator, each stepped by its own optimizer): an objective of any sign
        (:meth:`declare_objective`), and a grad norm that grows steadily as one player sharpens
        against the other is the game's, not a sharp valley (:class:`GradNormGrowth`: info; a jump
        by orders of magnitude still warns); a player's term exactly 0 on point after point is
        one that has won outright (:class:`Stall`'s *player* rule). A replayed log whose loss sums
        such terms, and a live run whose optimizers each step on a loss of its own, declare it."""
        self.declare_objective()
        for d in self.detectors:
            if isinstance(d, (GradNormGrowth, Stall, LossSpike)):
                d.game = True

    def declare_cross_entropy(self, printed: str) -> None:
        """The loss is a cross-entropy, never below zero (a replayed log names it so: ``printed``):
        a value below zero is the loss computed wrong (:class:`Stall`'s *impossible* rule)."""
        for d in self.detectors:
            if isinstance(d, Stall):
                d.declare_cross_entropy(printed)

    def update(self, record: StepRecord) -> list[Finding]:
        out: list[Finding] = []
        step = record.step
        if record.checkpoints:   # saved before this step, as a replayed log names them
            for saved_at, path in record.checkpoints:
                self.note_checkpoint(saved_at, path)
        if record.warmup_steps is not None and self.config.phase.warmup_steps is None:
            self.phase.declare_warmup(record.warmup_steps)   # a replayed run log's declared warmup
        if record.num_outputs is not None:
            self.set_num_outputs(record.num_outputs)         # ... and its model's output size
        # A segment's start_step is the step it resumes from (its checkpoint): the step before
        # its first record (docs/design.md, Run log; what the integrations write).
        if record.segment != self.segment and record.segment > self.segment:
            out += self.begin_segment(step - 1, "resume", segment=record.segment)
        elif self.last_step is not None and step <= self.last_step:
            out += self.begin_segment(step - 1, "rollback", segment=self.segment + 1)
            self._forget_future()
        ctx = self._ctx
        one = (record,), (ctx,)   # the record as a run of one, as the runs' methods take it
        window = self._begin_run(*one)[0]
        if out:   # the segment's findings come before the phase's
            ctx.found[:0] = out
        out = ctx.found
        shape = frozenset(record.metrics)
        plan = self._plans.get(shape)
        if plan is None:   # which detectors this set of keys feeds (logs keep one shape)
            plan = self._plan(shape)
        before, loss_spike, after = plan
        ctx.columns = self._cols   # what several detectors read of the record, worked out once
        self._cols.refill(record)
        if before:
            self._run(before, record, ctx)
        if loss_spike is None:
            _no_loss_view(ctx)
        else:
            self._loss_column(loss_spike, *one, None)
        self._run(after, record, ctx)
        self._cycles(record, ctx, out)
        self._decide(record, ctx, out, window)
        return out

    def _cycles(self, record: StepRecord, ctx: Context, out: list[Finding]) -> None:
        """The run's cycles at this step (its epoch, the LR's warm restarts): a rise found that is
        their own shape made info (:mod:`stability_callbacks.cycles`), before the policy decides on it."""
        if record.epoch is not None:
            epochs = self.epochs
            said = epochs.update(record.epoch, record.step, ctx.loss)
            if said:
                out += said
            if out and epochs.before is not None:
                epochs.judge(out)
        restarts = self.restarts
        if out or restarts.eager:
            said = restarts.update(record.step, ctx.loss, out)
            if said:
                out += said
            if out:
                restarts.judge(out)

    def update_many(self, records: Sequence[StepRecord]) -> list[Finding]:
        """:meth:`update` of each record in turn, the same findings in the same order (a replay's
        way: it reads a log in batches), at two thirds of the cost: a run of records goes through
        one detector at a time, each over the whole run, while its code is hot
        (:meth:`_run_columns`). A record that changes what the detectors are (a segment, a
        rollback, a declared warmup or output size, a checkpoint saved before it) goes alone
        through :meth:`update`; one whose set of keys has no plan yet starts a run (its plan is
        made where update() would make it)."""
        if self.policy.skip_step_on != "never":   # the skip rule reads grad_norm_spike's baseline
            return [f for r in records for f in self.update(r)]   # after each step: one at a time
        out: list[Finding] = []
        run: list[StepRecord] = []
        plans: list[_Plan] = []
        # the last step begun or to be begun (a run is begun as its columns run, _run_columns)
        last_step = self.last_step
        # The last two sets of keys and their plans (a log alternates between two at most, as a loss
        # printed with and without its resolution): a record's keys compared with them cost half of
        # a frozenset built and looked up. Exact: a plan stays valid until the plans are forgotten
        # (a new set of keys, a failing detector, a segment: in _plan, _run_columns or update, after
        # which these are dropped and looked up again).
        seen: list[tuple[frozenset, _Plan]] = []
        for r in records:
            if (r.warmup_steps is not None or r.num_outputs is not None or r.segment > self.segment
                    or r.checkpoints or (last_step is not None and r.step <= last_step)):
                out += self._run_columns(run, plans)
                run, plans, seen = [], [], []
                out += self.update(r)
                last_step = self.last_step
                continue
            names = r.metrics.keys()
            if seen and names == seen[0][0]:
                plan: _Plan | None = seen[0][1]
            elif len(seen) > 1 and names == seen[1][0]:
                plan = seen[1][1]
            else:
                shape = frozenset(names)
                plan = self._plans.get(shape)
                if plan is not None:
                    seen = [(shape, plan), *seen[:1]]
            k = len(run)
            if plan is None or k == _COLUMN_RUN:
                out += self._run_columns(run, plans)
                run, plans, k, seen = [], [], 0, []
                if plan is None:
                    plan = self._plan(frozenset(names))
            run.append(r)
            plans.append(plan)
            last_step = r.step
        out += self._run_columns(run, plans)
        return out

    def _run_columns(self, run: list[StepRecord], plans: list[_Plan]) -> list[Finding]:
        """The records of ``run`` begun (:meth:`_begin_run`: nothing before it reads what that
        changes), then the detectors and the policy over them, each record with its context and
        plan: one detector at a time over the records whose plan has it, in the detectors'
        order, then the policy step by step. Exact: each step has its own context (:meth:`_begin_run`,
        then the main loss spike's view at that step, :meth:`_loss_column`); a detector sees its
        records in order, with the findings of the detectors before it at each step
        (``ctx.found``); no detector reads what the policy decides; and a plan holds over a run
        (what a detector wants changes only at a segment, a state load or a new set of keys, which
        end a run), less a detector that fails, which is off from its failing step as in update()."""
        n = len(run)
        if not n:
            return []
        ctxs = self._contexts[:n]
        windows = self._begin_run(run, ctxs)
        first = plans[0]
        columns: list[tuple[Detector, list[int] | None]]
        if plans.count(first) == n:   # the same detectors at every step (most logs; two sets
            # of keys may feed the same ones: a loss printed with and without its resolution)
            before, loss_spike, after = first
            columns = [(d, None) for d in before + ((loss_spike,) if loss_spike else ()) + after]
            unviewed = ctxs if loss_spike is None else []   # no step with the main loss spike, or none without
        else:
            fed = [{*p[0], p[1], *p[2]} for p in plans]
            columns = [(d, idx) for d in self.detectors if (idx := [i for i in range(n) if d in fed[i]])]
            unviewed = [ctx for ctx, p in zip(ctxs, plans) if p[1] is None]
        for ctx in unviewed:
            _no_loss_view(ctx)
        cols = Columns.of(run)   # what several detectors read of each record, worked out once
        for d, at in columns:
            self._column(d, run, ctxs, at, cols)
        out: list[Finding] = []
        last, policy = n - 1, self.policy
        restarts = self.restarts
        for i, (r, ctx) in enumerate(zip(run, ctxs)):
            if r.epoch is not None or ctx.found or restarts.eager:   # (step by step, as update() does;
                self._cycles(r, ctx, ctx.found)                      # else _cycles changes nothing)
            # A step where nothing was found changes nothing of the policy: it only sets the save
            # interval on Control, which the next step the policy decides sets again, from that
            # step alone (nothing reads Control within a batch): the run's last step is decided.
            # While saves are blocked by damage, each step is (the loss may be back: saves resume).
            if ctx.found or i == last or policy.damage is not None:
                self._decide(r, ctx, ctx.found, windows[i])
                out += ctx.found
        carried = self._ctx   # where a later update() or end() carries on from: the last step's context
        for name in _CONTEXT_FIELDS:
            setattr(carried, name, getattr(ctxs[-1], name))
        return out

    def _column(self, d: Detector, run: list[StepRecord], ctxs: list[Context], idx: list[int] | None,
                cols: Columns) -> None:
        """One detector over the records of a run at ``idx`` (None: all), each with its step's
        context and the run's ``cols``; after the main loss spike, each context takes its view of the loss."""
        if idx is None and d is not self._loss_spike:   # the common column: every record, no view
            try:
                d.update_run(run, ctxs, cols)
            except Exception:   # off from this run on, as update() is from its failing step
                self._disable(d.name, run[0].step, run[-1].step)
            return
        if d is self._loss_spike:
            self._loss_column(d, run, ctxs, idx)   # type: ignore[arg-type]
            return
        update = d.update
        i = 0
        try:
            for i in range(len(run)) if idx is None else idx:
                ctx = ctxs[i]
                found = update(run[i], ctx)
                if found:
                    ctx.found += found
        except Exception:   # off from this step, as update() does
            self._disable(d.name, run[i].step)

    def _loss_column(self, d: LossSpike, run: Sequence[StepRecord], ctxs: Sequence[Context],
                     idx: list[int] | None) -> None:
        """The main loss spike over the records of a run at ``idx`` (None: all); each context takes
        its view of the loss right after that step's update, for the detectors after it (written
        out here, not called: once a record). One that fails is off from its step, its view still
        taken there, and no context after it has one."""
        update = d.update
        for i in range(len(run)) if idx is None else idx:
            ctx = ctxs[i]
            try:
                found = update(run[i], ctx)
            except Exception:
                found = None
                self._disable(d.name, run[i].step)
            ctx.loss_baseline, ctx.loss_noise = d.baseline_before, d.noise_before
            ctx.loss_slope, ctx.loss_floor_log = d.slope_before, d.floor_log
            ctx.loss_signed = d.signed
            ctx.loss_step_noise, ctx.loss_step_mean = d.step_noise_before, d.step_mean_before
            episode = d.episode
            ctx.loss_spike_open = episode is not None
            ctx.loss_spike_onset = episode.onset if episode is not None else None
            if found:
                ctx.found += found
            elif found is None:
                for ctx in ctxs[i + 1:]:
                    _no_loss_view(ctx)
                return

    def _begin_run(self, run: Sequence[StepRecord], ctxs: Sequence[Context]) -> list[tuple[int, int] | None]:
        """Each step's start, before the detectors, in order: the phase (its findings into the
        step's ``ctx.found``, a new list) and the step's context. Returns the risk window the policy
        judges each step by. One loop over a run: what no step changes (the numbering, the resume,
        the tensor names: set between runs) is read once."""
        phase, startup, names = self.phase, self.policy.startup_steps, self.tensor_names
        epochs = phase.epochs = self.steps_are_epochs
        by_order, resume, segment = self.steps_by_order, self.resume_step, self.segment
        windows: list[tuple[int, int] | None] = []
        for record, ctx in zip(run, ctxs):
            step = record.step
            if self.last_step is None and resume is None and segment == 0 and step <= 1 and not by_order:
                self.run_start = step   # (a step 1 the reader numbered in order may be any of the run's)
            self.last_step = step
            m = record.metrics
            # the step's findings, the phase's first (PhaseTracker.update returns a new list)
            ctx.found = phase.update(step, m.get(_LR))
            loss = ctx.loss = m.get(_LOSS)
            seen = self.success_seen
            if not seen:
                skipped = m.get(keys.OVERFLOW_SKIPPED)
                seen = self.success_seen = skipped is None or skipped == 0 or (loss is not None and math.isfinite(loss))
            # phase.risk_window, less the property's call and its tuple where there is none
            end, last = phase.warmup_end_step, phase.risk_window_end
            if end is None or last is None:
                windows.append(None)
                ctx.in_risk_window = False
            else:
                windows.append((end, last))
                ctx.in_risk_window = end < step <= last
            ctx.step, ctx.phase = step, phase.phase
            ctx.warmup_end_step = end
            # the start-up is counted in optimizer steps: an epoch of a log that prints nothing finer
            # is a whole pass over the data, far past them
            ctx.in_startup = (step <= startup and not epochs) or not seen
            ctx.steps_since_resume = step - resume if resume is not None else None
            ctx.tensor_names = names
            ctx.run_start = self.run_start
            ctx.steps_are_epochs, ctx.steps_by_order = epochs, by_order
        return windows

    def _decide(self, record: StepRecord, ctx: Context, out: list[Finding], window) -> None:
        """A step's end, after the detectors: the policy's findings into ``out``, each finding's phase."""
        policy = self.policy
        if policy.skip_step_on != "never":   # (review_skip has nothing to review otherwise)
            out += policy.review_skip(record, out, ctx, self.control, self._grad_norm_spike)
        out += policy.decide(out, ctx, self.control, window)
        for f in out:
            if f.phase is None:
                f.phase = ctx.phase
            f.in_warmup_risk_window = ctx.in_risk_window
        self.phase_at_last_step = ctx.phase

    def end(self) -> list[Finding]:
        """The end of a replayed log: what the detectors can say only of the whole of it
        (:meth:`Detector.at_end`); a followed log or a live run may go on, and does not ask."""
        if self.last_step is None:
            return []
        ctx = self._ctx
        ctx.step, ctx.found = self.last_step, []
        ctx.steps_are_epochs, ctx.steps_by_order = self.steps_are_epochs, self.steps_by_order
        out = ctx.found
        for d in self.detectors:
            if d.name in self._broken:
                continue
            try:
                out += d.at_end(ctx)
            except Exception:   # a broken detector must not take the replay down
                self._disable(d.name, self.last_step)
        for f in out:
            f.phase = f.phase or self.phase_at_last_step
        return out

    def _plan(self, shape: frozenset) -> _Plan:
        """The detectors a record with these keys feeds (:meth:`Detector.wants`), in order, split
        around the main loss spike (whose view of the loss the detectors after it read); broken
        ones left out."""
        if shape not in self._shapes:   # keys not seen before: what a detector wants may change
            self._shapes.add(shape)      # with them (Detector.wants), so every plan is made anew
            self._plans = {}
        fed = [d for d in self.detectors if d.name not in self._broken and d.wants(shape)]
        if self._loss_spike not in fed:
            plan: _Plan = ((), None, tuple(fed))
        else:
            i = fed.index(self._loss_spike)
            plan = (tuple(fed[:i]), self._loss_spike, tuple(fed[i + 1:]))
        self._plans[shape] = plan
        return plan

    def _forget_plans(self) -> None:
        """A segment, a state load, a new or broken detector: every detector is asked again."""
        self._plans, self._shapes = {}, set()

    def _run(self, detectors: tuple, record: StepRecord, ctx: Context) -> None:
        """``detectors`` over one record, its findings into its ``ctx.found``."""
        for d in detectors:
            try:
                found = d.update(record, ctx)
            except Exception:   # a broken detector must not take training down
                self._disable(d.name, record.step)
                continue
            if found:
                ctx.found += found

    def _disable(self, name: str, step: int, last: int | None = None) -> None:
        """``name`` off, having failed at ``step`` (or among the steps of a run, ``step`` to ``last``)."""
        self._broken.add(name)
        self._forget_plans()
        at = f"step {step}" if last is None or last == step else f"a step from {step} to {last}"
        log.exception("stability_callbacks: detector %s failed at %s and is now off", name, at)

    # -- run structure ------------------------------------------------------------------------
    def begin_segment(self, start_step: int, reason: str, *, segment: int | None = None) -> list[Finding]:
        """A run segment starts: ``start`` (fresh), ``resume`` (from a checkpoint) or ``rollback``."""
        if reason not in ("start", "resume", "rollback"):
            raise ValueError(f"reason must be start, resume or rollback, got {reason!r}")
        self.segment = segment if segment is not None else (self.segment + (reason != "start"))
        self.segment_start = start_step
        if reason == "start":
            return []
        self.resume_step = start_step
        self.last_step = None
        self.control.state_is_good = True
        self.control.rollback = None
        self.policy.forget_after(start_step)
        for d in self.detectors:
            d.on_segment(start_step, reason)
        self._forget_plans()   # what a detector wants may change at a segment (Detector.wants)
        restarted = reason == "rollback" and start_step <= 1
        # (dated at the step it resumes from, as any resume; a count from 0 restarts from no step: -1)
        at = max(start_step, 0) if restarted else start_step
        what = (f"Training restarted from its start (its first step again: {start_step + 1}; segment {self.segment}): "
                f"a second run in the same log, or one rolled back to its start" if restarted else
                f"Training {'rolled back and ' if reason == 'rollback' else ''}resumed at step {start_step} "
                f"(segment {self.segment})")
        return [Finding(step=at, kind="resume", severity="info", phase=self.phase.phase,
                        message=(f"{what}. Watching the next steps for a resume spike, an LR discontinuity and "
                                 f"repeated data."),
                        details={"reason": reason, "segment": self.segment})]

    def _forget_future(self) -> None:
        """A replayed log went back to an older step, and no checkpoint state came with it:
        what the detectors learned since belongs to the abandoned branch (docs/design.md,
        Invariants 5: after a rollback, the past, not the future). They start afresh; the phase keeps the
        warmup end and risk window it knows, but not the last LR."""
        self.detectors = [self.config.detectors.on[d.name].build() for d in self.detectors]
        self._loss_spike = next((d for d in self.detectors if isinstance(d, LossSpike)), None)
        self._grad_norm_spike = next((d for d in self.detectors if isinstance(d, GradNormSpike)), None)
        self._forget_plans()
        self.phase.prev_lr = self.phase.prev_step = None
        self.phase.rising_samples = self.phase.flat = 0

    def note_checkpoint(self, step: int, path: str | None = None) -> None:
        """A checkpoint was written; it counts as 'good' if the state was good at that time."""
        self.policy.note_checkpoint(step, path, self.control.state_is_good)

    # -- state ----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Small JSON: what ``update`` changed, keyed by part. Never configuration."""
        return {
            "version": STATE_VERSION,
            "monitor": {"last_step": self.last_step, "segment": self.segment,
                        "segment_start": self.segment_start, "resume_step": self.resume_step,
                        "run_start": self.run_start, "success_seen": self.success_seen, "state_is_good": self.control.state_is_good},
            "phase": self.phase.state_dict(),
            "policy": self.policy.state_dict(),
            "epochs": self.epochs.state_dict(),
            "restarts": self.restarts.state_dict(),
            "detectors": {d.name: d.state_dict() for d in self.detectors},
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Strict: a state from another configuration (other detectors) is an error."""
        if state.get("version") != STATE_VERSION:
            raise ValueError(f"stability state version {state.get('version')!r} is not {STATE_VERSION}")
        names = {d.name for d in self.detectors}
        if set(state["detectors"]) != names:
            raise ValueError(f"stability state has detectors {sorted(state['detectors'])}, "
                             f"this Monitor has {sorted(names)}")
        mon = state["monitor"]
        self.last_step, self.segment = mon["last_step"], mon["segment"]
        self.segment_start, self.resume_step = mon["segment_start"], mon["resume_step"]
        # Absent from a state saved before it was kept: that run's first step is long past.
        self.run_start = mon.get("run_start")
        self.success_seen = mon["success_seen"]
        self.control.state_is_good = mon["state_is_good"]
        self.phase.load_state_dict(state["phase"])
        self.policy.load_state_dict(state["policy"])
        self.epochs.load_state_dict(state["epochs"])
        self.restarts.load_state_dict(state["restarts"])
        for d in self.detectors:
            d.load_state_dict(state["detectors"][d.name])
        self._forget_plans()   # ... and with the state


def _no_loss_view(ctx: Context) -> None:
    """No main loss spike at this step (no loss in the record, or it failed): no view of the loss."""
    ctx.loss_spike_open, ctx.loss_spike_onset, ctx.loss_baseline = False, None, None
    ctx.loss_noise = ctx.loss_slope = ctx.loss_step_noise = ctx.loss_step_mean = 0.0
    ctx.loss_floor_log, ctx.loss_signed = -math.inf, False
