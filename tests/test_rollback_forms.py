"""Rollback advice in native forms: exact strings for HF/accelerate, Lightning, Megatron, DeepSpeed."""
from __future__ import annotations

import re

import pytest

from stability_callbacks.advice import advice_forms_for, native_forms

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
    (None, 'engine.load_checkpoint(save_dir, tag="global_step700") with save_dir the folder your loop saves into'),
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
    assert forms["deepspeed"].startswith('engine.load_checkpoint(save_dir, tag="global_step700") with save_dir '
                                         'the folder your loop saves into')
    assert forms["megatron"].startswith("--load CKPT_DIR with CKPT_DIR the folder that holds the checkpoint of "
                                        "iteration 700")


def test_a_single_step():
    forms = native_forms({**ADVICE, "skip_steps": [40701, 40701], "global_batch_size": None})
    assert forms["megatron"].endswith("--skip-train-iteration-range 40701-40701")
    assert "the data of steps 40701-40701 (1 optimizer step): when the loop reaches step 40701, " \
           "draw and discard 1 * gradient_accumulation_steps micro-batches" in forms["deepspeed"]


def test_no_checkpoint_saved_says_so_and_what_to_do():
    """A live run sees every save: with none before the onset, train again from the start with a
    save interval that puts one before it, and leave the bad data out."""
    forms = native_forms({**ADVICE, "checkpoint_step": None, "checkpoint_path": None, "onset_step": 22,
                          "skip_steps": [22, 22], "global_batch_size": None, "checkpoints_seen": True,
                          "save_steps": 20})
    head = "no checkpoint was saved before step 22 (none that the monitor saw): "
    assert forms["hf"] == (
        f"{head}train again from the start (trainer.train() without resume_from_checkpoint), with "
        "TrainingArguments(save_steps=20) so that a checkpoint comes before step 22, and leave the data of "
        "steps 22-22 (1 optimizer step) out of the train dataset")
    assert forms["lightning"] == (
        f"{head}fit again from the start (trainer.fit(model, datamodule=dm) without ckpt_path), with "
        "ModelCheckpoint(every_n_train_steps=20) so that a checkpoint comes before step 22, and leave the data "
        "of steps 22-22 (1 optimizer step) out of train_dataloader()")
    assert forms["megatron"] == (f"{head}train again without --load, with --save-interval 20 so that a checkpoint "
                                 "comes before step 22, and --skip-train-iteration-range 22-22")
    assert forms["deepspeed"].startswith(f"{head}run the loop again from the start, with engine.save_checkpoint "
                                         "every 20 steps so that a checkpoint comes before step 22, and skip")
    # At step 1 nothing can come before it: no interval.
    first = native_forms({**ADVICE, "checkpoint_step": None, "checkpoint_path": None, "onset_step": 1,
                          "skip_steps": [1, 1], "checkpoints_seen": True, "save_steps": None}, ("hf",))
    assert first["hf"].startswith("no checkpoint was saved before step 1 (none that the monitor saw): train "
                                  "again from the start (trainer.train() without resume_from_checkpoint) and leave")


def test_a_log_that_names_no_checkpoint_points_at_the_newest_before_the_onset():
    forms = native_forms({**ADVICE, "checkpoint_step": None, "checkpoint_path": None})
    assert forms["hf"].startswith('trainer.train(resume_from_checkpoint=os.path.join(args.output_dir, '
                                  'f"checkpoint-{N}")) with N the step of the newest checkpoint-N folder below '
                                  '40701 (the log names no checkpoint)')
    assert forms["megatron"] == ("--load with latest_checkpointed_iteration.txt = the newest iteration saved "
                                 "before 40701 (the log names no checkpoint; Megatron-LM: --ckpt-step that "
                                 "iteration) --skip-train-iteration-range 40701-40900")


@pytest.mark.parametrize("change, message", [
    ({"checkpoint_step": 40701}, "checkpoint_step 40701 must precede the skipped steps 40701-40900"),
    ({"skip_steps": [40900, 40701]}, "skip_steps must be [first, last]"),
    ({"skip_steps": [-1, 5]}, "skip_steps must be [first, last]"),
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


# ------------------------------------------------------------------- no blank, anywhere
PLACEHOLDER = re.compile(r"<[^<>\n]*>")
CHECKPOINTS = {"none": [], "one": [(10, "out/checkpoint-10")], "one, no path": [(10, None)],
               "one file": [(10, "out/ckpts/stability-step=10.ckpt")],
               "many": [(10, "out/ds/global_step10"), (20, "out/ds/global_step20"), (30, "out/ds/global_step30")]}


@pytest.mark.parametrize("framework", ["hf", "lightning", "megatron", "deepspeed", None])
@pytest.mark.parametrize("seen", [True, False], ids=["live", "log"])
@pytest.mark.parametrize("saved", list(CHECKPOINTS))
def test_no_advice_text_has_a_blank_to_fill_in(tmp_path, framework, seen, saved, capsys):
    """Every place advice is written, for no checkpoint, one (with a folder, without a path, one
    file) and many, in a live run (every save seen) and a replayed log (none named): the finding's
    sentence, every native form, the alert, the end-of-run summary, ``replay``'s printed lines and
    a log without step numbers. None holds a ``<...>`` to fill in."""
    from stability_callbacks.alerts.sink import Alert, alert_text
    from stability_callbacks.live import LiveRun
    from stability_callbacks.record import StepRecord
    from stability_callbacks.replay.command import print_finding, record_numbered

    run = LiveRun(config={"actions": {}, "policy": {"halt_on": "critical"}}, run_dir=tmp_path,
                  advice_forms=(framework,) if framework else None, sees_checkpoints=seen)
    run.start(0)
    for step in range(1, 41):
        run.observe(StepRecord(step, {"loss": float("nan") if step == 40 else 2.0 + step % 3 / 100}))
        for at, path in CHECKPOINTS[saved]:
            if at == step:
                run.checkpoint_saved(step, path)
    run.close()
    advice = run.control.rollback
    assert advice.details["checkpoint_step"] == (CHECKPOINTS[saved][-1][0] if CHECKPOINTS[saved] else None)
    texts = [advice.message, record_numbered(advice).message, *native_forms(advice.details).values(),
             alert_text(Alert(advice, "run", advice_forms=run.advice_forms), markdown=False),
             *run.outcome(halted_at=40).summary_lines()]
    print_finding(advice, run.advice_forms)
    texts.append(capsys.readouterr().out)
    assert not [t for t in texts if PLACEHOLDER.search(t)], [PLACEHOLDER.search(t).group() for t in texts
                                                             if PLACEHOLDER.search(t)]
    if not CHECKPOINTS[saved]:
        said = "No checkpoint was saved before step 40" if seen else "the newest checkpoint saved before step 40"
        assert said in advice.message
