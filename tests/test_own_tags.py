"""Replay reads every name our own sinks and callbacks write (one key scheme, `keys.py`):
TensorBoard events of our TensorBoard sink (`stability/<key>`) and of HF's TensorBoard reporter
fed through `trainer.log` (`train/stability/<key>`); W&B history exports of our W&B sink
(`stability/step` axis) next to HF's W&B reporter (`train/global_step`). Real writers, real
files, read back through `read_records` and the `replay` CLI."""
from __future__ import annotations

import ast
import csv
import json
import pathlib
import subprocess
import sys

import pytest
from streams import healthy, scale

import stability_callbacks
from stability_callbacks import Monitor, keys
from stability_callbacks.live import LiveRun, reporter_scalars
from stability_callbacks.record import Finding
from stability_callbacks.replay.readers import read_records
from stability_callbacks.replay.readers.tags import metric_key

N, SPIKE = 300, 200


def _stream():
    return scale(healthy(N, adam=True), "loss", lambda s: 2.5 if s == SPIKE else 1.0)


def _same_records(read, fed, rel=1e-6):
    assert [r.step for r in read] == [r.step for r in fed]
    for got, want in zip(read, fed):
        assert set(got.metrics) == set(want.metrics), got.step
        for k, v in want.metrics.items():
            assert got.metrics[k] == pytest.approx(v, rel=rel), (got.step, k)


def test_names_map_back_to_metric_keys():
    assert metric_key("stability/adam/exp_avg_sq_max") == "adam/exp_avg_sq_max"
    assert metric_key("train/stability/adam/exp_avg_sq_max") == "adam/exp_avg_sq_max"
    assert metric_key("train/stability/loss/cm4") == "loss/cm4"
    for not_a_signal in ("stability/finding/loss_spike", "train/stability/finding/nonfinite",
                         "stability/findings/text_summary", "stability/step",
                         "stability/batch_fingerprint", "stability/no_such_key"):
        assert metric_key(not_a_signal) is None, not_a_signal
    scalars = reporter_scalars(_stream()[0], [Finding(1, "loss_spike", "warning", "...")])
    assert sorted(scalars) == ["stability/adam/exp_avg_sq_l1", "stability/adam/exp_avg_sq_max",
                               "stability/adam/exp_avg_sq_numel", "stability/finding/loss_spike",
                               "stability/grad_norm", "stability/loss", "stability/lr"]
    assert {metric_key(k) for k in scalars} - {None} == set(_stream()[0].metrics)


