"""Automatic rollback (``policy.auto_rollback``): the policy's request, the standing data skips,
the skip-aware sampler, and real HF / Lightning runs where a planted data pocket that does not
recover is rolled back, skipped, and the run ends exactly where a run that never saw it ends.

The DeepSpeed path (in-process, ``hook.batches``) runs on 2 ranks in
``tests/dist/ds_scenarios.py`` (``test_deepspeed.py``); Lightning DDP on 2 ranks at the end.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from stability_callbacks import Monitor, StepRecord
from stability_callbacks.config import ConfigError, load_config
from stability_callbacks.control import DataSkips

REPO = Path(__file__).resolve().parents[1]
NAN = float("nan")


def _monitor(**auto) -> Monitor:
    return Monitor({"actions": {}, "phase": {"warmup_steps": 5},
                    "policy": {"auto_rollback": auto, "halt_on": "never"}})


def _run(m: Monitor, steps, nan_at=()):
    out = []
    for s in steps:
        loss = NAN if s in nan_at else 3.0 - s / 100
        out += m.update(StepRecord(s, {"loss": loss, "grad_norm": 1.0, "lr": 1e-3}))
        if s in (10, 20):
            m.note_checkpoint(s, f"ckpt/checkpoint-{s}")
        m.control.step_done()
    return out


# ------------------------------------------------------------------------------ the policy
def test_a_critical_finding_asks_for_a_rollback_instead_of_a_halt():
    m = _monitor(lr_factor=0.5, lr_factor_steps=40, skip_extra_steps=3)
    found = _run(m, range(1, 31), nan_at={30})
    c = m.control
    r = c.rollback_request
    assert (r.step, r.checkpoint_step, r.checkpoint_path, r.skip_steps) == (30, 20, "ckpt/checkpoint-20", (30, 33))
    assert (r.lr_factor, r.lr_factor_steps, r.attempt, r.max_attempts) == (0.5, 40, 1, 2)
    assert r.skips.state_dict() == {"ranges": [[30, 33]], "lr_window": [21, 60, 0.5], "attempts": 1}
    assert not c.stop and not c.save_now and not c.state_is_good
    assert [(f.kind, f.severity) for f in found if f.step == 30] == [
        ("nonfinite", "critical"), ("rollback_advice", "critical"), ("auto_rollback", "warning")]
    auto = found[-1]
    assert auto.message == (
        "Rolling back automatically (attempt 1 of 2): nonfinite at step 30. Training goes back to the "
        "checkpoint of step 20 (ckpt/checkpoint-20); the data of steps 30-33 (4 steps, 3 of them past "
        "the detection as a margin) is skipped on every rank, and the LR is scaled by 0.5 for 40 steps. "
        "The detectors restart from that checkpoint's state; the abandoned steps stay in the run log as "
        "a superseded branch (stability-callbacks timeline).")
    assert m.policy.data_skips.attempts == 0   # installed by the integration once the checkpoint is loaded


def test_no_checkpoint_or_no_attempt_left_is_a_halt_that_says_why():
    m = _monitor()
    _run(m, range(1, 9), nan_at={8})          # no checkpoint before step 8
    assert m.control.rollback_request is None and m.control.stop
    assert m.control.stop_reason == ("nonfinite (critical) at step 8; no automatic rollback: no good "
                                     "checkpoint before the onset (step 8) is known")
    m = _monitor(max_attempts=1)
    m.policy.data_skips = DataSkips([[40, 45]], None, 1)
    _run(m, range(1, 31), nan_at={30})
    assert m.control.stop and m.control.rollback_request is None
    assert m.control.stop_reason.endswith("no automatic rollback: policy.auto_rollback.max_attempts (1) "
                                          "automatic rollbacks are used up")


def test_the_standing_requests_survive_the_policy_state_round_trip():
    m = _monitor()
    m.policy.data_skips = DataSkips([[25, 40]], [21, 30, 0.5], 1)
    state = json.loads(json.dumps(m.state_dict()))
    m2 = _monitor()
    m2.load_state_dict(state)
    assert m2.policy.data_skips == DataSkips([[25, 40]], [21, 30, 0.5], 1)
    assert [m2.policy.data_skips.lr_factor_at(s) for s in (20, 21, 30, 31)] == [1.0, 0.5, 0.5, 1.0]


def test_a_state_saved_before_rollbacks_existed_still_loads():
    m = _monitor()
    state = json.loads(json.dumps(m.state_dict()))
    for key in ("skips", "data_skips"):
        del state["policy"][key]
    m2 = _monitor()
    m2.load_state_dict(state)
    assert m2.policy.data_skips == DataSkips() and m2.policy.skips == []
    state["policy"]["surprise"] = 1
    with pytest.raises(ValueError, match="policy state keys"):
        m2.load_state_dict(state)


def test_two_rollbacks_map_steps_to_data_steps():
    skips = DataSkips().after_rollback(checkpoint_step=20, skip_steps=(25, 35))
    # The second rollback's steps are numbered as its branch counted them: step 30 read data 41.
    skips = skips.after_rollback(checkpoint_step=28, skip_steps=(30, 31))
    assert skips.ranges == [[25, 35], [41, 42]] and skips.attempts == 2
    assert [skips.data_step(s) for s in (24, 25, 29, 30)] == [24, 36, 40, 43]
    # A range overlapping one already skipped merges with it.
    assert DataSkips([[5, 8]]).after_rollback(checkpoint_step=2, skip_steps=(4, 6)).ranges == [[4, 10]]


@pytest.mark.parametrize("auto, message", [
    ({"lr_factor": 0}, "policy.auto_rollback.lr_factor must be in (0, 1], got 0"),
    ({"max_attempts": 0}, "policy.auto_rollback.max_attempts must be a positive integer, got 0"),
    ({"skip_extra": 2}, "policy.auto_rollback.skip_extra: unknown key (known: max_attempts, lr_factor, "
                        "lr_factor_steps, skip_extra_steps)"),
    (True, "policy.auto_rollback must be a mapping of max_attempts, lr_factor, lr_factor_steps, "
           "skip_extra_steps (or null), got True"),
])
def test_bad_auto_rollback_keys_name_key_and_value(auto, message):
    with pytest.raises(ConfigError) as e:
        load_config({"policy": {"auto_rollback": auto}})
    assert str(e.value) == message


# --------------------------------------------------------------------------- the sampler
torch = pytest.importorskip("torch")

from stability_callbacks.integrations.torch.auto_rollback import (DataSkipSampler, install_sampler,  # noqa: E402
                                                        set_aside_newer)


def test_the_sampler_skips_per_epoch_and_reports_the_epoch_length():
    skips = DataSkips([[2, 2], [6, 7]])
    s = DataSkipSampler(list(range(10)), samples_per_step=2, skips=lambda: skips)
    assert list(s) == [0, 1, 4, 5, 6, 7, 8, 9] and len(s) == 8   # data steps 1-5 in epoch 0
    s.set_epoch(1)                                               # data steps 6-10: 6 and 7 go
    assert list(s) == [4, 5, 6, 7, 8, 9] and len(s) == 6


def test_install_sampler_reaches_a_dataloader_and_refuses_what_it_cannot():
    loader = torch.utils.data.DataLoader(list(range(12)), batch_size=2)
    done = {"n": 1}
    install_sampler(loader, samples_per_step=4, skips=lambda: DataSkips([[3, 3]]), start_step=lambda: done["n"])
    assert [b.tolist() for b in loader] == [[4, 5], [6, 7]]     # after step 1; data step 3 skipped
    assert len(loader) == 4                                      # the epoch's length without step 3
    with pytest.raises(ValueError, match="a DataLoader over a map-style dataset is needed"):
        install_sampler(object(), samples_per_step=4, skips=DataSkips)


def test_set_aside_moves_newer_checkpoints_only(tmp_path):
    for name in ("checkpoint-10", "checkpoint-20", "checkpoint-30", "runs"):
        (tmp_path / name).mkdir()
    for name in ("stability-step=25.ckpt", "last.ckpt", "notes-2024.txt"):
        (tmp_path / name).write_text("x")
    assert set_aside_newer(tmp_path, 20) == ["stability-step=25.ckpt", "checkpoint-30"]
    assert sorted(os.listdir(tmp_path / "rolled_back")) == ["checkpoint-30", "stability-step=25.ckpt"]
    assert sorted(os.listdir(tmp_path)) == ["checkpoint-10", "checkpoint-20", "last.ckpt",
                                            "notes-2024.txt", "rolled_back", "runs"]


# ---------------------------------------------------------------------- real runs: HF
transformers = pytest.importorskip("transformers")

from transformers import Trainer, TrainingArguments  # noqa: E402

from stability_callbacks.demo.scenarios import ScenarioDataset, build_scenario  # noqa: E402
from stability_callbacks.integrations.hf import StabilityCallback  # noqa: E402
from stability_callbacks.replay.timeline import stitch  # noqa: E402

#: A pocket of 12 steps of random tokens from step 25 (the model forgets its pattern); the loss
#: is not back 10 steps after the onset (horizon_steps 10 for a 45-step run): spike_unrecovered
#: at 35, rollback to the checkpoint of step 20 (bumped saves every 5 steps in the risk window),
#: data of steps 25-40 skipped (35 + a margin of 5 covers the pocket's last step, 36).
CONFIG = {"actions": {}, "detectors": {"loss_spike": {"horizon_steps": 10}},
          "policy": {"bump_save_interval_to": 5, "auto_rollback": {"skip_extra_steps": 5}}}
SKIPPED = set(range(25, 41))


pytestmark = pytest.mark.usefixtures("one_thread")


def _pocket():
    return build_scenario("data-pocket", pocket_steps=12, batch_size=4, grad_accum=2, data_steps=70)


def _without(ds, sc, steps) -> ScenarioDataset:
    g = sc.samples_per_step()
    return ScenarioDataset(ds.input_ids[[i for i in range(len(ds)) if i // g + 1 not in steps]])


def _hf(out, sc, ds, cb_config=None, run_dir=None):
    args = TrainingArguments(output_dir=str(out), max_steps=sc.max_steps, per_device_train_batch_size=sc.batch_size,
                             gradient_accumulation_steps=sc.grad_accum, learning_rate=sc.lr,
                             warmup_steps=sc.warmup_steps, weight_decay=0.0, logging_steps=1000,
                             save_strategy="steps", save_steps=1000, report_to="none",
                             train_sampling_strategy="sequential", use_cpu=True, disable_tqdm=True,
                             logging_nan_inf_filter=False)
    trainer = Trainer(model=sc.make_model(), args=args, train_dataset=ds)
    cb = StabilityCallback.attach(trainer, config=cb_config, run_dir=run_dir) if cb_config else None
    trainer.train()
    return trainer, cb


def _runlog(path):
    return [json.loads(x) for x in Path(path).read_text().splitlines()]


def _story(lines):
    """(step, what) of the segment, action and warning+ finding lines."""
    out = []
    for x in lines:
        if x["type"] == "segment":
            out.append((x["start_step"], f"segment {x['reason']}"))
        elif x["type"] == "action" and x["action"] in ("rollback", "stop"):
            out.append((x["step"], x["action"]))
        elif x["type"] == "finding" and x["severity"] != "info":
            out.append((x["step"], x["kind"]))
    return out


@pytest.fixture(scope="module")
def hf_rollback(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hf_rollback")
    sc = _pocket()
    ds = sc.train_dataset()
    trainer, cb = _hf(tmp / "ckpt", sc, ds, CONFIG, tmp / "stability")
    return sc, ds, trainer, cb, tmp


@pytest.mark.slow
def test_hf_rolls_back_skips_the_pocket_and_ends_where_a_clean_run_ends(hf_rollback):
    sc, ds, trainer, cb, tmp = hf_rollback
    assert trainer.state.global_step == 45 and not cb.control.stop
    ref, _ = _hf(tmp / "ref", sc, _without(ds, sc, SKIPPED))
    a, b = trainer.model.state_dict(), ref.model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)   # exactly the run that never saw steps 25-40
    lines = _runlog(tmp / "stability" / "runlog.jsonl")
    assert _story(lines) == [(0, "segment start"), (25, "loss_spike"), (35, "spike_unrecovered"),
                             (35, "rollback_advice"), (35, "auto_rollback"), (35, "rollback"),
                             (20, "segment rollback")]
    action = next(x for x in lines if x["type"] == "action" and x["action"] == "rollback")
    assert action == {"type": "action", "step": 35, "action": "rollback",
                      "reason": "spike_unrecovered (critical) at step 35; policy.auto_rollback: back to the "
                                "checkpoint of step 20, skipping the data of steps 25-40",
                      "path": str(tmp / "ckpt" / "checkpoint-20"), "checkpoint_step": 20,
                      "skip_steps": [25, 40], "lr_factor": 1.0, "lr_factor_steps": 100, "attempt": 1}
    steps = [x for x in lines if x["type"] == "step"]
    healthy = [x["metrics"]["loss"] for x in steps if x["segment"] == 1]
    assert len(healthy) == 25 and max(healthy) < 1.0   # steps 21-45, no pocket batch among them


def test_hf_rollback_leaves_a_stitched_timeline_and_the_branch_aside(hf_rollback):
    sc, ds, trainer, cb, tmp = hf_rollback
    t = stitch(tmp / "stability" / "runlog.jsonl")
    assert [r.step for r in t.live] == list(range(1, 46))
    assert [r.step for r in t.superseded] == list(range(21, 36))
    assert [(s["start_step"], s["reason"], s["num_superseded"]) for s in t.segments] == [
        (0, "start", 0), (20, "rollback", 15)]
    # The abandoned branch's saves moved aside (never deleted): "the latest checkpoint" is the one
    # rolled back to, then the final save.
    assert sorted(os.listdir(tmp / "ckpt" / "rolled_back")) == ["checkpoint-25", "checkpoint-30"]
    assert sorted(d for d in os.listdir(tmp / "ckpt") if d.startswith("checkpoint-")) == [
        "checkpoint-10", "checkpoint-15", "checkpoint-20", "checkpoint-45"]
    # The detectors went back to checkpoint 20's state: the rollback is attempt 1 of 2, recorded
    # in the state saved with the final checkpoint (a crash-resume keeps skipping).
    final = json.loads((tmp / "ckpt" / "checkpoint-45" / "stability_state.json").read_text())
    assert final["live"]["monitor"]["policy"]["data_skips"] == {"ranges": [[25, 40]], "lr_window": None,
                                                                  "attempts": 1}


def test_hf_random_order_is_the_same_after_the_rollback_minus_the_skipped_steps(tmp_path):
    """train_sampling_strategy="random" (HF's default): one poisoned sample (the ``nan`` scenario's
    inf embedding row) lands at step 33 of the seeded order; after the rollback to step 20 the
    order comes back identical (steps 21-32 read the same batches) and step 33's is never read."""
    from stability_callbacks.demo.scenarios import POISON_TOKEN

    sc = build_scenario("healthy", max_steps=45, batch_size=4, grad_accum=2, data_steps=70)
    ids = sc.train_dataset().input_ids.clone()
    g = sc.samples_per_step()
    order = torch.randperm(len(ids), generator=torch.Generator().manual_seed(3))   # data_seed = seed = 3
    ids[order[32 * g], sc.seq_len // 2] = POISON_TOKEN                                 # step 33's first sample
    args = TrainingArguments(output_dir=str(tmp_path / "ckpt"), max_steps=sc.max_steps,
                             per_device_train_batch_size=4, gradient_accumulation_steps=2,
                             learning_rate=sc.lr, warmup_steps=sc.warmup_steps, weight_decay=0.0,
                             save_strategy="steps", save_steps=1000, report_to="none", use_cpu=True,
                             disable_tqdm=True, train_sampling_strategy="random", seed=3,
                             logging_nan_inf_filter=False)
    model = build_scenario("nan").make_model()          # its embedding row POISON_TOKEN is +inf
    trainer = Trainer(model=model, args=args, train_dataset=ScenarioDataset(ids))
    cb = StabilityCallback.attach(trainer, config={"actions": {}, "policy": {
        "bump_save_interval_to": 5, "auto_rollback": {}}}, run_dir=tmp_path / "stability")
    trainer.train()
    assert trainer.state.global_step == 45 and not cb.control.stop
    lines = _runlog(tmp_path / "stability" / "runlog.jsonl")
    assert [(x["step"], x["checkpoint_step"], x["skip_steps"]) for x in lines
            if x["type"] == "action" and x["action"] == "rollback"] == [(33, 20, [33, 33])]
    fp = {}
    for x in lines:
        if x["type"] == "step":
            fp.setdefault(x["segment"], {})[x["step"]] = x["metrics"]["batch_fingerprint"]
    assert [fp[1][s] for s in range(21, 33)] == [fp[0][s] for s in range(21, 33)]   # the same order
    assert fp[0][33] not in fp[1].values()                                         # never read again
    assert all(x["metrics"]["loss"] == x["metrics"]["loss"] for x in lines
               if x["type"] == "step" and x["segment"] == 1)                       # no NaN after it


def test_hf_refuses_a_rollback_the_trainer_cannot_do_and_halts(tmp_path):
    sc = _pocket()
    args = dict(output_dir=str(tmp_path / "ckpt"), max_steps=sc.max_steps, per_device_train_batch_size=4,
                gradient_accumulation_steps=2, learning_rate=sc.lr, warmup_steps=sc.warmup_steps,
                weight_decay=0.0, save_strategy="steps", save_steps=1000, report_to="none",
                train_sampling_strategy="sequential", use_cpu=True, disable_tqdm=True, ignore_data_skip=True)
    trainer = Trainer(model=sc.make_model(), args=TrainingArguments(**args), train_dataset=sc.train_dataset())
    cb = StabilityCallback.attach(trainer, config=CONFIG, run_dir=tmp_path / "stability")
    trainer.train()
    assert trainer.state.global_step == 35 and cb.control.stop
    assert cb.control.stop_reason == (
        "spike_unrecovered (critical) at step 35; policy.auto_rollback; cannot roll back automatically: "
        "ignore_data_skip=True: the Trainer would re-read the data it already trained on")
    # save_only_model: the checkpoints hold no optimizer or scheduler to go back to.
    args.update(ignore_data_skip=False, save_only_model=True, output_dir=str(tmp_path / "ckpt2"))
    trainer = Trainer(model=sc.make_model(), args=TrainingArguments(**args), train_dataset=sc.train_dataset())
    cb = StabilityCallback.attach(trainer, config=CONFIG, run_dir=tmp_path / "stability2")
    trainer.train()
    assert trainer.state.global_step == 35 and cb.control.stop_reason.endswith(
        "cannot roll back automatically: save_only_model=True: the checkpoints hold no optimizer or "
        "scheduler state to go back to")


# ------------------------------------------------------------------- real runs: Lightning
pl = pytest.importorskip("lightning.pytorch")

from stability_callbacks.integrations.lightning import StabilityCallback as PLCallback  # noqa: E402


class _Module(pl.LightningModule):
    def __init__(self, sc):
        super().__init__()
        self.sc, self.model = sc, sc.make_model()

    def training_step(self, batch, batch_idx):
        return self.model(input_ids=batch["input_ids"], labels=batch["labels"]).loss

    def configure_optimizers(self):
        opt, sched = self.sc.make_optimizer(self.model)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def _fit(tmp, sc, ds, cb=None):
    module = _Module(sc)
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=sc.max_steps, gradient_clip_val=1.0,
                         accumulate_grad_batches=sc.grad_accum, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False, default_root_dir=tmp,
                         callbacks=[cb] if cb else [])
    trainer.fit(module, torch.utils.data.DataLoader(ds, batch_size=sc.batch_size))
    return module, trainer


