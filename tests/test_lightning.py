"""Lightning StabilityCallback: real ``Trainer.fit`` on the planted-fault scenarios (CPU)."""
from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pl = pytest.importorskip("lightning.pytorch")

from stability_callbacks.advice import native_forms  # noqa: E402
from stability_callbacks.demo.scenarios import build_scenario  # noqa: E402
from streams import two_stream_losses  # noqa: E402
from stability_callbacks.integrations.lightning import StabilityCallback  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent


class ScenarioModule(pl.LightningModule):
    """The scenario's tiny GPT-2 with its AdamW + linear-warmup schedule (stepped per step)."""

    def __init__(self, scenario):
        super().__init__()
        self.scenario = scenario
        self.model = scenario.make_model()

    def training_step(self, batch, batch_idx):
        return self.model(input_ids=batch["input_ids"], labels=batch["labels"]).loss

    def configure_optimizers(self):
        opt, sched = self.scenario.make_optimizer(self.model)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def fit(sc, tmp_path, *, config=None, dataset=None, max_steps=None, ckpt_path=None,
        run_dir="stability", checkpoint_dir="ckpt", callbacks=(), module=None, **trainer_kwargs):
    cb = StabilityCallback(config=config, run_dir=tmp_path / run_dir,
                           checkpoint_dir=tmp_path / checkpoint_dir)
    loader = torch.utils.data.DataLoader(sc.train_dataset() if dataset is None else dataset,
                                         batch_size=sc.batch_size, shuffle=False)
    kwargs = dict(accelerator="cpu", devices=1, max_steps=max_steps or sc.max_steps,
                  accumulate_grad_batches=sc.grad_accum, gradient_clip_val=1.0, logger=False,
                  enable_progress_bar=False, enable_model_summary=False,
                  enable_checkpointing=False, default_root_dir=tmp_path)
    kwargs.update(trainer_kwargs)
    trainer = pl.Trainer(callbacks=[cb, *callbacks], **kwargs)
    module = module or ScenarioModule(sc)
    trainer.fit(module, loader, ckpt_path=ckpt_path)
    return cb, trainer


def first_steps(findings) -> dict[str, int]:
    """kind -> step of its first finding (Finding objects or their JSON dicts)."""
    out: dict[str, int] = {}
    for f in findings:
        kind, step = (f["kind"], f["step"]) if isinstance(f, dict) else (f.kind, f.step)
        out.setdefault(kind, step)
    return out


