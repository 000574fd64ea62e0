"""Automatic rollback (``policy.auto_rollback``): carrying out a
:class:`~stability_callbacks.control.RollbackRequest` in each framework.

The policy decides (the checkpoint the rollback advice names, the data steps to skip, an LR
factor for a while); here the run goes back and skips, the same way on every rank:

1. **accept** at the step the request was made: the checkpoint must exist and the data must be
   skippable; otherwise the request turns into a halt with the reason. The run log gets an
   ``action`` line ``rollback`` (checkpoint, steps skipped, LR factor, attempt). Checkpoints of
   the abandoned branch are moved to ``<dir>/rolled_back/`` (never deleted) so that "the latest
   checkpoint" is the one rolled back to.
2. **reload** that checkpoint, each framework its own way: DeepSpeed in-process
   (``engine.load_checkpoint`` from the hook, and the loop's ``hook.batches(loader)`` rewinds);
   HF by re-entering ``trainer.train(resume_from_checkpoint=...)`` from the ``train`` wrapper
   ``attach`` installs (the Trainer cannot be rewound in the middle of its loop: its dataloader
   iterator and step counters are locals); Lightning by re-entering ``trainer.fit_loop.run()``
   after restoring the checkpoint with the trainer's own checkpoint connector (the same
   restore as ``fit(ckpt_path=...)``). Detector state comes back from that checkpoint.
3. **skip the data**: :class:`DataSkipSampler` replaces the loader's sampler (HF: the sampler the
   Trainer builds; Lightning and DeepSpeed: ``loader.batch_sampler.sampler``) and leaves out
   the samples of the skipped data steps (:class:`~stability_callbacks.control.DataSkips`); with
   ``start_step`` (Lightning, DeepSpeed) it also starts after the data of the steps already
   trained (HF's resume skips those batches itself). Indices only: nothing skipped is loaded.
   The same wrapper records each step's indices for the data forensics (docs/design.md,
   Forensics), with or without an automatic rollback.
4. **go on** with the segment ``rollback`` in the run log (``timeline`` keeps the abandoned
   branch apart) and the standing requests installed in the policy (saved with every later
   checkpoint, so a crash-resume keeps skipping).

The data order must be the same every time the sampler is iterated (sequential, or seeded per
epoch as ``DistributedSampler`` and HF's samplers are). Data steps are counted from the first
sample of the first epoch; map-style datasets only.
"""
from __future__ import annotations

import logging
import os
import re
import shutil
from itertools import chain, islice
from typing import Any, Callable, Iterator

import torch

from stability_callbacks.control import DataSkips, RollbackRequest
from stability_callbacks.forensics import StepIndices

__all__ = ["DataSkipSampler", "RollBack", "install_sampler", "set_aside_newer", "tag_step", "rank0s",
           "barrier", "is_rank0", "ROLLED_BACK_DIR"]

log = logging.getLogger("stability_callbacks")

#: Where checkpoints newer than a rollback target are moved.
ROLLED_BACK_DIR = "rolled_back"
_TAG_STEP = re.compile(r"(\d+)$")


