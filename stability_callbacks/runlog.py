"""The run log (docs/design.md, Run log): one JSON object per line — steps, findings, segments, checkpoints,
and (an extension) actions: what the integration did and why (``{"type": "action", "step": N,
"action": "save"|"save_blocked"|"save_interval"|"stop", "reason": ..., "path": ...}``) and the
phase facts the Monitor was given (``{"type": "phase", "warmup_steps": N}``, after the ``segment``
line of every start and resume: the LR warmup the integration declared from the scheduler or
TrainingArguments, or the configured one). The LR stream alone tells a warmup's end only a few
steps late; a replay of the run log declares it again, so replay = live (docs/design.md, Invariants).

Written by every integration (rank 0), read by ``replay`` and ``timeline`` (which skip line
types they do not know). Lines are buffered and flushed every ``flush_every`` steps and at every
finding, segment, checkpoint and action, so a crash loses at most a few step lines and never a
finding.

One run log per run (docs/design.md, Run log): a run that resumes from a checkpoint the run log
in its folder knows continues it (:func:`knows_checkpoint`); any other run moves an earlier
run's log aside (:func:`set_aside`) and starts its own.
"""
from __future__ import annotations

import json
import os
import re
from pathlib import Path

from .control import Action
from .record import Finding, StepRecord

RUNLOG_NAME = "runlog.jsonl"
#: The run's folder (``run_dir``) by default: this name inside the folder the framework keeps the
#: run in (HF ``output_dir``, Lightning ``default_root_dir``, a DeepSpeed loop's checkpoint
#: folder, the folder of the log ``replay --follow`` follows).
RUN_DIR_NAME = "stability"
_ASIDE = re.compile(r"^runlog\.(\d+)\.jsonl$")
_CHECKPOINT_LINE = '"type":"checkpoint"'


def knows_checkpoint(path: str | Path, step: int, checkpoint: str | None = None) -> bool:
    """Whether the run log at ``path`` noted a checkpoint of ``step`` (the one a run resumes
    from); when both it and ``checkpoint`` name a path, the same one (resolved, or at least the
    same folder or file name: a checkpoint moved to another mount is still the same).

    One pass over the file, parsing only its checkpoint lines.

    >>> import tempfile, os
    >>> p = os.path.join(tempfile.mkdtemp(), "runlog.jsonl")
    >>> log = RunLog(p); log.checkpoint(20, "out/checkpoint-20"); log.close()
    >>> knows_checkpoint(p, 20, "/elsewhere/checkpoint-20"), knows_checkpoint(p, 20, "out/checkpoint-30")
    (True, False)
    """
    name = None if checkpoint is None else os.path.basename(os.path.normpath(str(checkpoint)))
    with open(path, encoding="utf-8", errors="replace") as fh:
        for line in fh:
            if _CHECKPOINT_LINE not in line:
                continue
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if obj.get("step") != step:
                continue
            noted = obj.get("path")
            if checkpoint is None or noted is None or name == os.path.basename(os.path.normpath(noted)) \
                    or os.path.realpath(noted) == os.path.realpath(str(checkpoint)):
                return True
    return False


def set_aside(path: str | Path) -> Path:
    """Move the run log at ``path`` (an earlier run's) to ``runlog.<n>.jsonl`` beside it, ``n``
    one more than the highest taken (1 = the oldest); returns the new path."""
    path = Path(path)
    taken = [int(m.group(1)) for m in map(_ASIDE.match, os.listdir(path.parent)) if m]
    target = path.with_name(f"runlog.{max(taken, default=0) + 1}.jsonl")
    os.replace(path, target)
    return target


class RunLog:
    def __init__(self, path: str | Path, *, flush_every: int = 50):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = open(self.path, "a", encoding="utf-8")
        self.flush_every = flush_every
        self._pending = 0

    def _write(self, obj: dict, *, flush: bool) -> None:
        self._f.write(json.dumps(obj, separators=(",", ":")) + "\n")
        self._pending += 1
        if flush or self._pending >= self.flush_every:
            self._f.flush()
            self._pending = 0

    def step(self, record: StepRecord) -> None:
        self._write(record.to_json(), flush=False)

    def finding(self, finding: Finding) -> None:
        self._write({"type": "finding", **finding.to_json()}, flush=True)

    def segment(self, segment: int, start_step: int, reason: str) -> None:
        self._write({"type": "segment", "segment": segment, "start_step": start_step, "reason": reason},
                    flush=True)

    def phase(self, warmup_steps: int) -> None:
        self._write({"type": "phase", "warmup_steps": warmup_steps}, flush=True)

    def model(self, num_outputs: int) -> None:
        """The model's output size (a live run reads it from its output layer): replay declares it
        again, for not_learning's chance level."""
        self._write({"type": "model", "num_outputs": num_outputs}, flush=True)

    def checkpoint(self, step: int, path: str | None) -> None:
        self._write({"type": "checkpoint", "step": step, "path": path}, flush=True)

    def action(self, action: Action) -> None:
        self._write(action.to_json(), flush=True)

    def close(self) -> None:
        if not self._f.closed:
            self._f.close()
