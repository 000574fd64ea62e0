"""Planted-fault DeepSpeed runs for tests/test_deepspeed.py: real engines on CPU, 2 ranks, gloo.

    DS_ACCELERATOR=cpu torchrun --nproc_per_node 2 tests/dist/ds_scenarios.py OUT_DIR [CASE ...]
    DS_ACCELERATOR=cpu deepspeed --num_accelerators 2 tests/dist/ds_scenarios.py OUT_DIR [CASE ...]

Every case runs a hand-written loop (forward, engine.backward, engine.step) on a fresh engine
with ``attach(engine, ...)`` and writes what the hook saw and did to
``OUT_DIR/<case>.rank<r>.json``; the test compares the ranks and asserts exact steps. All cases
share one launch: DeepSpeed's first ``initialize`` costs ~10-20 s of imports on this machine,
later engines well under a second each.
"""
from __future__ import annotations

import json
import logging
import os
import sys
import time
import traceback

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import deepspeed  # noqa: E402
from cpu_deepspeed import GradBlowUp, allow_fp16  # noqa: E402  (before DeepSpeed initialises)

allow_fp16()

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))   # tests/
from alert_inbox import AlertInbox  # noqa: E402
from streams import two_stream_losses  # noqa: E402
from teardown import leave  # noqa: E402
from stability_callbacks.demo.scenarios import build_scenario  # noqa: E402
from stability_callbacks.integrations.deepspeed import (CLIENT_STATE_KEY, attach,  # noqa: E402
                                                        roll_back_latest)


def make_engine(sc, *, stage: int, precision: str):
    model = sc.make_model()
    engine, _, _, _ = deepspeed.initialize(model=model, config=sc.deepspeed_config(stage=stage, precision=precision),
                                           model_parameters=model.parameters())
    return engine


def micro_batches(ids: torch.Tensor, sc, data_step: int):
    """This rank's micro-batches of optimizer step ``data_step`` (1-based), in the order a
    ``DistributedSampler(shuffle=False)`` deals them: rank r takes rows r, r+W, ... of the step."""
    world, rank = dist.get_world_size(), dist.get_rank()
    g = sc.samples_per_step(world)
    mine = ids[(data_step - 1) * g: data_step * g][rank::world]
    return [mine[m * sc.batch_size:(m + 1) * sc.batch_size] for m in range(sc.grad_accum)]


def train(engine, hook, sc, *, last_step: int, ids=None, data_offset: int = 0, blow_up_from=None,
          user_save_every=None, save_dir=None, stop_on_halt=True):
    """The user's loop. Returns what happened: the step the loop left at and a DeepSpeed error."""
    ids = sc.train_dataset(dist.get_world_size()).input_ids if ids is None else ids
    out = {"error": None, "left_at": None, "user_saves": {}}
    while engine.global_steps < last_step:
        step = engine.global_steps + 1
        try:
            for mb in micro_batches(ids, sc, step + data_offset):
                loss = engine(input_ids=mb, labels=mb).loss
                if blow_up_from is not None and step >= blow_up_from:
                    loss = GradBlowUp.apply(loss)
                engine.backward(loss)
                engine.step()
        except Exception as e:   # DeepSpeed's own exit (minimum loss scale)
            out["error"] = {"step": step, "message": str(e)}
            break
        if user_save_every and step % user_save_every == 0:
            out["user_saves"][step] = engine.save_checkpoint(save_dir, tag=f"global_step{step}")
        if hook.should_stop and stop_on_halt:
            break
    out["left_at"] = int(engine.global_steps)
    return out


def train_over_loader(engine, hook, sc) -> None:
    """The user's loop over ``hook.batches(loader)``: a DataLoader with a ``DistributedSampler``
    (rank r reads samples r, r+W, ... of the data), to ``sc.max_steps`` or a halt."""
    ds = sc.train_dataset(dist.get_world_size())
    loader = torch.utils.data.DataLoader(ds, batch_size=sc.batch_size, sampler=torch.utils.data.DistributedSampler(
        ds, num_replicas=dist.get_world_size(), rank=dist.get_rank(), shuffle=False))
    for batch in hook.batches(loader):
        engine.backward(engine(input_ids=batch["input_ids"], labels=batch["labels"]).loss)
        engine.step()
        if hook.should_stop or engine.global_steps >= sc.max_steps:
            break


