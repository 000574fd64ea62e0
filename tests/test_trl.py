"""TRL's SFTTrainer, DPOTrainer and GRPOTrainer with the plain callback, ``callbacks=[cb]``.

TRL's trainers are HF Trainers: the callback finds the TRL trainer in its constructor and reads
what TRL's ``training_step`` returns (the loss already divided by the accumulation steps), its
pre-clip grad norm and its LR, as for the HF Trainer. Each trainer gets one planted fault of its
own kind and one healthy run that must stay quiet (no finding above ``info``):

- SFT: a shard of uniform random letters for 3 steps (a bad data shard);
- DPO: a shard whose ``chosen`` and ``rejected`` are swapped for 3 steps (a labelling bug);
- GRPO: the LR ×100 from one step on (a resume that restored the wrong LR).

The model is a 2-layer Llama that already knows its task (tests/trl_tiny.py, built here, nothing
downloaded), so every run starts flat, as fine-tuning does. Steps are 1-based optimizer steps.
The losses behave differently and the same detector reads all three, with no TRL rule: SFT is a
cross-entropy (flat at ~0.5 nats here); DPO starts at ln 2 (policy = reference) and falls as the
policy moves away; GRPO's loss is ~0 and goes below zero (the advantages are centred per group),
which the loss detectors judge on an additive scale.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
trl = pytest.importorskip("trl")

from datasets import Dataset  # noqa: E402
from transformers import TrainerCallback  # noqa: E402

import trl_tiny as tiny  # noqa: E402
from stability_callbacks.integrations.hf import StabilityCallback  # noqa: E402

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]   # slow: TRL's trainers on real runs

FAULT_STEP = 25          # after the 20 start-up steps, whose findings are info only
POCKET = (25, 26, 27)    # the steps whose batches carry a bad shard
PER_STEP = 8             # samples per optimizer step: 2 micro-batches of 4
WARMUP = 5
LOGGING = 5


def _args(config_cls, out, max_steps: int, lr: float, **kw):
    """TRL's own defaults, except what makes a run small and its data order fixed. Gradient
    accumulation 2: the loss of a step is its 2 micro-batches' (SFT and GRPO scale each for
    the accumulation themselves, DPO leaves it to the Trainer: ``loss_is_scaled_for_ga``)."""
    return config_cls(output_dir=str(out / "trl"), max_steps=max_steps, per_device_train_batch_size=PER_STEP // 2,
                      gradient_accumulation_steps=2, learning_rate=lr, warmup_steps=WARMUP,
                      logging_steps=LOGGING, save_strategy="no", report_to="none", use_cpu=True,
                      disable_tqdm=True, train_sampling_strategy="sequential", seed=0, **kw)


def _train(make_trainer, out):
    """Build the trainer with the callback added the plain way, train, return both."""
    cb = StabilityCallback(config={"actions": {}}, run_dir=out / "stability")
    trainer = make_trainer([cb])
    assert cb.trainer is trainer          # found inside the TRL trainer's constructor
    trainer.train()
    return trainer, cb


def _findings(cb) -> list[tuple[int, str, str]]:
    return [(f.step, f.kind, f.severity) for f in cb.findings]


def _step_losses(cb) -> dict[int, float]:
    """The loss of every step, as the run log recorded it."""
    with open(Path(cb.run_dir) / "runlog.jsonl") as fh:
        lines = [json.loads(line) for line in fh]
    return {x["step"]: x["metrics"]["loss"] for x in lines if x["type"] == "step"}


def _assert_loss_is_trls(trainer, cb, max_steps: int) -> None:
    """The loss of a step is what TRL trains on: at every logging step, TRL's logged loss is
    the mean of the monitor's losses over the steps it covers."""
    losses = _step_losses(cb)
    assert sorted(losses) == list(range(1, max_steps + 1))
    logged = [h for h in trainer.state.log_history if "loss" in h and "step" in h]
    assert [h["step"] for h in logged] == list(range(LOGGING, max_steps + 1, LOGGING))
    for h in logged:
        window = [losses[s] for s in range(h["step"] - LOGGING + 1, h["step"] + 1)]
        assert sum(window) / LOGGING == pytest.approx(h["loss"], rel=1e-5, abs=1e-7)


