"""DeepSpeed ``attach(engine)``: real engines on CPU, 2 ranks (torchrun + gloo), planted faults.

One torchrun launch runs every case of ``tests/dist/ds_scenarios.py`` (DeepSpeed's first
initialize pays ~20 s of imports; later engines under a second); the tests below read what each
rank wrote. Steps are 1-based optimizer steps (``engine.global_steps`` after the step).
"""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("deepspeed")

from stability_callbacks.integrations.deepspeed import attach, roll_back_latest  # noqa: E402
from stability_callbacks.monitor import STATE_VERSION  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DRIVER = ROOT / "tests" / "dist" / "ds_scenarios.py"
CASES = ("loud-z1", "monitor-z1", "overflow-z1", "overflow-z0", "pocket-z2", "nan-z0", "spike-z3", "streams-z1", "nonorm-z2",
         "crash-z1", "skip-z2", "rollback-z1", "hostsync-z2", "forensics-z2")
LAUNCH_TIMEOUT_S = 420


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def ds(tmp_path_factory) -> dict:
    """case -> [rank0 result, rank1 result]."""
    out = tmp_path_factory.mktemp("ds")
    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1",
               PYTHONPATH=f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
           "--master_port", str(_free_port()), str(DRIVER), str(out), *CASES]
    try:
        proc = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True,
                              timeout=LAUNCH_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:   # a hang (e.g. a one-rank save) must fail, not block
        pytest.fail(f"torchrun timed out after {LAUNCH_TIMEOUT_S}s:\n{(e.stderr or '')[-4000:]}")
    results = {}
    for case in CASES:
        ranks = []
        for r in (0, 1):
            path = out / f"{case}.rank{r}.json"
            ranks.append(json.loads(path.read_text()) if path.exists() else None)
        results[case] = ranks
    crashes = {c: rs for c, rs in results.items() if any(r is None or "crash" in r for r in rs)}
    if proc.returncode != 0 or crashes:
        pytest.fail(f"torchrun rc={proc.returncode}; crashed cases: "
                    f"{ {c: [r and r.get('crash') for r in rs] for c, rs in crashes.items()} }\n"
                    f"{proc.stderr[-4000:]}")
    return results


def kinds(result) -> list:
    """(step, kind, severity) of every finding, in order."""
    return [tuple(f) for f in result["findings"]]


def first(result, kind: str):
    return next((tuple(f) for f in result["findings"] if f[1] == kind), None)


def _comparable(result):
    # rank 0 alone reads the run log and moves folders; everything decided must be identical.
    drop = {"records", "seconds", "actions", "seen"}   # seen: this rank's own data
    res = {k: v for k, v in result.items() if k not in drop}
    for part in ("first", "second"):
        if part in res:
            res[part] = {k: v for k, v in res[part].items() if k not in drop}
    if "helper" in res:
        res["helper"] = {k: v for k, v in res["helper"].items() if k != "moved"}
    return res


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_every_rank_decides_the_same(ds, case):
    rank0, rank1 = ds[case]
    assert _comparable(rank0) == _comparable(rank1)


@pytest.mark.slow
def test_a_bad_config_raises_at_attach_and_an_unwritable_run_dir_is_one_warning(ds):
    r0 = ds["loud-z1"][0]
    assert r0["errors"] == ["policy.halt_on", "actions.slack.webhook_url"]
    # DeepSpeed's linear warmup over 2 steps runs its peak LR first at step 4 (W + 2): the warmup
    # ends there, and its risk window (from step 5) bumps the save interval to 1
    assert r0["last_step"] == 6 and r0["findings"] == [[4, "warmup_end", "info"]]
    (warning,) = r0["records"]["warnings"]   # rank 0 writes the run log, and says it cannot, once
    assert warning.startswith("stability: cannot write the run log") and "detection and alerts go on" in warning
    # The hook's own save into <run_dir>/checkpoints: one line, once, on every rank (each skips
    # the collective save alike), no traceback.
    for rank in ds["loud-z1"]:
        assert rank["records"]["save_warnings"] == [
            "stability: cannot save the checkpoint of step 5 into BLOCKER/stability/checkpoints (Not a directory); "
            "the monitor's saves are off, training and detection go on"]
        assert rank["saved_steps"] == []


