"""Rollback under a DeepSpeed engine: ``latest`` pointed at a good checkpoint (the advice carried
out on disk, :func:`roll_back_latest`), and the automatic rollback of the user's loop
(:class:`DeepSpeedRollBack`; the shared steps: :mod:`..torch.auto_rollback`).
"""
from __future__ import annotations

import logging
import os
from typing import Any, Callable, Iterator

from stability_callbacks.control import RollbackRequest
from stability_callbacks.forensics import StepIndices

from ..torch.auto_rollback import RollBack, barrier, install_sampler, is_rank0, set_aside_newer, tag_step

__all__ = ["roll_back_latest", "set_latest_on_rank0", "DeepSpeedRollBack"]

log = logging.getLogger("stability_callbacks")


def roll_back_latest(save_dir: str | os.PathLike, tag: str) -> list[str]:
    """Point ``<save_dir>/latest`` (DeepSpeed's default tag) at ``tag`` and move every tag with a
    higher step number into ``<save_dir>/rolled_back/`` (:func:`set_aside_newer`). Returns the
    moved tags, oldest first. Filesystem only: call it on one rank.

    Raises ``ValueError`` when ``tag`` is not a checkpoint folder in ``save_dir`` or carries no
    step number (``global_step<N>``, ``iter_<N>``, ...).
    """
    save_dir = os.fspath(save_dir)
    if not os.path.isdir(os.path.join(save_dir, tag)):
        raise ValueError(f"tag: {tag!r} is not a checkpoint folder in {save_dir}")
    target = tag_step(tag)
    if target is None:
        raise ValueError(f"tag: {tag!r} carries no step number")
    moved = set_aside_newer(save_dir, target)
    tmp = os.path.join(save_dir, "latest.tmp")
    with open(tmp, "w") as fh:
        fh.write(tag)
    os.replace(tmp, os.path.join(save_dir, "latest"))
    return moved


def set_latest_on_rank0(save_dir: str, tag: str, rank0: bool) -> list[str]:
    """:func:`roll_back_latest` on rank 0 (``rank0``), then a barrier every rank reaches, even
    if rank 0's file moves failed. Returns the moved tags (rank 0; elsewhere empty)."""
    moved: list[str] = []
    try:
        if rank0:
            moved = roll_back_latest(save_dir, tag)
    finally:
        barrier()
    return moved


class DeepSpeedRollBack(RollBack):
    """DeepSpeed (the user's loop): ``hook.batches(loader)`` yields the loader's micro-batches
    from the data step the engine is at and rewinds after a rollback, which loads the
    checkpoint in-process (``engine.load_checkpoint``) right after ``engine.step()``."""

    def __init__(self, session_of, engine):
        super().__init__(session_of)
        self.engine = engine
        self.sampler_problem = ("the loop does not iterate hook.batches(loader); the data cannot be "
                                "rewound")
        self._rewind = False

    def batches(self, loader, record: Callable[[], StepIndices | None] | None = None) -> Iterator[Any]:
        """``hook.batches``: ``record`` returns the run's index ring (data forensics; the same
        sampler wrapper records each step's indices)."""
        e = self.engine
        self.sampler = install_sampler(loader, skips=self.skips, start_step=lambda: int(e.global_steps),
                                       samples_per_step=loader.batch_size * e.gradient_accumulation_steps(),
                                       record=record)
        self.sampler_problem = None
        try:
            while True:
                self._rewind = False
                for batch in loader:
                    yield batch
                    if self._rewind:
                        break
                else:
                    return
        finally:
            self.sampler_problem = "the loop left hook.batches(loader); the data cannot be rewound"

    def carry_out(self, req: RollbackRequest) -> None:
        """Load the checkpoint (every rank; the hook's load wrapper restores the session and
        opens the rollback segment) and rewind the data. A load that fails is a halt: the
        engine's state is then unknown (the checkpoints on disk are untouched)."""
        save_dir, tag = os.path.split(req.checkpoint_path.rstrip("/\\"))
        try:
            set_latest_on_rank0(save_dir, tag, is_rank0())   # the newer tags were set aside on accept
            self.engine.load_checkpoint(save_dir, tag=tag)
            self._rewind = True
        except Exception as e:   # monitoring never takes training down: a halt instead
            log.exception("stability: the automatic rollback to %s failed", req.checkpoint_path)
            self.pending = None
            c = self.session.control
            c.rollback_done()
            c.halt(f"{req.reason}; the automatic rollback failed: {e!r}")
            self.session.requests(req.step)   # reports the halt (a stop action); hook.close() closes

    def apply_advice(self, save_dir: str | os.PathLike | None, default_dir: Callable[[], str]) -> dict | None:
        """:meth:`~.hook.StabilityHook.apply_rollback`: ``latest`` names the tag of the
        checkpoint the rollback advice names (``"<save_dir>/<tag>"``, how the hook reports saves),
        newer tags move aside. ``save_dir``: where the tags are (None: the advice's folder, else
        ``default_dir()``). Every rank; rank 0 moves."""
        s = self.session
        details = getattr(s.control.rollback, "details", None) or {}
        step = details.get("checkpoint_step")
        if step is None:
            s.guard.warn_once("no-rollback-target", "stability: no good checkpoint before the "
                              "instability is known; latest is left as it is")
            return None
        path = (details.get("checkpoint_path") or "").rstrip("/\\")
        tag = os.path.basename(path) or f"global_step{step}"
        target_dir = os.fspath(save_dir) if save_dir is not None else os.path.dirname(path) or default_dir()
        rank0 = int(getattr(self.engine, "global_rank", 0)) == 0
        return {"tag": tag, "moved": set_latest_on_rank0(target_dir, tag, rank0)}