def runlog(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


# ------------------------------------------------------------------------------ planted faults
# The same scenarios (model, data order, LR schedule, clipping at 1.0) as the HF Trainer tests.
# Trainer.max_steps stops a little after the fault (the schedule is the scenario's, unchanged)
# to keep the suite short.
SCENARIO_CONFIG = {"policy": {"halt_on": "critical", "bump_save_interval_to": 4}}


def _config(sc, **policy):
    cfg = json.loads(json.dumps(SCENARIO_CONFIG))
    # Risk window = (warmup_end, warmup_end + 2 x warmup]: the bumped saves inside are exact.
    cfg["phase"] = {"warmup_steps": sc.warmup_steps, "risk_window_factor": 2}
    cfg["policy"].update(policy)
    return cfg


def _stop_step(sc) -> int:
    return sc.fault_steps[-1] + 5      # the spike, its recovery, and a few steps more


def _resume_step(sc) -> int:
    return sc.fault_steps[0] - 5       # a checkpoint before the fault: the resumed run meets it


@pytest.fixture(scope="module")
def pocket_run(tmp_path_factory):
    """data-pocket, uninterrupted; a ModelCheckpoint also saves the resume point mid-run."""
    tmp = tmp_path_factory.mktemp("pocket")
    sc = build_scenario("data-pocket")
    mc = pl.callbacks.ModelCheckpoint(dirpath=tmp / "mc", every_n_train_steps=_resume_step(sc),
                                      save_top_k=-1)
    cb, trainer = fit(sc, tmp, config=_config(sc), max_steps=_stop_step(sc), callbacks=[mc],
                      enable_checkpointing=True)
    return sc, cb, trainer, tmp


def _resume_checkpoint(tmp, step: int) -> Path:
    (path,) = (tmp / "mc").glob(f"epoch=*-step={step}.ckpt")
    return path


@pytest.mark.slow
def test_data_pocket(pocket_run):
    sc, cb, trainer, tmp = pocket_run
    first = first_steps(cb.findings)
    spike = sc.fault_steps[0]
    assert first["loss_spike"] == spike == sc.expected["loss_spike"][0]
    lo, hi = sc.expected["spike_recovered"]
    assert lo <= first["spike_recovered"] <= min(hi, _stop_step(sc))
    assert [f.severity for f in cb.findings if f.kind == "loss_spike" and f.step == spike] == \
        ["warning"]
    # The spike names the pocket's first step's samples; its recovery the whole pocket.
    named = next(f for f in cb.findings if f.kind == "loss_spike").details["samples"]
    assert (named["step"], named["indices"]) == (spike, sc.pocket_indices(steps=(spike,)))
    episode = next(f for f in cb.findings if f.kind == "spike_recovered").details["samples"]
    assert episode["indices"] + sum(episode["neighbours"].values(), []) == sc.pocket_indices()
    assert trainer.global_step == _stop_step(sc) and not trainer.should_stop
    # The bumped interval (4) inside the risk window, a save now at the spike (warning), then
    # the bumped interval again after the warning; trainer.save_checkpoint each time.
    w = sc.warmup_steps
    assert [s for s, _ in cb.saved] == [s for s in range(w + 1, 3 * w + 1) if s % 4 == 0] + \
        [spike] + [s for s in range(spike + 1, _stop_step(sc) + 1) if s % 4 == 0]
    assert all(Path(p).is_file() for _, p in cb.saved)
    # The user's ModelCheckpoint keeps its own interval; the Monitor hears of its saves too.
    mc_steps = sorted(int(p.stem.split("step=")[1]) for p in (tmp / "mc").glob("epoch=*.ckpt"))
    assert mc_steps == [_resume_step(sc)]
    lines = runlog(tmp / "stability" / "runlog.jsonl")
    assert lines[0] == {"type": "segment", "segment": 0, "start_step": 0, "reason": "start"}
    logged = [r for r in lines if r["type"] == "checkpoint"]
    assert sorted(r["step"] for r in logged) == sorted([s for s, _ in cb.saved] + mc_steps)
    # Every step's record carries the batch fingerprint (the resume auditor reads it).
    steps = [r for r in lines if r["type"] == "step"]
    assert [r["step"] for r in steps] == list(range(1, _stop_step(sc) + 1))
    assert all("batch_fingerprint" in r["metrics"] and "grad_norm" in r["metrics"] for r in steps)
    assert {r["epoch"] for r in steps} == {1}   # each record says its epoch (from 1): one epoch here


@pytest.mark.slow
def test_resume_continues_detector_state(pocket_run, tmp_path):
    sc, ref_cb, _, tmp = pocket_run
    r = _resume_step(sc)
    g = sc.samples_per_step()
    rest = torch.utils.data.Subset(sc.train_dataset(), range(r * g, _stop_step(sc) * g))
    cb, trainer = fit(sc, tmp_path, config=_config(sc), dataset=rest, max_steps=_stop_step(sc),
                      ckpt_path=_resume_checkpoint(tmp, r))
    assert trainer.global_step == _stop_step(sc)
    ref = [(f.step, f.kind, f.severity) for f in ref_cb.findings if f.step > r]
    got = [(f.step, f.kind, f.severity) for f in cb.findings
           if f.kind not in ("resume", "resume_spike")]
    assert got == ref and ("loss_spike" in {k for _, k, _ in ref})   # carried on where it stopped
    # The resume-spike watch (steps right after a resume) sees the planted spike as well.
    assert [f.step for f in cb.findings if f.kind == "resume_spike"] == [sc.fault_steps[0]]
    assert [(f.step, f.kind) for f in cb.findings if f.kind == "resume"] == [(r, "resume")]
    seg = [x for x in runlog(tmp_path / "stability" / "runlog.jsonl") if x["type"] == "segment"]
    assert seg == [{"type": "segment", "segment": 1, "start_step": r, "reason": "resume"}]


def test_resume_with_data_from_scratch_finds_repetition(pocket_run, tmp_path):
    """Lightning restores the loop, not a map-style loader's position: the data restarts at the
    first batch. The fingerprints say so at the first step after the resume."""
    sc, _, _, tmp = pocket_run
    r = _resume_step(sc)
    cb, trainer = fit(sc, tmp_path, config=_config(sc), max_steps=r + 2,
                      ckpt_path=_resume_checkpoint(tmp, r))
    rep = [f for f in cb.findings if f.kind == "data_repetition"]
    assert [(f.step, f.severity, f.details.get("repeats_step")) for f in rep] == \
        [(r + 1, "critical", 1)]


@pytest.mark.slow
def test_nan_halts_without_saving_damaged_weights(tmp_path, caplog):
    sc = build_scenario("nan")
    (fault,) = sc.fault_steps
    # A ModelCheckpoint that would save every step: damaged weights must not reach it either.
    mc = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "mc", every_n_train_steps=1,
                                      save_top_k=-1, save_last=True)
    with caplog.at_level("INFO", logger="stability_callbacks"):
        cb, trainer = fit(sc, tmp_path, config=_config(sc), callbacks=[mc], enable_checkpointing=True)
    # The end: halted, why, and the advice in Lightning's form only.
    o = cb.outcome
    halt = f"nonfinite (critical) at step {fault}; policy.halt_on = critical"
    assert (o.halted, o.halted_at, o.reason, o.exit_code) == (True, fault, halt, 3)
    assert o.advice == native_forms(cb.run.control.rollback.details, ("lightning",))["lightning"]
    assert o.advice.startswith('trainer.fit(model, datamodule=dm, ckpt_path="')
    (summary,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith("stability: the run")]
    assert summary.splitlines()[0] == f"stability: the run halted at step {fault}: {halt}"
    assert summary.splitlines()[-3:] == [f"  roll back: {o.advice}",
                                         f"  run log: {tmp_path / 'stability' / 'runlog.jsonl'}",
                                         "  report: none (report.enabled is false)"]
    first = first_steps(cb.findings)
    assert first["nonfinite"] == fault
    assert cb.findings[[f.kind for f in cb.findings].index("nonfinite")].severity == "critical"
    assert trainer.global_step == fault and trainer.should_stop      # halted at the fault
    w = sc.warmup_steps
    # Only the bumped saves of the risk window, all before the fault; nothing from it on.
    assert [s for s, _ in cb.saved] == [s for s in range(w + 1, 3 * w + 1) if s % 4 == 0]
    assert max(s for s, _ in cb.saved) < fault
    steps = sorted(int(p.stem.split("step=")[1]) for p in (tmp_path / "mc").glob("epoch=*.ckpt"))
    assert steps == list(range(1, fault))                            # nothing from step 35 on
    last = torch.load(tmp_path / "mc" / "last.ckpt", weights_only=False)
    assert last["global_step"] == fault - 1
    # Every save noted once, with its step and its step-named file (the callback's own, then
    # ModelCheckpoint's, where both saved: a resume from either continues the run log), never as
    # last.ckpt (save_last=True copies each save there): the advice names the step-named
    # checkpoint just before the fault.
    noted = [(x["step"], Path(x["path"]).name) for x in runlog(tmp_path / "stability" / "runlog.jsonl")
             if x["type"] == "checkpoint"]
    assert noted == [(s, name) for s in range(1, fault) for name in
                     ([f"stability-step={s}.ckpt"] if s in dict(cb.saved) else []) + [f"epoch=0-step={s}.ckpt"]]
    assert cb.run.control.rollback.details["checkpoint_step"] == fault - 1
    assert o.advice.startswith(f'trainer.fit(model, datamodule=dm, ckpt_path="{tmp_path / "mc"}/'
                               f'epoch=0-step={fault - 1}.ckpt") (step {fault - 1})')
    # The last checkpoint holds good weights (wte keeps its planted +inf row, nothing else).
    assert all(torch.isfinite(v).all() for k, v in last["state_dict"].items()
               if v.is_floating_point() and "wte" not in k)