def summary(hook, extra: dict) -> dict:
    res = {
        "findings": [[f.step, f.kind, f.severity] for f in hook.findings],
        "stopped_at": hook.stopped_at,
        "saved_steps": hook.saved_steps,
        "control": {"stop": hook.control.stop, "state_is_good": hook.control.state_is_good},
        "rollback": (hook.control.rollback.details if hook.control.rollback is not None else None),
    }
    o = hook.outcome   # what every rank knows alike of how the run ended
    if o is not None:
        res["outcome"] = {"halted": o.halted, "halted_at": o.halted_at, "reason": o.reason,
                          "exit_code": o.exit_code, "advice": o.advice}
    res.update(extra)
    return res


def runlog_actions(run_dir):
    """``[step, action, reason]`` of every action line (rank 0 writes the run log)."""
    return [[r["step"], r["action"], r["reason"]] for r in runlog_lines(run_dir) if r["type"] == "action"]


def runlog_lines(run_dir):
    path = os.path.join(run_dir, "runlog.jsonl")
    if not os.path.exists(path):
        return []
    with open(path) as fh:
        return [json.loads(line) for line in fh]


def shared_dir(out_dir, name):
    d = os.path.join(out_dir, name)
    if dist.get_rank() == 0:
        os.makedirs(d, exist_ok=True)
    dist.barrier()
    return d


# ---------------------------------------------------------------------------------------- cases
def case_overflow(out_dir, stage):
    """fp16: every step overflows from step 25 on. The hook must warn (overflow_burst), call the
    collapse and halt before DeepSpeed's minimum-scale exit; we then keep going to see the exit."""
    sc = build_scenario("healthy", max_steps=40, warmup_steps=5, batch_size=4, lr=3e-3)
    engine = make_engine(sc, stage=stage, precision="fp16")
    run_dir = shared_dir(out_dir, f"overflow-z{stage}")
    hook = attach(engine, config={"policy": {"halt_on": "critical"}, "actions": {}},
                  run_dir=run_dir, save_dir=os.path.join(run_dir, "ckpt"))
    first = train(engine, hook, sc, last_step=40, blow_up_from=25)
    halted_at = first["left_at"]
    # Ignore the halt to find where DeepSpeed itself would have ended the run.
    rest = train(engine, hook, sc, last_step=40, blow_up_from=25, stop_on_halt=False)
    hook.close()
    return summary(hook, {"halted_at": halted_at, "first_error": first["error"],
                          "ds_error": rest["error"],
                          "records": {r["step"]: r["metrics"] for r in runlog_lines(run_dir)
                                      if r["type"] == "step"} if dist.get_rank() == 0 else None})


def case_pocket(out_dir):
    """bf16 ZeRO-2, a bad-data pocket at steps 40-42 after warmup: spike, saves, recovery."""
    sc = build_scenario("data-pocket", max_steps=45, warmup_steps=5, fault_step=25, batch_size=4,
                        lr=3e-3)
    param_count = sum(p.numel() for p in sc.make_model().parameters())
    engine = make_engine(sc, stage=2, precision="bf16")
    run_dir = shared_dir(out_dir, "pocket-z2")
    save_dir = os.path.join(run_dir, "ckpt")
    hook = attach(engine, config={"policy": {"bump_save_interval_to": 5}, "actions": {}},
                  run_dir=run_dir, save_dir=save_dir)
    res = train(engine, hook, sc, last_step=sc.max_steps)
    hook.close()
    state = None
    if hook.saved_steps:
        blob = torch.load(os.path.join(save_dir, f"global_step{hook.saved_steps[0]}",
                                       "mp_rank_00_model_states.pt"), map_location="cpu", weights_only=False)
        state = blob.get(CLIENT_STATE_KEY)
    lines = runlog_lines(run_dir)
    return summary(hook, {"train": res, "expected": sc.expected, "saved_state": state,
                          "param_count": param_count,
                          "tags": sorted(os.listdir(save_dir)) if os.path.isdir(save_dir) else [],
                          "runlog_steps": [r["step"] for r in lines if r["type"] == "step"],
                          "runlog_checkpoints": [r["step"] for r in lines if r["type"] == "checkpoint"],
                          "first_record": next((r["metrics"] for r in lines if r["type"] == "step"), None),
                          "actions": runlog_actions(run_dir), **_names(hook, engine)})