# ------------------------------------------------------------------------------- the data
class DataSkipSampler(torch.utils.data.Sampler):
    """The base sampler's indices minus the samples of skipped data steps (and, with
    ``start_step``, minus those of the data steps already trained on); with ``record``, each
    optimizer step's indices also go into the run's ring (data forensics,
    :class:`~stability_callbacks.forensics.StepIndices`). The one wrapper around a train
    sampler: the automatic rollback and the forensics share it.

    ``samples_per_step``: samples one optimizer step takes from *this* sampler (per rank for a
    rank-local sampler such as ``DistributedSampler``: batch size x accumulation; for one
    sampler sharded by batches across ranks, as accelerate does for HF: x world size, and
    ``shared_by_ranks`` = the world size).
    ``skips``: returns the current :class:`DataSkips` (the policy's; read at every ``iter``).
    ``start_step``: returns the optimizer steps already done (read at every ``iter``), or None.
    ``record``: returns the ring (or None: nothing recorded), read at every ``iter``.
    ``steps_before``: returns the optimizer steps trained before this iteration's first sample
    (read at every ``iter``; default ``start_step``, else the steps of the earlier epochs: the
    loop re-reads each epoch from its start and skips what a resume already trained itself, as
    HF's does). The k-th sample an iteration yields belongs to optimizer step
    ``steps_before + 1 + k // samples_per_step``.
    ``len`` is the epoch's length without the skipped data, as if iterated from its start (a
    loop that resumes mid-epoch counts what it already consumed, as Lightning does). O(1) per
    index; recording draws one step's indices at a time (a list from an ``islice``); ``len`` in
    O(#ranges).

    >>> from stability_callbacks.control import DataSkips
    >>> s = DataSkipSampler(range(12), samples_per_step=2, skips=lambda: DataSkips([[2, 3]]))
    >>> list(s), len(s)
    ([0, 1, 6, 7, 8, 9, 10, 11], 8)
    >>> s.start_step = lambda: 2                   # steps 1-2 done: they read data steps 1 and 4
    >>> list(s), len(s)
    ([8, 9, 10, 11], 8)
    >>> from stability_callbacks.forensics import StepIndices
    >>> ring = StepIndices(8)
    >>> s.record = lambda: ring
    >>> list(s) and (ring.get(3), ring.get(4))     # what optimizer steps 3 and 4 read
    ([8, 9], [10, 11])
    """

    def __init__(self, base, *, samples_per_step: int, skips: Callable[[], DataSkips | None],
                 start_step: Callable[[], int] | None = None,
                 record: Callable[[], StepIndices | None] | None = None,
                 steps_before: Callable[[], int] | None = None, shared_by_ranks: int = 1):
        if not isinstance(samples_per_step, int) or samples_per_step < 1:
            raise ValueError(f"samples_per_step must be a positive integer, got {samples_per_step!r}")
        self.base, self.samples_per_step = base, samples_per_step
        self.skips, self.start_step = skips, start_step
        self.record, self.steps_before, self.shared_by_ranks = record, steps_before, shared_by_ranks
        self.epoch = 0

    def _plan(self) -> tuple[DataSkips, int]:
        skips = self.skips() or DataSkips()
        done = self.start_step() if self.start_step is not None else 0
        return skips, (skips.data_step(done + 1) if done else 1)

    def __iter__(self) -> Iterator[Any]:
        # An iterator, not a generator: the indices pass at C speed (chain), one resume per step.
        skips, first = self._plan()
        ring = self.record() if self.record is not None else None
        kept = self._kept(skips, first)
        if ring is None:
            return kept
        ring.problem, ring.shared_by_ranks, ring.samples_per_step = None, self.shared_by_ranks, self.samples_per_step
        return chain.from_iterable(self._steps(kept, ring, self._steps_before(skips) + 1))

    def _steps(self, kept: Iterator[Any], ring: StepIndices, step: int) -> Iterator[list]:
        """Each optimizer step's indices, put into the ring as the loader reaches the step."""
        sps = self.samples_per_step
        while chunk := list(islice(kept, sps)):
            ring.put(step, chunk)
            step += 1
            yield chunk

    def _kept(self, skips: DataSkips, first: int) -> Iterator[Any]:
        """The base's indices from data step ``first`` on, minus the skipped data steps."""
        if first == 1 and not skips.ranges:
            return iter(self.base)
        return self._filtered(skips, first)

    def _filtered(self, skips: DataSkips, first: int) -> Iterator[Any]:
        sps, offset = self.samples_per_step, self.epoch * len(self.base)
        last_d, keep = 0, True
        for i, idx in enumerate(self.base):
            d = (offset + i) // sps + 1
            if d != last_d:
                last_d, keep = d, d >= first and not skips.skipped(d)
            if keep:
                yield idx

    def _steps_before(self, skips: DataSkips) -> int:
        if self.steps_before is not None:
            return self.steps_before()
        if self.start_step is not None:
            return self.start_step()
        before = self.epoch * len(self.base) // self.samples_per_step   # data steps of earlier epochs
        return before - sum(max(0, min(b, before) - a + 1) for a, b in skips.ranges)

    def __len__(self) -> int:
        skips = self.skips() or DataSkips()
        n, sps = len(self.base), self.samples_per_step
        lo, hi = self.epoch * n, (self.epoch + 1) * n
        cut = sum(max(0, min(b * sps, hi) - max((a - 1) * sps, lo)) for a, b in skips.ranges)
        return n - cut

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)
        if hasattr(self.base, "set_epoch"):
            self.base.set_epoch(epoch)


def install_sampler(loader, *, samples_per_step: int, skips, start_step=None, record=None,
                    steps_before=None) -> DataSkipSampler:
    """Put a :class:`DataSkipSampler` into a torch ``DataLoader``'s batch sampler (idempotent).
    Raises ``ValueError`` naming what is missing for a loader it cannot reach."""
    batch_sampler = getattr(loader, "batch_sampler", None)
    base = getattr(batch_sampler, "sampler", None)
    if base is None or not hasattr(base, "__len__"):
        raise ValueError(f"{type(loader).__name__} has no batch_sampler.sampler with a length "
                         f"(a DataLoader over a map-style dataset is needed to skip data)")
    if isinstance(base, DataSkipSampler):
        base.samples_per_step, base.skips, base.start_step = samples_per_step, skips, start_step
        base.record, base.steps_before = record, steps_before
        return base
    batch_sampler.sampler = DataSkipSampler(base, samples_per_step=samples_per_step, skips=skips,
                                            start_step=start_step, record=record, steps_before=steps_before)
    return batch_sampler.sampler