def test_a_last_ckpt_saved_over_is_advised_only_as_the_newest(tmp_path):
    """``ModelCheckpoint(save_top_k=0, save_last=True)``: every save goes to last.ckpt, saved over
    each time. Each save is noted at its own step; last.ckpt stands for the newest one only, so
    the advice names it with the step it holds."""
    sc = build_scenario("nan", fault_step=12, max_steps=12)
    mc = pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "mc", every_n_train_steps=5, save_top_k=0, save_last=True)
    cb, _ = fit(sc, tmp_path, config={"policy": {"halt_on": "critical"}, "report": {"enabled": False}},
                callbacks=[mc], enable_checkpointing=True)
    last = tmp_path / "mc" / "last.ckpt"
    assert torch.load(last, weights_only=False)["global_step"] == 10
    assert [(x["step"], x["path"]) for x in runlog(tmp_path / "stability" / "runlog.jsonl")
            if x["type"] == "checkpoint"] == [(5, str(last)), (10, str(last))]
    advice = cb.run.control.rollback
    assert (advice.details["checkpoint_step"], advice.details["checkpoint_path"]) == (10, str(last))
    assert cb.outcome.advice.startswith(f'trainer.fit(model, datamodule=dm, ckpt_path="{last}") (step 10)')


@pytest.mark.slow
def test_warmup_spike_escalates_saves_and_halts(tmp_path):
    sc = build_scenario("warmup-spike")
    spike = sc.fault_steps[0]
    from lightning.pytorch.loggers import CSVLogger

    # The halt's mechanics: every instability in the risk window is critical here (the default
    # escalates this recovering spike to a warning only: tests/test_hard_cases.py)
    cb, trainer = fit(sc, tmp_path, config=_config(sc, bump_save_interval_to=2, warmup_escalation="any"),
                      log_every_n_steps=10, logger=CSVLogger(tmp_path, name="csv", version=0))
    first = first_steps(cb.findings)
    assert first["warmup_end"] == sc.warmup_steps
    assert first["loss_spike"] == spike
    lo, hi = sc.expected["warmup_instability"]
    assert lo <= first["warmup_instability"] <= hi
    assert trainer.global_step == spike and trainer.should_stop
    # Inside the risk window the bumped interval (2) saves; the spike saves now, then halts.
    assert [s for s, _ in cb.saved] == \
        [s for s in range(sc.warmup_steps + 1, spike) if s % 2 == 0] + [spike]
    # What the callback did and why, in the run log: the halt first, then the save before it.
    actions = [(x["step"], x["action"], x["reason"].split(":")[0])
               for x in runlog(tmp_path / "stability" / "runlog.jsonl") if x["type"] == "action"]
    w, halt = sc.warmup_steps, f"warmup_instability (critical) at step {spike}; policy.halt_on = critical"
    assert actions == [(w + 1, "save_interval", f"inside the warmup-end risk window (steps {w + 1}-{3 * w})")] + [
        (s, "save", "bumped save interval (2 steps)") for s in range(w + 1, spike) if s % 2 == 0] + [
        (spike, "stop", halt), (spike, "save", "before the halt")]
    # The signals and findings reach callback_metrics (pl_module.log with logger=False).
    assert trainer.callback_metrics["stability/finding/warmup_instability"] == 3.0
    assert float(trainer.callback_metrics["stability/lr"]) == pytest.approx(sc.lr_at(spike))
    # The logger (a real CSVLogger): the signals at log_every_n_steps, each finding once, at its
    # own step (through pl_module.log a finding's value came back at later logging steps).
    import csv
    rows = list(csv.DictReader(open(tmp_path / "csv" / "version_0" / "metrics.csv")))
    at = lambda key: [int(r["step"]) for r in rows if r.get(key)]  # noqa: E731
    assert at("stability/loss") == [10, 20]
    assert at("stability/finding/warmup_end") == [first["warmup_end"]]
    assert at("stability/finding/warmup_instability") == [first["warmup_instability"]]