def test_our_tensorboard_sink_replays_to_the_live_findings(tmp_path):
    pytest.importorskip("tensorboard")
    run = LiveRun(config={"actions": {"tensorboard": {}}}, run_dir=tmp_path)
    run.start(0)
    fed = _stream()
    live = [f for r in fed for f in run.observe(r)]
    run.close()
    assert (SPIKE, "loss_spike") in [(f.step, f.kind) for f in live]
    events = tmp_path / "tensorboard"
    _same_records(list(read_records(events)), fed)          # float32 in the event file
    r = subprocess.run([sys.executable, "-m", "stability_callbacks", "replay", str(events), "--json", "-"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr                   # a recovering spike after warmup: a warning
    read, *replayed = [json.loads(x) for x in r.stdout.splitlines()]
    assert read["type"] == "read" and read["format"] == "tensorboard"
    assert [(f["step"], f["kind"]) for f in replayed] == [(f.step, f.kind) for f in live]


def test_hf_tensorboard_reporter_tags_replay_with_ours_over_the_trainers_mean(tmp_path):
    pytest.importorskip("tensorboard")
    from torch.utils.tensorboard import SummaryWriter
    from transformers import TrainerState
    from transformers.integrations import TensorBoardCallback

    writer = SummaryWriter(str(tmp_path))
    reporter = TensorBoardCallback(tb_writer=writer)     # what `report_to="tensorboard"` adds
    monitor, fed, window = Monitor(), _stream(), []
    for rec in fed:
        findings = monitor.update(rec)
        state = TrainerState(global_step=rec.step)
        window.append(rec.metrics["loss"])
        if rec.step % 5 == 0:                            # the Trainer's own line: a 5-step mean
            reporter.on_log(None, state, None, logs={"loss": sum(window) / 5, "learning_rate":
                                                     rec.metrics["lr"], "grad_norm": 99.0})
            window = []
        reporter.on_log(None, state, None, logs=reporter_scalars(rec, findings))   # our trainer.log
    writer.close()
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    ea = EventAccumulator(str(tmp_path), size_guidance={"scalars": 0})
    ea.Reload()
    assert {"train/loss", "train/stability/loss", "train/stability/adam/exp_avg_sq_max",
            "train/stability/finding/loss_spike"} <= set(ea.Tags()["scalars"])
    _same_records(list(read_records(tmp_path, "tensorboard")), fed)


def _wandb_history_csv(run_file: pathlib.Path, out: pathlib.Path) -> pathlib.Path:
    """The run's history as W&B's CSV export writes it: one row per `log` call, the union of
    the keys as columns, empty cells where a call did not log a key."""
    from test_alerts import _wandb_records_when_complete
    rows = []
    for r in _wandb_records_when_complete(run_file):
        if r.WhichOneof("record_type") == "history":
            rows.append({"/".join(i.nested_key) if i.nested_key else i.key: json.loads(i.value_json)
                         for i in r.history.item})
    columns = sorted({k for row in rows for k in row}, key=lambda k: (not k.startswith("_"), k))
    with open(out, "w", newline="") as f:
        w = csv.DictWriter(f, columns)
        w.writeheader()
        w.writerows(rows)
    return out


def test_wandb_history_export_of_our_sink_and_hfs_reporter(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    from transformers import TrainerState, TrainingArguments
    from transformers.integrations import WandbCallback

    from stability_callbacks.alerts import build_sinks
    for k, v in {"WANDB_MODE": "offline", "WANDB_DIR": str(tmp_path), "WANDB_SILENT": "true"}.items():
        monkeypatch.setenv(k, v)
    # The run in tmp_path (wandb keeps the settings of a process's first run); HF's setup
    # takes it over as it does a user's own wandb.init, and defines its step metric on it.
    run = wandb.init(mode="offline", dir=str(tmp_path), project="stability-test")
    reporter = WandbCallback()
    args = TrainingArguments(str(tmp_path / "hf"), report_to="wandb", run_name="tiny")
    reporter.setup(args, TrainerState(), None)
    try:
        sink = build_sinks({"wandb": {"min_severity": "info"}}, is_rank0=True, run_name="tiny",
                           wandb_run=run)
        monitor, fed = Monitor(), _stream()
        for rec in fed:
            findings = monitor.update(rec)
            sink.log_metrics(rec.step, rec.metrics)
            for f in findings:
                sink.submit(f)
            state = TrainerState(global_step=rec.step)
            if rec.step % 5 == 0:
                reporter.on_log(args, state, None, logs={"loss": 99.0, "learning_rate": 1.0})
            reporter.on_log(args, state, None, logs=reporter_scalars(rec, findings))
        sink.close(timeout_s=30.0)
    finally:
        wandb.finish()
    (run_file,) = tmp_path.rglob("run-*.wandb")
    export = _wandb_history_csv(run_file, tmp_path / "history.csv")
    header = next(csv.reader(open(export)))
    assert {"_step", "stability/step", "stability/loss", "stability/finding/loss_spike",
            "train/global_step", "train/loss", "train/stability/adam/exp_avg_sq_max"} <= set(header)
    # One record per optimizer step (W&B's own `_step` counts log calls: 3-4 per step here),
    # our exact values: never HF's 99.0, never a step counted twice.
    _same_records(list(read_records(export)), fed, rel=1e-12)


def test_the_stability_prefix_has_one_home():
    """No string literal outside keys.py spells our metric prefix (docstrings excepted)."""
    root = pathlib.Path(stability_callbacks.__file__).parent
    offenders = []
    for path in root.rglob("*.py"):
        if path.name == "keys.py" and path.parent == root:
            continue
        tree = ast.parse(path.read_text())
        docstrings = {id(n.body[0].value) for n in ast.walk(tree)
                      if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                      and n.body and isinstance(n.body[0], ast.Expr)
                      and isinstance(n.body[0].value, ast.Constant)}
        for n in ast.walk(tree):
            if (isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docstrings
                    and keys.PREFIX in n.value):
                offenders.append(f"{path.relative_to(root)}:{n.lineno}")
            if isinstance(n, ast.JoinedStr) and any(
                    isinstance(v, ast.Constant) and keys.PREFIX in str(v.value) for v in n.values):
                offenders.append(f"{path.relative_to(root)}:{n.lineno}")
    assert offenders == []