@pytest.mark.slow
def test_the_ds_config_monitor_gets_the_scalars_and_the_run_lives_with_its_checkpoints(ds):
    """A ``monitor.tensorboard`` section in ds_config: DeepSpeed's own event file holds
    ``stability/loss`` at every step of the three runs (x = samples, DeepSpeed's axis: 8+2 steps
    of the first two, then 2 of a fresh start). The run's folder is ``<save_dir>/stability``, and
    the engine that loads from the checkpoint folder lands there too and continues that run log;
    a fresh start moves it aside."""
    r0 = ds["monitor-z1"][0]
    assert r0["run_dirs"] == ["ckpt/stability"] * 3
    rec = r0["records"]
    g = rec["samples_per_step"]
    assert rec["loss_x"] == [s * g for s in range(1, 11)] + [g, 2 * g]
    assert rec["continued"] == [[0, 0, "start"], [1, 8, "resume"]]
    assert rec["runlogs"] == ["runlog.1.jsonl", "runlog.jsonl"]
    assert rec["fresh_segments"] == [[0, 0, "start"]]


@pytest.mark.slow
def test_ordinary_steps_read_only_the_packed_record_and_adams_step(ds):
    # tests/test_host_sync.py under ZeRO-2 on 2 ranks (the reductions on their GPU path): over
    # steps 4-11 the hook reads the packed record and Adam's CPU step count, once per step each;
    # DeepSpeed's own reads are DeepSpeed's.
    for rank in ds["hostsync-z2"]:
        assert rank["reads"] == {"packed.py/_decode/tolist": 8, "probe.py/_sample_adam_hyperparams/scalar": 8}
        assert kinds(rank) == [(7, "warmup_end", "info")]   # linear warmup 5: peak LR first at step 7


@pytest.mark.slow
def test_fp16_overflow_cascade_is_called_before_deepspeeds_minimum_scale_exit(ds):
    r = ds["overflow-z1"][0]
    # Every step overflows from step 25 on. ZeRO's scaler (initial 2**8, hysteresis 2) keeps
    # 256 at the first overflow, then halves: 128 at 26 ... 1 at 33, and exits at 34.
    rec = {int(k): v for k, v in r["records"].items()}
    assert [rec[s]["skipped"] for s in range(23, 34)] == [0.0] * 2 + [1.0] * 9
    assert [rec[s]["loss_scale"] for s in range(24, 34)] == [256.0, 256.0, 128.0, 64.0, 32.0,
                                                             16.0, 8.0, 4.0, 2.0, 1.0]
    assert rec[25]["grad_norm"] == "inf" and 0 < rec[24]["grad_norm"] < 10
    # The LR each step used (read before _take_model_step): DeepSpeed's linear WarmupDecayLR
    # runs step s at iteration s-2, so 0, 0, lr/5, ... lr at step 7; frozen while steps skip.
    assert [rec[s]["lr"] for s in (1, 2)] == [0.0, 0.0]
    assert rec[3]["lr"] == pytest.approx(3e-3 / 5) and rec[7]["lr"] == pytest.approx(3e-3)
    assert {rec[s]["lr"] for s in range(25, 34)} == {rec[25]["lr"]} and rec[25]["lr"] < rec[24]["lr"]
    assert r["ds_error"]["step"] == 34 and "minimum" in r["ds_error"]["message"]
    # Third skip in the window: overflow_burst; 3 halvings down: loss_scale_collapse, a warning;
    # scale 4 (6 halvings down, 2 above the floor): critical -> halt (policy.halt_on: critical)
    # three steps before the exit.
    assert first(r, "overflow_burst") == (27, "overflow_burst", "warning")
    assert [(f[0], f[2]) for f in r["findings"] if f[1] == "loss_scale_collapse"] == [(28, "warning"), (31, "critical")]
    assert r["stopped_at"] == r["halted_at"] == 31 and r["first_error"] is None
    # The warning saved a checkpoint while the state was good; nothing after the collapse.
    assert r["saved_steps"] == [27]
    assert r["control"] == {"stop": True, "state_is_good": False}