def test_lightning_rolls_back_in_the_same_fit_and_ends_where_a_clean_run_ends(tmp_path):
    sc = _pocket()
    ds = sc.train_dataset()
    config = {**CONFIG, "phase": {"warmup_steps": sc.warmup_steps}}
    cb = PLCallback(config=config, run_dir=tmp_path / "stability", checkpoint_dir=tmp_path / "ckpt")
    module, trainer = _fit(tmp_path / "a", sc, ds, cb)
    assert trainer.global_step == 45 and not trainer.should_stop
    ref, _ = _fit(tmp_path / "ref", sc, _without(ds, sc, SKIPPED))
    assert all(torch.equal(x, y) for x, y in zip(module.state_dict().values(), ref.state_dict().values()))
    lines = _runlog(tmp_path / "stability" / "runlog.jsonl")
    assert _story(lines) == [(0, "segment start"), (25, "loss_spike"), (35, "spike_unrecovered"),
                             (35, "rollback_advice"), (35, "auto_rollback"), (35, "rollback"),
                             (20, "segment rollback")]
    assert sorted(os.listdir(tmp_path / "ckpt" / "rolled_back")) == ["stability-step=25.ckpt",
                                                                     "stability-step=30.ckpt"]
    assert [r.step for r in stitch(tmp_path / "stability" / "runlog.jsonl").superseded] == list(range(21, 36))


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.slow
def test_lightning_ddp_two_ranks_roll_back_together(tmp_path):
    """torchrun, 2 CPU processes, gloo, DDP with DistributedSampler(shuffle=False): both ranks
    decide the rollback at the same step, restore the same checkpoint and skip the same data."""
    env = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu",
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    config = {**CONFIG, "phase": {"warmup_steps": 5}}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={_free_port()}",
           str(REPO / "tests" / "dist" / "lightning_worker.py"), "--strategies", "ddp",
           "--scenario", "data-pocket", "--pocket-steps", "12", "--data-steps", "70", "--batch-size", "4",
           "--config", json.dumps(config), "--out", str(tmp_path)]
    proc = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r0, r1 = (json.loads((tmp_path / f"ddp_rank{r}.json").read_text()) for r in (0, 1))
    assert r0["findings"] == r1["findings"] and r0["global_step"] == r1["global_step"] == 45
    kinds = [(f["step"], f["kind"]) for f in r0["findings"] if f["severity"] != "info"]
    assert kinds == [(25, "loss_spike"), (35, "spike_unrecovered"), (35, "rollback_advice"),
                     (35, "auto_rollback")]
    lines = _runlog(tmp_path / "ddp" / "stability" / "runlog.jsonl")
    healthy = [x["metrics"]["loss"] for x in lines if x["type"] == "step" and x["segment"] == 1]
    assert len(healthy) == 25 and max(healthy) < 1.0


