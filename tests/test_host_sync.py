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

from stability_callbacks.integrations import _reductions  # noqa: E402
from stability_callbacks.integrations._session import LiveSession  # noqa: E402
from stability_callbacks.live import LiveRun  # noqa: E402

PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(sys.modules[LiveSession.__module__].__file__)))


def _call_site() -> tuple[str, str] | None:
    """(file, function) of the innermost frame inside the package, or None (not ours)."""
    frame = sys._getframe(2)
    while frame is not None:
        path = frame.f_code.co_filename
        if path.startswith(PACKAGE + os.sep):
            return os.path.basename(path), frame.f_code.co_name
        frame = frame.f_back
    return None


class ValueReads(TorchDispatchMode):
    """Counts, per call site in the package, every scalar read (``_local_scalar_dense``: what
    ``.item()``, ``float()``, ``int()`` and ``bool()`` of a tensor dispatch to) and every
    ``.tolist()`` / ``.numpy()`` / ``.cpu()`` (which read memory without dispatching a scalar op)."""

    def __init__(self, monkeypatch):
        super().__init__()
        self.counts: collections.Counter = collections.Counter()
        for name in ("tolist", "numpy", "cpu"):
            orig = getattr(torch.Tensor, name)

            def wrapper(t, *args, _orig=orig, _name=name, **kwargs):
                site = _call_site()
                if site is not None:
                    self.counts[(*site, _name)] += 1
                return _orig(t, *args, **kwargs)

            monkeypatch.setattr(torch.Tensor, name, wrapper)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._local_scalar_dense.default:
            site = _call_site()
            if site is not None:
                self.counts[(*site, "scalar")] += 1
        return func(*args, **(kwargs or {}))


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
    with ValueReads(monkeypatch) as reads:
        for n in range(4, 24):
            step(n)
    host_reads = {
        ("_probe.py", "_decode", "tolist"): 20,                       # the packed record
        ("_probe.py", "_sample_adam_hyperparams", "scalar"): 20,      # Adam's step: a CPU tensor
    }
    if kernels == "cpu":
        cpu_only = {k: v for k, v in reads.counts.items() if k[:2] in (
            ("_reductions.py", "_max_and_sum_cpu"), ("_reductions.py", "<genexpr>"))}
        assert cpu_only and all(v == 20 for v in cpu_only.values())
        host_reads.update(cpu_only)
    assert dict(reads.counts) == host_reads
    assert s.run.monitor.last_step == 23   # every step reached the Monitor
    s.close()