def test_grad_norm_is_pre_clip_and_clipping_reuses_it(tmp_path):
    """The recorded norm is Lightning's pre-clip norm, and the clipping (taken over) gives the
    same weights as Lightning's own clip_grad_norm_."""
    sc = build_scenario("healthy", max_steps=6)
    cb, trainer = fit(sc, tmp_path, config=_config(sc), max_steps=3, gradient_clip_val=0.05)
    ref_module = ScenarioModule(sc)
    loader = torch.utils.data.DataLoader(sc.train_dataset(), batch_size=sc.batch_size)
    norms = []

    class Reference(pl.Callback):
        def on_before_optimizer_step(self, trainer, pl_module, optimizer):
            norms.append(float(torch.nn.utils.get_total_norm(
                [p.grad for p in pl_module.parameters() if p.grad is not None])))

    ref = pl.Trainer(accelerator="cpu", max_steps=3, gradient_clip_val=0.05, logger=False,
                     enable_progress_bar=False, enable_model_summary=False,
                     enable_checkpointing=False, callbacks=[Reference()],
                     default_root_dir=tmp_path / "ref")
    ref.fit(ref_module, loader)
    got = [r["metrics"]["grad_norm"] for r in runlog(tmp_path / "stability" / "runlog.jsonl")
           if r["type"] == "step"]
    assert got == pytest.approx(norms, rel=1e-6) and max(norms) > 0.05   # clipping was active
    mine = trainer.lightning_module.state_dict()
    for k, v in ref_module.state_dict().items():
        torch.testing.assert_close(mine[k], v, equal_nan=True)


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_process_ddp_and_deepspeed_decide_the_same(tmp_path):
    """2 ranks (gloo, CPU), DDP then DeepSpeed ZeRO-2 in the same processes: every rank takes the
    same decisions at the same steps (collective saves in the risk window and at the spike),
    halts at the spike and exits cleanly."""
    pytest.importorskip("deepspeed")
    sc = build_scenario("warmup-spike")
    spike = sc.fault_steps[0]
    cfg = {"phase": {"warmup_steps": sc.warmup_steps},
           "policy": {"halt_on": "critical", "bump_save_interval_to": 2, "warmup_escalation": "any"}}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
           f"--master_port={_free_port()}", str(ROOT / "tests" / "dist" / "lightning_worker.py"),
           "--scenario", "warmup-spike", "--batch-size", str(sc.batch_size // 2),
           "--config", json.dumps(cfg), "--out", str(tmp_path)]
    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1")
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=480)
    assert proc.returncode == 0, (proc.stdout[-4000:], proc.stderr[-4000:])
    decisions = {}
    for strategy in ("ddp", "deepspeed"):
        r0, r1 = (json.loads((tmp_path / f"{strategy}_rank{r}.json").read_text()) for r in (0, 1))
        assert r0["findings"] == r1["findings"]          # bit-identical reduced values
        first = first_steps(r0["findings"])
        # The same finding kinds at the same steps as one process (and as the HF Trainer).
        assert first["warmup_end"] == sc.warmup_steps
        assert first["loss_spike"] == spike == first["warmup_instability"]
        assert [f["severity"] for f in r0["findings"] if f["kind"] == "loss_spike"] == ["warning"]
        # Bumped interval (2) inside the risk window, then save now + halt at the escalation.
        saves = [s for s in range(sc.warmup_steps + 1, spike) if s % 2 == 0] + [spike]
        assert r0["saved"] == r1["saved"] == saves
        assert r0["global_step"] == r1["global_step"] == spike
        assert r0["should_stop"] and r1["should_stop"]
        decisions[strategy] = [(f["step"], f["kind"], f["severity"]) for f in r0["findings"]]
    assert decisions["ddp"] == decisions["deepspeed"]
    assert sorted(p.name for p in (tmp_path / "deepspeed" / "ckpt").iterdir()) == \
        sorted(f"stability-step={s}.ckpt" for s in saves)



