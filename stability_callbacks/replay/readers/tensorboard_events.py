"""TensorBoard event files (``events.out.tfevents.*``), via the ``tensorboard`` package.

Every scalar is read (``size_guidance`` 0: the default keeps 10,000 per tag by reservoir
sampling), both legacy ``simple_value`` scalars and ``new_style`` tensors.
Tags map to metric keys through :mod:`.tags` (HF ``train/loss``, Megatron ``lm loss``,
torchtitan ``loss_metrics/global_avg_loss``, OLMo-core ``train/CE loss``, Lightning
``train_loss_step``; ``--keys`` and ``tag_map`` name others; our ``stability/<key>`` wins over
an alias of the same key); values of one step from several tags make one record. A directory
whose event files sit in sub-directories (one per run/version) is read as one run, later files
winning on conflicts. A run with no tag that is a training loss is refused, naming the tags it
has. Requires ``pip install stability-callbacks[tensorboard]``; loads the run into memory.
"""
from __future__ import annotations

import os
from typing import Iterator

from ... import keys
from ...record import StepRecord
from .account import ReadAccount
from .source import LogFormatError
from .tags import metric_key, rank


def event_dirs(path) -> list[str]:
    """Directories holding event files, under ``path`` (a directory or one event file)."""
    path = str(path)
    if os.path.isfile(path):
        return [path]
    found = []
    for root, _dirs, files in os.walk(path):
        if any("tfevents" in f for f in files):
            found.append(root)
    return sorted(found)


def read(path, *, account: ReadAccount, tag_map=None, user_keys=None, **_) -> Iterator[StepRecord]:
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
        from tensorboard.util.tensor_util import make_ndarray
    except ImportError as e:
        raise LogFormatError(path, None, "reading TensorBoard logs needs the tensorboard package "
                             "(pip install 'stability-callbacks[tensorboard]')") from e
    dirs = event_dirs(path)
    if not dirs:
        raise LogFormatError(path, None, "no events.out.tfevents.* file here")
    by_step: dict[int, dict[str, tuple[int, float]]] = {}
    seen: list[str] = []
    for d in dirs:
        ea = EventAccumulator(d, size_guidance={"scalars": 0, "tensors": 0})
        try:
            ea.Reload()
        except Exception as e:  # a corrupt/truncated event file: keep what the others give
            account(0, d, f"unreadable event file: {e!r}")
            continue
        tags = ea.Tags()
        named = [(t, False) for t in tags.get("scalars", [])] + [(t, True) for t in tags.get("tensors", [])]
        for tag, is_tensor in named:
            if tag not in seen:
                seen.append(tag)
            key = metric_key(tag, tag_map, user_keys)
            if key is None:
                continue
            r = rank(tag)
            account.saw(key, tag)
            for step, value in _values(ea, tag, is_tensor, make_ndarray, account, d):
                got = by_step.setdefault(step, {})
                if key not in got or r <= got[key][0]:
                    got[key] = (r, value)
    if not any(keys.LOSS in m for m in by_step.values()):
        shown = ", ".join(seen[:40]) + (f", ... ({len(seen)} tags)" if len(seen) > 40 else "")
        raise LogFormatError(path, None, f"no training loss among the TensorBoard tags "
                             f"({shown or 'none'}); name it with --keys loss=TAG")
    account.numbered("counter", "the event step")
    for step in sorted(by_step):
        yield StepRecord(step, {k: v for k, (_, v) in by_step[step].items()})


def _values(ea, tag, is_tensor, make_ndarray, account, d) -> Iterator[tuple[int, float]]:
    if not is_tensor:
        for ev in ea.Scalars(tag):
            yield int(ev.step), float(ev.value)
        return
    for ev in ea.Tensors(tag):
        try:
            yield int(ev.step), float(make_ndarray(ev.tensor_proto).reshape(-1)[0])
        except (ValueError, IndexError, TypeError) as e:
            account(0, f"{d}:{tag}@{ev.step}", f"not a scalar tensor: {e!r}")
