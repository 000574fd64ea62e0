"""The assembler: interpreted lines (numbers + :class:`~.plan.Plan`) -> step records.

What it decides across lines (docs/replay.md, The reader grammar):

- Step numbering: the log's counter as printed; a counter beside an epoch counts batches of the
  epoch, ``(epoch - first epoch) x batches per epoch + batch``, until it fails to restart at an
  epoch change (then it is global and taken as printed); one whose epoch length the log does
  not print, one way for the whole log (:meth:`Assembler._restarting`); a bar's count of
  samples, by samples seen / its unit (:meth:`Assembler._sample_unit`); a record glued after a
  bar's redraw, by its count, + 1 where the bar lags (:meth:`Assembler._bar_lag`); an integer
  before the step that goes up when the step restarts counts epochs; bars only ever printed
  complete, or an epoch with no finer counter, number steps by the epoch; no counter at all, by
  order of appearance. Two records of one epoch with nothing finer fall back to order of
  appearance. The account hears of every change of numbering (the parts of the log, each with
  its first step: a finding says how its own step was numbered).
- The loss: a log that prints the loss itself takes no statistic or sum of terms of it from
  other lines (``LOSS_KINDS``); in a counted log, a line numbered by its epoch alone (a
  summary) and a bar of another loop are no records (``DROPPED``).
- The same step printed again is one record (a table's row or a JSON line that re-logs a step
  after steps printed once is another: :meth:`Assembler._relogged`): the mean loss (ranks,
  micro-batches of one step),
  a bar redrawn for the same count, its last values, or terms of the step on lines of their
  own, their sum; a record printed again in another form at the same epoch fraction, one. ``iter N step M``: micro-batches, one
  record per optimizer step with their mean loss.
- DeepSpeed / apex / fairseq overflow lines fold into the next record (``skipped`` and the
  scale they reduced to); at the end of the log each is a record. DeepSpeed's cumulative
  ``skipped=K`` gives each record its delta; the first count is a delta only where the log starts
  at the run's first print interval.
- A NaN warning marks the step already printed; a step header above an indented block of metric
  lines makes one record of the block.

Memory is O(1) per line; records are emitted one line late (an overflow or NaN warning may still
concern them), or at once on an idle tick (:meth:`Assembler.flush`).
"""
from __future__ import annotations

import math
import re
from dataclasses import replace

from ... import keys
from ...record import StepRecord
from .account import ReadAccount
from .plan import LOSS_KINDS, Plan
from .vocabulary import TRAIN_SPLITS, adversarial


#: A bar's count whose counts are multiples of this power of two counts samples (a batch size
#: holds it; a print interval of batches, 10 to 10,000, holds at most 16).
SAMPLES_POWER = 32
#: ... and whose total is at least this many units (a dataset of many batches).
SAMPLES_PRINTS = 8

#: Two losses of one step this close (relative) are one value printed twice (ranks' rounding).
SAME_LOSS = 1e-3
#: Lines of one template at its first step, with losses that differ, that make a count that stays:
#: over the whole log (more than ranks print), or this many (more than micro-batches print) before it ends.
STAYS = 8
STAYS_HELD = 256

#: Why records were merged into one (the account counts them).
MERGED = ("records merged into the one before: a progress bar redrawn at its count, or a record printed "
          "again in another form (its last values kept)",
          "records merged into the one before: terms of one step's loss on lines of their own (their sum)",
          "records merged into the one before: the same step printed again (ranks, repeats: their mean loss)",
          "records merged into one: micro-batches of one optimizer step (their mean loss)",
          "records merged into the one before: a summary in another template that prints its loss again, with "
          "no step or one behind it (its other values, totals or means over the run, left out)",
          "records merged into the one before: a running statistic of the loss printed again within its epoch "
          "(it restarts with the epoch: its last value, the epoch's mean, kept)",
          "records merged into the one before: the same step's other values, on a line of their own (one record)")

#: Records dropped as copies of records read before (Assembler.emit).
COPIED = ("records dropped: a copy of a record read before, its step and values the same (another host or "
          "rank printing the same lines, interleaved)")
#: How many records back a copy is looked for.
COPIES_KEPT = 1024
#: The log's first line read as a record, of a form the records after it do not share (Assembler._one_off).
ONE_OFF = ("records dropped: a line before the log's first record, of a form no record shares (prose quoting a "
           "value, a setting's value), not a training step")
ONE_OFF_AFTER = ("records dropped: a line after the log's last record, of a form no record shares (a summary, "
                 "prose), not a training step")

#: A loss's term this small beside their sum is a player of a game that has won (LOSS_TERMS_ZERO).
_WON = 1e-3
_WON_CLIMBED = 1e-2
MEAN_NAN = ("records whose loss is read as NaN: a mean of the loss printed right after them (their epoch's) is not "
            "finite, so one of the steps it averages was not, whatever the record printed")
DROPPED_BLOCK = ("records dropped: a block under a step header whose loss is a statistic (an average) where the "
                 "log's other blocks print the loss itself: a summary")
#: A NaN warning's line, ignored (it marks the step before it), or read as a record of its own.
NAN_WARNING = "NaN warning (marks the step before it)"
NAN_AFTER = ("records read from a warning that the loss went non-finite after the last record (no record follows "
             "it): at the step it prints, else the step after the last")
#: What a warning line beside a record whose loss prints 0 does to it (Assembler.warning).
WARNED = ("records whose loss prints 0 read as NaN: a warning line beside them says the loss was not finite",
          "records whose loss prints 0 marked skipped (skipped=1, no loss read): a warning line beside them says "
          "the step was skipped")

#: The step of a record printed on the line after a progress bar's redraw (Assembler.record).
BAR_DRAWN = "the count of the progress bar drawn on the line before"

#: Why a record line makes no record (the account counts them as ignored lines).
DROPPED = ("epoch summary or another loop (the log's records print a finer counter)",
           "a statistic or terms of the loss (the log prints the loss itself)",
           "evaluation (the training bar counting the validation's batches, its values frozen: Lightning 1.x)",
           "a progress display's first draw (its count 0 and its loss 0: nothing computed yet)")