def case_nan(out_dir):
    """fp32 ZeRO-0 (the hook computes the grad norm), a NaN at step 35: halt on every rank at
    the same step, no save of the damaged state, latest rolled back to the advised checkpoint;
    then a restart from it that skips the bad batch and carries the detector state on."""
    # Gradient accumulation 2: the step loss is the mean of 2 micro-batches x 2 ranks.
    sc = build_scenario("nan", max_steps=30, warmup_steps=5, fault_step=22, batch_size=2,
                        grad_accum=2, lr=3e-3)
    # Reference for step 1: the plain model on the whole global batch (both ranks' rows).
    ref = sc.make_model()
    rows = sc.train_dataset(dist.get_world_size()).input_ids[:sc.samples_per_step(dist.get_world_size())]
    ref_loss = ref(input_ids=rows, labels=rows).loss
    ref_loss.backward()
    reference = {"loss": float(ref_loss), "grad_norm": float(torch.nn.utils.get_total_norm(
        [p.grad for p in ref.parameters() if p.grad is not None]))}
    engine = make_engine(sc, stage=0, precision="fp32")
    run_dir = shared_dir(out_dir, "nan-z0")
    save_dir = os.path.join(run_dir, "ckpt")
    cfg = {"policy": {"halt_on": "critical"}, "actions": {}}
    hook = attach(engine, config=cfg, run_dir=run_dir, rollback_on_halt=True)
    res = train(engine, hook, sc, last_step=sc.max_steps, user_save_every=5, save_dir=save_dir)
    # The loop's own save after the halt: refused on every rank (the weights hold NaN).
    res["save_after_halt"] = engine.save_checkpoint(save_dir, tag="after_halt")
    hook.close()
    with open(os.path.join(save_dir, "latest")) as fh:
        latest = fh.read().strip()
    lines = runlog_lines(run_dir)
    first = summary(hook, {"train": res, "latest": latest, "tags": sorted(os.listdir(save_dir)),
                           "aside": sorted(os.listdir(os.path.join(save_dir, "rolled_back")))
                           if os.path.isdir(os.path.join(save_dir, "rolled_back")) else [],
                           "reference": reference, "expected": sc.expected,
                           "step1": next((r["metrics"] for r in lines if r["type"] == "step"), None),
                           "actions": runlog_actions(run_dir)})
    dist.barrier()

    # Restart: a fresh engine and hook, engine.load_checkpoint(save_dir) reads `latest`.
    engine2 = make_engine(sc, stage=0, precision="fp32")
    hook2 = attach(engine2, config=cfg, run_dir=run_dir)
    load_path, _ = engine2.load_checkpoint(save_dir)
    mon = hook2.run.monitor
    restored = {"load_path": os.path.basename(os.path.dirname(load_path)), "global_steps": engine2.global_steps,
                "segment": mon.segment, "warmup_end_step": mon.phase.warmup_end_step,
                "checkpoints": [c[0] for c in mon.policy.checkpoints]}
    skip = first["rollback"]["skip_steps"]
    # Skip the advised batches: after step skip[0]-1 the data runs (last-first+1) steps ahead.
    ids = sc.train_dataset(dist.get_world_size()).input_ids
    res2 = train(engine2, hook2, sc, last_step=skip[0] - 1, ids=ids)
    res3 = train(engine2, hook2, sc, last_step=sc.max_steps - (skip[1] - skip[0] + 1), ids=ids,
                 data_offset=skip[1] - skip[0] + 1)
    hook2.close()
    lines = runlog_lines(run_dir)
    second = summary(hook2, {"restored": restored, "train": [res2, res3],
                             "segments": [[r["segment"], r["start_step"], r["reason"]]
                                          for r in lines if r["type"] == "segment"]})
    # The rollback helper itself on real checkpoint folders: back to the first save moves the
    # others aside (a name already aside gets a suffix).
    moved = roll_back_latest(save_dir, "global_step5") if dist.get_rank() == 0 else None
    dist.barrier()
    with open(os.path.join(save_dir, "latest")) as fh:
        latest2 = fh.read().strip()
    return {"first": first, "second": second, "helper": {
        "moved": moved, "latest": latest2, "tags": sorted(os.listdir(save_dir)),
        "aside": sorted(os.listdir(os.path.join(save_dir, "rolled_back")))}}