@pytest.mark.slow
def test_hf_ddp_two_ranks_roll_back_together(tmp_path):
    """torchrun, 2 CPU processes, gloo, HF DDP: the sampler wrapper sees the global data order
    (accelerate shards it by batches), both ranks roll back at the same step and skip the same data."""
    env = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu",
               PYTHONPATH=str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={_free_port()}",
           str(REPO / "tests" / "dist" / "hf_worker.py"), "--backend", "ddp", "--scenario", "data-pocket",
           "--pocket-steps", "12", "--data-steps", "70", "--full-checkpoints", "--config", json.dumps(CONFIG),
           "--out", str(tmp_path)]
    proc = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert r0["findings"] == r1["findings"] and r0["global_step"] == r1["global_step"] == 45
    assert r0["weights_sum"] == r1["weights_sum"]
    kinds = [(f["step"], f["kind"]) for f in r0["findings"] if f["severity"] != "info"]
    assert kinds == [(25, "loss_spike"), (35, "spike_unrecovered"), (35, "rollback_advice"),
                     (35, "auto_rollback")]
    lines = _runlog(tmp_path / "stability" / "runlog.jsonl")
    healthy = [x["metrics"]["loss"] for x in lines if x["type"] == "step" and x["segment"] == 1]
    assert len(healthy) == 25 and max(healthy) < 1.0


