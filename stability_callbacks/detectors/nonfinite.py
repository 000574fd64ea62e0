"""NaN / Inf in the loss, a per-stream loss, the grad norm or the Adam statistics."""
from __future__ import annotations

from typing import Sequence

from .. import keys
from ..record import Finding, StepRecord
from ..stats import Latch
from .base import Columns, Context, Detector

_WATCHED = frozenset((keys.LOSS, keys.GRAD_NORM, keys.ADAM_V_MAX, keys.ADAM_V_L1, keys.PARAM_NORM))


class NonFinite(Detector):
    """Critical on the first non-finite value of an episode; re-armed after a finite step. At the
    run's first step (``Context.run_start``) there is no checkpoint to roll back to: the message
    says to train again from the initial weights, as the rollback advice does.

    A non-finite grad norm on a step the fp16 scaler skipped is an ordinary overflow (see
    ``overflow_burst``), not a NaN. O(#keys) per update; state: 1 flag.

    >>> d = NonFinite()
    >>> [f.kind for f in d.update(StepRecord(3, {"loss": float("nan")}), Context(3))]
    ['nonfinite']
    >>> d.update(StepRecord(4, {"loss": 2.0}), Context(4))
    []
    >>> print(d.update(StepRecord(1, {"loss": float("nan")}), Context(1, run_start=1))[0].message)
    Non-finite values at step 1: loss=nan. Nothing was trained before step 1, so no checkpoint comes before it: train again from the initial weights and skip this step's batch; a NaN this early points at the data, the initialisation or the loss itself.
    """

    name = "nonfinite"
    kind = "nonfinite"
    signals = ()   # looks at every record
    _state = ("latch", "eval_latch", "nan_run")

    def __init__(self):
        self.latch = Latch()
        self.eval_latch = Latch()   # an evaluation's loss not finite beside a finite training loss
        self.nan_run: list | None = None   # [first step, records, last step] of a loss not finite on
        # every record in a row (the episode's, while no finite record came between: see at_end)

    def update_run(self, run: Sequence[StepRecord], ctxs: Sequence[Context], cols: Columns | None = None) -> None:
        """update()'s first test inline (all values finite: the latch re-armed, nothing found),
        update() for the rest."""
        for record, ctx in zip(run, ctxs):
            total = sum(record.metrics.values())
            if total - total == 0.0:
                self.latch.armed = self.eval_latch.armed = True
                continue
            found = self.update(record, ctx)
            if found:
                ctx.found += found

    def update(self, record: StepRecord, ctx: Context) -> list[Finding]:
        m = record.metrics
        total = sum(m.values())
        if total - total == 0.0:   # a finite sum: every value is finite (NaN and ±Inf carry through)
            self.latch.armed = True   # a finite step ends the episode (hot path: no call)
            return []
        # One pass: v - v is 0.0 for every finite float and NaN for NaN/±Inf.
        bad = [k for k, v in m.items() if v - v != 0.0 and (k in _WATCHED or k.startswith(keys.LOSS_STREAM_PREFIX))]
        if bad and (m.get(keys.OVERFLOW_SKIPPED) or 0.0) >= 1.0 and keys.GRAD_NORM in bad:
            bad.remove(keys.GRAD_NORM)   # an overflow on a skipped fp16 step is not a NaN
        if not bad:
            self.latch.armed = True   # a finite step ends the episode (hot path: no call)
            return self._evaluation(record, ctx)
        if keys.LOSS in bad:
            r = self.nan_run
            if self.latch.armed or r is None:
                self.nan_run = [record.step, 1, record.step]
            else:
                r[1], r[2] = r[1] + 1, record.step
        if not self.latch.update(True):
            return []
        what = ", ".join(f"{k}={m[k]}" for k in bad)
        # A loss of exactly 0.0 next to a NaN grad norm is one failure, not a lucky loss: the
        # backward overflowed (fp16 LoRA, some NPU kernels) and the logged loss was zeroed.
        zero_loss = m.get(keys.LOSS) == 0.0 and keys.GRAD_NORM in bad
        why = (" The loss reads exactly 0.0 beside it: the backward pass overflowed (typical of "
               "fp16, e.g. LoRA fine-tuning in fp16, or an accelerator kernel fault) and the logged "
               "loss was zeroed, so nothing useful is being learnt; switch to bf16 or fp32."
               if zero_loss else "")
        unit = "epoch" if ctx.steps_are_epochs else "step"   # (a log numbered by its epochs says so)
        if record.step == ctx.run_start:   # as the rollback advice says (policy: from_start)
            todo = (f" Nothing was trained before {unit} {record.step}, so no checkpoint comes before it: "
                    f"train again from the initial weights and skip this {unit}'s "
                    f"{'batches' if ctx.steps_are_epochs else 'batch'}; a NaN this early "
                    f"points at the data, the initialisation or the loss itself.")
        else:
            todo = (f" The weights may already be damaged: do not save over the last good checkpoint; "
                    f"roll back to the last checkpoint before this {unit} and skip the batches since.")
        return [self.finding(
            record.step, severity="critical", signal=bad[0], value=m[bad[0]],
            message=f"Non-finite values at {unit} {record.step}: {what}.{why}{todo}",
            keys=bad, zero_loss=zero_loss)]

    def at_end(self, ctx: Context) -> list[Finding]:
        """A replayed log whose loss was not finite on every record from its episode's first to the
        log's last (3 at least): no single bad batch does that, and skipping batches will not help
        (``info``, once: the critical finding came at the first)."""
        r = self.nan_run
        if r is None or self.latch.armed or r[1] < 3:
            return []
        unit = "epoch" if ctx.steps_are_epochs else "step"
        return [self.finding(
            r[2], severity="info", signal=keys.LOSS, onset_step=r[0],
            message=(f"The loss stayed non-finite on all {r[1]} records from {unit} {r[0]} to the log's last "
                     f"({unit} {r[2]}): not one bad batch, whose skip would let training go on, but the "
                     f"weights gone to NaN at {unit} {r[0]} or a setup that makes every step overflow (an LR "
                     f"too high, fp16, a loss that divides by zero). Roll back to before {unit} {r[0]} and "
                     f"change the LR or the precision, not just the data order."),
            records=r[1], rule="to_the_end")]

    def _evaluation(self, record: StepRecord, ctx: Context) -> list[Finding]:
        """An evaluation's loss printed on the record not finite while the training values are (a results
        table's row): a warning, once per episode. The model's outputs on held-out data are not finite:
        an evaluation in fp16 that overflows, an empty evaluation batch, or weights gone bad that the
        training loss (a mean taken before them) does not show yet."""
        v = record.metrics.get(keys.EVAL_LOSS)
        if v is None or v - v == 0.0:
            self.eval_latch.armed = True
            return []
        if not self.eval_latch.update(True):
            return []
        unit = "epoch" if ctx.steps_are_epochs else "step"
        x = record.metrics.get(keys.LOSS)
        beside = ("" if x is None else " while the training loss reads exactly 0.0 (itself a sign: a loss masked "
                  "away or zeroed after an overflow)" if x == 0.0 else f" while the training loss is {x!r}")
        why = ("the loss path or the weights broke, as the zero says" if x == 0.0 else
               "weights gone bad that the training loss does not show yet")
        return [self.finding(
            record.step, severity="warning", signal=keys.EVAL_LOSS, value=v,
            message=(f"The evaluation loss is {v!r} at {unit} {record.step}{beside}: the model's outputs on "
                     f"the evaluation data are not finite. An evaluation run in fp16 that overflows, an empty "
                     f"evaluation batch, or {why}. Evaluate the last checkpoint in fp32 before trusting or "
                     f"resuming from it."),
            keys=[keys.EVAL_LOSS])]