class Assembler:
    """Turns interpreted lines into records (see the module docstring). ``feed`` returns the
    records that are final; ``flush`` releases the held-back one; ``finish`` the rest."""

    # long: one line per piece of the assembler's state, each said beside it (the rules that
    # read a log one line at a time keep what they saw here; grouped, their names would hide)
    def __init__(self, account: ReadAccount | None = None):
        self.account = account if account is not None else ReadAccount("")
        self.indent = 0                       # the indentation of the line being fed
        self.line_no = 0                      # ... and its number (what the account says)
        self.last_step = 0
        self.pending: StepRecord | None = None
        self.made = 0                         # records made so far
        self.counted = False                  # a record was numbered by a counter it printed
        self.counted_template = ""            # ... and the template of the last such record
        self.dropped = ""                     # why the last record line made no record
        self.bar_before_epoch = False         # a complete bar came before any epoch
        self.fraction: tuple = (None, None)   # the epoch fraction and plan of the last uncounted record
        self.fractions = False   # the epoch printed as a fraction on some record (HF's `'epoch': '0.98'`)
        self.reprinted = False                # the record at hand prints the one before again
        self.outer: dict[str, list] = {}      # template -> [last count, last numbers before it,
        # the one that counts epochs, their first values, iterations per epoch]
        self.pending_how = ""
        self.pending_line = 0                 # the line the pending record was read from
        self.repeat = [0, 0.0, 0.0, True]     # a repeated step's losses (see _add)
        self.repeated_steps = 0               # steps printed more than once with a loss (ranks)
        self.row = False                      # the line fed is a table's row or a JSON line
        self.pending_undecided = False        # see emit
        self.pending_loss_name = ""
        self.pending_last_step = 0
        self.loss_name: str | None = None     # how the log's plain records name their loss
        self.loss_rank = len(LOSS_KINDS)      # the best way a record printed its loss so far
        self.loss_printed = ""                # ... and its name
        self.overflows: list[tuple] = []      # (step or None, scale left, skipped) since the last record
        self.nan_after: tuple | None = None   # a NaN warning after the last record: (step or None, value,
        #                                     its line, why it is ignored until then)
        self.saves: list[tuple[int, str]] = []   # checkpoints the log said it saved since the last record
        self.cumulative: int | None = None    # DeepSpeed's last cumulative skip count
        self.cumulative_first: tuple[StepRecord | None, int, int | None] | None = None
        # ^ (record, count, step) of the first cumulative count, its delta undecided
        self.epoch: int | None = None
        self.first_epoch: int | None = None   # the first epoch the log printed (its base: epoch_base)
        self.per_epoch: int | None = None     # batches per epoch, where the log declares them
        self.fine_counter = False             # a bar below its total was printed
        self.epoch_bars = False               # ... in the last epoch of a log numbered by epochs
        self.bar: tuple = (0, 0)              # (epochs done, total) of the last complete bar
        self.counter_global: set = set()      # (name, total) of batch counters that went on across an epoch change
        self.counter_restarts = False         # ... or restarted, no epoch length printed
        self.restart: list | None = None      # see _restarting
        self.bar_offset: int | None = None    # see _bar_lag
        self.step_restarts = False   # a step-named count with a total restarted as the epoch moved
        self.bar_step = 0   # the step of the last record a bar's count numbered (-1: the bar restarts: none)
        self.bar_drawn: tuple[int, int] = (-2, 0)   # (line, count) of the last bar drawn on a line of its own
        self.nums: list[str] = []             # the numbers of the record line fed, and of the held record's
        self.pending_nums: list[str] = []
        self.pending_indent = 0               # the indent of the held record's line
        self.stays: dict[int, tuple] = {}     # id(plan) -> (plan, the plan that numbers its lines: _stays, _stayed)
        self.kept: list[dict] = []            # the records of one step printed again by its template (_keep)
        self.released: list[StepRecord] = []  # ... made records after all (_stayed)
        self.copies: dict[int, dict] = {}      # the last records' metrics by step (copies), pruned in bulk
        self.kept_plan: Plan | None = None
        self.unit: int | None = None          # samples per step of a bar that counts samples
        self.sample_first: tuple | None = None   # (record, epochs done, total) of its 0 count
        self.counter_last: dict = {}          # (name, total) -> (epoch, value) of the last batch counter
        self.step_beside_epoch: tuple[int | None, int] | None = None   # see _constant_step
        self.step_stays = False
        self.step_moved = False               # a step-named count moved within an epoch (see _constant_step)
        self.bar_loop: tuple | None = None    # (printed keys, total) of the first bar record
        self.bar_last: tuple = (None, None)   # (count, epoch text) of that loop's last record
        self.epoch_steps = True               # False once an epoch held two records
        self.warned: tuple[str, int] = ("", 0)   # a warning line's word on the next record, its line
        self.beside: tuple | None = None      # (epoch, values) of a line of an epoch's values (see _in_epoch)
        self.ahead = False                    # beside or warned is set (emit's one test)
        self.epoch_made = 0                   # records made before the epoch at hand began
        self.attached = False                 # the line fed was read into a record (no ignored line)
        self.per_epoch_said = ""              # what the account heard of epoch x batches + batch
        self.epoch_lengths: list | None = None   # see _epochs_before
        self.passes = 0                       # see _next_pass: the batches of the passes before
        self.game_low = math.inf              # the lowest sum of a loss's terms so far (_loss_of_others)
        self.block: dict | None = None        # metrics of the indented block under a step header
        self.block_ranks: dict[str, tuple[int, int]] = {}   # (how the loss is printed, the name's rank)
        self.block_step: tuple = (None, "order", "")
        self.block_indent = -1
        self.by_header = False                # the last record was a step header's block
        self.micro = [0, 0.0, 0.0, True]      # micro-batch losses of one optimizer step
        self.micro_step: int | None = None
        self.micro_lone: dict | None = None   # the log's first line (at micro_step), until the second shows its step
        self.micro_metrics: dict[str, float] = {}
        self._noted: set = set()
        self._noted_plan: Plan | None = None   # the plan noted last (the common case: again)
        self._noted_how = ""
        self.noted_at = 0                     # the record the plan noted last made first
        self.validating: dict | None = None   # a validation bar began after a record with these values

    # -- lines -------------------------------------------------------------------------------

    def feed(self, nums, plan: Plan) -> list[StepRecord]:
        kind = plan.kind
        if kind == "record" or (kind == "ignore" and self.block is not None and plan.metrics):
            return self.record(nums, plan)   # (an LR alone is a line of the block)
        if kind == "overflow":
            idx = plan.overflow_scale if plan.overflow_scale is not None else plan.overflow_attempted
            # Hysteresis consumed without a reduction: the attempted scale stays.
            self._overflow(int(float(nums[plan.step])) if plan.step is not None else None,
                           float(nums[idx]) if idx is not None else None,
                           not plan.overflow_applied)
        elif kind == "nan":
            rec = self.pending
            at = int(float(nums[plan.step])) if plan.step is not None else None
            if rec is not None and keys.LOSS not in rec.metrics and (at is None or at == rec.step):
                rec.metrics[keys.LOSS] = float("nan")
            else:
                self._nan_after_seen(at, next((float(v) for v in nums if v.lstrip("+-")[:1] in "nNiI"), math.nan),
                                     NAN_WARNING)
        elif kind == "epoch" or (kind == "ignore" and plan.epoch is not None):
            self._epoch_context(nums, plan)   # (`Start Training ... Epoch 82/300, lr=0.05`)
        elif kind == "ignore" and self.epoch is not None and plan.step is None and plan.metrics \
                and all(k == keys.LR for _, k, _ in plan.metrics):
            self._in_epoch(nums, plan)
        elif kind == "header":
            out = self.close_block()
            step, how = self._step_of(nums, plan)
            self.block, self.block_ranks = {}, {}
            self.block_step = (step, how, self._printed_step(plan))
            self.block_indent = self.indent
            return out
        elif kind == "multi":
            out = []
            for a, b, part in plan.parts:
                out += self.feed(nums[a:b], part)
            return out
        elif kind == "eval" and plan.counter and self.pending is not None and self.pending_how == "counter":
            self.validating = self.pending.metrics   # (a validation bar after the epoch's training records)
        elif kind == "eval" and self.row and plan.eval_at is not None:
            # a results table's row whose training loss is not logged (HF's `No log`): its evaluation's
            # loss, a record of its own at its step (an evaluation gone NaN, weights that stopped changing)
            step, how = self._step_of(nums, plan)
            if step is not None:
                v = float(nums[plan.eval_at])
                return self.emit(step, {keys.EVAL_LOSS: -v if plan.eval_at in plan.signs else v}, plan, how,
                                 plan.step_name)
        return []

    def _in_epoch(self, nums, plan: Plan) -> None:
        """A line of the learning rate alone, with no step, inside an epoch's lines (`Epoch 3/20`,
        then `Learning rate: 0.0081`, then the epoch's bar): its value is the epoch's record's, the
        one held if it is this epoch's (the line printed after it), else the next one."""
        values = {k: (-float(nums[i]) if neg else float(nums[i])) for i, k, neg in plan.metrics}
        rec = self.pending
        if rec is not None and self.made > self.epoch_made and not values.keys() & rec.metrics.keys():
            rec.metrics.update(values)        # (the record held was printed in this epoch)
        else:
            self.beside, self.ahead = (self.epoch, values), True
        names = [printed for key, printed in plan.printed if key != "step"]
        for key, printed in plan.printed:
            if key != "step":
                self.account.saw(key, printed)
        self.account.note(f"lines of the learning rate alone inside an epoch ({', '.join(map(repr, names))}) are "
                          "read into that epoch's record")
        self.attached = True

    def goes_on(self, plan: Plan | None) -> bool:
        """Whether a line not indented under the step header holding a block is still one of its
        lines: a header whose lines start at its own margin (`iter 40/500`, then `loss=2.1
        grad_norm=0.8`, then `lr=1e-4`) holds the lines of metrics printing no step of their own
        after it, up to one that prints a metric the block holds already (a record of its own).
        Only a header that numbers the log's records does: one before the first record, or after a
        record it numbered, at a step ahead of it; a header among records numbered otherwise
        (`Iteration 50: saving checkpoint` between lines with no step) is about the one before it."""
        step = self.block_step[0]
        return plan is not None and plan.kind in ("record", "ignore") and bool(plan.metrics) \
            and plan.step is None and plan.epoch is None and self.block is not None \
            and (self.made == 0 or (self.by_header and (step is None or step > self.last_step))) \
            and not any(k in self.block for _, k, _ in plan.metrics)

    def close_block(self) -> list[StepRecord]:
        """The record of the indented block under a step header, once the block has ended."""
        block, self.block = self.block, None
        if not block:
            return []
        if keys.LOSS in block and self.block_ranks.get(keys.LOSS, (0, 1))[0] > self.loss_rank:
            # its loss a statistic (`| > avg_loss:`) in a log whose blocks print the loss itself: an
            # epoch's summary (Coqui's `TRAIN PERFORMACE -- GLOBAL_STEP: 405`), no step of its own
            self.account.change(self.line_no, DROPPED_BLOCK)
            return []
        self.by_header = True
        step, how, name = self.block_step
        return self.emit(step, block, None, how, name)

    def _printed_step(self, plan: Plan) -> str:
        return plan.step_name

    def _epoch_context(self, nums, plan: Plan) -> None:
        if plan.per_epoch is not None:
            self.per_epoch = int(float(nums[plan.per_epoch]))
        if plan.epoch is not None:
            text = nums[plan.epoch]
            if not text.isdigit():
                self.fractions = True
                return                        # HF's epoch fraction is no counter
            if self.fractions:
                return                        # ... nor that fraction at a whole epoch (`'epoch': '1'` after '0.99')
            first = self.epoch is None
            if self.epoch != int(text):
                self.epoch_made = self.made
            self.epoch = int(text)
            if self.first_epoch is None:
                self.first_epoch = self.epoch
            if first and self.bar_before_epoch and self.pending is not None and self.made == 1:
                # An excerpt that opens with a complete bar, its `Epoch E` header above the
                # excerpt: the bar is the epoch before the first header.
                self.pending.step = self.last_step = self.epoch - 1
                self._renumbered("epoch")

    def _step_of(self, nums, plan: Plan) -> tuple[int | None, str]:
        """The step a line stands for and how it was numbered (``counter``, ``epoch``, or
        ``order``: ``None``, numbered in order of appearance)."""
        if plan.epoch is None and plan.per_epoch is None \
                and (self.epoch is None or plan.step_rank == 0):
            if plan.step is None:
                return None, "order"
            text = nums[plan.step]
            value = int(text) if text.isdigit() else int(float(text))
            total = total_of(nums, plan)
            if plan.counter and self.made == 0 and total == value:
                self.bar_before_epoch = True  # a complete bar opens the log (see _epoch_context)
            unit = self._sample_unit(value, total, plan, 0) if plan.counter and total is not None else 0
            if unit:
                return -(-value // unit), "samples"
            return (self._outer_step(nums, plan, value) if plan.outer else value) + self.passes, "counter"
        self._epoch_context(nums, plan)
        if plan.step is None:
            own = nums[plan.epoch] if plan.epoch is not None else ""
            if own.isdigit() and self.epoch_steps and not self.fractions:
                return int(own), "epoch"      # an epoch and nothing finer: the epoch is the step
            if not own and self.epoch is not None and self.epoch_steps:
                return self.epoch, "epoch"    # under an epoch's header (`=== Epoch 3/20 ===`)
            return None, "order"
        value = int(float(nums[plan.step]))
        if self.epoch is not None and not plan.counter and plan.step_total is None \
                and self._constant_step(value, plan):
            return self.epoch, "epoch"
        if self.epoch is None or plan.step_rank == 0:
            return value, "counter"
        done = self.epoch - (self.epoch_base or 0)
        total = int(float(nums[plan.step_total])) if plan.step_total is not None else None
        # A count whose name does not say it counts within the epoch, with no total (a bar
        # without one, `100it [.., loss=1.8]` under `Epoch 2`), is one too if it goes down when
        # the epoch moves, and a global count if it goes on: the same test decides.
        if plan.within_epoch or (total is None and self.per_epoch is None):
            if self._counts_the_run(plan, total, value):
                return value, "counter"
            unit = self._sample_unit(value, total, plan, done) if plan.counter and total is not None else 0
            if plan.counter and self.epoch_bars:
                return self.epoch, "epoch"    # a bar that stops inside the last epoch: see _cut_epoch
            if total is not None and value < total and not self.fine_counter:
                if plan.counter and self._cut_epoch(plan):
                    return self.epoch, "epoch"
                self.fine_counter = True
                self._renumber_bar()
            if plan.counter and total is not None and value == total and not self.fine_counter:
                self.bar = (self.epoch - (self.epoch_base or 0), total)
                return self.epoch, "epoch"    # only complete bars: nothing finer than the epoch
            if unit and total is not None:
                return done * -(-total // unit) + -(-value // unit), "samples"
            per_epoch = total if total is not None else self.per_epoch
            if per_epoch is not None:
                if not self.per_epoch_said:
                    self.per_epoch_said = (f"{plan.step_name!r} counts batches within an epoch of {per_epoch:,}: "
                                           f"{self._epochs_times(plan.step_name, per_epoch)}")
                    self.account.note(self.per_epoch_said)
                return self._epochs_before(done, per_epoch, plan) + value, "counter"
            return self._restarting(value, plan, done)
        elif self.per_epoch is not None:
            return done * self.per_epoch + value, "counter"
        if total is not None and not plan.counter:
            return self._named_restart(value, total, done, plan), "counter"
        return (value, "counter") if value >= done and not plan.counter else (None, "order")

    def _moved(self, prev: StepRecord, metrics: dict, plan: Plan | None, how: str) -> int | None:
        """The step of a record at the held one's that is a step of its own after all: a count that
        stays (:meth:`_stays`), or a complete bar's next pass (:meth:`_next_pass`); None: it is not."""
        moved = self._stays(prev, plan, metrics) if how == "counter" and plan is not None and plan.others else None
        if moved is not None:
            return moved
        extra = self._next_pass(prev, metrics, plan)
        return prev.step + extra if extra else None

    def _next_pass(self, prev: StepRecord, metrics: dict, plan: Plan | None) -> int:
        """The batches of a complete bar printed again on a line of its own, with other values, where
        no epoch is named (0 where it is not so): the next pass over the data (Keras' `fit` pasted
        without its `Epoch N/M` lines: `1875/1875 [====] - loss: 0.41`, then `.. - loss: 0.33`),
        numbered on from the one before by the bar's total (``passes``), as an epoch's batches."""
        if plan is None or not plan.counter or self.epoch is not None or self.line_no == self.pending_line \
                or metrics == prev.metrics or plan.step is None:
            return 0
        total = total_of(self.nums, plan)
        if total is None or float(self.nums[plan.step]) != total or prev.step != total + self.passes:
            return 0
        if not self.passes:
            self.account.note(f"a complete bar printed again on a line of its own, no epoch named: each is the next "
                              f"pass over the data (an epoch of {total:,} batches), numbered on from the one before")
        self.passes += total
        return total

    def _epochs_before(self, done: int, per_epoch: int, plan: Plan) -> int:
        """The steps of the epochs before this one, each as long as its bar's total: ``done x
        total`` until the total changes (YOLO's bars double when the backbone unfreezes, its batch
        halved: 60 batches an epoch, then 120), then on from where the epochs before it ended."""
        base = self.epoch_lengths
        if base is None:
            base = self.epoch_lengths = [per_epoch, 0, 0]   # total, from epochs done, steps before them
        elif per_epoch != base[0] and done > base[1]:
            base[:] = [per_epoch, done, base[2] + (done - base[1]) * base[0]]
            self.account.note(f"{plan.step_name!r} counts to {per_epoch:,} from epoch {self.epoch}: steps go on "
                              f"from {base[2]:,}, the steps of the epochs before it")
        return base[2] + (done - base[1]) * per_epoch

    def _counts_the_run(self, plan: Plan, total: int | None, value: int) -> bool:
        """Whether a count beside the epoch went on as the epoch moved (a global count, the step as
        printed), not restarted, per counter: a header's own count (RETURNN's `start epoch 2 global
        train step 80`) is not its records' (`step 0`)."""
        counter = (plan.step_name, total)
        last_epoch, last_value = self.counter_last.get(counter, (None, 0))
        if last_epoch is not None and self.epoch is not None and self.epoch > last_epoch and (
                value > last_value or (value == last_value and self.step_moved)):
            self.counter_global.add(counter)   # it did not restart: a global count
            if self.per_epoch_said in self.account.notes:   # (said at the first epoch: taken back)
                self.account.notes.remove(self.per_epoch_said)
                self.account.note(f"{plan.step_name!r} goes on counting as the epoch moves: the run's own "
                                  f"count, the step as printed")
        self.counter_last[counter] = (self.epoch, value)
        return counter in self.counter_global and not (self.restart and self.restart[0] is None)

    def _named_restart(self, value: int, total: int, done: int, plan: Plan) -> int:
        """A step-named count with its total beside the epoch (``Epoch [2/5], Step [100/600]``, or
        under an epoch a summary after its records names):
        the run's own count (``Epoch 3/10 | Step 12000/40000``) until it goes down as the epoch
        moves; from then on it counts the epoch's batches: steps are epochs done x its total +
        the count (the records before the restart, of the log's first epoch, keep their count)."""
        counter = (plan.step_name, total)
        if plan.epoch is None and counter not in self.counter_last and self.pending is not None \
                and self.pending.epoch is None and value < self.pending.step and self.epoch is not None:
            # the epoch known only from a summary after its records (SimCLR's `Step [0/390]` lines,
            # then `Epoch [0/100] Loss:`): the count before it was the epoch before's
            self.counter_last[counter] = (self.epoch - 1, self.pending.step)
        last_epoch, last_value = self.counter_last.get(counter, (None, 0))
        self.counter_last[counter] = (self.epoch, value)
        if not self.step_restarts and last_epoch is not None and self.epoch is not None \
                and self.epoch > last_epoch and value < last_value:
            self.step_restarts = True
            self.account.note(f"{plan.step_name!r} restarts as the epoch moves (from epoch {self.epoch}): it counts "
                              f"batches within an epoch of {total:,}: {self._epochs_times(plan.step_name, total)}")
        return done * total + value if self.step_restarts else value

    @property
    def epoch_base(self) -> int | None:
        """What the log's epochs count from: Lightning's from 0, Keras' from 1 (its first epoch
        printed, at most 1)."""
        return None if self.first_epoch is None else min(self.first_epoch, 1)

    def _epochs_times(self, name: str, per_epoch: int) -> str:
        """How steps are made of the epoch and a count within it, for the account's note."""
        first = f"(epoch - {self.epoch_base})" if self.epoch_base else "epoch"
        base = (f" (epochs assumed counted from 1: the first printed is {self.first_epoch}, not 0 or 1)"
                if self.first_epoch is not None and self.first_epoch > 1 else "")
        return f"steps are {first} x {per_epoch:,} + {name!r}{base}"

    def _constant_step(self, value: int, plan: Plan) -> bool:
        """A step-named count that does not move while the epoch printed beside it does (`Epoch 2
        finished: steps 469, train_loss ...`: the batches of an epoch) counts no steps: the
        records are numbered by the epoch, the first one too (it is still held back)."""
        if self.step_stays:
            return True
        seen, self.step_beside_epoch = self.step_beside_epoch, (self.epoch, value)
        if seen is not None and seen[0] == self.epoch and seen[1] != value:
            self.step_moved = True        # it moved within an epoch: a running count (litgpt's optimizer
            # step printed on each micro-batch's line stays as an epoch ends inside an accumulation)
        if self.step_moved or seen is None or seen[0] is None or seen[0] == self.epoch or seen[1] != value:
            return False
        self.step_stays = True
        if self.pending is not None and self.made == 1 and self.pending.step == value:
            self.pending.step = self.last_step = seen[0]
            self._renumbered("epoch")
        self.account.note(f"{plan.step_name!r} stays at {value:,} while the epoch moves (a count of an "
                          "epoch's batches, or the batch it prints at): it numbers no steps; the records "
                          "are numbered by the epoch")
        return True

    def _sample_unit(self, value: int, total: int, plan: Plan, done: int) -> int:
        """The unit of a bar's count that counts samples, not batches (the PyTorch examples'
        ``[640/60000 (1%)]``, open_clip's ``[64/109468 (0%)]``, old Keras' ``32/60000``), or 0.
        Decided once, at its first count above 0 and below its total: samples come in
        multiples of the batch size, and a batch size holds a power of two (>= 32) that a print
        interval of batches (10, 50, 100, 1000) does not; the unit is that first count, and an
        epoch (the total) holds many of them (a bar at 160/162 is no sample count). A first
        record printed at 0 is renumbered (0 samples: the epoch's first step)."""
        if self.unit is None:
            if not 0 < value < total:
                if value == 0 and self.sample_first is None:
                    self.sample_first = (self.made + 1, done, total)
                return 0
            self.unit = value if (value & -value) >= SAMPLES_POWER and total >= SAMPLES_PRINTS * value else 0
            if self.unit:
                per = -(-total // value)
                self.account.sample_unit, self.account.sample_epoch = value, per
                self.account.note(f"{plan.step_name!r} counts samples, not batches (its counts are multiples "
                                  f"of {value:,}, which holds a power of two >= {SAMPLES_POWER}, as a batch size "
                                  f"does and a print interval of batches does not): steps are samples seen / "
                                  f"{value:,}, {per:,} to an epoch of {total:,}")
                first = self.sample_first
                if first is not None and self.pending is not None and first[0] == self.made \
                        and self.pending_how == "counter":
                    self.pending.step = self.last_step = first[1] * -(-first[2] // value)
                    self._renumbered("samples")
        return self.unit or 0

    def _restarting(self, value: int, plan: Plan, done: int) -> tuple[int | None, str]:
        """The step of a counter within an epoch whose length the log does not print, one way for
        the whole log, decided at its first record: one below the epochs done (an excerpt from a
        late epoch: ``[37][0]``) numbers the records in order; any other (``step``, ``iter``,
        ``batch``, a bar's count), the steps of the epochs before + n: the first epoch shown as
        printed (offset 0; it may be cut at its start), each later one L long, L the largest
        count an epoch showed (+ 1 where the counter counts from 0), learned at its first
        restart and grown at each epoch's end (`(epoch - first epoch) x L + n` where the first
        epoch is whole). Never records by order after the counter's own numbers, or the reverse."""
        r = self.restart
        name = plan.step_name
        if r is None:
            ordered = value < done
            # [first epoch, epoch, its largest count, counts from 0, L, the epoch's offset, it is the first
            #  shown, the gap between its prints, L found from where the prints fall]
            r = self.restart = [None if ordered else self.epoch, self.epoch, 0, False, 0, 0, True, 0, False]
            if self.made and self.pending_how == "counter" and value < self.last_step and self.epoch:
                # records this count numbered before the log printed an epoch (an excerpt that
                # starts inside one, above its next epoch's header): that epoch's, the one before
                r[0], r[4], r[5], r[6] = self.epoch - 1, self.last_step, self.last_step, False
            if ordered:
                self.account.note(f"{name!r} counts within an epoch and the log prints no epoch "
                                  "length: the records are numbered in order, for the whole log")
                self.account.order_reason = (f"whose counter {name!r} counts within an epoch and which "
                                             "prints no epoch length")
        if r[0] is None:
            return None, "order"
        r[3] = r[3] or value == 0
        if self.epoch != r[1]:
            self._epoch_ended(r, name, value)
        elif value > r[2] > 0:   # the gap between prints, while every one is the same (-1: not so)
            r[7] = value - r[2] if r[7] in (0, value - r[2]) else -1
        r[2] = max(r[2], value)
        return r[5] + value, "counter"

    def _epoch_ended(self, r: list, name: str, first: int) -> None:
        """The epoch of a restarting count ended (:meth:`_restarting`): the next one's offset. Where
        the count is printed every ``gap`` optimizer steps of the whole run, not of the epoch (the
        next epoch's ``first`` print comes before one gap: 350, then 9 with a gap of 50), the epoch
        was ``largest + gap - first`` long (391), not its largest print."""
        gap = r[7]
        grid = gap > 0 and not r[3] and 0 < first < gap
        r[7] = 0   # the next epoch's gaps are its own
        ended = r[2] + gap - first if grid else r[2] + r[3]
        r[8] = r[8] or grid
        grew = r[1] == r[0] + 1 and ended > r[4] > 0      # the first whole epoch, longer than the first shown
        r[4] = max(r[4], ended)               # the epoch that ended: its length
        r[5] += (ended if r[6] else r[4]) + max(0, self.epoch - r[1] - 1) * r[4]
        r[1], r[2], r[6] = self.epoch, 0, False
        if not self.counter_restarts:
            self.counter_restarts = True
            lead = f"(epoch - {r[0]})" if r[0] else "epoch"
            plus = ", + 1: it counts from 0" if r[3] else ""
            how = (f"its largest print + the gap between prints ({gap:,}) - the next epoch's first: printed every "
                   f"{gap:,} steps of the run" if r[8] else f"the largest {name!r} of an epoch{plus}")
            self.account.note(f"{name!r} restarts at every epoch and the log prints no epoch length: "
                              f"steps are {lead} x {r[4]:,} ({how}) + {name!r}")
        elif grew:
            self.account.note(f"{name!r} went to {r[4]:,} in the first whole epoch, higher than in the first one "
                              f"shown (cut): the epochs after that are {r[4]:,} long, each going on from the one before")

    def _another_loop(self, plan: Plan, nums) -> bool:
        """A progress bar with another total than the first bar that carried a metric: another
        loop's, with other keys (stable-dreamfusion's evaluation bar, `loss=0.0000: 100% 8/8`,
        between training bars `loss=1.0000, lr=0.05: 100% 100/100`), or with the same keys where
        it counts again from below the first loop's last count in the same epoch (an evaluation
        pass, `Epoch 1 [ 5/20] loss: 2.6` after `Epoch 1 [100/100] loss: 1.9`: a resume would
        begin another epoch or go on counting)."""
        here = (plan.printed, total_of(nums, plan))
        count = float(nums[plan.step]) if plan.step is not None else None
        epoch = nums[plan.epoch] if plan.epoch is not None else None
        if self.bar_loop is None:
            self.bar_loop, self.bar_last = here, (count, epoch)
            return False
        if here[1] == self.bar_loop[1]:
            self.bar_last = (count, epoch)
            return False
        if here[0] != self.bar_loop[0]:
            return True
        last, last_epoch = self.bar_last
        return here[1] is not None and count is not None and last is not None and count <= last and epoch == last_epoch

    def _another_bar(self, plan: Plan, nums, metrics: dict) -> bool:
        """Whether a bar's line is no training record: another loop's (:meth:`_another_loop`) or a
        validation's redraw of the training bar (:meth:`_validation_redraw`); its reason kept."""
        if self._another_loop(plan, nums):
            self.dropped = DROPPED[0]
        elif self.validating is not None and self._validation_redraw(self.validating, metrics):
            self.dropped = DROPPED[2]
        else:
            return False
        return True

    def _validation_redraw(self, last: dict, metrics: dict) -> bool:
        """Whether a training bar's line after a validation bar began is the validation's: Lightning
        1.x's main bar counts the validation's batches after the epoch's training ones, its postfix
        frozen at the last training values meanwhile (`120/120 [.., loss=1.947]` after `100/120
        [.., loss=1.947]`). A value that changed is training again (a validation mid-epoch over)."""
        if all(metrics.get(k) == v for k, v in last.items() if k in metrics) and metrics.keys() <= last.keys():
            return True
        self.validating = None
        return False

    def _same_fraction(self, text: str, plan: Plan, metrics: dict) -> int | None:
        """A record with no counter, printed in another form (other keys) at the epoch fraction
        and with the loss of the one before it (HF's `'epoch': 0.01` dict printed by two callbacks): the same
        record, printed again; its later values win."""
        self.reprinted = False
        if text.isdigit():
            return None
        fraction, (last, last_plan) = float(text), self.fraction
        self.fraction = (fraction, plan)
        prev = self.pending
        if fraction == last and last_plan is not None and plan.printed != last_plan.printed \
                and prev is not None \
                and prev.metrics.get(keys.LOSS) == metrics.get(keys.LOSS):
            self.reprinted = True
            return prev.step
        return None

    def _outer_step(self, nums, plan: Plan, value: int) -> int:
        """The step of a line whose counter restarts when an integer before it goes up (timm's
        `Train: 1 [  0/73 (  1%)]`): epoch x iteration, ``(epoch - first epoch) x N + n``, N the
        counter's printed total. Without one (a table's columns, ``1 100 2.30`` then ``2 10
        1.95``), only a restart to the counter's first value as the integer goes up by one counts
        an epoch (a resume goes back to a checkpoint's step, and a clock's hour may tick), and N
        is the largest count printed before it. Until the restart the counter is taken as printed."""
        outs = [nums[i] for i in plan.outer]
        state = self.outer.get(plan.merged)
        if state is None:
            self.outer[plan.merged] = [value, outs, None, outs, 0, value]
            return value
        last, last_outs, at, first, per, start = state
        total = total_of(nums, plan)
        if at is None and value < last:
            at = next((j for j, (a, b) in enumerate(zip(last_outs, outs)) if a.isdigit() and b.isdigit()
                       and (int(b) > int(a) if total else int(b) == int(a) + 1 and value <= start)), None)
            if at is not None:
                per = total or last
                state[2], state[4] = at, per
                name = plan.step_name
                each = f"{per:,} iterations each" if total else \
                    f"{per:,} iterations each (the largest {name!r} printed before it restarts: the log prints no total)"
                self.account.note(f"steps are epoch x iteration: the number before {name!r} counts "
                                  f"epochs (it goes up when {name!r} restarts), {each}")
        state[0], state[1] = value, outs
        if at is None or at >= len(outs) or at >= len(first) or not outs[at].isdigit() or not first[at].isdigit():
            return value   # (a line of the template with fewer numbers before the counter: none counts epochs)
        return (int(outs[at]) - int(first[at])) * (total or per) + value

    def _cut_epoch(self, plan: Plan) -> bool:
        """Whether a bar below its total, after records numbered by their epochs (complete bars
        only, released already), is the last epoch's, in progress where the log ends or was cut
        (Keras' `fit` excerpt): numbered by its epoch too, its redraws one record (its last
        values), so the log keeps one numbering (before, the earlier epochs were steps 1, 2, 3
        and the last ones batches since the start: 2345, 2395, ...)."""
        if not (self.made >= 2 and self.pending_how == "epoch" and self.bar[1]):
            return False
        self.epoch_bars = True
        self.account.note(f"{plan.step_name!r} stops below its total after epochs printed only complete: the "
                          "log ends inside an epoch, whose records are numbered by the epoch too (one record, "
                          "its last values), as the epochs before it")
        return True

    def _renumber_bar(self) -> None:
        """The first bar below its total: the complete bar held back counts batches too."""
        if self.pending is not None and self.pending_how == "epoch":
            done, total = self.bar
            self.pending.step = self.last_step = done * total + total
            self._renumbered("counter")

    def _renumbered(self, how: str) -> None:
        """The held-back record is numbered ``how`` after all (the account hears of it)."""
        self.pending_how = how
        self.account.renumbered(self.made, how, self.pending.step if self.pending is not None else self.last_step)

    def record(self, nums, plan: Plan) -> list[StepRecord]:
        """The records a record line completes (the readers' fast path calls it directly)."""
        if self.stays:
            got = self.stays.get(id(plan))
            plan = got[1] if got is not None and got[0] is plan else plan
        self.nums = nums
        if plan.values is not None:
            metrics = plan.values(nums)
        else:
            metrics = {key: (-float(nums[i]) if negative else float(nums[i]))
                       for i, key, negative in plan.metrics}
        if plan.components or plan.ppl_at is not None:
            self._loss_of_others(nums, plan, metrics)
        if plan.scale_log2_at is not None:
            metrics[keys.LOSS_SCALE] = 2.0 ** float(nums[plan.scale_log2_at])
        if plan.loss_at is not None:
            text = nums[plan.loss_at]
            if text[-1:] == "0" and "." in text and "e" not in text and "E" not in text:
                # `1.000000` reads back as 1.0: the printed digits the float loses (stall)
                metrics[keys.LOSS_RESOLUTION] = 10.0 ** (text.index(".") + 1 - len(text))
            if plan.loss_window:
                metrics[keys.LOSS_WINDOW] = plan.loss_window
        if self.block is not None:
            self._into_block(metrics, plan)
            return []
        self.by_header = False
        if plan.simple and self.epoch is None:      # the common case: a named step as printed
            text = nums[plan.step]             # (its loss printed as such: Plan.simple)
            return self.emit(int(text) if text.isdigit() else int(float(text)), metrics, plan,
                             "counter", plan.step_name)
        if self._first_draw(nums, plan, metrics):
            return []
        if plan.step is None and not plan.loss_kind and self._indented_more(plan, metrics):
            return []   # (a record's line wrapped onto an indented one)
        if plan.loss_rank != self.loss_rank and self._another_loss(nums, plan, metrics):
            return []
        if plan.counter and self._another_bar(plan, nums, metrics):
            return []
        step, how = self._step_of(nums, plan)
        if plan.after_bar and step is not None and how == "counter":
            step += self._bar_lag(step)
        elif step is None and self.bar_drawn[0] >= self.line_no - 1:
            step, how = self._by_bar()
        if how == "epoch" and not plan.counter and self.pending is not None \
                and self.pending_how == "epoch" and self.pending.step == step:
            if self._again_in_epoch(self.pending, metrics, plan):
                return []
            # Two records of one epoch and nothing finer: records are numbered in order.
            self.epoch_steps = False
            self.account.order_reason = "whose records print no counter finer than their epoch"
            self.pending.step = self.last_step = self.pending_last_step + 1
            self._renumbered("order")
            step, how = None, "order"
        if how == "epoch" and self.counted and (plan.step is None or (
                plan.counter and self.pending_how in ("counter", "samples"))):
            # A line of metrics numbered by its epoch alone in a log whose records print a finer
            # counter: an epoch's summary or evaluation (`[train] epoch: 1/15` over `- total loss:`).
            self.dropped = DROPPED[0]
            if keys.LOSS in metrics and self.epoch is not None and self.pending is not None \
                    and self.pending.epoch in (None, self.epoch):
                # ... printed once the epoch's records are done (its loss is their result: speechbrain's
                # `epoch: 1, lr: .. - train loss: ..` after the bar): the records after it are the next epoch's
                self.epoch, self.epoch_made = self.epoch + 1, self.made
            return []
        if self.made and self._noted_plan is not None and plan.merged != self._noted_plan.merged \
                and self._split_named(plan):
            self.dropped = DROPPED[0]
            return []
        if step is None and plan.epoch is not None:
            step = self._same_fraction(nums[plan.epoch], plan, metrics)
        if plan.cumulative_skips and keys.OVERFLOW_SKIPPED in metrics:
            self._cumulative(metrics, step)
        if plan.micro is not None and step is not None:
            return self._micro(step, metrics, plan, how)
        return self.emit(step, metrics, plan, how, self._printed_step(plan) or (BAR_DRAWN if how == "counter" else ""))

    def _loss_of_others(self, nums, plan: Plan, metrics: dict) -> None:
        """The loss of a line that prints its terms (their sum) or a perplexity (its log), into ``metrics``."""
        if plan.components:
            total = metrics[keys.LOSS] = _sum_of_terms(nums, plan.components)
            before = self.game_low
            if total < before:
                self.game_low = total
            # a term at 0, or a discriminator's within 0.1% of the sum: a GAN's player that has won (a
            # discriminator's 0.0004 beside a generator's 8.3 tells real from generated perfectly, printed or
            # not as 0; an identity or reconstruction term may near 0 in a healthy game); or within 1% of it
            # where the sum has doubled since its low (the generator's loss climbing as the discriminator wins:
            # DCGAN's 0.05 beside 7.2, after 0.8 beside 2.5 — a healthy DCGAN's stays above 3% of it; a game
            # that sits at 0.01 beside 6 from its start has not moved)
            won = _WON_CLIMBED if 0.0 < before < math.inf and total >= 2.0 * before else _WON
            zeros = sum(float(nums[i]) == 0.0 or (i in plan.discriminators and abs(float(nums[i])) <= won * abs(total))
                        for i, _ in plan.components) if len(plan.components) > 1 else 0
            if zeros:
                metrics[keys.LOSS_TERMS_ZERO] = float(zeros)
        elif plan.ppl_at is not None:
            ppl = float(nums[plan.ppl_at])
            if ppl > 0.0 or ppl != ppl:
                metrics[keys.LOSS] = math.log(ppl) if ppl == ppl else ppl

    def _first_draw(self, nums, plan: Plan, metrics: dict) -> bool:
        """Whether a line is a progress display's first draw, its count 0 and its loss 0 (DeepSpeech's
        `Steps: 0 | Loss: 0.000000` as each epoch's bar opens): nothing computed yet, dropped and said."""
        if plan.step is None or metrics.get(keys.LOSS) != 0.0 or nums[plan.step] != "0":
            return False
        self.dropped = DROPPED[3]
        return True

    def _indented_more(self, plan: Plan, metrics: dict) -> bool:
        """Whether a line of values with no step and no loss, indented deeper than the held record's
        line, is that record's line wrapped (`Epoch: [3][100/500]  loss: 6.93` then `    grad_norm:
        1.2e-09  lr: 0.03`): its values, other keys than the record's, read into it and said."""
        rec = self.pending
        if rec is None or self.indent <= self.pending_indent or not metrics or metrics.keys() & rec.metrics.keys():
            return False
        rec.metrics.update(metrics)
        for key, printed in plan.printed:
            if key != "step":
                self.account.saw(key, printed)
        self.account.change(self.line_no, MERGED[6])
        return True

    def _split_named(self, plan: Plan) -> bool:
        """Whether a line names the loss of the log's counted records with the training split's word
        before it (fairseq's epoch summary ``{"epoch": 1, "train_loss": .., "train_num_updates": 1563}``
        after its interval records' ``{"loss": .., "num_updates": ..}``): the epoch's summary."""
        words = plan.loss_name.split()
        return self.loss_name is not None and len(words) > 1 and words[0] in TRAIN_SPLITS \
            and " ".join(words[1:]) == self.loss_name

    def _by_bar(self) -> tuple[int | None, str]:
        """The step of a record with no counter printed on the line after a bar's redraw (HF's
        Trainer: `50/1000 [..]`, then `{'loss': ..}`): the bar's count, or in order where the
        bar restarted below the record it numbered."""
        if self.bar_drawn[1] <= self.last_step and self.pending is not None \
                and self.pending.step == self.bar_step and self.pending_how == "counter":
            # the bar restarted: it counts the batches of a pass over the data (an epoch), not
            # the run's steps; each record a pass's summary, numbered in order, the one it
            # numbered too (before: that one at the bar's count, the next ones in order after
            # it, and the account said "in order" of all of them)
            self.bar_step = -1
            self.account.order_reason = ("each printed after a progress bar whose count restarts (the bar counts the "
                                         "batches of a pass over the data, not the run's steps)")
            self.pending.step = self.last_step = self.pending_last_step + 1
            self._renumbered("order")
            return None, "order"
        if self.bar_drawn[1] <= self.last_step or self.bar_step == -1:
            return None, "order"
        if self.bar_offset is None:
            self.account.note("records that print no counter, printed on the line after a progress bar's redraw, "
                              "are numbered by its count (HF's Trainer draws its bar at the step, then prints "
                              "the step's logs)")
        self.bar_step = self.bar_drawn[1] + self._bar_lag(self.bar_drawn[1])
        return self.bar_step, "counter"

    def loss_printed_as(self, plan: Plan) -> None:
        """The log prints its loss as ``plan`` does (a reader that saw it ahead says so)."""
        if plan.loss_rank < self.loss_rank:
            self.loss_rank = plan.loss_rank
            self.loss_printed = plan.loss_name

    def _loss_of(self, plan: Plan, metrics: dict) -> bool:
        """A log that prints the loss itself anywhere takes no statistic of it (``avg loss``)
        or sum of its terms from another line (LOSS_KINDS): such a line keeps its other
        metrics. False when nothing is left of the record. An epoch's line with no step, in a log
        whose records print a finer counter, is a summary (dropped as such): its loss's name says
        nothing of the records' (JoeyNMT's `Epoch 1: total training loss 6234.5` beside its `Batch
        Loss:` records, which were no longer read after it)."""
        if plan.step is None and plan.epoch is not None and self.counted:
            return True
        if plan.loss_rank < self.loss_rank:
            self.loss_rank = plan.loss_rank
            self.loss_printed = plan.loss_name or " + ".join(n for k, n in plan.printed if k == keys.LOSS)
            return True
        if plan.loss_rank < len(LOSS_KINDS):
            metrics.pop(keys.LOSS, None)
            metrics.pop(keys.LOSS_RESOLUTION, None)
            metrics.pop(keys.LOSS_WINDOW, None)
            metrics.pop(keys.LOSS_TERMS_ZERO, None)
            self.account.note(f"lines that print only {LOSS_KINDS[plan.loss_rank]} of the loss are "
                              f"not read as the loss: the log prints {self.loss_printed!r}")
        return bool(metrics)

    def _into_block(self, metrics: dict, plan: Plan) -> None:
        block = self.block
        assert block is not None
        ranks = dict(zip((k for _, k, _ in plan.metrics), plan.ranks)) if plan.ranks else {}
        for k, v in metrics.items():
            # the loss printed as such beats a term's line (Coqui's `| > decoder_loss:` above `| > loss:`)
            rank = (plan.loss_rank if k == keys.LOSS else 0, ranks.get(k, 1))
            if k not in block or rank < self.block_ranks.get(k, (0, 1)):
                block[k] = v
                self.block_ranks[k] = rank
        self._note(plan, "")

    def _cumulative(self, metrics: dict, step: int | None) -> None:
        total = int(metrics.pop(keys.OVERFLOW_SKIPPED))
        first = self.cumulative_first
        if self.cumulative is None:
            if total == 0:
                metrics[keys.OVERFLOW_SKIPPED] = 0.0           # nothing skipped so far: none here either
            else:
                self.cumulative_first = (None, total, step)   # the record is set by emit
        else:
            last = self.cumulative
            metrics[keys.OVERFLOW_SKIPPED] = float(total - last if total >= last else total)
            if first is not None:
                rec, count, first_step = first
                if step is not None and first_step is not None and first_step <= step - first_step \
                        and rec is not None and rec is self.pending:
                    rec.metrics[keys.OVERFLOW_SKIPPED] = float(count)   # the run's first print interval
                else:
                    self._mid_run(count, first_step)
                self.cumulative_first = None
        self.cumulative = total

    def _mid_run(self, count: int, step) -> None:
        self.account.note(f"the first cumulative skip count ({count} at step {step}) is not "
                          "counted as skips of that step: the log does not start at the run's "
                          "first print interval")

    def _micro(self, step: int, metrics: dict, plan: Plan, how: str) -> list[StepRecord]:
        # litgpt counts the optimizer step on the micro-batch that takes it: a record is the
        # micro-batches since the previous step, at the new step number; micro-batches after
        # the last optimizer step of the log make none.
        # The log's first line waits for the second to show whether lines repeat a step: where
        # that one steps too, every line is an optimizer step of its own, the first one included
        # (before: the first merged into the second as its micro-batch).
        out_first: list[StepRecord] = []
        lone, self.micro_lone = self.micro_lone, None
        if lone is not None and not plan.marker and self.micro_step is not None and step > self.micro_step:
            out_first = self.emit(self.micro_step, lone, plan, how, self._printed_step(plan))
        elif lone is not None:
            self._micro_add(lone)
        if self.micro_step is None and not plan.marker:
            self.micro_step, self.micro_lone = step, metrics
            return []
        self._micro_add(metrics)
        stepped = plan.marker or (self.micro_step is not None and step > self.micro_step)
        self.micro_step = step
        if not stepped:
            return out_first
        out = self.micro_metrics
        if self.micro[0]:
            out[keys.LOSS] = _mean(self.micro)
            if self.micro[0] > 1:
                self.account.change(self.line_no, MERGED[3], int(self.micro[0]) - 1)
        self.micro, self.micro_metrics = [0, 0.0, 0.0, True], {}
        return out_first + self.emit(step, out, plan, how, self._printed_step(plan))

    def _micro_add(self, metrics: dict) -> None:
        """A micro-batch's line into the optimizer step's record being made."""
        loss = metrics.pop(keys.LOSS, None)
        metrics.pop(keys.LOSS_RESOLUTION, None)   # their mean is not printed
        if loss is not None:
            _add(self.micro, loss)
        self.micro_metrics.update(metrics)

    # -- records -----------------------------------------------------------------------------

    def emit(self, step: int | None, metrics: dict, plan: Plan | None, how: str,
             step_name: str) -> list[StepRecord]:
        """A record at ``step`` (``None``: the next in order); returns the one it releases."""
        if plan is not None and (plan.mixed or self.pending_undecided):
            if self._mixed_is_eval(plan):
                return []
        elif plan is not None and plan.loss_name and self.loss_name is None:
            self.loss_name = plan.loss_name
        if (step is None or (step < self.last_step and how == "counter")) and self._summary(plan, metrics):
            self.account.change(self.line_no, MERGED[4])   # (it adds nothing the record does not print)
            return []
        if step is None:
            if self.pending is not None and self.pending_how != "order" and self._terms_apart(self.pending, metrics, plan):
                return []   # (the other player's term on the next line, no step of its own: `        Loss_G: 1.2`)
            step, how = self.last_step + 1, "order"
        elif how == "counter" and step < self.last_step and self.copies.get(step) == metrics:
            self.account.change(self.line_no, COPIED)   # a step gone back to, printed the same: a copy
            return []
        if self.overflows:
            self._fold_overflows(metrics, plan)
        prev = self.pending
        if prev is not None and how == "counter" and self.pending_how == "epoch" and plan is not None \
                and not plan.counter and step > self.pending_last_step and self._bar_again(prev, step, metrics, plan):
            return []
        if self.made == 1 and prev is not None and how == "counter" and self.pending_how == "order" \
                and ((one_off := self._one_off(plan)) or step > prev.step + 1):
            prev = self._before_the_records(prev, step, one_off)   # (a lone record, then the log's steps)
        elif prev is not None and prev.step == step:
            moved = self._moved(prev, metrics, plan, how)
            if moved is not None:
                step = moved
            elif self._again(prev, step, metrics, plan, how):
                out, self.released = self.released, []
                return out
        if self.ahead:
            self._ahead(metrics)
        self.pending_last_step = self.last_step
        self.last_step = step
        rec = self.pending = StepRecord(step, metrics)
        self.nan_after = None   # (a record after a NaN warning: the run went on, and says the rest)
        if self.saves:
            rec.checkpoints, self.saves = tuple(self.saves), []
        if self.epoch is not None and how != "epoch":   # a step inside the epoch the log last named
            rec.epoch = self.epoch
        self._keep_copy(step, metrics)
        self.pending_nums, self.pending_indent = self.nums, self.indent
        self.pending_how, self.pending_line = how, self.line_no
        self.made += 1
        if self.repeat[0]:
            self.repeat = [0, 0.0, 0.0, True]
        if self.cumulative_first is not None and self.cumulative_first[0] is None:
            self.cumulative_first = (rec, *self.cumulative_first[1:])
        if plan is None:
            self.account.numbered(how, step_name)
            self._part(how, step_name)
        else:
            if plan is not self._noted_plan or how != self._noted_how:
                # (a part of the log numbered otherwise starts only where the plan or its
                # numbering changes: the common record costs nothing more)
                self._part(how, step_name)
                if how in ("counter", "samples") and plan.step is not None:
                    self.counted, self.counted_template = True, plan.merged
                self._note(plan, how, step_name)
            if plan.mixed:
                self.pending_undecided = self.loss_name is None
                self.pending_loss_name = plan.loss_name
        return [prev] if prev is not None else []

    def _mixed_is_eval(self, plan: Plan) -> bool:
        """A line printing a split-named training loss beside an evaluation loss (`train loss
        2.1, val loss 2.3`) is a record where the log's plain records name their loss the same way
        (deit, Lightning), and an evaluation report where they name it otherwise (nanoGPT's `step
        N: train loss .., val loss ..` beside `iter N: loss ..`): True for that report. Undecided
        until a plain record shows the log's naming (the one held undecided is dropped then)."""
        if plan.mixed and self.loss_name is not None and plan.loss_name != self.loss_name:
            return True
        if self.pending_undecided and not plan.mixed:
            if plan.loss_name and plan.loss_name != self.pending_loss_name:
                self.pending, self.pending_undecided = None, False
                self.last_step = self.pending_last_step
        return False

    def _keep_copy(self, step: int, metrics: dict) -> None:
        """The record's values at its step, to tell a copy printed later (another rank's) from a record."""
        copies = self.copies
        copies[step] = metrics
        if len(copies) > 2 * COPIES_KEPT:   # amortized O(1): the last COPIES_KEPT kept, in bulk
            self.copies = dict(list(copies.items())[-COPIES_KEPT:])

    def _ahead(self, metrics: dict) -> None:
        """What lines before a record said of it: a learning-rate line of its epoch, a warning
        line of a loss printed as 0 (:meth:`_in_epoch`, :meth:`warning`)."""
        if self.beside is not None:
            if self.beside[0] == self.epoch:
                for k, v in self.beside[1].items():
                    metrics.setdefault(k, v)
            self.beside = None
        if self.warned[0]:
            if metrics.get(keys.LOSS) == 0.0:
                self._warned(metrics, *self.warned)
            self.warned = ("", 0)
        self.ahead = False

    def warning(self, said: str, line_no: int) -> None:
        """A warning line that says a step's loss was not finite or the step was skipped
        (:func:`.plan.warning`) marks the record beside it whose loss prints 0 (a NaN replaced by a
        printed zero, which read as a stall to zero): the one printed right before it, else the
        next record, if its loss prints 0."""
        rec = self.pending
        if rec is not None and rec.metrics.get(keys.LOSS) == 0.0 and not self.warned[0]:
            self._warned(rec.metrics, said, line_no)
        elif rec is None or rec.metrics.get(keys.LOSS) == rec.metrics.get(keys.LOSS):
            self.warned, self.ahead = (said, line_no), True

    def _warned(self, metrics: dict, said: str, line_no: int) -> None:
        metrics.pop(keys.LOSS_RESOLUTION, None)
        if "nan" in said:
            metrics[keys.LOSS] = math.nan
            self.account.change(line_no, WARNED[0])
        else:
            del metrics[keys.LOSS]
            self.account.change(line_no, WARNED[1])
        if "skip" in said:
            metrics[keys.OVERFLOW_SKIPPED] = 1.0

    def _summary(self, plan: Plan | None, metrics: dict) -> bool:
        """Whether a line with no step, or one behind the last step, is a summary of the record
        held, merged into it (as a record of its own: one after the last, or a false resume): a
        line of another template than the counted record held (not a table's row: a re-logged
        step, :meth:`_relogged`) that prints its loss again (`[1] loss -0.30`, `done: loss -0.30`
        after `40 loss -0.30`: an epoch's or the run's summary)."""
        prev = self.pending
        if plan is None or self.row or self.pending_how not in ("counter", "samples") or not plan.merged \
                or plan.merged == self.counted_template or prev is None:
            return False
        loss, last = metrics.get(keys.LOSS), prev.metrics.get(keys.LOSS)
        return loss is not None and last is not None and (loss == last or (loss != loss and last != last))

    def _bar_lag(self, count: int) -> int:
        """What to add to the count of the bar a record is printed right after (``2/6 [..]{'loss':
        ..}``), decided at the first such record: 0 where the bar shows the step the record reports
        (HF's Trainer updates its bar, then prints), 1 where it shows the batches done before it
        (a loop's body printing under ``for batch in tqdm(...)``), which the log shows by a first
        count of 0, or one not past the record printed before it with no step."""
        if self.bar_offset is None:
            prev = self.pending
            lags = count == 0 or (prev is not None and self.pending_how == "order" and count <= prev.step)
            self.bar_offset = int(lags)
            if lags:
                self.account.note("records printed right after a progress bar's redraw are numbered by its "
                                  "count + 1 (the bar shows the batches done before the one they report)")
        return self.bar_offset

    def _again(self, prev: StepRecord, step: int, metrics: dict, plan: Plan | None, how: str) -> bool:
        """A record at the step of the one held: True where it is that record printed again
        (merged into it), False where it is a record of its own (:meth:`_before_first_step`,
        :meth:`_relogged`)."""
        if how != "order" and self.pending_how == "order":
            if not self._before_first_step(prev, step) or prev.step != step:
                return False
        elif plan is not None and not (plan.counter or self.reprinted or plan.components) \
                and self._relogged(prev, metrics):
            return False
        if self.cumulative_first is not None and self.cumulative_first[0] is None:
            self.cumulative_first = (prev, *self.cumulative_first[1:])
        if plan is not None and (plan.counter or plan.step_total is not None or self.reprinted
                                 or self.line_no == self.pending_line):
            # a progress bar redrawn (`n/N`, or the same physical line again after a `\r`: YOLOv7's row
            # of running means, its counter guessed): its last values count
            _redrawn(prev.metrics, metrics)
            self.account.change(self.line_no, MERGED[0])
        elif self._terms_apart(prev, metrics, plan):
            pass   # merged: another term of the step's loss
        elif self._summary_of(prev, metrics, plan):
            pass   # consumed: the step's record stays as its own lines printed it
        elif plan is not None and metrics and not metrics.keys() & prev.metrics.keys():
            # the step's other values on a line of their own (`Iteration 100, lr = 0.001`, then
            # `Iteration 100, loss = 2.3`): one record, nothing averaged, their names said
            prev.metrics.update(metrics)
            for key, printed in plan.printed:
                if key != "step":
                    self.account.saw(key, printed)
            self.account.change(self.line_no, MERGED[6])
        else:
            keep = plan is not None and plan is self._noted_plan and how == "counter" and self.noted_at == self.made
            if keep:
                self._keep(prev, metrics)
            self._repeat(prev, metrics)   # another rank, or a micro-batch of the step
            self.account.change(self.line_no, MERGED[2])
            if keep and plan is not None and len(self.kept) > STAYS_HELD:
                self._stayed(prev, plan)
        return True

    def _keep(self, prev: StepRecord, metrics: dict) -> None:
        """A copy of each line of the first step its template printed, printed again,
        ``STAYS_HELD`` + 1 at most (and the template's plan)."""
        if not self.kept or self.kept[0] is not prev.metrics:
            self.kept = [prev.metrics, dict(prev.metrics)]
            self.kept_plan = self._noted_plan
        self.kept.append(dict(metrics))

    def _stayed(self, prev: StepRecord, plan: Plan) -> None:
        """Lines of one template at the first step it printed, with losses that differ, more than
        ``STAYS_HELD``, or more than ``STAYS`` when the log ended with that step: no ranks or
        micro-batches of a step, a count that stays (`Iteration: 500` over each interval, no
        other counter beside it): each line is a record, numbered in order, from the held
        record on."""
        kept, self.kept = self.kept[1:], []
        if len({m.get(keys.LOSS) for m in kept}) == 1:
            return
        base, n, value = self.pending_last_step, len(kept), prev.step
        self.released = [StepRecord(base + 1 + k, m) for k, m in enumerate(kept[:-1])]
        prev.step, prev.metrics = base + n, kept[-1]
        self.account.renumbered(self.made, "order", base + 1)
        self.pending_how, self.last_step, self.made = "order", base + n, self.made + n - 1
        merged = self.account.changed[MERGED[2]]
        merged[0] -= n - 1
        if not merged[0]:
            del self.account.changed[MERGED[2]]
        self.repeat, self.repeated_steps = [0, 0.0, 0.0, True], self.repeated_steps - 1
        self.stays[id(plan)] = (plan, replace(plan, step=None, step_name="", step_total=None, outer=(), others=(),
                                              counter=False, simple=False, after_bar=False))
        self._noted_plan = None
        self.account.order_reason = (f"whose counter {plan.step_name!r} stays at {value:,} over its records with other "
                                     "losses: a rollout's length or an interval's size, no step")

    def _stays(self, prev: StepRecord, plan: Plan, metrics: dict) -> int | None:
        """A step printed again by the next line of its template with another loss while another
        integer named as a count of the loop went up (`Iteration: 500 | Episode: 3`: a rollout's
        length, then the episode; :data:`.plan._LOOP_COUNT`) is no step: that integer is, from
        the held record on (said in a note). Ranks print one step with the same loss. The line's
        step, or None where the step did not stay."""
        a, b = prev.metrics.get(keys.LOSS), metrics.get(keys.LOSS)
        if a is None or b is None or not abs(a - b) > SAME_LOSS * max(abs(a), abs(b)):
            return None
        now, before = self.nums, self.pending_nums
        up, name = next(((i, n) for i, n in plan.others if i < len(now) and i < len(before) and now[i].isdigit()
                         and before[i].isdigit() and int(now[i]) > int(before[i])), (None, ""))
        if up is None or plan.step is None or plan is not self._noted_plan:
            return None
        old = plan.step_name
        self.stays[id(plan)] = (plan, replace(plan, step=up, step_name=name, step_total=None, outer=(), others=(),
                                              counter=False, simple=False, after_bar=False))
        prev.step = self.last_step = int(before[up])
        names = self.account.numbering.get("counter", [])
        if old in names:
            names.remove(old)
        self.account.restep(self.made, prev.step)
        self.account.note(f"{old!r} stays at {int(before[plan.step]):,} from record to record (a rollout's length, "
                          f"an interval's size): it numbers no steps; the records are numbered by {name!r}, the "
                          "integer that goes up")
        self._noted_plan = None
        return int(now[up])

    def _summary_of(self, prev: StepRecord, metrics: dict, plan: Plan | None, by_epoch: bool = False) -> bool:
        """Whether a line printing the held record's step is a summary of it (an epoch's dict
        between the interval dicts): another form than the record's lines (another template;
        not a term of the objective on a line of its own), another loss, in a log whose steps
        are printed once each. Ranks and micro-batches print a step in one form, and a resumed
        run re-logs it in the form it logged it (:meth:`_relogged`). ``by_epoch``: both lines
        numbered by their epoch (a complete bar's running loss, then the epoch's total on its own
        line): nothing to repeat across ranks there, from the log's first epoch. Ignored, and said."""
        if not self._another_form(plan):
            return False
        a, b = prev.metrics.get(keys.LOSS), metrics.get(keys.LOSS)
        if a is None or b is None or a == b or (a != a and b != b) \
                or abs(a - b) <= SAME_LOSS * max(abs(a), abs(b)) \
                or (not by_epoch and 2 * self.repeated_steps >= self.made - 1):
            return False
        self.account.ignore(self.line_no, "", "a summary at a record's step (another form, another loss)")
        return True

    def _again_in_epoch(self, prev: StepRecord, metrics: dict, plan: Plan) -> bool:
        """Whether a second line numbered by the held record's epoch (nothing finer) is that record
        printed again, merged or ignored (said): in another form on another scale (a summary), the
        same loss under another name, or a running statistic printed again within its epoch
        (`running loss` under `Epoch 3/30`: cumulative, it restarts with the epoch; its last value,
        the epoch's mean, is the point). False: a record of its own."""
        if self._terms_apart(prev, metrics, plan) or self._summary_of(prev, metrics, plan, by_epoch=True) \
                or self._reprinted(prev, metrics, plan):
            return True
        if metrics == prev.metrics:   # the same epoch printed the same again (a line written twice): a copy
            self.account.change(self.line_no, COPIED)
            return True
        if plan.loss_kind == LOSS_KINDS[1] and plan is self._noted_plan:
            _redrawn(prev.metrics, metrics)
            self.account.change(self.line_no, MERGED[5])
            return True
        if self.line_no == self.pending_line and plan is self._noted_plan:
            # the same physical line again after a `\r`: the epoch's bar redrawn (YOLO's row of
            # the epoch's running means, its count past the header's columns): one record, its last
            _redrawn(prev.metrics, metrics)
            self.account.change(self.line_no, MERGED[0])
            return True
        return False

    def _reprinted(self, prev: StepRecord, metrics: dict, plan: Plan) -> bool:
        """Whether a line numbered by the held record's epoch prints its loss again, the same value
        under another name (`Epoch 3: loss 0.52 acc 0.9`, then `Train loss: 0.52`): one record (the
        held one), said."""
        a, b = prev.metrics.get(keys.LOSS), metrics.get(keys.LOSS)
        if not self._another_form(plan) or a is None or b is None or not (a == b or (a != a and b != b)):
            return False
        self.account.change(self.line_no, MERGED[4])
        return True

    def _terms_apart(self, prev: StepRecord, metrics: dict, plan: Plan | None) -> bool:
        """Whether a line at the held record's step prints another term of its loss on a line of
        its own (`discriminator loss at step 100: x`, then `adversarial loss at step 100: y`; a
        GAN's players, `d_loss: x` then `g_loss: y`): merged, the loss their sum, and said."""
        held = self._noted_plan
        if plan is None or held is None or plan is held or keys.LOSS not in prev.metrics or keys.LOSS not in metrics:
            return False
        a = next((p for k, p in held.printed if k == keys.LOSS), "")
        b = next((p for k, p in plan.printed if k == keys.LOSS), "")
        players = adversarial([f"{a} + {b}"]) is not None   # a GAN's: `d_loss: x`, then `g_loss: y`
        if not (players or (plan.components and held.components)):
            return False
        prev.metrics[keys.LOSS] = _sum_of_terms(
            [repr(prev.metrics[keys.LOSS]), repr(metrics.pop(keys.LOSS))], ((0, False), (1, False)))
        for k, v in metrics.items():
            prev.metrics.setdefault(k, v)
        self.account.change(self.line_no, MERGED[1])
        names = self.account.keys.get(keys.LOSS, [])
        if players and a in names:   # the players' sum is the loss read, as on one line: said so
            names.remove(a)          # (the game is declared from it: :func:`.vocabulary.adversarial`)
            self.account.saw(keys.LOSS, f"{a} + {b} (the sum of the terms printed)")
        return True

    def _another_form(self, plan: Plan | None) -> bool:
        """Whether ``plan`` prints the held record in another form than its own line: other names
        (lines that print the same names, their spaces or a bar's drawing aside, are one form)."""
        held = self._noted_plan
        return plan is not None and held is not None and plan is not held and plan.printed != held.printed

    def _relogged(self, prev: StepRecord, metrics: dict) -> bool:
        """Whether a row of a table or a JSON line that prints a step again, with another loss,
        is another event (a resumed run re-logging it, a table's summary row), kept as a record
        of its own, rather than another rank's print of the step (one record, their mean). One
        writer prints a table's rows; ranks print every step from the log's first, with losses
        alike: a repeat after steps printed once, as most of the log's were, with a loss that
        differs by more than ``SAME_LOSS``, is a re-log (the Monitor sees the run go back to that
        step). Text lines that print a step again stay one record (ranks, micro-batches)."""
        a, b = prev.metrics.get(keys.LOSS), metrics.get(keys.LOSS)
        if not self.row or a is None or b is None or a == b or (a != a and b != b) \
                or abs(a - b) <= SAME_LOSS * max(abs(a), abs(b)):
            return False
        if self.repeat[0] == 0 and 2 * self.repeated_steps < self.made - 1:
            self.account.note(f"step {prev.step:,} was printed again with another loss after steps printed "
                              "once: a re-logged step (a resumed run, a summary row), kept as a record of "
                              "its own")
            return True
        return False

    def _one_off(self, plan: Plan | None) -> bool:
        """Whether the log's first record, numbered in order, prints words the record after it
        (``plan``), which prints the log's counter, does not (:func:`_words`): a line of its own
        before the records (prose quoting a value, a setup list's LR, an argument dump's `loss`
        setting), not a training step."""
        return plan is not None and plan.step is not None and self._noted_plan is not None \
            and not _words(self._noted_plan.merged) <= _words(plan.merged)

    def _bar_again(self, prev: StepRecord, step: int, metrics: dict, plan: Plan) -> bool:
        """Whether the record held, a complete bar numbered by its epoch, is the record this line prints
        with its step (d3rlpy's `Epoch 1/100: 100%|..| 1000/1000 [.., loss=0.201]` then `epoch=1 step=1000
        metrics={'loss': 0.2013..}`): the same loss to the bar's digits. Then one record, at the line's step
        with its values, and the bars after it are the epochs' summaries (:meth:`record`)."""
        if not _printed_same(prev.metrics.get(keys.LOSS), metrics.get(keys.LOSS)):
            return False
        prev.step = self.last_step = step
        prev.metrics.update(metrics)
        self.counted, self.counted_template = True, plan.merged
        self._renumbered("counter")
        self.account.change(self.line_no, MERGED[0])
        return True

    def _before_the_records(self, prev: StepRecord, step: int, one_off: bool) -> StepRecord | None:
        """The log's first record, numbered in order, before the first it numbers by its counter
        (``step``): dropped and said where it is a line of its own form (``one_off``,
        :meth:`_one_off`; none is released in its place), else numbered the step before
        (:meth:`_before_first_step`)."""
        if not one_off:
            self._before_first_step(prev, step)
            return prev
        self.account.change(self.pending_line, ONE_OFF)
        self.account.forget_records(self._noted_plan.printed if self._noted_plan is not None else ())
        self.copies.pop(prev.step, None)
        self.pending, self.made, self.last_step = None, 0, self.pending_last_step
        self._noted_plan, self._noted_how = None, ""
        return None

    def _before_first_step(self, prev: StepRecord, step: int) -> bool:
        """A record numbered in order whose number is the step the next record prints: two
        records, never one (the order number is the reader's, the step the log's). The held
        record is numbered one before the printed step where that keeps steps increasing
        (True); else both keep their numbers."""
        if step - 1 > self.pending_last_step or (self.made == 1 and step >= 1):
            prev.step = self.last_step = step - 1
            self.account.restep(self.made, step - 1)
            self.account.note(f"a record printed before the log's first step ({step:,}) is numbered {step - 1:,}")
            return True
        return False

    def _part(self, how: str, step_name: str) -> None:
        if how != self.account.segment_how:
            self.account.record_numbered(how, step_name, self.made, self.last_step)

    def _note(self, plan: Plan, how: str, step_name: str = "") -> None:
        """The account learns each plan's printed names and numbering once (and the assembler
        how the log prints its loss: LOSS_KINDS)."""
        self._noted_plan, self._noted_how, self.noted_at = plan, how, self.made
        self.loss_printed_as(plan)
        tag = (id(plan), how)
        if tag in self._noted:
            return
        self._noted.add(tag)
        for key, printed in plan.printed:
            if key != "step":
                self.account.saw(key, printed)
        if how:
            self.account.numbered(how, step_name if how in ("counter", "samples") else "")

    def _overflow(self, step: int | None, scale: float | None, skipped: bool = True) -> None:
        """One overflow skip, told once however many ranks and lines print it: the same
        iteration again, or rank 0's unnumbered line giving the scale of a numbered one. An
        overflow whose update went ahead (``skipped`` false) only sets the scale."""
        if not self.overflows and not self.account.keys.get(keys.LOSS_SCALE):
            self.account.saw(keys.LOSS_SCALE, "overflow lines (the scale they leave)")
            self.account.saw(keys.OVERFLOW_SKIPPED, "overflow lines (a skip each)")
        last = self.overflows[-1] if self.overflows else None
        if last is not None and ((step is not None and last[0] == step)
                                 or (step is None and last[0] is not None and last[1] is None)):
            self.overflows[-1] = (last[0], scale if scale is not None else last[1], last[2])
        else:
            self.overflows.append((step, scale, skipped))

    def _fold_overflows(self, metrics: dict, plan: Plan | None) -> None:
        skips = sum(1 for _, _, skipped in self.overflows if skipped)
        if not (plan is not None and plan.prints_skipped) and skips:
            metrics[keys.OVERFLOW_SKIPPED] = float(skips)
        scale = next((x for _, x, _ in reversed(self.overflows) if x is not None), None)
        if keys.LOSS_SCALE not in metrics and scale is not None:
            metrics[keys.LOSS_SCALE] = scale
        self.overflows = []

    def _repeat(self, prev: StepRecord, metrics: dict) -> None:
        if keys.LOSS in metrics:
            if self.repeat[0] == 0:
                self.repeated_steps += 1
            if self.repeat[0] == 0 and keys.LOSS in prev.metrics:
                _add(self.repeat, prev.metrics[keys.LOSS])
            _add(self.repeat, metrics[keys.LOSS])
            prev.metrics[keys.LOSS] = _mean(self.repeat)
            prev.metrics.pop(keys.LOSS_RESOLUTION, None)   # a mean is not printed
            metrics.pop(keys.LOSS_RESOLUTION, None)
        for k, v in metrics.items():
            prev.metrics.setdefault(k, v)

    def flush(self, final: bool = False) -> list[StepRecord]:
        """The held-back records (a followed file went idle: no warning is coming for them;
        ``final``: the log ended)."""
        prev = self.pending
        if final and prev is not None and len(self.kept) > STAYS and self.kept[0] is prev.metrics \
                and self.kept_plan is not None:
            self._stayed(prev, self.kept_plan)       # the log ended at its first step: it stays
        out, self.released = self.released, []
        out += self.close_block()
        if final and self.pending is not None and self._drop_one_off_after():
            self.pending = None
        if self.pending is not None:
            out.append(self.pending)
        self.pending = None
        return out

    def _drop_one_off_after(self) -> bool:
        """Whether the log's last record, numbered in order after records its counter numbered,
        prints words the last of them does not (:func:`_words`): a line of its own after the records (a
        post's `loss: 2.0 -> 0.5` summary, a results file's closing line), not a training step.
        If so, its drop is said and its part of the log forgotten (the caller drops it)."""
        plan = self._noted_plan
        if self.pending_how != "order" or not self.counted or plan is None \
                or _words(plan.merged) <= _words(self.counted_template):
            return False
        self.account.change(self.pending_line, ONE_OFF_AFTER)
        self.account.forget_last(self.made)
        self.made -= 1
        return True

    def saved(self, step: int | None, path: str) -> None:
        """A line said a checkpoint of ``step`` (None: the last record's) was saved to ``path``:
        the next record carries it (:attr:`StepRecord.checkpoints`), for the Monitor to note."""
        at = step if step is not None else self.last_step if self.made else None
        if at is not None:
            self.saves.append((at, path))

    def _another_loss(self, nums, plan: Plan, metrics: dict) -> bool:
        """Whether a line whose loss is printed otherwise than the log's (a statistic, terms) is
        dropped: nothing left of it once its loss is taken out (:meth:`_loss_of`), or a line with no
        step in a log whose records print the loss and a counter (a summary, its other values no
        record after the last) — its loss gone NaN still said (TF's `Model diverged with loss = NaN.`)."""
        x = metrics.get(keys.LOSS, 0.0)
        if self._loss_of(plan, metrics) and not (
                plan.step is None and self.counted and plan.loss_rank > self.loss_rank):
            return False
        self.dropped = DROPPED[1]
        rec = self.pending
        if math.isfinite(x):
            return True
        if plan.loss_kind == LOSS_KINDS[1] and rec is not None and plan.step is None \
                and math.isfinite(rec.metrics.get(keys.LOSS, math.nan)):
            # a mean over the records before it (an epoch's, beside a bar's running loss) gone NaN: one
            # of them was, whatever the last printed; the last is read so, and said
            rec.metrics[keys.LOSS] = x
            rec.metrics.pop(keys.LOSS_RESOLUTION, None)
            self.account.change(self.line_no, MEAN_NAN)
        else:
            self._nan_after_seen(int(float(nums[plan.step])) if plan.step is not None else None, x, DROPPED[1])
        return True

    def _nan_after_seen(self, at: int | None, value: float, ignored: str) -> None:
        """A line that says the loss went non-finite, at step ``at`` (None: it prints none), and no
        record of it: where the last record's loss is finite and ``at`` is after it, the loss went
        non-finite at a step after the last record (`Loss is inf, stopping training`, detectron2's
        `Loss became infinite or NaN at iteration=3456!`, TF's `Model diverged with loss = NaN.`):
        a step of its own if no record follows (:meth:`finish`; one that does says the rest).
        ``ignored``: why the line is ignored until then."""
        rec = self.pending
        if at is None and self.nan_after is not None:
            at = self.nan_after[0]   # (the same event's next line printing no step: detectron2's loss_dict after it)
        if rec is not None and math.isfinite(rec.metrics.get(keys.LOSS, math.nan)) and (at is None or at > rec.step):
            self.nan_after = (at, value, self.line_no, ignored)

    def _nan_after(self) -> list[StepRecord]:
        """The log's last line about the loss, a warning that it went non-finite after the last
        record (no record follows it): a record of its own, at the step the warning prints, else
        the step after the last (said: the account's ``after`` numbering)."""
        assert self.nan_after is not None
        at, value, line_no, ignored = self.nan_after
        self.nan_after = None
        self.account.unignore(ignored)
        self.account.change(line_no, NAN_AFTER)
        self.account.after_what = "NaN-warning"
        return [self._record_after(at, {keys.LOSS: value}, "after")]

    def _record_after(self, step: int | None, metrics: dict, unprinted: str) -> StepRecord:
        """A record made at the log's end from a line no record followed (an overflow, a NaN
        warning): at the ``step`` it prints, else the step after the last, numbered ``unprinted``."""
        self.last_step = step if step is not None else self.last_step + 1
        how = "counter" if step is not None else unprinted
        self.account.numbered(how, "")
        self.made += 1
        if how != self.account.segment_how:
            self.account.record_numbered(how, "", self.made, self.last_step)
        return StepRecord(self.last_step, metrics)

    def finish(self) -> list[StepRecord]:
        out = self.flush(final=True)
        counted = self.account.counted
        for step, scale, skipped in self.overflows:    # overflow lines no record followed
            m = {keys.OVERFLOW_SKIPPED: 1.0} if skipped else {}
            if scale is not None:
                m[keys.LOSS_SCALE] = scale
            # An overflow line without a step after steps the log counted: the next step.
            out.append(self._record_after(step, m, "after" if counted else "order"))
        self.overflows = []
        if self.nan_after is not None:
            out += self._nan_after()
        if self.cumulative_first is not None:
            self._mid_run(*self.cumulative_first[1:])
            self.cumulative_first = None
        return out


def total_of(nums, plan: Plan) -> int | None:
    """The printed total of a line's counter (``176/800``: 800), or None."""
    return int(float(nums[plan.step_total])) if plan.step_total is not None else None


def _printed_same(printed: float | None, value: float | None) -> bool:
    """Whether ``value`` is ``printed`` to the decimals it was printed with (``0.201`` for 0.2013)."""
    if printed is None or value is None or not (math.isfinite(printed) and math.isfinite(value)):
        return False
    text = repr(printed)
    return "e" not in text and round(value, len(text.partition(".")[2])) == printed


def _sum_of_terms(nums, terms) -> float:
    """The sum of the printed terms of the loss, to the decimals they print (``1.2 + 2.0001``
    is ``3.2001``, not the float sum's ``3.2000999999999995``)."""
    total = 0.0
    places = 0
    for i, negative in terms:
        text = nums[i]
        total += -float(text) if negative else float(text)
        if places >= 0:
            dot = text.find(".")
            places = -1 if ("e" in text or "E" in text or not text[:1].isdigit()) else \
                max(places, len(text) - dot - 1 if dot >= 0 else 0)
    return round(total, places) if places >= 0 and total == total and abs(total) != float("inf") else total


def _redrawn(held: dict, again: dict) -> None:
    """A step printed again (a progress bar redrawn): its last values count, but a value that was
    NaN or infinite in any print of the step stays so (a redraw does not undo a NaN)."""
    for k, v in again.items():
        old = held.get(k)
        if old is None or math.isfinite(old):
            held[k] = v


def _add(acc: list, value: float) -> None:
    """A running mean's state ``[count, sum, first value, all equal]``: O(1) per value."""
    if acc[0] == 0:
        acc[2] = value
    elif value != acc[2]:
        acc[3] = False
    acc[0] += 1
    acc[1] += value


def _mean(acc: list) -> float:
    """The mean, exact when every value is the same (a step repeated by every rank)."""
    return acc[2] if acc[3] else acc[1] / acc[0]


def _words(template: str) -> set[str]:
    """A template's words (its names, its prose), lower case: a line whose words the records'
    lines all print is of their form (HF's dicts with fewer keys, printed as strings or after a
    bar's count); one with words of its own is prose, a setting, a summary."""
    return set(_WORD.findall(template.lower()))


_WORD = re.compile(r"[a-z]+")
