"""HF Trainer ``trainer_state.json``: the Trainer's own history, one record per step.

``log_history`` holds one entry per ``trainer.log`` call: the Trainer's own (``loss``,
``grad_norm``, ``learning_rate`` at ``step``), and any a callback logged at the same step (ours:
``stability/<key>``). Entries of one step make one record (a step is never read twice: that
would be a resume that never happened); our names win over the Trainer's alias of the same key
(its ``loss`` is a mean over the logging interval). Evaluation entries (``eval_loss``) and the
final summary (``train_runtime``) are not steps. Loaded whole (JSON has no streaming reader in
the standard library, and the file is small). The printed log dicts (``{'loss': '2.346', ...}``)
are read by the generic reader (:mod:`.generic`).
"""
from __future__ import annotations

import json
import math
from typing import Iterator

from ... import keys
from ...record import StepRecord
from .account import ReadAccount
from .source import LogFormatError, to_float
from .tags import metric_key, rank

_NOT_A_STEP = ("train_runtime", "eval_loss", "eval_runtime")


def read_state(path, *, account: ReadAccount, lines, tag_map=None, user_keys=None, **_
               ) -> Iterator[StepRecord]:
    text = "\n".join(t for _, t in lines if t is not None)
    try:
        state = json.loads(text)
    except json.JSONDecodeError as e:
        raise LogFormatError(path, e.lineno, f"not valid JSON: {e.msg}") from e
    history = state.get("log_history") if isinstance(state, dict) else None
    if not isinstance(history, list):
        raise LogFormatError(path, None, "no log_history list (not a trainer_state.json)")
    by_step: dict[int, dict[str, tuple[int, float]]] = {}
    epochs: dict[int, int] = {}   # the epoch (from 1) of a step: `epoch` is e + the part done, in (e, e + 1]
    for i, entry in enumerate(history):
        if not isinstance(entry, dict) or "step" not in entry:
            account(i + 1, repr(entry)[:200], "log_history entry without a step")
            continue
        if any(k in entry for k in _NOT_A_STEP):
            account.ignore(i + 1, "", "evaluation or run summary entry")
            continue
        try:
            step = int(entry["step"])
            ours_at = entry.get(keys.STEP_AXIS)
            if isinstance(entry.get("epoch"), (int, float)) and entry["epoch"] > 0:
                epochs[step] = max(1, math.ceil(round(entry["epoch"], 6)))
            for name, value in entry.items():
                if name in ("step", "epoch"):
                    continue
                key = metric_key(name, tag_map, user_keys)
                if key is None:
                    continue
                at = int(ours_at) if ours_at is not None and keys.from_tag(name) else step
                got = by_step.setdefault(at, {})
                r = rank(name)
                if key not in got or r < got[key][0]:
                    got[key] = (r, to_float(value) if isinstance(value, str) else float(value))
                    account.saw(key, name)
        except (TypeError, ValueError) as e:
            account(i + 1, repr(entry)[:200], f"unreadable value: {e}")
    account.numbered("counter", "log_history step")
    for step in sorted(by_step):
        metrics = {k: v for k, (_, v) in by_step[step].items()}
        if metrics:
            yield StepRecord(step, metrics, epoch=epochs.get(step))