@pytest.mark.slow
def test_zero0_fp16_overflow_cascade(ds):
    r = ds["overflow-z0"][0]
    # ZeRO-0 fp16 is FP16_UnfusedOptimizer: no hysteresis (256 -> 128 at the first overflow),
    # its scale lives elsewhere (loss_scale_config), and it clamps at the minimum, no exit.
    rec = {int(k): v for k, v in r["records"].items()}
    assert [rec[s]["skipped"] for s in range(23, 31)] == [0.0] * 2 + [1.0] * 6
    assert [rec[s]["loss_scale"] for s in range(24, 31)] == [256.0, 128.0, 64.0, 32.0, 16.0, 8.0, 4.0]
    assert first(r, "overflow_burst") == (27, "overflow_burst", "warning")
    assert [(f[0], f[2]) for f in r["findings"] if f[1] == "loss_scale_collapse"] == [(27, "warning"), (30, "critical")]
    assert first(r, "nonfinite") is None            # an fp16 overflow is not a NaN
    assert r["stopped_at"] == r["halted_at"] == 30
    assert r["ds_error"] is None and r["first_error"] is None


@pytest.mark.slow
def test_bf16_zero2_data_pocket_spike_saves_and_state(ds):
    r = ds["pocket-z2"][0]
    exp = r["expected"]
    spike, recovered = first(r, "loss_spike"), first(r, "spike_recovered")
    assert spike[1:] == ("loss_spike", "warning") and exp["loss_spike"][0] <= spike[0] <= exp["loss_spike"][1]
    assert exp["spike_recovered"][0] <= recovered[0] <= exp["spike_recovered"][1]
    assert not [f for f in r["findings"] if f[2] == "critical"]
    # Saves the hook made itself (policy.bump_save_interval_to: 5): every 5 steps inside the
    # warmup-end risk window (linear warmup 5: the peak LR first at step 7 -> window (7, 28]), a save now at the
    # spike (25), then the bumped interval after the warning to the end.
    assert first(r, "warmup_end")[0] == 7
    assert r["saved_steps"] == [10, 15, 20, 25, 30, 35, 40, 45]
    assert [t for t in r["tags"] if t.startswith("global_step")] == sorted(
        f"global_step{s}" for s in r["saved_steps"])
    assert r["runlog_checkpoints"] == r["saved_steps"]
    # client_state["stability"] of the first save: the live state as of that step.
    st = r["saved_state"]
    assert st["live"]["monitor"]["version"] == STATE_VERSION and st["step"] == 10
    assert st["live"]["monitor"]["monitor"]["last_step"] == 10
    assert st["live"]["monitor"]["policy"]["checkpoints"][-1][0] == 10
    # One record per optimizer step, with every signal; Adam statistics over both ZeRO-2
    # partitions add up to exactly the model's parameter count (alignment padding excluded).
    assert r["runlog_steps"] == list(range(1, 46))
    rec = r["first_record"]
    assert set(rec) >= {"loss", "grad_norm", "lr", "adam/exp_avg_sq_max", "adam/exp_avg_sq_l1",
                        "adam/exp_avg_sq_numel", "consumed_samples", "batch_fingerprint"}
    assert rec["adam/exp_avg_sq_numel"] == r["param_count"]
    # the probe's tensors carry the module's names (ZeRO-2 numbers them by its bit16 groups)
    assert sorted(r["tensor_names"]) == sorted(r["param_names"]) and len(r["param_names"]) > 10
    assert rec["lr"] == 0.0 and rec["consumed_samples"] == 8.0   # 2 ranks x micro-batch 4
    assert "loss_scale" not in rec and "skipped" not in rec      # bf16: no scaler
    # What the hook did and why, in the run log (rank 0 writes it).
    window = "inside the warmup-end risk window (steps 8-28)"
    after = "for 1000 steps after a warning (until step 1025)"
    assert r["actions"] == [[8, "save_interval", window]] + [
        [s, "save", f"bumped save interval (5 steps): {window}"] for s in (10, 15, 20)] + [
        [25, "save", "save now: loss_spike (warning) at step 25"]] + [
        [s, "save", f"bumped save interval (5 steps): {after}"] for s in (30, 35, 40, 45)]


