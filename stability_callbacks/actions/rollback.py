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
from typing import Any, Mapping

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
    none can be, the onset is the run's first step), ``checkpoint_path``
    (str or None), ``onset_step``, ``skip_steps`` ``[first, last]``, ``global_batch_size``
    (int or None), ``consumed_samples`` ``[a, b]`` or None. Raises ``ValueError`` naming the
    key when the advice is inconsistent (e.g. a checkpoint inside the skipped range).
    """
    d = dict(advice_details)
    onset = _int(d, "onset_step")
    skip = d.get("skip_steps")
    if (not isinstance(skip, (list, tuple)) or len(skip) != 2
            or not all(isinstance(s, int) and not isinstance(s, bool) for s in skip)
            or skip[0] > skip[1] or skip[0] < 1):
        raise ValueError(f"skip_steps must be [first, last] with 1 <= first <= last, got {skip!r}")
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
    what = f"the data of steps {first}-{last} ({n_steps} {noun}{sample_note})"
    if d.get("from_start") and ckpt_step is None:
        forms = _from_start(first, last, n_steps, what)
        return forms if frameworks is None else {k: v for k, v in forms.items() if k in frameworks}

    if ckpt_step is None:
        where = f"<the newest checkpoint saved before step {min(onset, first)}>"
        ckpt_step_text = "<its step>"
        prefix_steps = f"{last}"
        tag = "<its tag>"
        ckpt_dir = where
        iteration = "<its iteration>"
    else:
        where = path if path else f"<the checkpoint of step {ckpt_step}>"
        ckpt_step_text = str(ckpt_step)
        prefix_steps = f"{last}"
        ckpt_dir, tag = _split_tag(path, ckpt_step)
        iteration = str(ckpt_step)
    dropped_good = (f"; this also drops the good steps {ckpt_step + 1}-{first - 1}"
                    if ckpt_step is not None and ckpt_step + 1 <= first - 1 else "")

    hf = (f'trainer.train(resume_from_checkpoint="{where}") (step {ckpt_step_text}) with '
          f"TrainingArguments(ignore_data_skip=True), and skip {what}: start the train "
          f"dataloader after step {last} with accelerate's skip_first_batches(dataloader, "
          f"num_batches={prefix_steps} * gradient_accumulation_steps) (counted within the "
          f"epoch{dropped_good})")
    lightning = (f'trainer.fit(model, datamodule=dm, ckpt_path="{where}") (step '
                 f"{ckpt_step_text}); Lightning restores the loop, not a map-style loader's "
                 f"position: skip {what} in train_dataloader(), i.e. start its sampler after "
                 f"{prefix_steps} * accumulate_grad_batches batches{dropped_good}")
    megatron = (f"--load {ckpt_dir} with {ckpt_dir}/latest_checkpointed_iteration.txt = "
                f"{iteration} (Megatron-LM: --ckpt-step {iteration}) "
                f"--skip-train-iteration-range {first}-{last}")
    deepspeed = (f'engine.load_checkpoint("{ckpt_dir}", tag="{tag}") (or write {tag} into '
                 f"{ckpt_dir}/latest, the tag load_checkpoint picks by default); then skip "
                 f"{what}: when the loop reaches step {first}, draw and discard {n_steps} * "
                 f"gradient_accumulation_steps micro-batches")
    forms = {"hf": hf, "lightning": lightning, "megatron": megatron, "deepspeed": deepspeed}
    return forms if frameworks is None else {k: v for k, v in forms.items() if k in frameworks}


def _from_start(first: int, last: int, n_steps: int, what: str) -> dict[str, str]:
    """No checkpoint can precede the onset (the run's first step): train again from the initial
    weights and skip ``what``, the data of steps ``first``-``last``."""
    return {
        "hf": (f"trainer.train() again from the initial weights (no checkpoint comes before step {first}), "
               f"and skip {what}: start the train dataloader after step {last} with accelerate's "
               f"skip_first_batches(dataloader, num_batches={last} * gradient_accumulation_steps)"),
        "lightning": (f"trainer.fit(model, datamodule=dm) again from the initial weights, without ckpt_path "
                      f"(no checkpoint comes before step {first}); skip {what} in train_dataloader(), i.e. "
                      f"start its sampler after {last} * accumulate_grad_batches batches"),
        "megatron": f"train again without --load (no checkpoint comes before iteration {first}) "
                    f"--skip-train-iteration-range {first}-{last}",
        "deepspeed": (f"run the loop again from the initial weights, without engine.load_checkpoint (no "
                      f"checkpoint comes before step {first}); then skip {what}: when the loop reaches step "
                      f"{first}, draw and discard {n_steps} * gradient_accumulation_steps micro-batches"),
    }


def _split_tag(path: str | None, step: int) -> tuple[str, str]:
    """(save dir, tag): DeepSpeed saves ``<dir>/<tag>/`` with the default tag ``global_step<N>``;
    Megatron saves ``<dir>/iter_<N>/``. A path naming the tag folder itself is split."""
    if path is None or _ONE_FILE.search(path.rstrip("/\\")):
        return f"<checkpoint dir of step {step}>", f"global_step{step}"
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