def _assert_trls_line_keeps_its_metrics(trainer, key: str) -> None:
    """TRL's ``log`` adds the metrics it gathered since its last line (token accuracy, rewards)
    and clears them: they belong to TRL's own line at each logging step, and the monitor's
    scalars, reported at logging steps and findings, must not take them away."""
    lines = trainer.state.log_history
    assert [h["step"] for h in lines if key in h] == [h["step"] for h in lines if "loss" in h]


HEALTHY = [(WARMUP + 1, "warmup_end", "info")]   # the first step at the peak LR


# ---------------------------------------------------------------------------------------- SFT
def _sft(out, *, pocket: bool, max_steps: int):
    """SFT on TRL's defaults (bf16 autocast, gradient checkpointing), LR 1e-3."""
    texts = tiny.texts(max_steps * PER_STEP, seed=1)
    if pocket:
        bad = tiny.garbage(len(POCKET) * PER_STEP, seed=2)
        lo = (POCKET[0] - 1) * PER_STEP
        texts[lo:lo + len(bad)] = bad
    args = _args(trl.SFTConfig, out, max_steps, 1e-3, max_length=64)
    return _train(lambda cbs: trl.SFTTrainer(model=tiny.model(), args=args, processing_class=tiny.tokenizer(),
                                             train_dataset=Dataset.from_dict({"text": texts}), callbacks=cbs), out)


def test_sft_garbage_shard_is_a_loss_spike(tmp_path):
    trainer, cb = _sft(tmp_path, pocket=True, max_steps=30)
    assert trainer.args.bf16 and trainer.args.gradient_checkpointing      # TRL's defaults
    # The shard's loss is ~10x the flat ~0.53 (5.2-5.3): a warning at its first step (the grad
    # norm 4.4x with it), back at the first clean batch.
    assert _findings(cb) == [*HEALTHY, (25, "loss_spike", "warning"), (25, "grad_norm_spike", "info"),
                             (28, "spike_recovered", "info")]
    _assert_loss_is_trls(trainer, cb, 30)
    _assert_trls_line_keeps_its_metrics(trainer, "mean_token_accuracy")


def test_sft_healthy_run_is_quiet(tmp_path):
    trainer, cb = _sft(tmp_path, pocket=False, max_steps=40)
    assert _findings(cb) == HEALTHY


# ---------------------------------------------------------------------------------------- DPO
def _dpo(out, *, swapped: bool, max_steps: int):
    """DPO: an 8-letter prompt, its 4-letter continuation chosen over 4 random letters; fp32,
    no gradient checkpointing (a third of the time on CPU). The reference model is passed:
    without one, DPOTrainer loads it from ``model.config._name_or_path`` (a hub download)."""
    prompt = 8
    texts = tiny.texts(max_steps * PER_STEP, seed=1, length=prompt + 4)
    rows = {"prompt": [t[:prompt] for t in texts], "chosen": [t[prompt:] for t in texts],
            "rejected": tiny.garbage(len(texts), seed=3, length=4)}
    if swapped:
        for i in range((POCKET[0] - 1) * PER_STEP, POCKET[-1] * PER_STEP):
            rows["chosen"][i], rows["rejected"][i] = rows["rejected"][i], rows["chosen"][i]
    args = _args(trl.DPOConfig, out, max_steps, 3e-3, max_length=64, bf16=False,
                 gradient_checkpointing=False)
    return _train(lambda cbs: trl.DPOTrainer(model=tiny.model(), ref_model=tiny.model(), args=args,
                                             processing_class=tiny.tokenizer(), callbacks=cbs,
                                             train_dataset=Dataset.from_dict(rows)), out)


def test_dpo_swapped_preferences_are_a_loss_spike(tmp_path):
    trainer, cb = _dpo(tmp_path, swapped=True, max_steps=40)
    # Swapped pairs push the loss from ~0.4 to 1.3-1.4, above ln 2: measured against the level
    # the falling loss's trend forecasts, a rise that warns at once; back at the first clean batch.
    assert _findings(cb) == [*HEALTHY, (25, "loss_spike", "warning"), (28, "spike_recovered", "info")]
    losses = _step_losses(cb)
    assert all(losses[s] > math.log(2) for s in POCKET)
    _assert_loss_is_trls(trainer, cb, 40)
    _assert_trls_line_keeps_its_metrics(trainer, "rewards/margins")