@pytest.mark.slow
def test_a_spike_names_every_ranks_samples_and_ranks_the_garbage_first(ds):
    """``forensics-z2``: hook.batches over a DistributedSampler loader (rank r reads samples r,
    r+2, ... of each step), 3 garbage samples among step 25's 8; the finding names both ranks'
    indices (one gather at the finding), and rank 0 writes the ranked batch."""
    r = ds["forensics-z2"][0]
    assert r["pocket"] == [193, 196, 198]
    assert first(r, "loss_spike") == (25, "loss_spike", "warning")
    samples = r["samples"]["loss_spike"]
    assert samples["indices"] == [192, 194, 196, 198, 193, 195, 197, 199] and samples["ranks"] == 2
    assert samples["neighbours"] == {"23": [176, 178, 180, 182, 177, 179, 181, 183],
                                     "24": [184, 186, 188, 190, 185, 187, 189, 191]}
    assert {t["index"] for t in samples["ranked"]["top"]} == set(r["pocket"])
    dump = r["records"]["dump"]
    assert [(x["index"], x["rank"]) for x in dump[:3]] == [(t["index"], t["index"] % 2) for t in samples["ranked"]["top"]]
    assert sorted(x["index"] for x in dump) == list(range(192, 200))
    assert r["samples"]["spike_recovered"] == {"step": 25, "indices": samples["indices"], "ranks": 2}


@pytest.mark.slow
def test_nan_halts_every_rank_at_the_same_step_and_rolls_back_latest(ds):
    r = ds["nan-z0"][0]["first"]
    nan_step = r["expected"]["nonfinite"][0]
    assert first(r, "nonfinite") == (nan_step, "nonfinite", "critical")
    assert r["stopped_at"] == r["train"]["left_at"] == nan_step     # on CPU: at the step itself
    # No save of damaged weights: neither before the halt nor the loop's own save after it.
    assert r["saved_steps"] == [] and r["train"]["save_after_halt"] is False
    halt = f"nonfinite (critical) at step {nan_step}; policy.halt_on = critical"
    damaged = f"refused: the weights are damaged (nonfinite at step {nan_step})"
    assert r["actions"] == [[8, "save_interval", "inside the warmup-end risk window (steps 8-28)"],
                            [nan_step, "stop", halt],
                            [nan_step, "save_blocked", f"before the halt: {halt}; {damaged}"],
                            [nan_step, "save_blocked", f"the loop's save_checkpoint; {damaged}"]]
    assert r["train"]["user_saves"] == {"5": True, "10": True, "15": True, "20": True}
    # rollback_on_halt: latest names the advised good checkpoint; newer tags moved aside.
    adv = r["rollback"]
    good = adv["checkpoint_step"]
    # the last checkpoint before the NaN; start-up transients do not drag the onset back
    assert (good, adv["onset_step"], adv["skip_steps"]) == (20, nan_step, [nan_step, nan_step])
    assert adv["checkpoint_path"].endswith(f"ckpt/global_step{good}")
    assert r["latest"] == f"global_step{good}"
    assert r["aside"] == sorted(f"global_step{s}" for s in (5, 10, 15, 20) if s > good)
    assert sorted(t for t in r["tags"] if t.startswith("global_step")) == sorted(
        f"global_step{s}" for s in (5, 10, 15, 20) if s <= good)


@pytest.mark.slow
def test_nan_step1_loss_and_grad_norm_match_the_plain_model(ds):
    r = ds["nan-z0"][0]["first"]
    # fp32 ZeRO-0: the engine keeps no grad norm, the hook computes it (pre-clip, before the
    # step); the loss is the mean over 2 micro-batches x 2 ranks = the global batch's loss.
    ref, got = r["reference"], r["step1"]
    assert got["loss"] == pytest.approx(ref["loss"], rel=1e-6)
    assert got["grad_norm"] == pytest.approx(ref["grad_norm"], rel=1e-6)