def case_warmup_spike(out_dir):
    """ZeRO-3 bf16, a data pocket right after the LR warmup (read from the DS scheduler)."""
    sc = build_scenario("warmup-spike", max_steps=32, warmup_steps=18, batch_size=4, lr=3e-3)
    engine = make_engine(sc, stage=3, precision="bf16")
    run_dir = shared_dir(out_dir, "spike-z3")
    hook = attach(engine, config={"actions": {}}, run_dir=run_dir,
                  save_dir=os.path.join(run_dir, "ckpt"))
    res = train(engine, hook, sc, last_step=sc.max_steps)
    hook.close()
    return summary(hook, {"train": res, "expected": sc.expected, **_names(hook, engine)})


def _names(hook, engine) -> dict:
    """The names the run gave the probe's tensors, and the module's own."""
    return {"tensor_names": hook.session.run.monitor.tensor_names,
            "param_names": [n for n, _ in engine.module.named_parameters()]}


class TwoStreams(torch.nn.Module):
    """The scenario's model, whose output also carries two per-dataset losses (``stream_losses``:
    the first half of the micro-batch's rows is stream "a"), and what this rank saw of them."""

    def __init__(self, model):
        super().__init__()
        self.model = model
        self.seen = []

    def forward(self, input_ids=None, labels=None):
        out = self.model(input_ids=input_ids, labels=labels)
        out["stream_losses"] = two_stream_losses(out.logits, labels)
        self.seen.append([float(out["stream_losses"]["a"]), float(out["stream_losses"]["b"])])
        return out


def case_streams(out_dir):
    """fp32 ZeRO-1, per-dataset losses declared in sampling.loss_streams: every record carries
    loss/a and loss/b, the mean over the step's micro-batches and both ranks."""
    sc = build_scenario("healthy", max_steps=4, warmup_steps=2, batch_size=4, grad_accum=2, lr=3e-3)
    model = TwoStreams(sc.make_model())
    engine, _, _, _ = deepspeed.initialize(model=model, config=sc.deepspeed_config(stage=1),
                                           model_parameters=model.parameters())
    run_dir = shared_dir(out_dir, "streams-z1")
    hook = attach(engine, config={"sampling": {"loss_streams": ["a", "b"]}, "actions": {}},
                  run_dir=run_dir)
    train(engine, hook, sc, last_step=sc.max_steps)
    hook.close()
    return summary(hook, {"seen": model.seen, "grad_accum": sc.grad_accum,
                          "records": [r["metrics"] for r in runlog_lines(run_dir) if r["type"] == "step"]
                          if dist.get_rank() == 0 else None})


def case_no_grad_norm(out_dir):
    """bf16 ZeRO-2 with ``zero_optimization.compute_grad_norm: false``: DeepSpeed keeps no grad
    norm, so the hook computes its own (one info says so, once): the same values DeepSpeed
    reports with the flag on, on the same data."""
    sc = build_scenario("healthy", max_steps=4, warmup_steps=2, batch_size=4, lr=3e-3)
    infos = []
    handler = logging.Handler(logging.INFO)
    handler.emit = lambda record: infos.append(record.getMessage())
    logger = logging.getLogger("stability_callbacks")
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    norms, engine_norms = {}, {}
    for compute in (True, False):
        cfg = sc.deepspeed_config(stage=2, precision="bf16")
        cfg["gradient_clipping"] = 0.0          # what compute_grad_norm: false requires
        cfg["zero_optimization"]["compute_grad_norm"] = compute
        model = sc.make_model()
        engine, _, _, _ = deepspeed.initialize(model=model, config=cfg, model_parameters=model.parameters())
        run_dir = shared_dir(out_dir, f"nonorm-z2-{compute}")
        with attach(engine, config={"actions": {}}, run_dir=run_dir) as hook:
            train(engine, hook, sc, last_step=sc.max_steps)
        engine_norms[str(compute)] = engine.get_global_grad_norm() is not None
        norms[str(compute)] = [r["metrics"].get("grad_norm") for r in runlog_lines(run_dir)
                               if r["type"] == "step"] if dist.get_rank() == 0 else None
    logger.removeHandler(handler)
    logger.setLevel(level)
    return {"engine_keeps_norm": engine_norms, "infos": [m for m in infos if "compute_grad_norm" in m],
            "records": norms}


