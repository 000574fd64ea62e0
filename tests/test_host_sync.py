"""No host sync on ordinary steps, proved on CPU: every read of a tensor's value that the
package makes while a real model trains is counted with its call site.

On a GPU a value read (``.item()``, ``float(t)``, ``bool(t)``, ``.tolist()``, ``.numpy()``,
``.cpu()``) waits for the device. The live loop may read exactly two things per step, both host
memory on a GPU: the probe's packed record (copied to pinned memory without blocking, read a step
later: ``StepProbe._decode``) and Adam's ``step`` count (torch keeps it on the CPU unless
``capturable`` / ``fused``). Anything else is a sync that would cost every step; the deliberate
ones (checkpoints, the end) carry a ``# host-sync:`` comment and happen outside ordinary steps.
"""
from __future__ import annotations

import collections
import os
import sys

import pytest

torch = pytest.importorskip("torch")

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

import stability_callbacks  # noqa: E402

from stability_callbacks.integrations.torch import reductions as _reductions  # noqa: E402
from stability_callbacks.integrations.torch.session import LiveSession  # noqa: E402
from stability_callbacks.live import LiveRun  # noqa: E402

PACKAGE = os.path.dirname(os.path.abspath(stability_callbacks.__file__))
TORCH = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep


def _call_site() -> tuple[str, str] | None:
    """(file, function) of the code that asked for the value when it is the package's, else
    None: the first frame outside torch (a framework's own reads, even inside a method the
    package wraps, are the framework's)."""
    frame = sys._getframe(2)
    while frame is not None and frame.f_code.co_filename.startswith(TORCH):
        frame = frame.f_back
    if frame is None or not frame.f_code.co_filename.startswith(PACKAGE + os.sep):
        return None
    return os.path.basename(frame.f_code.co_filename), frame.f_code.co_name


class ValueReads(TorchDispatchMode):
    """Counts, per call site in the package, every scalar read (``_local_scalar_dense``: what
    ``.item()``, ``float()``, ``int()`` and ``bool()`` of a tensor dispatch to) and every
    ``.tolist()`` / ``.numpy()`` / ``.cpu()`` (which read memory without dispatching a scalar op)."""

    def __init__(self, step_of=lambda: None):
        super().__init__()
        self.counts: collections.Counter = collections.Counter()
        self.steps: collections.Counter = collections.Counter()   # (step, *site) -> reads
        self.step_of = step_of
        self._originals = {name: getattr(torch.Tensor, name) for name in ("tolist", "numpy", "cpu")}
        self._own = {name for name in self._originals if name in vars(torch.Tensor)}

    def __enter__(self):
        for name, orig in self._originals.items():
            def wrapper(t, *args, _orig=orig, _name=name, **kwargs):
                self._count(_call_site(), _name)
                return _orig(t, *args, **kwargs)

            setattr(torch.Tensor, name, wrapper)
        return super().__enter__()

    def __exit__(self, *exc):
        for name, orig in self._originals.items():
            if name in self._own:
                setattr(torch.Tensor, name, orig)
            else:
                delattr(torch.Tensor, name)   # inherited from TensorBase again
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            self._count(_call_site(), "scalar")
        return func(*args, **(kwargs or {}))

    def _count(self, site, what: str) -> None:
        if site is not None:
            self.counts[(*site, what)] += 1
            self.steps[(self.step_of(), *site, what)] += 1


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(50, 16), torch.nn.Flatten(), torch.nn.Linear(64, 50))