def test_dpo_healthy_run_is_quiet(tmp_path):
    """40 steps: the loss falls from ln 2 to ~0.25. Further down (~0.1), one mis-ranked pair
    moves the batch's loss several-fold and loss_spike warns on healthy steps (docs/limits.md):
    a detector matter, measured, not hidden here."""
    trainer, cb = _dpo(tmp_path, swapped=False, max_steps=40)
    assert _findings(cb) == HEALTHY
    losses = _step_losses(cb)
    assert losses[1] == pytest.approx(math.log(2), abs=1e-4)        # policy = reference at step 1
    assert sum(losses[s] for s in range(36, 41)) / 5 < 0.3


# --------------------------------------------------------------------------------------- GRPO
class LRJump(TrainerCallback):
    """The LR ×100 from optimizer step ``at`` on: the scheduler's base LRs and the current LR
    are multiplied after step ``at - 1`` (a resume that restored the wrong LR)."""

    def __init__(self, at: int, factor: float = 100.0):
        self.at, self.factor = at, factor

    def on_step_end(self, args, state, control, optimizer=None, lr_scheduler=None, **kwargs):
        if state.global_step == self.at - 1:
            lr_scheduler.base_lrs = [lr * self.factor for lr in lr_scheduler.base_lrs]
            for group in optimizer.param_groups:
                group["lr"] *= self.factor


def _grpo(out, *, lr_jump: bool, max_steps: int):
    """GRPO: 2 prompts of 6 letters per step (one per micro-batch; TRL generates for both at
    the step's first), 4 completions of 8 letters each, the reward the fraction of letters
    that continue the alphabet; beta 0 (TRL's default: no reference model), fp32, no gradient
    checkpointing, LR 1e-4."""
    prompt, completion = 6, 8
    texts = tiny.texts(max_steps * 2, seed=1, length=prompt + completion)
    data = Dataset.from_dict({"prompt": [t[:prompt] for t in texts], "target": [t[prompt:] for t in texts]})

    def continues(prompts, completions, target, **kwargs) -> list[float]:
        return [sum(a == b for a, b in zip(c.replace(" ", ""), t)) / len(t) for c, t in zip(completions, target)]

    args = _args(trl.GRPOConfig, out, max_steps, 1e-4, num_generations=4, max_completion_length=completion,
                 shuffle_dataset=False, bf16=False, gradient_checkpointing=False)
    plant = [LRJump(FAULT_STEP)] if lr_jump else []
    return _train(lambda cbs: trl.GRPOTrainer(model=tiny.model(), reward_funcs=continues, args=args,
                                              train_dataset=data, processing_class=tiny.tokenizer(),
                                              callbacks=plant + cbs), out)


def test_grpo_lr_jump_is_an_lr_anomaly(tmp_path):
    trainer, cb = _grpo(tmp_path, lr_jump=True, max_steps=30)
    # HF's linear decay to step 30: LR(step s) = 1e-4 * (30 - (s - 1)) / 25, then x100 from step 25.
    jump = next(f for f in cb.findings if f.kind == "lr_anomaly")
    assert (jump.value, jump.baseline) == (pytest.approx(1e-2 * 6 / 25), pytest.approx(1e-4 * 7 / 25))
    # A jump is never a re-warmup (no warmup_end). GRPO's ~0 loss and the grad norm stay within
    # their noise over the 6 steps left: the LR is the finding (a warning), with the update it
    # drives (x100: the precursor, info while neither the loss nor the grad norm follows it).
    assert _findings(cb) == [*HEALTHY, (25, "precursor", "info"), (25, "lr_anomaly", "warning")]
    _assert_loss_is_trls(trainer, cb, 30)
    _assert_trls_line_keeps_its_metrics(trainer, "reward")


def test_grpo_healthy_run_is_quiet_with_a_loss_below_zero(tmp_path):
    trainer, cb = _grpo(tmp_path, lr_jump=False, max_steps=40)
    assert _findings(cb) == HEALTHY
    losses = _step_losses(cb)
    assert min(losses.values()) < 0 < max(abs(v) for v in losses.values()) < 1