class TwoStreams(ScenarioModule):
    """``training_step`` returns the loss and two per-dataset losses (first rows: stream "a")."""

    def __init__(self, scenario, seen):
        super().__init__(scenario)
        self.seen = seen

    def training_step(self, batch, batch_idx):
        ids = batch["input_ids"]
        out = self.model(input_ids=ids, labels=ids)
        streams = two_stream_losses(out.logits, ids)
        self.seen.append((streams["a"].item(), streams["b"].item()))
        return {"loss": out.loss, "stream_losses": streams}


def test_per_dataset_losses_from_training_step_outputs(tmp_path):
    """``loss/<name>`` in every record: the mean over the step's micro-batches, as under HF."""
    sc = build_scenario("healthy", max_steps=4, batch_size=4, grad_accum=2)
    seen: list = []
    cb, _ = fit(sc, tmp_path, config={"actions": {}, "sampling": {"loss_streams": ["a", "b"]}},
                module=TwoStreams(sc, seen))
    steps = [r["metrics"] for r in runlog(tmp_path / "stability" / "runlog.jsonl") if r["type"] == "step"]
    assert len(steps) == 4 and len(seen) == 8
    for i, m in enumerate(steps):
        a = (seen[2 * i][0] + seen[2 * i + 1][0]) / 2
        b = (seen[2 * i][1] + seen[2 * i + 1][1]) / 2
        assert (m["loss/a"], m["loss/b"]) == (pytest.approx(a, rel=1e-6), pytest.approx(b, rel=1e-6))


# ------------------------------------------------------------------ AMP with a fused optimizer
class FusedOrNot(ScenarioModule):
    def __init__(self, scenario, fused: bool):
        super().__init__(scenario)
        self.fused = fused

    def configure_optimizers(self):
        return torch.optim.AdamW(self.model.parameters(), lr=self.scenario.lr, weight_decay=0.0,
                                 fused=self.fused)


def test_fp16_amp_grad_norm_is_unscaled_with_a_fused_optimizer_too(tmp_path):
    """16-mixed with a GradScaler (forced on CPU): Lightning unscales the
    grads before ``on_before_optimizer_step`` for AdamW, but not for AdamW(fused=True), which
    unscales inside its step. The recorded norm is the unscaled one either way."""
    from lightning.pytorch.plugins import MixedPrecision

    sc = build_scenario("healthy", max_steps=4)
    norms = {}
    for fused in (False, True):
        amp = MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu", init_scale=256.0))
        fit(sc, tmp_path / str(fused), config={"actions": {}}, module=FusedOrNot(sc, fused),
            plugins=[amp], gradient_clip_val=None, accumulate_grad_batches=1)
        steps = [r["metrics"] for r in runlog(tmp_path / str(fused) / "stability" / "runlog.jsonl")
                 if r["type"] == "step"]
        assert [m["loss_scale"] for m in steps] == [256.0] * 4
        # found_inf says "not skipped"; the fused run has none (yet) in the hook: a skip is a
        # scale decrease there, unknown at the first step.
        assert [m.get("skipped") for m in steps] == [None if fused else 0.0] + [0.0] * 3
        norms[fused] = [m["grad_norm"] for m in steps]
    assert norms[True][0] == pytest.approx(norms[False][0], rel=1e-6)   # the same first batch
    assert norms[True] == pytest.approx(norms[False], rel=1e-3)         # kernels differ a little
    assert 0.1 < norms[True][0] < 10                                    # not 256x


# --------------------------------------------------------------------------- crash alert
class RaisesAt(ScenarioModule):
    def __init__(self, scenario, step: int, exc: BaseException):
        super().__init__(scenario)
        self.step, self.exc = step, exc

    def training_step(self, batch, batch_idx):
        if self.trainer.global_step + 1 == self.step:
            raise self.exc
        return super().training_step(batch, batch_idx)


