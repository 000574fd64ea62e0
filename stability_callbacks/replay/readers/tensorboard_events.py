"""TensorBoard event files (``events.out.tfevents.*``), via the ``tensorboard`` package.

Every scalar is read (``size_guidance`` 0: the default keeps 10,000 per tag by reservoir
sampling, FRAMEWORK_NOTES 6), both legacy ``simple_value`` scalars and ``new_style`` tensors.
Tags map to metric keys through :mod:`.tags` (HF ``train/loss``, Megatron ``lm loss``, ...; our
``stability/<key>`` and HF's ``train/stability/<key>``, which win over an alias of the same key);
values of one step from several tags make one record. A directory whose event files sit in
sub-directories (one per run/version) is read as one run, later files winning on conflicts.
Requires ``pip install stability-callbacks[tensorboard]``; loads the run into memory (event files
are read by the package as a whole).
"""
from __future__ import annotations

import os
from typing import Iterator

from ...record import StepRecord
from .source import LogFormatError, SkipReport
from .tags import is_ours, metric_key


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


def read(path, *, on_skip: SkipReport, tag_map=None, **_) -> Iterator[StepRecord]:
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
        from tensorboard.util.tensor_util import make_ndarray
    except ImportError as e:
        raise LogFormatError(path, None, "reading TensorBoard logs needs the tensorboard package "
                             "(pip install 'stability-callbacks[tensorboard]')") from e
    dirs = event_dirs(path)
    if not dirs:
        raise LogFormatError(path, None, "no events.out.tfevents.* file here")
    by_step: dict[int, dict[str, float]] = {}
    for d in dirs:
        ea = EventAccumulator(d, size_guidance={"scalars": 0, "tensors": 0})
        try:
            ea.Reload()
        except Exception as e:  # a corrupt/truncated event file: keep what the others give
            on_skip(0, d, f"unreadable event file: {e!r}")
            continue
        tags = ea.Tags()
        # Our own tags last: they win over a framework's alias of the same key at the same step.
        named = sorted([(t, False) for t in tags.get("scalars", [])]
                       + [(t, True) for t in tags.get("tensors", [])], key=lambda tt: is_ours(tt[0]))
        for tag, is_tensor in named:
            key = metric_key(tag, tag_map)
            if key is None:
                continue
            if not is_tensor:
                for ev in ea.Scalars(tag):
                    by_step.setdefault(int(ev.step), {})[key] = float(ev.value)
                continue
            for ev in ea.Tensors(tag):
                try:
                    value = float(make_ndarray(ev.tensor_proto).reshape(-1)[0])
                except (ValueError, IndexError, TypeError) as e:
                    on_skip(0, f"{d}:{tag}@{ev.step}", f"not a scalar tensor: {e!r}")
                    continue
                by_step.setdefault(int(ev.step), {})[key] = value
    for step in sorted(by_step):
        yield StepRecord(step, by_step[step])