# -------------------------------------------------------------------------- the checkpoints
def set_aside_newer(save_dir: str | os.PathLike, step: int) -> list[str]:
    """Move every checkpoint of ``save_dir`` whose name ends in a step number above ``step``
    (folders: ``global_step30``, ``checkpoint-30``, ``iter_0000030``; Lightning files:
    ``stability-step=30.ckpt``, ``epoch=0-step=30.ckpt``) into ``<save_dir>/rolled_back/`` (kept,
    never deleted; a name already there gets a ``.1``, ``.2`` suffix). Returns the moved names,
    oldest first. Filesystem only: call it on one rank."""
    save_dir = os.fspath(save_dir)

    def checkpoint_step(name: str) -> int | None:
        path = os.path.join(save_dir, name)
        if os.path.isdir(path):
            return tag_step(name)
        return tag_step(name[:-len(".ckpt")]) if name.endswith(".ckpt") else None

    newer = sorted((s, name) for name in os.listdir(save_dir)
                   if name != ROLLED_BACK_DIR and (s := checkpoint_step(name)) is not None and s > step)
    aside = os.path.join(save_dir, ROLLED_BACK_DIR)
    moved = []
    for _, name in newer:
        os.makedirs(aside, exist_ok=True)
        dest, k = os.path.join(aside, name), 0
        while os.path.exists(dest):
            k += 1
            dest = os.path.join(aside, f"{name}.{k}")
        shutil.move(os.path.join(save_dir, name), dest)
        moved.append(name)
    return moved


def tag_step(tag: str) -> int | None:
    m = _TAG_STEP.search(tag)
    return int(m.group(1)) if m else None


def rank0s(value):
    """Rank 0's ``value`` on every rank (one object broadcast; only on a rollback step)."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return value
    box = [value]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]


def barrier() -> None:
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.barrier()


def is_rank0() -> bool:
    return not (torch.distributed.is_available() and torch.distributed.is_initialized()) or \
        torch.distributed.get_rank() == 0


# ------------------------------------------------------------------------ carrying it out
class RollBack:
    """What every framework shares: accept or refuse the request, install the standing
    requests once the checkpoint is loaded. ``pending`` is the accepted request until then.
    ``sampler_problem``: why the data cannot be skipped (every request is a halt), or None."""

    def __init__(self, session_of: Callable[[], Any], sampler_problem: str | None = "the training data was not seen yet"):
        self._session_of = session_of
        self.pending: RollbackRequest | None = None
        self.sampler: DataSkipSampler | None = None
        self.sampler_problem = sampler_problem

    @property
    def session(self):
        return self._session_of()

    def skips(self) -> DataSkips | None:
        s = self.session
        return None if s is None else s.run.data_skips

    def lr_factor(self, next_step: Callable[[], int]) -> Callable[[], float] | None:
        """The LR factor of the step about to run, for :class:`~.skip_step.GatedStep` (None when
        automatic rollbacks never scale the LR)."""
        ar = self.session.run.auto_rollback
        if ar is None or ar.lr_factor == 1.0 or ar.lr_factor_steps == 0:
            return None
        return lambda: self.skips().lr_factor_at(next_step())

    def accept(self, step: int, problem: str | None = None) -> RollbackRequest | None:
        """The request of this step, if it can be carried out (else a halt, with ``problem``
        or the checkpoint's absence as the reason). Reports the ``rollback`` action."""
        s = self.session
        c = s.control
        req = c.rollback_request
        if req is None:
            return None
        path = req.checkpoint_path
        problem = problem or self.sampler_problem
        if problem is None and (not path or not os.path.exists(path)):
            problem = f"the checkpoint {path or f'of step {req.checkpoint_step}'} is not on disk"
        problem = rank0s(problem)   # every rank goes back, or none (what rank 0 sees on disk)
        if problem is not None:
            c.rollback_done()
            c.halt(f"{req.reason}; cannot roll back automatically: {problem}")
            return None
        self.pending = req
        try:
            if is_rank0():   # "the latest checkpoint" is the one rolled back to from now on
                set_aside_newer(os.path.dirname(path), req.checkpoint_step)
        except OSError as e:   # a nicety: the rollback goes on without it
            log.warning("stability: could not move the abandoned branch's checkpoints aside: %s", e)
        finally:
            barrier()   # reached on every rank
        s.run.act(req.action(f"{req.reason}: back to the checkpoint of step {req.checkpoint_step}, "
                             f"skipping the data of steps {req.skip_steps[0]}-{req.skip_steps[1]}"))
        return req

    def failed(self, error: Exception) -> None:
        """Loading the checkpoint failed: a halt with the reason (the training stopped already);
        the session the rollback kept open closes."""
        log.error("stability: the automatic rollback to %s failed: %r", self.pending.checkpoint_path, error)
        req, self.pending = self.pending, None
        s = self.session
        s.control.rollback_done()
        s.control.halt(f"{req.reason}; the automatic rollback failed: {error!r}")
        s.requests(req.step)   # reports the halt (a stop action)
        s.close()

    def restored(self) -> None:
        """The checkpoint is loaded and the session restored from it (its segment opened):
        the standing requests of this rollback replace the checkpoint's older ones."""
        req, self.pending = self.pending, None
        s = self.session
        s.run.request_data_skips(req.skips)
        s.control.rollback_done()