def test_a_bad_config_stops_the_run_before_step_one_with_the_key_named(tmp_path, monkeypatch):
    from stability_callbacks import ConfigError

    with pytest.raises(ConfigError, match="detectors.loss_spike.z_threshold"):
        StabilityCallback(config={"detectors": {"loss_spike": {"z_threshold": -1}}})
    monkeypatch.delenv("NO_SUCH_WEBHOOK", raising=False)
    sc = build_scenario("healthy", max_steps=4)
    with pytest.raises(ConfigError, match="actions.webhook.url: environment variable NO_SUCH_WEBHOOK"):
        fit(sc, tmp_path, config={"actions": {"webhook": {"url": "${NO_SUCH_WEBHOOK}"}}})


def test_the_run_lives_under_default_root_dir_and_an_unwritable_one_is_one_warning(tmp_path, caplog):
    sc = build_scenario("healthy", max_steps=4)
    cb = StabilityCallback(config={"actions": {}})
    trainer = pl.Trainer(callbacks=[cb], max_steps=4, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False, default_root_dir=tmp_path / "root")
    loader = torch.utils.data.DataLoader(sc.train_dataset(), batch_size=sc.batch_size)
    trainer.fit(ScenarioModule(sc), loader)
    steps = [x["step"] for x in runlog(tmp_path / "root" / "stability" / "runlog.jsonl") if x["type"] == "step"]
    assert steps == [1, 2, 3, 4]
    (tmp_path / "a-file").write_text("not a folder")
    # The monitor's own saves (every 2 steps in the risk window after step 3) cannot go there either.
    with caplog.at_level("WARNING", logger="stability_callbacks"):
        cb, trainer = fit(build_scenario("healthy", max_steps=8, warmup_steps=3), tmp_path,
                          run_dir="a-file/stability", checkpoint_dir="a-file/ckpt",
                          config={"actions": {}, "policy": {"bump_save_interval_to": 2}})
    assert caplog.text.count("cannot write the run log") == 1 and "monitoring is off" not in caplog.text
    assert [r.getMessage() for r in caplog.records if "save" in r.getMessage()] == [
        f"stability: cannot save the checkpoint of step 6 into {tmp_path / 'a-file' / 'ckpt'} (Not a "
        "directory); the monitor's saves are off, training and detection go on"]
    assert "Traceback" not in caplog.text and cb.saved == []
    assert [f.kind for f in cb.findings] == ["warmup_end"] and trainer.global_step == 8   # still detecting


def test_crash_alert_goes_out_through_apprise_before_lightning_reraises(tmp_path):
    """``on_exception``: one critical alert to a real local endpoint (Apprise ``json://``),
    delivered before Lightning re-raises the very same exception."""
    pytest.importorskip("apprise")
    from alert_inbox import AlertInbox

    sc = build_scenario("healthy", max_steps=10)
    exc = ValueError("labels out of range in batch 5")
    with AlertInbox() as inbox:
        port = inbox.server_address[1]
        actions = {"apprise": {"urls": f"json://127.0.0.1:{port}/alerts", "min_severity": "critical"}}
        with pytest.raises(ValueError) as raised:
            fit(sc, tmp_path, config={"actions": actions}, module=RaisesAt(sc, 6, exc),
                accumulate_grad_batches=1)
        alerts = inbox.alerts
    assert raised.value is exc
    assert [(a["kind"], a["severity"]) for a in alerts] == [("crash", "critical")]
    body = alerts[0]["body"]
    assert body["title"] == "stability: crash (critical)"
    assert ("Training crashed in step 6 with ValueError: labels out of range in batch 5. The last "
            "finished step is 5") in body["message"]
    lines = runlog(tmp_path / "stability" / "runlog.jsonl")
    assert [x["step"] for x in lines if x["type"] == "step"] == [1, 2, 3, 4, 5]
    assert [(x["step"], x["kind"]) for x in lines if x["type"] == "finding"][-1] == (5, "crash")


# ------------------------------------------------------------------------------ state_key
class StatesAtStart(pl.Callback):
    """Each StabilityCallback's detector state as the checkpoint left it: read at train start
    before theirs (callbacks run in list order), i.e. before the resumed segment begins."""

    def __init__(self):
        self.states: list[str] = []

    def on_train_start(self, trainer, pl_module):
        self.states = [json.dumps(cb.run.state_dict(), sort_keys=True) for cb in trainer.callbacks
                       if isinstance(cb, StabilityCallback)]


TWO_CONFIGS = ("default", {"detectors": {"lr_anomaly": False}})   # two detector states that differ


