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
3. **skip the data**: :class:`SkipSampler` replaces the loader's sampler (HF: the sampler the
   Trainer builds; Lightning and DeepSpeed: ``loader.batch_sampler.sampler``) and leaves out
   the samples of the skipped data steps (:class:`~stability_callbacks.control.DataSkips`); with
   ``start_step`` (Lightning, DeepSpeed) it also starts after the data of the steps already
   trained (HF's resume skips those batches itself). Indices only: nothing skipped is loaded.
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
from typing import Any, Callable, Iterator

import torch

from stability_callbacks.control import DataSkips, RollbackRequest
from stability_callbacks.live import InstancePatches

__all__ = ["SkipSampler", "RollBack", "HFRollBack", "LightningRollBack", "DeepSpeedRollBack",
           "install_sampler", "roll_back_latest", "set_aside_newer", "set_latest_on_rank0", "ROLLED_BACK_DIR"]

log = logging.getLogger("stability_callbacks")

#: Where checkpoints newer than a rollback target are moved.
ROLLED_BACK_DIR = "rolled_back"
_TAG_STEP = re.compile(r"(\d+)$")


# ------------------------------------------------------------------------------- the data
class SkipSampler(torch.utils.data.Sampler):
    """The base sampler's indices minus the samples of skipped data steps (and, with
    ``start_step``, minus those of the data steps already trained on).

    ``samples_per_step``: samples one optimizer step takes from *this* sampler (per rank for a
    rank-local sampler such as ``DistributedSampler``: batch size x accumulation; for one
    sampler sharded by batches across ranks, as accelerate does for HF: x world size).
    ``skips``: returns the current :class:`DataSkips` (the policy's; read at every ``iter``).
    ``start_step``: returns the optimizer steps already done (read at every ``iter``), or None.
    ``len`` is the epoch's length without the skipped data, as if iterated from its start (a
    loop that resumes mid-epoch counts what it already consumed, as Lightning does). O(1) per
    index; ``len`` in O(#ranges).

    >>> from stability_callbacks.control import DataSkips
    >>> s = SkipSampler(range(12), samples_per_step=2, skips=lambda: DataSkips([[2, 3]]))
    >>> list(s), len(s)
    ([0, 1, 6, 7, 8, 9, 10, 11], 8)
    >>> s.start_step = lambda: 2                   # steps 1-2 done: they read data steps 1 and 4
    >>> list(s), len(s)
    ([8, 9, 10, 11], 8)
    """

    def __init__(self, base, *, samples_per_step: int, skips: Callable[[], DataSkips | None],
                 start_step: Callable[[], int] | None = None):
        if not isinstance(samples_per_step, int) or samples_per_step < 1:
            raise ValueError(f"samples_per_step must be a positive integer, got {samples_per_step!r}")
        self.base, self.samples_per_step = base, samples_per_step
        self.skips, self.start_step = skips, start_step
        self.epoch = 0

    def _plan(self) -> tuple[DataSkips, int]:
        skips = self.skips() or DataSkips()
        done = self.start_step() if self.start_step is not None else 0
        return skips, (skips.data_step(done + 1) if done else 1)

    def __iter__(self) -> Iterator[Any]:
        skips, first = self._plan()
        sps, offset = self.samples_per_step, self.epoch * len(self.base)
        if first == 1 and not skips.ranges:
            yield from self.base
            return
        last_d, keep = 0, True
        for i, idx in enumerate(self.base):
            d = (offset + i) // sps + 1
            if d != last_d:
                last_d, keep = d, d >= first and not skips.skipped(d)
            if keep:
                yield idx

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


def install_sampler(loader, *, samples_per_step: int, skips, start_step=None) -> SkipSampler:
    """Put a :class:`SkipSampler` into a torch ``DataLoader``'s batch sampler (idempotent).
    Raises ``ValueError`` naming what is missing for a loader it cannot reach."""
    batch_sampler = getattr(loader, "batch_sampler", None)
    base = getattr(batch_sampler, "sampler", None)
    if base is None or not hasattr(base, "__len__"):
        raise ValueError(f"{type(loader).__name__} has no batch_sampler.sampler with a length "
                         f"(a DataLoader over a map-style dataset is needed to skip data)")
    if isinstance(base, SkipSampler):
        base.samples_per_step, base.skips, base.start_step = samples_per_step, skips, start_step
        return base
    batch_sampler.sampler = SkipSampler(base, samples_per_step=samples_per_step, skips=skips,
                                        start_step=start_step)
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
            return _tag_step(name)
        return _tag_step(name[:-len(".ckpt")]) if name.endswith(".ckpt") else None

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
    target = _tag_step(tag)
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


def _tag_step(tag: str) -> int | None:
    m = _TAG_STEP.search(tag)
    return int(m.group(1)) if m else None


def _rank0s(value):
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
        self.sampler: SkipSampler | None = None
        self.sampler_problem = sampler_problem

    @property
    def session(self):
        return self._session_of()

    def skips(self) -> DataSkips | None:
        s = self.session
        return None if s is None else s.run.monitor.policy.data_skips

    def lr_factor(self, next_step: Callable[[], int]) -> Callable[[], float] | None:
        """The LR factor of the step about to run, for :class:`~._skip.GatedStep` (None when
        automatic rollbacks never scale the LR)."""
        ar = self.session.run.monitor.policy.auto_rollback
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
        problem = _rank0s(problem)   # every rank goes back, or none (what rank 0 sees on disk)
        if problem is not None:
            c.rollback_done()
            c.stop = True
            c.stop_reason = f"{req.reason}; cannot roll back automatically: {problem}"
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
        s.control.stop, s.control.stop_reason = True, f"{req.reason}; the automatic rollback failed: {error!r}"
        s.requests(req.step)   # reports the halt (a stop action)
        s.close()

    def restored(self) -> None:
        """The checkpoint is loaded and the session restored from it (its segment opened):
        the standing requests of this rollback replace the checkpoint's older ones."""
        req, self.pending = self.pending, None
        s = self.session
        s.run.monitor.policy.data_skips = req.skips
        s.control.rollback_done()


class HFRollBack(RollBack):
    """HF Trainer: the sampler the Trainer builds is wrapped; a rollback stops the Trainer and
    re-enters ``train(resume_from_checkpoint=<checkpoint>)``, which restores model, optimizer,
    scheduler, RNG and ``global_step`` and skips the batches of the first ``S`` steps of the
    (skip-aware) data order. ``late``: met at train begin, the train loader built already."""

    def __init__(self, session_of, trainer, patches: InstancePatches, *, late: bool = False):
        super().__init__(session_of, "the callback met its Trainer after the train loader was built "
                         "(add it with Trainer(callbacks=[...]))" if late else "the training data was not seen yet")
        self.trainer = trainer
        orig = trainer._get_train_sampler   # transformers 5.23 trainer.py:1071 (private)

        def _get_train_sampler(*args, **kwargs):
            base = orig(*args, **kwargs)
            if base is None or not hasattr(base, "__len__"):
                self.sampler, self.sampler_problem = None, "the train dataset has no length (an IterableDataset)"
                return base
            a = trainer.args
            if type(base) is torch.utils.data.RandomSampler and _seedable(a):
                # accelerate swaps a plain RandomSampler for its seeded one (the same order on every
                # rank and at every iteration, which a resume and a rollback need); behind this
                # wrapper it would not see it, so the swap happens here.
                from accelerate.data_loader import SeedableRandomSampler

                base = SeedableRandomSampler(data_source=base.data_source, replacement=base.replacement,
                                             num_samples=base._num_samples,
                                             data_seed=a.data_seed if a.data_seed is not None else a.seed)
            self.sampler = SkipSampler(base, skips=self.skips, samples_per_step=(
                a.per_device_train_batch_size * a.gradient_accumulation_steps * a.world_size))
            self.sampler_problem = (
                "ignore_data_skip=True: the Trainer would re-read the data it already trained on"
                if a.ignore_data_skip else
                "save_only_model=True: the checkpoints hold no optimizer or scheduler state to go back to"
                if getattr(a, "save_only_model", False) else None)
            return self.sampler

        patches.set("_get_train_sampler", _get_train_sampler)

    def reentering(self, train: Callable[..., Any]) -> Callable[..., Any]:
        """``train`` (the Trainer's own), re-entered after it returns while a rollback is pending:
        ``resume_from_checkpoint`` is then the checkpoint gone back to (the loop reads it at train
        begin, and the callback restores its state from it)."""
        def call(*args, **kwargs):
            out = train(*args, **kwargs)
            while (path := self.reenter()) is not None:
                self.session.alive()   # reloading is progress, not a hang
                kwargs = {**dict(zip(("resume_from_checkpoint", "trial", "ignore_keys_for_eval"), args)),
                          **kwargs, "resume_from_checkpoint": path}
                args = ()
                out = train(**kwargs)
            return out
        return call

    def reenter(self) -> str | None:
        """After ``train()`` returned: the checkpoint to resume from, when a rollback is pending
        (the abandoned branch's checkpoints moved aside first)."""
        if self.pending is None:
            return None
        t = self.trainer
        from accelerate.optimizer import AcceleratedOptimizer

        if isinstance(t.optimizer, AcceleratedOptimizer):   # train() wraps it again
            t.optimizer = t.optimizer.optimizer
        return self.pending.checkpoint_path


def _seedable(args) -> bool:
    cfg = getattr(args, "accelerator_config", None)
    return bool(getattr(cfg, "use_seedable_sampler", True)) if cfg is not None else True


class LightningRollBack(RollBack):
    """Lightning: the train loader's sampler is wrapped (starting after the data already
    trained: Lightning restores the loop, not a map-style loader's position); a rollback stops
    the fit loop, restores the checkpoint with the trainer's checkpoint connector (model,
    optimizers, schedulers, loops, callbacks: what ``fit(ckpt_path=...)`` restores) and runs the
    fit loop again. Wraps ``trainer.fit_loop.run`` on that instance (until :meth:`close`)."""

    def __init__(self, session_of, trainer):
        super().__init__(session_of)
        self.trainer = trainer
        self._patches = InstancePatches(trainer.fit_loop)
        orig = trainer.fit_loop.run

        def run(*args, **kwargs):
            out = orig(*args, **kwargs)
            while self.pending is not None:
                try:
                    # lightning 2.6 trainer/connectors/checkpoint_connector.py restore() (private):
                    # the same restore _run() does for fit(ckpt_path=...).
                    trainer._checkpoint_connector.restore(self.pending.checkpoint_path)
                except Exception as e:   # e.g. a weights-only checkpoint: a halt, not a crash
                    self.failed(e)
                    break
                trainer.should_stop = False
                # A new iterator over the train loader (fit_loop.setup_data made the first and
                # skips when the loader exists): the sampler starts at the restored step.
                if trainer.fit_loop._data_fetcher is not None:
                    iter(trainer.fit_loop._data_fetcher)
                out = orig(*args, **kwargs)
            return out

        self._patches.set("run", run)

    def close(self) -> None:
        """Restore ``trainer.fit_loop.run``."""
        self._patches.restore()

    def install(self) -> None:
        """At train start: the skip-aware sampler into the train loader."""
        t = self.trainer
        loader = t.train_dataloader
        try:
            if not isinstance(loader, torch.utils.data.DataLoader):
                raise ValueError(f"the train loaders are a {type(loader).__name__}, not one DataLoader")
            self.sampler = install_sampler(loader, skips=self.skips, start_step=lambda: t.global_step,
                                           samples_per_step=loader.batch_size * t.accumulate_grad_batches)
            self.sampler_problem = None
        except ValueError as e:
            self.sampler, self.sampler_problem = None, str(e)


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

    def batches(self, loader) -> Iterator[Any]:
        e = self.engine
        self.sampler = install_sampler(loader, skips=self.skips, start_step=lambda: int(e.global_steps),
                                       samples_per_step=loader.batch_size * e.gradient_accumulation_steps())
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
            c.stop, c.stop_reason = True, f"{req.reason}; the automatic rollback failed: {e!r}"
            self.session.requests(req.step)   # reports the halt (a stop action); hook.close() closes

    def apply_advice(self, save_dir: str | os.PathLike | None, default_dir: Callable[[], str]) -> dict | None:
        """:meth:`~.deepspeed.StabilityHook.apply_rollback`: ``latest`` names the tag of the
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
