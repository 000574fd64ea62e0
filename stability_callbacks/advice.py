"""Rollback advice in each framework's own words (the PaLM / BLOOM / GLM-130B recipe).

"Go back to the last good checkpoint before the instability and skip the data of the steps
that led into it" (seeds: tr8-104B chronicles, ``--skip-train-iteration-range 13251-14000``).
:func:`native_forms` is a pure function from the ``details`` of a ``rollback_advice`` finding
to one copy-pasteable instruction per framework.

Conventions: a step is an optimizer step, numbered as HF ``global_step`` / Megatron
``iteration`` after it ran (1-based). ``skip_steps = [first, last]`` is inclusive.
``consumed_samples = [a, b]`` are the samples consumed before step ``first`` and after step
``last``: the bad samples are ``[a, b)``.

>>> forms = native_forms({"checkpoint_step": 40700, "checkpoint_path": "ckpt/iter_0040700",
...                       "onset_step": 40760, "skip_steps": [40701, 40900],
...                       "global_batch_size": 512, "consumed_samples": None})
>>> forms["megatron"]
'--load ckpt with ckpt/latest_checkpointed_iteration.txt = 40700 (Megatron-LM: --ckpt-step 40700) --skip-train-iteration-range 40701-40900'
"""
from __future__ import annotations

import os
import re
from typing import Any, Mapping, NamedTuple

_TAG_DIR = re.compile(r"^(global_step|iter_|step|checkpoint-|epoch=)")
# A checkpoint that is one file (Lightning's ``*.ckpt``, a torch.save): no Megatron or DeepSpeed
# checkpoint folder to load it from.
_ONE_FILE = re.compile(r"\.(ckpt|pt|pth|bin|safetensors)$")

#: The frameworks with a rollback form, and how an alert names each.
FORM_LABELS = {"hf": "HF Trainer / accelerate", "lightning": "Lightning", "megatron": "Megatron",
               "deepspeed": "DeepSpeed"}

# Where a run or a log comes from -> the form that speaks its language: an integration's name,
# or the format a replayed log was read as (docs/design.md, CLI).
_FORM_OF = {"hf": "hf", "hf-trainer": "hf", "hf-state": "hf", "trl": "hf", "lightning": "lightning",
            "megatron": "megatron", "megatron-deepspeed": "megatron", "gpt-neox": "megatron",
            "deepspeed": "deepspeed"}


def advice_forms_for(source: str | None) -> tuple[str, ...]:
    """The rollback forms for a run of ``source`` (an integration or a log format): its own,
    or none when no form speaks its language (the advice's sentence still says what to do).

    >>> advice_forms_for("hf-state"), advice_forms_for("megatron"), advice_forms_for("generic")
    (('hf',), ('megatron',), ())
    """
    form = _FORM_OF.get((source or "").strip().lower())
    return (form,) if form else ()


def native_forms(advice_details: Mapping[str, Any],
                 frameworks: tuple[str, ...] | None = None) -> dict[str, str]:
    """``{"hf", "lightning", "megatron", "deepspeed"}`` → one instruction each (``frameworks``:
    only these; None: all four).

    ``advice_details``: ``checkpoint_step`` (int or None = none recorded; with ``from_start``:
    none can be, the onset is the run's first step: train again from the initial weights), ``checkpoint_path``
    (str or None), ``onset_step``, ``skip_steps`` ``[first, last]``, ``global_batch_size``
    (int or None), ``consumed_samples`` ``[a, b]`` or None; without a checkpoint,
    ``checkpoints_seen`` (True: a live run, which saw every save, so none was saved: train again
    with ``save_steps``, the interval that puts one before the onset; else the log names none:
    the newest one saved before the onset). Every form is a complete instruction, without a
    blank to fill in. Raises ``ValueError`` naming the key when the advice is inconsistent (e.g.
    a checkpoint inside the skipped range).
    """
    d = dict(advice_details)
    onset = _int(d, "onset_step")
    skip = d.get("skip_steps")
    if (not isinstance(skip, (list, tuple)) or len(skip) != 2
            or not all(isinstance(s, int) and not isinstance(s, bool) for s in skip)
            or skip[0] > skip[1] or skip[0] < 0):   # a log may number its steps from 0
        raise ValueError(f"skip_steps must be [first, last] with 0 <= first <= last, got {skip!r}")
    first, last = skip
    ckpt_step = d.get("checkpoint_step")
    if ckpt_step is not None:
        ckpt_step = _int(d, "checkpoint_step")
        if ckpt_step >= first:
            raise ValueError(f"checkpoint_step {ckpt_step} must precede the skipped steps "
                             f"{first}-{last}: that checkpoint already saw the bad data")
    path = d.get("checkpoint_path")
    if path is not None and (not isinstance(path, str) or not path):
        raise ValueError(f"checkpoint_path must be a path or None, got {path!r}")
    gbs = d.get("global_batch_size")
    if gbs is not None:
        gbs = _int(d, "global_batch_size")
    samples = d.get("consumed_samples")
    if samples is not None and (not isinstance(samples, (list, tuple)) or len(samples) != 2
                                or samples[0] > samples[1]):
        raise ValueError(f"consumed_samples must be [a, b] with a <= b or None, got {samples!r}")

    n_steps = last - first + 1
    if samples is not None:
        sample_note = f", samples [{samples[0]}, {samples[1]}) = {samples[1] - samples[0]} samples"
    elif gbs is not None:
        sample_note = f", {n_steps * gbs} samples at global batch size {gbs}"
    else:
        sample_note = ""
    noun = "optimizer step" if n_steps == 1 else "optimizer steps"
    s = _Skip(first, last, n_steps, f"the data of steps {first}-{last} ({n_steps} {noun}{sample_note})")
    if ckpt_step is not None:
        forms = _from_checkpoint(ckpt_step, path, s)
    elif d.get("from_start"):
        forms = _from_start(s)
    elif d.get("checkpoints_seen"):
        forms = _none_saved(min(onset, first), d.get("save_steps"), s)
    else:
        forms = _none_named(min(onset, first), s)
    return forms if frameworks is None else {k: v for k, v in forms.items() if k in frameworks}