@pytest.mark.slow
def test_restart_from_latest_restores_the_detector_state(ds):
    adv = ds["nan-z0"][0]["first"]["rollback"]
    good = adv["checkpoint_step"]
    r = ds["nan-z0"][0]["second"]
    # A fresh engine + hook; engine.load_checkpoint(save_dir) follows `latest`.
    assert r["restored"] == {"load_path": f"global_step{good}", "global_steps": good, "segment": 1,
                             # restored from client_state (a fresh Monitor knows no warmup end yet)
                             "warmup_end_step": 7,
                             "checkpoints": [s for s in (5, 10, 15, 20) if s <= good]}
    assert r["segments"] == [[0, 0, "start"], [1, good, "resume"]]
    assert kinds(r)[0] == (good, "resume", "info")
    # The advised batches skipped: no NaN again, no second warmup_end, no halt.
    found = {f[1] for f in r["findings"]}
    assert not found & {"nonfinite", "warmup_end", "rollback_advice"}
    assert r["stopped_at"] is None and r["control"]["state_is_good"] is True


@pytest.mark.slow
def test_zero3_warmup_spike_escalates(ds):
    r = ds["spike-z3"][0]
    exp = r["expected"]
    # linear warmup_num_steps 18 -> step 20 is the first at the peak LR (the scheduler lags a step)
    assert first(r, "warmup_end") == (20, "warmup_end", "info")
    spike = first(r, "loss_spike")
    assert spike[1:] == ("loss_spike", "warning") and exp["loss_spike"][0] <= spike[0] <= exp["loss_spike"][1]
    esc = first(r, "warmup_instability")
    # no precursor before the spike: a warning escalation (save now), not a halt (issue 27)
    assert esc[2] == "warning" and exp["warmup_instability"][0] <= esc[0] <= exp["warmup_instability"][1]
    assert not first(r, "nonfinite")
    assert r["saved_steps"] == [spike[0]]   # save now at the warning (default interval: 300)
    # ZeRO-3 numbers the probe's tensors by its fp16 groups: each carries the module's name
    assert sorted(r["tensor_names"]) == sorted(r["param_names"]) and len(r["param_names"]) > 10


@pytest.mark.slow
def test_rollback_helper_on_real_checkpoints(ds):
    good = ds["nan-z0"][0]["first"]["rollback"]["checkpoint_step"]
    h = ds["nan-z0"][0]["helper"]
    # roll_back_latest(save_dir, "global_step5") after the halt's own rollback to `good`: the
    # tags still in place after 5 move too; everything newer than 5 is kept in rolled_back/.
    assert h["moved"] == [f"global_step{s}" for s in (10, 15, 20) if s <= good]
    assert h["latest"] == "global_step5"
    assert [t for t in h["tags"] if t.startswith("global_step")] == ["global_step5"]
    assert h["aside"] == ["global_step10", "global_step15", "global_step20"]


def test_roll_back_latest_keeps_everything(tmp_path):
    for tag in ("global_step100", "global_step200", "global_step300"):
        (tmp_path / tag).mkdir()
    (tmp_path / "rolled_back" / "global_step300").mkdir(parents=True)   # from an earlier rollback
    (tmp_path / "latest").write_text("global_step300")
    assert roll_back_latest(tmp_path, "global_step100") == ["global_step200", "global_step300"]
    assert (tmp_path / "latest").read_text() == "global_step100"
    assert sorted(os.listdir(tmp_path / "rolled_back")) == ["global_step200", "global_step300",
                                                            "global_step300.1"]
    with pytest.raises(ValueError, match="tag: 'global_step7'"):
        roll_back_latest(tmp_path, "global_step7")


def test_attach_rejects_what_is_not_an_engine():
    with pytest.raises(ValueError, match="engine must be a deepspeed engine, got object"):
        attach(object())


@pytest.mark.slow
def test_per_dataset_losses_are_the_mean_over_micro_batches_and_ranks(ds):
    """The model output's ``stream_losses`` (declared in sampling.loss_streams) on 2 ranks."""
    r0, r1 = ds["streams-z1"]
    ga = r0["grad_accum"]
    assert ga == 2 and len(r0["records"]) == 4 and r0["seen"] != r1["seen"]   # ranks differ
    for i, m in enumerate(r0["records"]):
        parts = [r["seen"][ga * i + k] for r in (r0, r1) for k in range(ga)]
        assert m["loss/a"] == pytest.approx(sum(p[0] for p in parts) / len(parts), rel=1e-6)
        assert m["loss/b"] == pytest.approx(sum(p[1] for p in parts) / len(parts), rel=1e-6)


