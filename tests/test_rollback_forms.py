"""Rollback advice in native forms: exact strings for HF/accelerate, Lightning, Megatron, DeepSpeed."""
from __future__ import annotations

import pytest

from stability_callbacks.actions.rollback import advice_forms_for, native_forms

# The tr8-104B / GLM-130B recipe: back to 40700, skip iterations 40701-40900.
ADVICE = {"checkpoint_step": 40700, "checkpoint_path": "ckpt/global_step40700",
          "onset_step": 40760, "skip_steps": [40701, 40900], "global_batch_size": 512,
          "consumed_samples": None}


def test_all_four_forms_exactly():
    forms = native_forms(ADVICE)
    assert list(forms) == ["hf", "lightning", "megatron", "deepspeed"]
    what = ("the data of steps 40701-40900 (200 optimizer steps, 102400 samples at global batch "
            "size 512)")
    assert forms["hf"] == (
        'trainer.train(resume_from_checkpoint="ckpt/global_step40700") (step 40700) with '
        f"TrainingArguments(ignore_data_skip=True), and skip {what}: start the train dataloader "
        "after step 40900 with accelerate's skip_first_batches(dataloader, "
        "num_batches=40900 * gradient_accumulation_steps) (counted within the epoch)")
    assert forms["lightning"] == (
        'trainer.fit(model, datamodule=dm, ckpt_path="ckpt/global_step40700") (step 40700); '
        "Lightning restores the loop, not a map-style loader's position: skip "
        f"{what} in train_dataloader(), i.e. start its sampler after "
        "40900 * accumulate_grad_batches batches")
    assert forms["megatron"] == (
        "--load ckpt with ckpt/latest_checkpointed_iteration.txt = 40700 "
        "(Megatron-LM: --ckpt-step 40700) --skip-train-iteration-range 40701-40900")
    assert forms["deepspeed"] == (
        'engine.load_checkpoint("ckpt", tag="global_step40700") (or write global_step40700 '
        "into ckpt/latest, the tag load_checkpoint picks by default); then skip "
        f"{what}: when the loop reaches step 40701, draw and discard 200 * "
        "gradient_accumulation_steps micro-batches")


def test_consumed_samples_and_good_steps_dropped_by_a_prefix_skip():
    forms = native_forms({**ADVICE, "checkpoint_step": 40500,
                          "checkpoint_path": "runs/a/iter_0040500",
                          "consumed_samples": [20_000_000, 20_102_400]})
    assert "samples [20000000, 20102400) = 102400 samples" in forms["hf"]
    assert "this also drops the good steps 40501-40700" in forms["hf"]
    assert "this also drops the good steps 40501-40700" in forms["lightning"]
    assert forms["megatron"] == (
        "--load runs/a with runs/a/latest_checkpointed_iteration.txt = 40500 "
        "(Megatron-LM: --ckpt-step 40500) --skip-train-iteration-range 40701-40900")
    assert forms["deepspeed"].startswith('engine.load_checkpoint("runs/a", tag="iter_0040500")')


@pytest.mark.parametrize("path, expected", [
    ("out/ds", 'engine.load_checkpoint("out/ds", tag="global_step700")'),
    ("out/ds/", 'engine.load_checkpoint("out/ds", tag="global_step700")'),
    ("out/ds/global_step700", 'engine.load_checkpoint("out/ds", tag="global_step700")'),
    ("out/checkpoint-700", 'engine.load_checkpoint("out", tag="checkpoint-700")'),
    (None, 'engine.load_checkpoint("<checkpoint dir of step 700>", tag="global_step700")'),
])
def test_deepspeed_dir_and_tag(path, expected):
    forms = native_forms({**ADVICE, "checkpoint_step": 700, "checkpoint_path": path,
                          "skip_steps": [701, 750], "onset_step": 720,
                          "global_batch_size": None})
    assert forms["deepspeed"].startswith(expected)
    assert "(50 optimizer steps)" in forms["deepspeed"]


def test_only_the_forms_asked_for_and_a_lightning_file_is_no_folder():
    """Live, an integration asks for its own form only; replay for the log's (a format without a
    form of its own: none, the sentence says it); a Lightning ``.ckpt`` file is never a folder
    to load a DeepSpeed tag or Megatron iteration from."""
    assert list(native_forms(ADVICE, ("lightning",))) == ["lightning"]
    assert native_forms(ADVICE, ()) == {}
    assert [advice_forms_for(s) for s in ("hf", "lightning", "deepspeed", "megatron", "hf-state", "generic",
                                          "jsonl", None)] == [("hf",), ("lightning",), ("deepspeed",), ("megatron",),
                                                              ("hf",), (), (), ()]
    ckpt = {**ADVICE, "checkpoint_step": 700, "checkpoint_path": "out/checkpoints/stability-step=700.ckpt",
            "skip_steps": [701, 750], "onset_step": 720}
    forms = native_forms(ckpt)
    assert forms["lightning"].startswith('trainer.fit(model, datamodule=dm, ckpt_path="out/checkpoints/'
                                         'stability-step=700.ckpt") (step 700)')
    assert ".ckpt/" not in forms["deepspeed"] + forms["megatron"]
    assert forms["deepspeed"].startswith('engine.load_checkpoint("<checkpoint dir of step 700>", '
                                         'tag="global_step700")')


def test_a_single_step():
    forms = native_forms({**ADVICE, "skip_steps": [40701, 40701], "global_batch_size": None})
    assert forms["megatron"].endswith("--skip-train-iteration-range 40701-40701")
    assert "the data of steps 40701-40701 (1 optimizer step): when the loop reaches step 40701, " \
           "draw and discard 1 * gradient_accumulation_steps micro-batches" in forms["deepspeed"]


def test_no_checkpoint_recorded_names_the_step_to_look_before():
    forms = native_forms({**ADVICE, "checkpoint_step": None, "checkpoint_path": None})
    assert forms["hf"].startswith('trainer.train(resume_from_checkpoint="<the newest checkpoint '
                                  'saved before step 40701>") (step <its step>)')
    assert forms["megatron"].endswith("--skip-train-iteration-range 40701-40900")


@pytest.mark.parametrize("change, message", [
    ({"checkpoint_step": 40701}, "checkpoint_step 40701 must precede the skipped steps 40701-40900"),
    ({"skip_steps": [40900, 40701]}, "skip_steps must be [first, last]"),
    ({"skip_steps": [0, 5]}, "skip_steps must be [first, last]"),
    ({"skip_steps": [True, 5]}, "skip_steps must be [first, last]"),
    ({"onset_step": None}, "onset_step must be an integer, got None"),
    ({"global_batch_size": 51.2}, "global_batch_size must be an integer, got 51.2"),
    ({"consumed_samples": [10, 5]}, "consumed_samples must be [a, b] with a <= b"),
    ({"checkpoint_path": ""}, "checkpoint_path must be a path or None"),
])
def test_inconsistent_advice_is_a_value_error(change, message):
    with pytest.raises(ValueError) as err:
        native_forms({**ADVICE, **change})
    assert str(err.value).startswith(message)
