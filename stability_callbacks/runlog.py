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
"""
from __future__ import annotations

import json
from pathlib import Path

from .control import Action
from .record import Finding, StepRecord

RUNLOG_NAME = "runlog.jsonl"


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

    def checkpoint(self, step: int, path: str | None) -> None:
        self._write({"type": "checkpoint", "step": step, "path": path}, flush=True)

    def action(self, action: Action) -> None:
        self._write(action.to_json(), flush=True)

    def close(self) -> None:
        if not self._f.closed:
            self._f.close()
