"""After a resume, the data stream repeats batches the model has already seen."""
from __future__ import annotations

import math

from .. import keys
from ..record import Finding, StepRecord
from ..stats import Latch, finite_positive
from .base import Context, Detector, fmt, positive, positive_int


class DataRepetition(Detector):
    """Three rules, all critical, checked for ``check_steps`` steps after every resume:

    - *fingerprints* (exact): integrations put a hash of each batch's token ids under
      ``batch_fingerprint``. Fingerprints are remembered for the first ``record_first_steps``
      steps of every segment and every ``sample_every_steps`` otherwise (at most
      ``max_fingerprints``, oldest dropped), and saved with the state. After a resume a batch whose
      fingerprint was already seen names the step it repeats.
    - *consumed samples* (exact, where the loop reports ``consumed_samples``): the first count
      after a resume is below the last one before it — the data stream started over.
    - *falsely low loss* (no fingerprints): the loss stays ``min_drop`` below its pre-checkpoint
      baseline for ``persist_samples`` points — a model re-reading memorised data (the
      "6x the same 50B tokens" story).
    The loss rule judges against the course ``loss_spike``'s baseline was on when the checkpoint
    was written: its forecast for the first step resumed, continued along its trend (a loss curve
    is convex: the line runs below a healthy continuation). Not the live baseline: that one
    follows the loss down, which is what the rule is there to notice.
    State: the fingerprint table (≤ ``max_fingerprints`` pairs) and 7 scalars.
    """

    name = "data_repetition"
    kind = "data_repetition"
    signals = (keys.LOSS, keys.BATCH_FINGERPRINT, keys.CONSUMED_SAMPLES)
    _state = ("seen", "segment_start", "resume_step", "low_count", "latch", "consumed", "course")

    def __init__(self, *, check_steps: int = 200, record_first_steps: int = 256,
                 sample_every_steps: int = 50, max_fingerprints: int = 4096, min_drop: float = 0.1,
                 persist_samples: int = 5):
        self.check_steps = positive_int("check_steps", check_steps)
        self.record_first_steps = positive_int("record_first_steps", record_first_steps)
        self.sample_every_steps = positive_int("sample_every_steps", sample_every_steps)
        self.max_fingerprints = positive_int("max_fingerprints", max_fingerprints)
        self.min_drop = positive("min_drop", min_drop)
        self.persist_samples = positive_int("persist_samples", persist_samples)
        self.seen: dict[str, int] = {}      # fingerprint (as str for JSON) → first step seen
        self.segment_start = 0
        self.resume_step: int | None = None
        self.low_count = 0
        self.latch = Latch()   # one finding per resume, whichever rule sees it first
        self.consumed: float | None = None   # the last consumed_samples seen
        self.course: list | None = None   # [log baseline, log slope per point, points since] after a resume

    def wants(self, present: frozenset[str]) -> bool:
        # fingerprints and the samples count are remembered from the start, the loss judged after a resume
        return (keys.BATCH_FINGERPRINT in present or keys.CONSUMED_SAMPLES in present
                or (self.resume_step is not None and keys.LOSS in present))

    def on_segment(self, start_step: int, reason: str) -> None:
        self.segment_start = start_step
        if reason in ("resume", "rollback"):
            self.resume_step, self.low_count, self.course = start_step, 0, None
            self.latch.rearm()
        if reason == "rollback":
            self.consumed = None   # going back to an older checkpoint re-reads data on purpose

    def update(self, record: StepRecord, ctx: Context) -> list[Finding]:
        m, step = record.metrics, record.step
        checking = (self.resume_step is not None and self.latch.armed
                    and 0 <= step - self.resume_step <= self.check_steps)
        out: list[Finding] = []
        consumed = m.get(keys.CONSUMED_SAMPLES)
        if consumed is not None and math.isfinite(consumed):
            before, self.consumed = self.consumed, consumed
            if checking and self.latch.update(on=before is not None and consumed < before):
                out.append(self.finding(
                    step, severity="critical", signal=keys.CONSUMED_SAMPLES, value=consumed,
                    baseline=before, onset_step=self.resume_step,
                    message=(f"After the resume at step {self.resume_step} the consumed-samples counter "
                             f"went back from {before:.0f} to {consumed:.0f} at step {step}: the data "
                             f"stream started over, so the model is re-reading data it has seen. Stop, "
                             f"restore the data-loader/sampler state, and resume again."),
                    rule="consumed_samples", resume_step=self.resume_step))
                return out
        fp = m.get(keys.BATCH_FINGERPRINT)
        if fp is not None and math.isfinite(fp):
            key = str(int(fp))
            first = self.seen.get(key)
            if checking and self.latch.update(on=first is not None and first < step):
                out.append(self.finding(
                    step, severity="critical", signal=keys.BATCH_FINGERPRINT, value=fp, onset_step=first,
                    message=(f"The batch of step {step} is the batch already trained on at step {first}: "
                             f"after the resume at step {self.resume_step} the data stream restarted "
                             f"instead of continuing. The loss will look falsely low while the model "
                             f"re-reads memorised data. Stop, fix the data-loader/sampler state (HF: do "
                             f"not set ignore_data_skip; Lightning: restore the sampler) and resume again."),
                    repeats_step=first, resume_step=self.resume_step, rule="fingerprint"))
            elif first is None and (step - self.segment_start < self.record_first_steps
                                    or step % self.sample_every_steps == 0):
                self.seen[key] = step
                if len(self.seen) > self.max_fingerprints:
                    del self.seen[next(iter(self.seen))]
        x = m.get(keys.LOSS)
        base = None
        if checking and x is not None and finite_positive(x):
            if self.course is None and ctx.loss_baseline is not None:
                self.course = [math.log(ctx.loss_baseline), ctx.loss_slope, 0]
            if self.course is not None:
                level, slope, k = self.course
                base = math.exp(level + slope * k)
                self.course[2] = k + 1
        if checking and fp is None and base is not None and x is not None and finite_positive(x):
            low = x < base * (1 - self.min_drop)
            self.low_count = self.low_count + 1 if low else 0
            if self.latch.update(on=low and not out and self.low_count >= self.persist_samples):
                out.append(self.finding(
                    step, severity="critical", value=x, baseline=base, threshold=base * (1 - self.min_drop),
                    onset_step=self.resume_step,
                    message=(f"The loss has been falsely low since the resume at step {self.resume_step}: "
                             f"{fmt(x)} at step {step} vs {fmt(base)} before the checkpoint "
                             f"({x / base - 1:.0%}). A resumed run that suddenly does better is usually "
                             f"re-reading data it memorised (the data loader restarted from the "
                             f"beginning). Check the data-loader/sampler state before training on."),
                    rule="falsely_low_loss", resume_step=self.resume_step))
        return out
