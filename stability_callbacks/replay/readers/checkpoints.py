"""Checkpoint saves a log prints, for the rollback advice to name the one to resume from.

A save is a line that says a checkpoint (or the model, its weights or state) was saved or is
being saved, and names where: ``saving checkpoint at iteration 1000 to /ckpt/iter_0001000``
(Megatron), ``Saving model checkpoint to out/checkpoint-500`` (HF's Trainer), ``saved checkpoint
checkpoints/checkpoint2.pt (epoch 2 @ 3126 updates)`` (fairseq), ``Saving checkpoint
run/model_step_1000.pt`` (OpenNMT), ``saving checkpoint: output/lora-000002.safetensors`` (kohya),
``Saving current state to out/checkpoint-150`` (accelerate). Its step is the one the line
prints (``iteration 1000``, ``@ 3126 updates``, ``checkpoint-500``, ``step_1000``), else that of
the last record before it (a save follows the step it holds). A line that says the save failed,
or loads a checkpoint, is none.
"""
from __future__ import annotations

import re

# a cheap filter first: every save names one of these
_WORDS = ("heckpoint", "aving", "aved", "ave model", "ave the model")
_SAVED = re.compile(r"\b(?:sav(?:e|ed|ing)|wr(?:ote|iting|itten)|stor(?:ed|ing))\b.{0,60}?"
                    r"\b(?:checkpoints?|ckpt|model|weights|state)\b"
                    r"|\b(?:checkpoint|model|weights|state)\b.{0,30}?\b(?:saved|written|stored)\b", re.I)
_NOT_A_SAVE = re.compile(r"\b(?:fail(?:ed|ure)?|error|unable|could not|cannot|load(?:ed|ing)?|restor(?:e|ed|ing)"
                         r"|resum(?:e|ed|ing)|skipp(?:ed|ing)|delet(?:e|ed|ing)|remov(?:e|ed|ing))\b", re.I)
_PATH = re.compile(r"""['"`]?((?:[A-Za-z]:)?[\w.~+-]*(?:[/\\][\w.~+=-]+)+[/\\]?|[\w.+=-]+\.(?:pt|pth|ckpt|bin|"""
                   r"""safetensors|h5|keras|pkl|npz|msgpack|params|tar))['"`]?""")
_STEP = re.compile(r"\b(?:iteration|iter|step|global[ _]step|update|num_updates)s?\b\s*[:=#]?\s*(\d+)"
                   r"|@\s*(\d+)\s*updates\b|\bcheckpoints? for (\d+)\b", re.I)
_STEP_IN_PATH = re.compile(r"(?:checkpoint|ckpt|iter|iteration|step|global_step|model_step)[-_=]?0*(\d+)(?!\d)",
                           re.I)


def saved(text: str) -> tuple[int | None, str] | None:
    """``(step or None, path)`` of a line that says a checkpoint was saved, else None.

    >>> saved("saving checkpoint at iteration    1000 to /ckpt/gpt")
    (1000, '/ckpt/gpt')
    >>> saved("Saving model checkpoint to out/checkpoint-500")
    (500, 'out/checkpoint-500')
    >>> saved("| saved checkpoint checkpoints/checkpoint2.pt (epoch 2 @ 3126 updates)")
    (3126, 'checkpoints/checkpoint2.pt')
    >>> saved("saving checkpoint: output/mylora-000002.safetensors")
    (None, 'output/mylora-000002.safetensors')
    >>> saved("Loading checkpoint from /ckpt/iter_0001000") is None, saved("step 5 loss 2.3") is None
    (True, True)
    """
    if not says_saved(text):
        return None
    paths = [p for p in _PATH.findall(text) if not p.startswith("//")]
    if not paths:
        return None
    path = max(paths, key=len).rstrip(".")
    m = _STEP.search(text.replace(path, " "))
    if m is not None:
        return int(next(g for g in m.groups() if g)), path
    m = _STEP_IN_PATH.search(path.rstrip("/\\").rsplit("/", 1)[-1])
    return (int(m.group(1)) if m is not None else None), path


def says_saved(text: str) -> bool:
    """Whether a line says a checkpoint (the model, its weights) was saved, where or not
    (pix2pixHD's ``saving the model at the end of epoch 1, iters 1000``)."""
    return any(w in text for w in _WORDS) and _SAVED.search(text) is not None and _NOT_A_SAVE.search(text) is None
