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

import pytest

torch = pytest.importorskip("torch")

from host_reads import ValueReads  # noqa: E402
from stability_callbacks.integrations.torch import native as _native  # noqa: E402
from stability_callbacks.integrations.torch import reductions as _reductions  # noqa: E402
from stability_callbacks.integrations.torch.session import LiveSession  # noqa: E402
from stability_callbacks.live import LiveRun  # noqa: E402

def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Embedding(50, 16), torch.nn.Flatten(), torch.nn.Linear(64, 50))


@pytest.mark.parametrize("kernels", ["accelerator", "cpu compiled", "cpu torch"])
def test_ordinary_steps_read_only_the_packed_record_and_adams_step(monkeypatch, tmp_path, kernels):
    """``accelerator``: the reductions take the path they take on a GPU (the device moment pass:
    its table, the kernel's contract in torch ops; the parameter norm's multi-tensor kernels):
    nothing but the two host reads. ``cpu compiled``: the CPU
    kernel's result is checked for NaN on the host, once a step (no device to wait for there).
    ``cpu torch``: the CPU pass in torch kernels reads row-sum bounds on the host to skip rows,
    and only that."""
    if kernels == "accelerator":
        monkeypatch.setattr(_reductions, "FOREACH_FAST_DEVICES", (*_reductions.FOREACH_FAST_DEVICES, "cpu"))
    elif kernels == "cpu torch":
        monkeypatch.setitem(_native._STATE, "kernels", None)
    else:
        assert _native.moment_kernels() is not None, _native.status()
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
    if kernels == "cpu compiled":
        host_reads[("reductions.py", "_moments_native", "scalar")] = 20   # its NaN check
    elif kernels == "cpu torch":
        # the CPU pass's host decisions (which rows can hold the max), on this thread and the
        # pass's own (those a dispatch mode, per thread, does not see): at least one per step
        cpu_only = {k: v for k, v in reads.counts.items()
                    if k[0] == "reductions.py" and k[1] in ("_moments_cpu", "reduce_piece", "reduce_rest")}
        assert cpu_only[("reductions.py", "_moments_cpu", "scalar")] >= 20
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
    assert dict(reads.per_step(ordinary)) == {("packed.py", "_decode", "tolist"): len(ordinary),
                                              ("probe.py", "_sample_adam_hyperparams", "scalar"): len(ordinary)}