class _Skip(NamedTuple):
    """The steps whose data a restart skips, and how the forms name that data."""

    first: int
    last: int
    n: int
    what: str


def _from_checkpoint(step: int, path: str | None, s: _Skip) -> dict[str, str]:
    """Back to the checkpoint of ``step`` (``path``: where it is, when the run recorded it)."""
    dropped = f"; this also drops the good steps {step + 1}-{s.first - 1}" if step + 1 <= s.first - 1 else ""
    hf_where = f'"{path}"' if path else f'os.path.join(args.output_dir, "checkpoint-{step}")'
    ckpt_dir, tag = _split_tag(path, step)
    if path:
        pl_where = f'ckpt_path="{path}")'
    else:
        pl_where = f"ckpt_path=CKPT) with CKPT the checkpoint file of step {step} (its path was not recorded)"
    if ckpt_dir is not None:
        megatron_load = f"--load {ckpt_dir} with {ckpt_dir}/latest_checkpointed_iteration.txt = {step}"
        ds_load = (f'engine.load_checkpoint("{ckpt_dir}", tag="{tag}") (or write {tag} into {ckpt_dir}/latest, '
                   f"the tag load_checkpoint picks by default)")
    else:
        megatron_load = (f"--load CKPT_DIR with CKPT_DIR the folder that holds the checkpoint of iteration "
                         f"{step} and its latest_checkpointed_iteration.txt = {step}")
        ds_load = (f'engine.load_checkpoint(save_dir, tag="{tag}") with save_dir the folder your loop saves '
                   f"into (or write {tag} into save_dir/latest, the tag load_checkpoint picks by default)")
    return {
        "hf": (f"trainer.train(resume_from_checkpoint={hf_where}) (step {step}) with "
               f"TrainingArguments(ignore_data_skip=True), and skip {s.what}: start the train dataloader "
               f"after step {s.last} with accelerate's skip_first_batches(dataloader, num_batches={s.last} * "
               f"gradient_accumulation_steps) (counted within the epoch{dropped})"),
        "lightning": (f"trainer.fit(model, datamodule=dm, {pl_where} (step {step}); Lightning restores the "
                      f"loop, not a map-style loader's position: skip {s.what} in train_dataloader(), i.e. "
                      f"start its sampler after {s.last} * accumulate_grad_batches batches{dropped}"),
        "megatron": (f"{megatron_load} (Megatron-LM: --ckpt-step {step}) "
                     f"--skip-train-iteration-range {s.first}-{s.last}"),
        "deepspeed": (f"{ds_load}; then skip {s.what}: when the loop reaches step {s.first}, draw and discard "
                      f"{s.n} * gradient_accumulation_steps micro-batches"),
    }