def _fit_two(tmp_path, configs, *, max_steps, ckpt_path=None, every=None):
    sc = build_scenario("healthy", max_steps=10)
    cbs = [StabilityCallback(config=c, run_dir=tmp_path / f"stability-{i}") for i, c in enumerate(configs)]
    seen = StatesAtStart()
    extra = [pl.callbacks.ModelCheckpoint(dirpath=tmp_path / "mc", every_n_train_steps=every,
                                          save_top_k=-1)] if every else []
    trainer = pl.Trainer(callbacks=[seen, *cbs, *extra], accelerator="cpu", devices=1, max_steps=max_steps,
                         logger=False, enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=bool(every), default_root_dir=tmp_path)
    loader = torch.utils.data.DataLoader(sc.train_dataset(), batch_size=sc.batch_size)
    trainer.fit(ScenarioModule(sc), loader, ckpt_path=ckpt_path)
    return cbs, seen.states


@pytest.fixture(scope="module")
def two_configs_checkpoint(tmp_path_factory):
    """One fit with two callbacks of different configs; ModelCheckpoint saves step 5."""
    tmp = tmp_path_factory.mktemp("two")
    cbs, _ = _fit_two(tmp, TWO_CONFIGS, max_steps=6, every=5)
    (path,) = (tmp / "mc").glob("epoch=*-step=5.ckpt")
    return path, [cb.state_key for cb in cbs]


def _saved_states(path) -> dict:
    return torch.load(path, weights_only=False)["callbacks"]


@pytest.mark.slow
def test_two_callbacks_keep_their_own_states_in_one_checkpoint(two_configs_checkpoint, tmp_path, recwarn):
    path, keys = two_configs_checkpoint
    digest = hashlib.sha256(json.dumps(TWO_CONFIGS[1], sort_keys=True).encode()).hexdigest()[:12]
    assert keys == ["StabilityCallback{'config': 'default'}", f"StabilityCallback{{'config': 'dict:{digest}'}}"]
    saved = _saved_states(path)
    blobs = [json.dumps(saved[k]["live"], sort_keys=True) for k in keys]
    assert [saved[k]["step"] for k in keys] == [5, 5] and blobs[0] != blobs[1]   # two states, not one
    cbs, restored = _fit_two(tmp_path, TWO_CONFIGS, max_steps=7, ckpt_path=path)
    assert restored == blobs   # each its own
    assert [(f.step, f.kind) for cb in cbs for f in cb.findings if f.kind == "resume"] == [(5, "resume")] * 2
    # Lightning names the saved states no callback claims: the ModelCheckpoint's, not ours.
    (unclaimed,) = [str(w.message) for w in recwarn if "callbacks used to create" in str(w.message)]
    assert "ModelCheckpoint" in unclaimed and "StabilityCallback" not in unclaimed


@pytest.mark.slow
def test_a_checkpoint_from_before_the_key_restores_into_the_one_callback(two_configs_checkpoint, tmp_path, caplog):
    """Saved before ``state_key``: the state under the class's name (Lightning's default key)."""
    path, keys = two_configs_checkpoint
    ckpt = torch.load(path, weights_only=False)
    ckpt["callbacks"] = {"StabilityCallback": ckpt["callbacks"][keys[1]]}
    old = tmp_path / "old.ckpt"
    torch.save(ckpt, old)
    blob = json.dumps(ckpt["callbacks"]["StabilityCallback"]["live"], sort_keys=True)
    caplog.set_level(logging.INFO, logger="stability_callbacks")
    _, restored = _fit_two(tmp_path / "one", TWO_CONFIGS[1:], max_steps=6, ckpt_path=old)
    assert restored == [blob]
    assert f"stability: restoring the state saved as 'StabilityCallback' into this callback (key {keys[1]!r})" \
        in caplog.messages
    # Two callbacks: whose it was is unknown; both start fresh, and say so.
    caplog.clear()
    _, restored = _fit_two(tmp_path / "two", TWO_CONFIGS, max_steps=6, ckpt_path=old)
    assert blob not in restored
    assert [m for m in caplog.messages if "start fresh" in m] == [
        "stability: the checkpoint keeps one StabilityCallback state under the key of checkpoints saved "
        "before each callback had its own ('StabilityCallback'), and this trainer has 2: whose it was "
        f"is unknown, and the detectors of {k!r} start fresh (resume with that callback alone to "
        "restore it)" for k in keys]
    # A key that is neither: the config is spelled otherwise now than when it was saved.
    saved = _saved_states(path)
    ckpt["callbacks"] = {keys[0]: saved[keys[0]], "StabilityCallback{'config': 'b.yaml'}": saved[keys[1]]}
    torch.save(ckpt, old)
    caplog.clear()
    _, restored = _fit_two(tmp_path / "three", TWO_CONFIGS, max_steps=6, ckpt_path=old)
    assert restored[0] == json.dumps(saved[keys[0]]["live"], sort_keys=True) and restored[1] != blob
    assert [m for m in caplog.messages if "start fresh" in m] == [
        f"stability: the checkpoint holds no state under this callback's key {keys[1]!r} (it holds "
        f"{keys[0]!r}, \"StabilityCallback{{'config': 'b.yaml'}}\"); its detectors start fresh. The key "
        "follows the config given: pass the one the checkpoint was saved with"]