@pytest.mark.parametrize("kernels", ["accelerator", "cpu"])
def test_ordinary_steps_read_only_the_packed_record_and_adams_step(monkeypatch, tmp_path, kernels):
    """``accelerator``: the reductions take the path they take on a GPU (fused multi-tensor
    kernels; they run on CPU too): nothing but the two host reads. ``cpu``: the CPU path reads
    block maxima on the host to skip blocks (no device to wait for there), and only that."""
    if kernels == "accelerator":
        monkeypatch.setattr(_reductions, "FOREACH_FAST_DEVICES", (*_reductions.FOREACH_FAST_DEVICES, "cpu"))
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
    s = LiveSession(LiveRun(config={"actions": {}, "phase": {"warmup_steps": 5}}, run_dir=tmp_path))
    s.start(0, "start", model=model, optimizer=opt)

    def step(n: int) -> None:
        for _ in range(2):   # two micro-batches per optimizer step, as an adapter feeds them
            ids = torch.randint(0, 50, (8, 4))
            loss = torch.nn.functional.cross_entropy(model(ids), ids[:, 0]) / 2
            loss.backward()
            s.add_micro_batch(loss=loss.detach(), input_ids=ids)
        s.read_lr(opt)
        norm = s.before_optimizer_step(params=list(model.parameters()))
        torch.nn.utils.clip_grads_with_norm_(model.parameters(), 1.0, norm)
        opt.step()
        opt.zero_grad()
        s.end_step(n, optimizer=opt)
        s.requests(n)
        s.control.step_done()

    for n in range(1, 4):   # warm-up of the loop: lazily built state, the first records
        step(n)
    with ValueReads() as reads:
        for n in range(4, 24):
            step(n)
    host_reads = {
        ("packed.py", "_decode", "tolist"): 20,                       # the packed record
        ("probe.py", "_sample_adam_hyperparams", "scalar"): 20,      # Adam's step: a CPU tensor
    }
    if kernels == "cpu":
        cpu_only = {k: v for k, v in reads.counts.items() if k[:2] in (
            ("reductions.py", "_max_and_sum_cpu"), ("reductions.py", "<genexpr>"))}
        assert cpu_only and all(v == 20 for v in cpu_only.values())
        host_reads.update(cpu_only)
    assert dict(reads.counts) == host_reads
    assert s.run.monitor.last_step == 23   # every step reached the Monitor
    s.close()


def test_hf_trainer_steps_read_only_the_packed_record_and_adams_step(monkeypatch, tmp_path):
    """The same under a real ``Trainer`` with the callback added the plain way (GA 2, clipping,
    logging every 5 steps): the adapter's wrappers and hooks add no read of their own."""
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from stability_callbacks.demo.scenarios import build_scenario
    from stability_callbacks.integrations.hf import StabilityCallback

    monkeypatch.setattr(_reductions, "FOREACH_FAST_DEVICES", (*_reductions.FOREACH_FAST_DEVICES, "cpu"))
    sc = build_scenario("healthy", max_steps=12, batch_size=4, grad_accum=2)
    step = [0]

    class Step(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            step[0] = state.global_step + 1

    args = TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=sc.max_steps,
                             per_device_train_batch_size=sc.batch_size, gradient_accumulation_steps=2,
                             learning_rate=sc.lr, warmup_steps=sc.warmup_steps, logging_steps=5,
                             max_grad_norm=1.0, save_strategy="no", report_to="none", use_cpu=True,
                             disable_tqdm=True, optim="adamw_torch")
    trainer = Trainer(model=sc.make_model(), args=args, train_dataset=sc.train_dataset(),
                      callbacks=[Step(), StabilityCallback(run_dir=tmp_path / "run")])
    with ValueReads(step_of=lambda: step[0]) as reads:
        trainer.train()
    _assert_only_the_two_host_reads(reads, range(3, sc.max_steps))


def test_lightning_steps_read_only_the_packed_record_and_adams_step(monkeypatch, tmp_path):
    """And under a real ``Trainer.fit`` (GA 2, the callback's own norm reused for clipping,
    ``pl_module.log`` of the signals): nothing but the two host reads either."""
    pl = pytest.importorskip("lightning.pytorch")
    from test_lightning import fit

    from stability_callbacks.demo.scenarios import build_scenario

    monkeypatch.setattr(_reductions, "FOREACH_FAST_DEVICES", (*_reductions.FOREACH_FAST_DEVICES, "cpu"))
    sc = build_scenario("healthy", max_steps=12, batch_size=4, grad_accum=2)
    step = [0]

    class Step(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            step[0] = trainer.global_step + 1

    with ValueReads(step_of=lambda: step[0]) as reads:
        fit(sc, tmp_path, callbacks=[Step()])
    _assert_only_the_two_host_reads(reads, range(3, sc.max_steps))


def _assert_only_the_two_host_reads(reads: ValueReads, ordinary: range) -> None:
    """Over the ``ordinary`` steps (after the first ones, before the end's flush): one read of
    the packed record and one of Adam's CPU step count per step, nothing else."""
    per_step: collections.Counter = collections.Counter()
    for (n, *site), count in reads.steps.items():
        if n in ordinary:
            per_step[tuple(site)] += count
    assert dict(per_step) == {("packed.py", "_decode", "tolist"): len(ordinary),
                              ("probe.py", "_sample_adam_hyperparams", "scalar"): len(ordinary)}