def _none_saved(onset: int, save_steps: int | None, s: _Skip) -> dict[str, str]:
    """No checkpoint was saved before ``onset`` (a live run, which sees every save): train again
    from the start, with a save interval that puts one before ``onset``, and skip the data."""
    head = f"no checkpoint was saved before step {onset} (none that the monitor saw): "

    def every(setting: str) -> str:
        return f", with {setting} so that a checkpoint comes before step {onset}," if save_steps else ""
    return {
        "hf": (f"{head}train again from the start (trainer.train() without resume_from_checkpoint)"
               f"{every(f'TrainingArguments(save_steps={save_steps})')} and leave {s.what} out of the "
               f"train dataset"),
        "lightning": (f"{head}fit again from the start (trainer.fit(model, datamodule=dm) without ckpt_path)"
                      f"{every(f'ModelCheckpoint(every_n_train_steps={save_steps})')} and leave {s.what} out "
                      f"of train_dataloader()"),
        "megatron": (f"{head}train again without --load{every(f'--save-interval {save_steps}')} and "
                     f"--skip-train-iteration-range {s.first}-{s.last}"),
        "deepspeed": (f"{head}run the loop again from the start{every(f'engine.save_checkpoint every {save_steps} steps')}"
                      f" and skip {s.what}: when the loop reaches step {s.first}, draw and discard {s.n} * "
                      f"gradient_accumulation_steps micro-batches"),
    }


def _none_named(onset: int, s: _Skip) -> dict[str, str]:
    """The log names no checkpoint (a replayed log): the newest one saved before ``onset``."""
    why = "the log names no checkpoint"
    return {
        "hf": (f'trainer.train(resume_from_checkpoint=os.path.join(args.output_dir, f"checkpoint-{{N}}")) with N '
               f"the step of the newest checkpoint-N folder below {onset} ({why}) and "
               f"TrainingArguments(ignore_data_skip=True), and skip {s.what}: start the train dataloader after "
               f"step {s.last} with accelerate's skip_first_batches(dataloader, num_batches={s.last} * "
               f"gradient_accumulation_steps) (counted within the epoch; this also drops the good steps "
               f"after N)"),
        "lightning": (f"trainer.fit(model, datamodule=dm, ckpt_path=CKPT) with CKPT the newest checkpoint saved "
                      f"before step {onset} ({why}); Lightning restores the loop, not a map-style loader's "
                      f"position: skip {s.what} in train_dataloader(), i.e. start its sampler after {s.last} * "
                      f"accumulate_grad_batches batches (this also drops the good steps after CKPT's)"),
        "megatron": (f"--load with latest_checkpointed_iteration.txt = the newest iteration saved before {onset} "
                     f"({why}; Megatron-LM: --ckpt-step that iteration) "
                     f"--skip-train-iteration-range {s.first}-{s.last}"),
        "deepspeed": (f"engine.load_checkpoint(save_dir, tag=TAG) with TAG the newest tag saved before step "
                      f"{onset} in save_dir, the folder your loop saves into ({why}); then skip {s.what}: when "
                      f"the loop reaches step {s.first}, draw and discard {s.n} * gradient_accumulation_steps "
                      f"micro-batches"),
    }


def _from_start(s: _Skip) -> dict[str, str]:
    """No checkpoint can precede the onset (the run's first step): train again from the initial
    weights and skip the data of ``s``."""
    return {
        "hf": (f"trainer.train() again from the initial weights (no checkpoint comes before step {s.first}), "
               f"and skip {s.what}: start the train dataloader after step {s.last} with accelerate's "
               f"skip_first_batches(dataloader, num_batches={s.last} * gradient_accumulation_steps)"),
        "lightning": (f"trainer.fit(model, datamodule=dm) again from the initial weights, without ckpt_path "
                      f"(no checkpoint comes before step {s.first}); skip {s.what} in train_dataloader(), i.e. "
                      f"start its sampler after {s.last} * accumulate_grad_batches batches"),
        "megatron": f"train again without --load (no checkpoint comes before iteration {s.first}) "
                    f"--skip-train-iteration-range {s.first}-{s.last}",
        "deepspeed": (f"run the loop again from the initial weights, without engine.load_checkpoint (no "
                      f"checkpoint comes before step {s.first}); then skip {s.what}: when the loop reaches step "
                      f"{s.first}, draw and discard {s.n} * gradient_accumulation_steps micro-batches"),
    }


def _split_tag(path: str | None, step: int) -> tuple[str | None, str]:
    """(save dir, tag): DeepSpeed saves ``<dir>/<tag>/`` with the default tag ``global_step<N>``;
    Megatron saves ``<dir>/iter_<N>/``. A path naming the tag folder itself is split. No folder
    (None) for an unknown path or a checkpoint that is one file."""
    if path is None or _ONE_FILE.search(path.rstrip("/\\")):
        return None, f"global_step{step}"
    clean = path.rstrip("/\\")
    base = os.path.basename(clean)
    if _TAG_DIR.match(base) and os.path.dirname(clean):
        return os.path.dirname(clean), base
    return clean, f"global_step{step}"


def _int(d: Mapping[str, Any], key: str) -> int:
    v = d.get(key)
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"{key} must be an integer, got {v!r}")
    return v