class RingGAN(pl.LightningModule):
    """A GAN on a 2-D ring, trained by manual optimization: the discriminator and the generator
    each stepped by its own Adam on its own loss; the step reports their sum."""

    def __init__(self):
        super().__init__()
        self.automatic_optimization = False
        self.G = torch.nn.Sequential(torch.nn.Linear(4, 32), torch.nn.ReLU(), torch.nn.Linear(32, 2))
        self.D = torch.nn.Sequential(torch.nn.Linear(2, 32), torch.nn.LeakyReLU(0.2), torch.nn.Linear(32, 1))

    def training_step(self, batch, batch_idx):
        real = batch[0]
        opt_g, opt_d = self.optimizers()
        bce = torch.nn.functional.binary_cross_entropy_with_logits
        ones, zeros = torch.ones(len(real), 1), torch.zeros(len(real), 1)
        fake = self.G(torch.randn(len(real), 4))
        d_loss = bce(self.D(real), ones) + bce(self.D(fake.detach()), zeros)
        opt_d.zero_grad()
        self.manual_backward(d_loss)
        opt_d.step()
        g_loss = bce(self.D(fake), ones)
        opt_g.zero_grad()
        self.manual_backward(g_loss)
        opt_g.step()
        return {"loss": (d_loss + g_loss).detach()}

    def configure_optimizers(self):
        return [torch.optim.Adam(p.parameters(), 2e-4, betas=(0.5, 0.999)) for p in (self.G, self.D)]


def test_a_gan_stepping_two_optimizers_is_judged_as_a_game(tmp_path, caplog):
    # a healthy GAN: the generator's gradients grow x7 as the discriminator sharpens (before: a
    # grad_norm_growth warning at step 640); with two optimizers the run declares a game, the
    # growth is info, and no warning is raised
    torch.manual_seed(0)
    ring = torch.rand(4096) * 2 * math.pi
    data = torch.stack([torch.cos(ring), torch.sin(ring)], 1) * 2 + 0.05 * torch.randn(4096, 2)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(data), batch_size=64, shuffle=True)
    cb = StabilityCallback(run_dir=tmp_path / "stability")
    trainer = pl.Trainer(max_epochs=8, callbacks=[cb], logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)
    with caplog.at_level(logging.INFO, logger="stability_callbacks"):
        trainer.fit(RingGAN(), loader)
    assert "the run steps 2 optimizers (a GAN's players" in caplog.text
    assert [(f.kind, f.severity) for f in cb.findings if f.severity != "info"] == []
    assert [f.details.get("game") for f in cb.findings if f.kind == "grad_norm_growth"] == [True]
    # each record says its epoch (trainer.current_epoch + 1): 8 epochs of the same number of steps
    epochs = [r["epoch"] for r in runlog(tmp_path / "stability" / "runlog.jsonl") if r["type"] == "step"]
    per = len(epochs) // 8
    assert epochs == [1 + i // per for i in range(8 * per)]


class TwoOptimizersOneLoss(pl.LightningModule):
    """Two optimizers over the body's and the head's parameters (Muon beside AdamW, say), stepped
    on one loss with one backward: no game."""

    def __init__(self):
        super().__init__()
        self.automatic_optimization = False
        self.body, self.head = torch.nn.Linear(4, 16), torch.nn.Linear(16, 3)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.head(torch.relu(self.body(x))), y)
        for opt in self.optimizers():
            opt.zero_grad()
        self.manual_backward(loss)
        for opt in self.optimizers():
            opt.step()
        return {"loss": loss.detach()}

    def configure_optimizers(self):
        return [torch.optim.SGD(self.body.parameters(), 0.1), torch.optim.Adam(self.head.parameters(), 1e-3)]


def test_two_optimizers_on_one_loss_are_no_game(tmp_path, caplog):
    torch.manual_seed(0)
    x = torch.randn(512, 4)
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, (x[:, 0] > 0).long()), batch_size=32)
    cb = StabilityCallback(run_dir=tmp_path / "stability")
    trainer = pl.Trainer(max_steps=40, callbacks=[cb], logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path)
    with caplog.at_level(logging.INFO, logger="stability_callbacks"):
        trainer.fit(TwoOptimizersOneLoss(), loader)
    assert "optimizers (a GAN's players" not in caplog.text and cb.findings is not None
    assert not cb.session.run.monitor._loss_spike.declared