def case_crash(out_dir):
    """fp32 ZeRO-1, the loop raises in step 4 inside ``with attach(...)`` on both ranks: one
    critical alert to a real local endpoint, from the rank that failed first, delivered before
    the very same exception leaves the block."""
    sc = build_scenario("healthy", max_steps=8, warmup_steps=2, batch_size=4, lr=3e-3)
    engine = make_engine(sc, stage=1, precision="fp32")
    run_dir = shared_dir(out_dir, "crash-z1")
    inbox = AlertInbox().__enter__() if dist.get_rank() == 0 else None
    port = [inbox.server_address[1] if inbox else None]
    dist.broadcast_object_list(port, src=0)
    actions = {"webhook": {"url": f"http://127.0.0.1:{port[0]}/alerts", "min_severity": "critical",
                           "rate_limit_s": 0}}
    err, raised = RuntimeError("NCCL error: unhandled system error"), None
    ids = sc.train_dataset(dist.get_world_size()).input_ids
    try:
        with attach(engine, config={"actions": actions}, run_dir=run_dir) as hook:
            for step in range(1, sc.max_steps + 1):
                if step == 4:
                    raise err
                for mb in micro_batches(ids, sc, step):
                    engine.backward(engine(input_ids=mb, labels=mb).loss)
                    engine.step()
    except RuntimeError as e:
        raised = e
    dist.barrier()   # both ranks are past their crash handling (the first one's alert is out)
    alerts = None
    if inbox is not None:
        alerts = {"received": inbox.kinds(), "finding": inbox.alerts[0]["body"]["finding"] if inbox.alerts else None}
        inbox.__exit__(None, None, None)
    return summary(hook, {"same_object": raised is err, "closed": hook.session.closed, "records": alerts})


class _NoHook:
    should_stop = False


def _params(engine):
    return [p.detach().clone() for p in engine.module.parameters()]