@pytest.mark.slow
def test_compute_grad_norm_false_falls_back_to_our_own_norm(ds):
    r0, r1 = ds["nonorm-z2"]
    assert r0["engine_keeps_norm"] == {"True": True, "False": False}   # DeepSpeed: None with the flag off
    norms = r0["records"]
    assert len(norms["False"]) == 4 and None not in norms["False"]
    assert norms["False"] == pytest.approx(norms["True"], rel=1e-6)     # the norm DeepSpeed would report
    for r in (r0, r1):   # once per process, an info
        assert r["infos"] == ["stability: DeepSpeed computes no grad norm (zero_optimization."
                              "compute_grad_norm: false); the monitor computes it (one pass over the "
                              "gradient partitions and one all_reduce per step)"]


@pytest.mark.slow
def test_an_exception_leaving_the_with_block_is_one_crash_alert(ds):
    r = ds["crash-z1"][0]
    assert r["same_object"] and r["closed"]
    assert r["findings"][-1] == [3, "crash", "critical"]
    # Both ranks raise: the one that failed first alerts, once, naming itself.
    assert r["records"]["received"] == [[3, "crash", "critical"]]
    details = r["records"]["finding"]["details"]
    assert details["exception"] == "RuntimeError" and details["rank"] in (0, 1)
    assert r["records"]["finding"]["message"].startswith(
        f"Training crashed on rank {details['rank']} in step 4 with RuntimeError: NCCL error: "
        f"unhandled system error.")


@pytest.mark.slow
def test_skip_step_goes_through_deepspeeds_overflow_path(ds):
    """bf16 ZeRO-2 (DeepSpeed does not test the norm of bf16 steps by itself): the pocket's three
    outlier steps are skipped by DeepSpeed (skipped_steps, no LR-scheduler step), and the
    weights equal those of a run that never had them, on both ranks."""
    r = ds["skip-z2"][0]
    assert r["same_as_without"] and ds["skip-z2"][1]["same_as_without"]
    assert (r["skipped_steps"], r["global_steps"], r["records"]["flags"]) == (3, 32, [25, 26, 27])
    assert [tuple(f) for f in r["findings"] if f[1] == "step_skipped"] == [
        (25, "step_skipped", "warning"), (26, "step_skipped", "warning"), (27, "step_skipped", "critical")]
    # The record keeps the real norm (DeepSpeed reports inf for a step it skipped).
    before, skipped = r["records"]["norms"]
    assert 3 * before < skipped < 100


@pytest.mark.slow
def test_automatic_rollback_in_process_with_hook_batches(ds):
    r = ds["rollback-z1"][0]
    assert r["same_as_without"] and ds["rollback-z1"][1]["same_as_without"]
    assert r["global_steps"] == 45 and r["stopped_at"] is None
    # the spike at 25 is inside the warmup-end risk window (8-28): escalated, upgraded when it
    # does not recover
    assert [tuple(f) for f in r["findings"] if f[2] != "info"] == [
        (25, "loss_spike", "warning"), (25, "warmup_instability", "warning"), (35, "spike_unrecovered", "critical"),
        (35, "warmup_instability", "critical"), (35, "rollback_advice", "critical"), (35, "auto_rollback", "warning")]
    assert r["records"]["segments"] == [[0, 0, "start"], [1, 20, "rollback"]]
    assert [a for a in r["actions"] if a[1] == "rollback"] == [
        [35, "rollback", "spike_unrecovered (critical) at step 35; policy.auto_rollback: back to the "
                         "checkpoint of step 20, skipping the data of steps 25-40"]]
    # the abandoned branch's tags moved aside; the new branch, still inside the risk window (8-28),
    # saves step 25 on the bumped interval: latest
    assert r["latest"] == "global_step25" and r["aside"] == ["global_step25", "global_step30"]