def test_lightning_rollback_to_a_checkpoint_it_cannot_restore_is_a_halt(tmp_path):
    """The advised checkpoint is corrupted on disk before the rollback: the restore fails, the run
    halts with the reason (no crash), the session is closed."""
    sc = build_scenario("data-pocket", pocket_steps=12, batch_size=8, data_steps=70)
    config = {**CONFIG, "phase": {"warmup_steps": sc.warmup_steps}}
    cb = PLCallback(config=config, run_dir=tmp_path / "stability", checkpoint_dir=tmp_path / "ckpt")

    class Corrupt(pl.Callback):
        def on_train_batch_end(self, trainer, *args):
            if trainer.global_step == 30:
                (tmp_path / "ckpt" / "stability-step=20.ckpt").write_bytes(b"not a checkpoint")

    module = _Module(sc)
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=sc.max_steps, logger=False,
                         enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                         default_root_dir=tmp_path, callbacks=[cb, Corrupt()])
    trainer.fit(module, torch.utils.data.DataLoader(sc.train_dataset(), batch_size=sc.batch_size))
    assert trainer.global_step == 35 and cb.control.stop
    assert cb.control.stop_reason.startswith("spike_unrecovered (critical) at step 35; policy.auto_rollback; "
                                             "the automatic rollback failed: ")
    lines = _runlog(tmp_path / "stability" / "runlog.jsonl")
    # The bumped interval's save and the save before the halt are refused (damaged weights).
    assert [x["action"] for x in lines if x["type"] == "action" and x["step"] == 35] == [
        "rollback", "save_blocked", "stop", "save_blocked"]
    assert cb.session.run.runlog._f.closed