def _rows_without(sc, steps):
    """The data order of a run where the optimizer steps ``steps`` never happened."""
    ids = sc.train_dataset(dist.get_world_size()).input_ids
    g = sc.samples_per_step(dist.get_world_size())
    return ids[[i for i in range(len(ids)) if i // g + 1 not in steps]]


def case_skip(out_dir):
    """bf16 ZeRO-2, a data pocket (steps 25-27) whose grad norm is ~6x its baseline; with
    skip_step_on: grad_outlier at ratio 3 DeepSpeed's own overflow path drops the three updates
    (its norm test turned on for bf16). The run equals one that never had those steps."""
    sc = build_scenario("data-pocket", max_steps=32, batch_size=4)
    run_dir = shared_dir(out_dir, "skip-z2")
    engine = make_engine(sc, stage=2, precision="bf16")
    hook = attach(engine, config={"actions": {}, "policy": {"skip_step_on": "grad_outlier",
                                                             "skip_grad_ratio": 3.0}}, run_dir=run_dir)
    train(engine, hook, sc, last_step=sc.max_steps)
    hook.close()
    got, skipped = _params(engine), int(engine.skipped_steps)
    ref = make_engine(sc, stage=2, precision="bf16")
    train(ref, _NoHook(), sc, last_step=sc.max_steps - 3, ids=_rows_without(sc, {25, 26, 27}))
    records = {r["step"]: r["metrics"] for r in runlog_lines(run_dir) if r["type"] == "step"}
    return summary(hook, {"same_as_without": all(torch.equal(a, b) for a, b in zip(got, _params(ref))),
                          "skipped_steps": skipped, "global_steps": int(engine.global_steps),
                          # rank 0 writes the run log
                          "records": {"flags": [s for s, m in sorted(records.items()) if m.get("skipped_by_policy")],
                                      "norms": [records[s]["grad_norm"] for s in (24, 25)]}
                          if dist.get_rank() == 0 else None})


def case_rollback(out_dir):
    """fp32 ZeRO-1, a 12-step data pocket from step 25 that does not recover: the hook rolls
    back in-process to the checkpoint of step 20, the loop's hook.batches(loader) (a
    DistributedSampler DataLoader) skips the data of steps 25-40 on both ranks, the LR runs at
    half for 10 steps; the run then equals a run that never saw that data (same LR factor)."""
    sc = build_scenario("data-pocket", pocket_steps=12, batch_size=4, data_steps=70)
    run_dir = shared_dir(out_dir, "rollback-z1")
    cfg = {"actions": {}, "detectors": {"loss_spike": {"horizon_steps": 10}},
           "policy": {"bump_save_interval_to": 5, "skip_step_on": "grad_outlier",
                      "auto_rollback": {"skip_extra_steps": 5, "lr_factor": 0.5, "lr_factor_steps": 10}}}
    engine = make_engine(sc, stage=1, precision="fp32")
    hook = attach(engine, config=cfg, run_dir=run_dir, save_dir=os.path.join(run_dir, "ckpt"))
    train_over_loader(engine, hook, sc)
    hook.close()
    got = _params(engine)
    # The reference: the data without steps 25-40, the LR halved for steps 21-30 by hand.
    ref = make_engine(sc, stage=1, precision="fp32")
    rows = _rows_without(sc, set(range(25, 41)))
    while ref.global_steps < sc.max_steps:
        step = ref.global_steps + 1
        for m, mb in enumerate(micro_batches(rows, sc, step)):
            ref.backward(ref(input_ids=mb, labels=mb).loss)
            if m == sc.grad_accum - 1 and 21 <= step <= 30:
                for group in ref.optimizer.param_groups:
                    group["lr"] *= 0.5   # the scheduler sets the next LR afterwards
            ref.step()
    lines = runlog_lines(run_dir)
    save_dir = os.path.join(run_dir, "ckpt")
    with open(os.path.join(save_dir, "latest")) as fh:
        latest = fh.read().strip()
    return summary(hook, {"same_as_without": all(torch.equal(a, b) for a, b in zip(got, _params(ref))),
                          "global_steps": int(engine.global_steps), "latest": latest,
                          "aside": sorted(os.listdir(os.path.join(save_dir, "rolled_back"))),
                          "records": {"segments": [[r["segment"], r["start_step"], r["reason"]] for r in lines
                                                   if r["type"] == "segment"]} if dist.get_rank() == 0 else None,
                          "actions": runlog_actions(run_dir)})


def case_forensics(out_dir):
    """fp32 ZeRO-2, the loop over hook.batches(loader) (a DistributedSampler: each rank reads its
    own samples), forensics.dump_batches on: 3 garbage samples of step 25's 8 (2 on rank 0, 1 on
    rank 1) make the spike; the finding names every rank's indices (one gather at the finding)
    and the garbage ranks first in forensics/step-25.jsonl, which rank 0 writes."""
    sc = build_scenario("data-pocket", pocket_steps=1, max_steps=27, batch_size=4, pocket_samples=(1, 4, 6))
    run_dir = shared_dir(out_dir, "forensics-z2")
    engine = make_engine(sc, stage=2, precision="fp32")
    hook = attach(engine, config={"actions": {}, "forensics": {"dump_batches": True}}, run_dir=run_dir,
                  save_dir=os.path.join(run_dir, "ckpt"))
    train_over_loader(engine, hook, sc)
    hook.close()
    path = os.path.join(run_dir, "forensics", "step-25.jsonl")
    return summary(hook, {"pocket": sc.pocket_indices(dist.get_world_size()),
                          "samples": {f.kind: f.details.get("samples") for f in hook.findings
                                      if f.step == 25 or f.kind == "spike_recovered"},
                          "records": ({"dump": [json.loads(x) for x in open(path)]} if dist.get_rank() == 0 else None)})


def case_host_sync(out_dir):
    """ZeRO-2, fp32, 2 ranks, the reductions on their GPU path: every value read the hook makes
    on steps 4-11 (tests/test_host_sync.py), by call site."""
    from test_host_sync import ValueReads

    from stability_callbacks.integrations.torch import reductions as _reductions

    _reductions.FOREACH_FAST_DEVICES += ("cpu",)
    try:
        sc = build_scenario("healthy", max_steps=12, batch_size=2, grad_accum=2)
        engine = make_engine(sc, stage=2, precision="fp32")
        with attach(engine, run_dir=shared_dir(out_dir, "host_sync")) as hook:
            train(engine, hook, sc, last_step=3)
            with ValueReads() as reads:
                train(engine, hook, sc, last_step=11)
            train(engine, hook, sc, last_step=12)
        return summary(hook, {"reads": {"/".join(k): v for k, v in sorted(reads.counts.items())}})
    finally:
        _reductions.FOREACH_FAST_DEVICES = _reductions.FOREACH_FAST_DEVICES[:-1]


def case_halt(out_dir):
    """fp32 ZeRO-2, a NaN at step 22, ``halt_on: critical``: every rank halts at that step; rank 0
    alone writes the run log. Run by tests/test_launchers.py under the ``deepspeed`` launcher."""
    sc = build_scenario("nan", batch_size=4)
    engine = make_engine(sc, stage=2, precision="fp32")
    run_dir = shared_dir(out_dir, "halt-z2")
    hook = attach(engine, config={"policy": {"halt_on": "critical"}, "actions": {}}, run_dir=run_dir)
    res = train(engine, hook, sc, last_step=sc.max_steps)
    hook.close()
    return summary(hook, {"train": res, "world": dist.get_world_size(), "expected": sc.expected})


def case_monitor(out_dir):
    """A ds_config ``monitor.tensorboard`` section: the stability scalars in DeepSpeed's own event
    file at every step (x = samples, DeepSpeed's axis). And where the run lives: ``save_dir=``
    puts it in ``<ckpt>/stability``; a second engine that loads from ``<ckpt>`` (no run_dir, no
    save_dir) continues that run log; a fresh start there moves it aside."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    sc = build_scenario("healthy", max_steps=10, warmup_steps=3, batch_size=2, grad_accum=2)
    base = shared_dir(out_dir, "monitor")
    ckpt, tb = os.path.join(base, "ckpt"), os.path.join(base, "tb")
    cfg = {**sc.deepspeed_config(stage=1), "tensorboard": {"enabled": True, "output_path": tb, "job_name": "job"}}

    def engine_with_monitor():
        model = sc.make_model()
        return deepspeed.initialize(model=model, config=cfg, model_parameters=model.parameters())[0]

    engine = engine_with_monitor()
    with attach(engine, config={"actions": {}}, save_dir=ckpt) as hook:
        train(engine, hook, sc, last_step=8, user_save_every=4, save_dir=ckpt)
    run_dir = str(hook.run.run_dir)
    resumed = engine_with_monitor()
    with attach(resumed, config={"actions": {}}) as hook2:
        resumed.load_checkpoint(ckpt)
        train(resumed, hook2, sc, last_step=10, save_dir=ckpt)
    continued = [[r["segment"], r["start_step"], r["reason"]] for r in runlog_lines(run_dir) if r["type"] == "segment"]
    dist.barrier()
    fresh = engine_with_monitor()
    with attach(fresh, config={"actions": {}}, save_dir=ckpt) as hook3:
        train(fresh, hook3, sc, last_step=2)
    res = {"run_dirs": [os.path.relpath(str(h.run.run_dir), base) for h in (hook, hook2, hook3)],
           "findings": [], "records": None}
    if dist.get_rank() == 0:   # rank 0 writes the run log and the monitor's events
        (events,) = {d for d, _, fs in os.walk(tb) for f in fs if "tfevents" in f}   # one per engine
        ea = EventAccumulator(events, size_guidance={"scalars": 0})
        ea.Reload()
        res["records"] = {
            "loss_x": [e.step for e in ea.Scalars("stability/loss")],
            "samples_per_step": sc.samples_per_step(dist.get_world_size()), "continued": continued,
            "runlogs": sorted(f for f in os.listdir(run_dir) if f.startswith("runlog")),
            "fresh_segments": [[r["segment"], r["start_step"], r["reason"]] for r in runlog_lines(run_dir)
                               if r["type"] == "segment"]}
    return res


def case_loud(out_dir):
    """A bad config raises at ``attach`` (before step one) with the key named; an unwritable
    run_dir is one warning, the hook's own save into it another (no traceback), and the run is
    monitored all the same."""
    from stability_callbacks import ConfigError

    sc = build_scenario("healthy", max_steps=6, warmup_steps=2, batch_size=2)
    engine = make_engine(sc, stage=1, precision="fp32")
    errors = []
    os.environ.pop("NO_SUCH_WEBHOOK", None)
    for config in ({"policy": {"halt_on": "warnings"}}, {"actions": {"slack": {"webhook_url": "${NO_SUCH_WEBHOOK}"}}}):
        try:
            attach(engine, config=config)
        except ConfigError as e:
            errors.append(str(e).split(":")[0].split(" must")[0])
    base = shared_dir(out_dir, "loud")
    blocker = os.path.join(base, "a-file")
    if dist.get_rank() == 0:
        with open(blocker, "w") as fh:
            fh.write("not a folder")
    dist.barrier()

    class Seen(logging.Handler):
        def __init__(self):
            super().__init__()
            self.messages = []

        def emit(self, record):
            self.messages.append(record.getMessage())

    seen = Seen()
    logging.getLogger("stability_callbacks").addHandler(seen)
    try:   # the hook's own save (every step in the risk window) goes to <run_dir>/checkpoints: no folder
        with attach(engine, config={"actions": {}, "policy": {"bump_save_interval_to": 1}},
                    run_dir=os.path.join(blocker, "stability")) as hook:
            train(engine, hook, sc, last_step=6)
    finally:
        logging.getLogger("stability_callbacks").removeHandler(seen)
    return summary(hook, {"errors": errors,
                          "last_step": hook.session.last_step,
                          "records": {"warnings": [m for m in seen.messages if "run log" in m],
                                      "save_warnings": [m.replace(blocker, "BLOCKER") for m in seen.messages
                                                        if "save" in m or "Traceback" in m]}})


CASES = {
    "halt-z2": case_halt,
    "loud-z1": case_loud,
    "monitor-z1": case_monitor,
    "nonorm-z2": case_no_grad_norm,
    "hostsync-z2": case_host_sync,
    "crash-z1": case_crash,
    "overflow-z1": lambda out: case_overflow(out, 1),
    "overflow-z0": lambda out: case_overflow(out, 0),
    "pocket-z2": case_pocket,
    "nan-z0": case_nan,
    "spike-z3": case_warmup_spike,
    "streams-z1": case_streams,
    "skip-z2": case_skip,
    "rollback-z1": case_rollback,
    "forensics-z2": case_forensics,
}


def main(argv):
    # The deepspeed launcher passes --local_rank=N to the script (its rank is in the environment too).
    argv = [a for a in argv if not a.startswith("--local_rank")]
    out_dir, names = argv[0], argv[1:] or list(CASES)
    deepspeed.init_distributed(dist_backend="gloo")
    rank = dist.get_rank()
    for name in names:
        t0 = time.perf_counter()
        try:
            res = CASES[name](out_dir)
        except Exception:
            with open(os.path.join(out_dir, f"{name}.rank{rank}.json"), "w") as fh:
                json.dump({"crash": traceback.format_exc()}, fh)
            # The other rank may sit in a collective this rank will never join: end the
            # launch now (its peer then fails fast on the closed connection) instead of
            # running the next case out of step.
            os._exit(1)
        res["seconds"] = round(time.perf_counter() - t0, 2)
        with open(os.path.join(out_dir, f"{name}.rank{rank}.json"), "w") as fh:
            json.dump(res, fh, indent=1, default=str)
        dist.barrier()


if __name__ == "__main__":
    main(sys.argv[1:])
    leave(0)   # gloo's teardown race (tests/dist/teardown.py)
