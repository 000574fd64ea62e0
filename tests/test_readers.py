"""Readers: every real log reads to the numbers of its CSV; every format fixture to its records."""
from __future__ import annotations

import csv
import json
import math
import time
from pathlib import Path

import pytest

from stability_callbacks.record import StepRecord
from stability_callbacks.replay.readers import (FORMATS, LogFormatError, compile_pattern,
                                                detect_format, parse_keys, read_records)
from stability_callbacks.replay.readers import source

DATA = Path(__file__).parent / "data"
REAL = DATA / "real_logs"
FIXTURES = DATA / "formats"
LABELS = {e["name"]: e for e in json.loads((REAL / "labels.json").read_text())}
REAL_LOGS = sorted(REAL.glob("*.log"))

# labels.json `format` -> the reader that must be auto-detected (formats without semantics of
# their own are read by the generic metric-line reader).
LABEL_FORMAT = {"megatron": "megatron", "megatron+deepspeed-overflow": "megatron",
                "nanogpt-speedrun": "generic", "llmc": "generic", "deepspeed-chat": "generic",
                "csv": "csv"}

FIXTURE_FORMAT = {
    "hf_printed.log": "generic", "trainer_state.json": "hf-state",
    "nanogpt_karpathy.log": "generic", "build_nanogpt.log": "generic",
    "llmc_stdout.log": "generic", "litgpt_old.log": "generic", "litgpt_new.log": "generic",
    "mlx_lora.log": "generic", "fairseq_inner.log": "fairseq", "fairseq_summary.log": "fairseq",
    "trainer_log.jsonl": "jsonl", "megatron_quoted.log": "megatron",
    "nanogpt_quoted.log": "generic", "wandb_history.csv": "wandb-csv",
    "wandb_panel.csv": "wandb-csv", "plain_metrics.jsonl": "jsonl",
    "caffe_solver.log": "caffe",
}


def expected_rows(csv_path: Path) -> tuple[list[str], list[dict[str, str]]]:
    with open(csv_path, newline="") as f:
        rows = list(csv.DictReader(f))
    return [c for c in rows[0] if c != "step"], rows


def assert_same(records: list[StepRecord], csv_path: Path, allowed_extra=()):
    """Every record's step and every metric of the CSV: NaN == NaN, empty cell = key absent.
    ``loss_resolution`` (the printed digits a float loses: ``1.000000``) and ``loss_window`` (a
    window median: ``loss: 6.9733 (6.9704)``) and ``loss_terms_zero`` (a sum's terms at 0) may come with any log,
    and ``eval_loss`` (an evaluation's loss printed on a record's line) with any that prints one."""
    columns, rows = expected_rows(csv_path)
    assert [r.step for r in records] == [int(row["step"]) for row in rows]
    for rec, row in zip(records, rows):
        for col in columns:
            cell = row[col]
            if cell == "":
                assert col not in rec.metrics, (rec.step, col, rec.metrics)
                continue
            want, got = float(cell), rec.metrics.get(col)
            assert got is not None, (rec.step, col)
            assert got == want or (math.isnan(want) and math.isnan(got)), (rec.step, col, got, want)
        assert set(rec.metrics) - set(columns) <= {*allowed_extra, "loss_resolution", "loss_window", "loss_terms_zero",
                                                   "eval_loss"}, (
            rec.step, rec.metrics)


@pytest.mark.parametrize("log", REAL_LOGS, ids=lambda p: p.stem)
def test_real_log_auto_reads_to_its_csv(log):
    label = LABELS[log.stem]
    assert detect_format(log) == LABEL_FORMAT[label["format"]]
    # Megatron prints consumed samples: kept (the resume auditor uses it), not in the CSVs.
    assert_same(list(read_records(log, format="auto")), REAL / label["csv"],
                allowed_extra=("consumed_samples",))


def test_every_real_log_is_covered():
    assert len(REAL_LOGS) == 21
    assert {LABELS[p.stem]["format"] for p in REAL_LOGS} <= set(LABEL_FORMAT)


@pytest.mark.parametrize("table", sorted(REAL.glob("*.csv")), ids=lambda p: p.stem)
def test_real_csv_reads_itself(table):
    assert detect_format(table) == "csv"
    assert_same(list(read_records(table)), table)


def test_megatron_rules_from_the_real_logs():
    # The loss field vanished with no skipped iteration: the run went NaN.
    recs = {r.step: r for r in read_records(REAL / "bs_tr8_104B_exp12_spike8740_diverge9027.log")}
    assert math.isnan(recs[9027].metrics["loss"]) and recs[9027].metrics["loss_scale"] == 8192.0
    # Start-up loss-scale search: all iterations skipped, no loss at all.
    recs = list(read_records(REAL / "bs_exp_gpt2meg_base_n4_fp16_scale_search_early_spike.log"))
    assert "loss" not in recs[0].metrics and recs[0].metrics["skipped"] == 10.0
    # DeepSpeed OVERFLOW lines mark the next iteration skipped although it prints 0.
    recs = list(read_records(REAL / "bs_tr8b_104B_embnorm_exp7_optreset_spike17062.log"))
    assert [r.metrics["skipped"] for r in recs] == [0, 0, 1, 1, 1, 1, 0, 1, 1]
    # Hard-wrapped lines: each record joined from three physical lines.
    recs = list(read_records(REAL / "bs_tr11_176B_throughput_drop_wrapped.log"))
    assert [r.step for r in recs] == [42780, 42781, 42782, 42783, 42784]
    assert recs[0].metrics["lr"] == 4.475e-05 and recs[0].metrics["skipped"] == 0


def test_deepspeed_chat_counts_skips_per_interval():
    recs = list(read_records(REAL / "dschat_opt1.3b_sft_fp16_periodic_overflow.log"))
    assert recs[0].step == 10 and recs[0].metrics == {
        "lr": 9.649992967150629e-06, "loss_scale": 2048.0, "skipped": 6.0}
    assert recs[1].metrics == {"lr": 9.649913847830647e-06, "skipped": 0.0}
    # The per-interval counts add up to the engine's final cumulative count.
    assert sum(r.metrics["skipped"] for r in recs) == 139


@pytest.mark.parametrize("name", sorted(FIXTURE_FORMAT))
def test_format_fixture(name):
    path = FIXTURES / name
    assert detect_format(path) == FIXTURE_FORMAT[name]
    assert_same(list(read_records(path)), FIXTURES / (path.name.split(".")[0] + ".expected.csv"))


def test_every_format_has_a_test():
    covered = set(FIXTURE_FORMAT.values()) | set(LABEL_FORMAT.values()) | {"tensorboard"}
    assert covered == set(FORMATS)


def test_records_without_step_numbers_are_numbered_in_order():
    recs = list(read_records(FIXTURES / "hf_printed.log", format="hf"))   # an alias of generic
    assert [r.step for r in recs] == [1, 2, 3, 4]


def test_format_aliases_and_forced_format():
    log = REAL / "mn_gpt2_124M_valueembed_blip946.log"
    assert len(list(read_records(log, format="nanogpt-speedrun"))) == 1530
    with pytest.raises(ValueError, match="format: unknown 'nope'"):
        read_records(log, format="nope")


def test_tensorboard_summary_writer_round_trip(tmp_path):
    torch_tb = pytest.importorskip("torch.utils.tensorboard")
    n = 10_050   # more than the 10,000 the default size guidance would keep (TensorBoard's scalar size guidance)
    writer = torch_tb.SummaryWriter(str(tmp_path / "run"))
    for step in range(n):
        writer.add_scalar("train/loss", 10.0 / (step + 1), step)
        if step % 100 == 0:
            writer.add_scalar("train/grad_norm", 0.5, step)
            writer.add_scalar("my odd loss", 3.0, step)
    writer.add_scalar("train/learning_rate", 1e-3, 7, new_style=True)
    writer.add_scalar("train/loss", float("nan"), n)
    writer.add_scalar("eval/accuracy", 0.5, 3)   # not a metric we use
    writer.close()
    assert detect_format(tmp_path) == "tensorboard"
    recs = list(read_records(tmp_path, tag_map={"my odd loss": "loss/odd"}))
    assert [r.step for r in recs] == list(range(n + 1))
    assert recs[9].metrics == {"loss": pytest.approx(1.0)}
    assert recs[100].metrics == {"loss": pytest.approx(10 / 101), "grad_norm": 0.5, "loss/odd": 3.0}
    assert recs[7].metrics["lr"] == pytest.approx(1e-3)
    assert math.isnan(recs[-1].metrics["loss"])


def test_wandb_history_csv_round_trip(tmp_path):
    truth = [StepRecord(s, {"loss": 3.0 - s / 100, "grad_norm": 0.25 * s, "lr": 1e-4})
             for s in range(1, 40)]
    truth[5].metrics["loss"] = float("nan")
    del truth[7].metrics["grad_norm"]
    path = tmp_path / "wandb_export.csv"
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["_step", "_runtime", "train/loss", "train/grad_norm", "train/learning_rate",
                    "train/global_step"])
        for i, r in enumerate(truth):
            m = r.metrics
            w.writerow([i, i * 0.5, "NaN" if math.isnan(m["loss"]) else repr(m["loss"]),
                        repr(m["grad_norm"]) if "grad_norm" in m else "", repr(m["lr"]), r.step])
            if i == 3:   # an eval-only row W&B writes between steps
                w.writerow([i, i * 0.5, "", "", "", ""])
    assert detect_format(path) == "wandb-csv"
    got = list(read_records(path))
    assert [r.step for r in got] == [r.step for r in truth]
    for a, b in zip(got, truth):
        assert set(a.metrics) == set(b.metrics)
        for k, v in b.metrics.items():
            assert a.metrics[k] == v or (math.isnan(v) and math.isnan(a.metrics[k]))


def test_run_log_jsonl_reads_step_lines_in_file_order(tmp_path):
    path = tmp_path / "run.jsonl"
    lines = [
        {"type": "segment", "segment": 0, "start_step": 1, "reason": "start"},
        StepRecord(1, {"loss": 2.0}).to_json(),
        StepRecord(2, {"loss": float("nan"), "grad_norm": float("inf")}).to_json(),
        {"type": "finding", "step": 2, "kind": "nonfinite", "severity": "critical",
         "message": "NaN"},
        {"type": "segment", "segment": 1, "start_step": 2, "reason": "rollback"},
        StepRecord(2, {"loss": 1.9}, segment=1).to_json(),
    ]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    assert detect_format(path) == "jsonl"
    recs = list(read_records(path))
    assert [(r.step, r.segment) for r in recs] == [(1, 0), (2, 0), (2, 1)]
    assert math.isnan(recs[1].metrics["loss"]) and recs[1].metrics["grad_norm"] == math.inf


def test_a_run_logs_model_line_declares_the_output_size_again_on_replay(tmp_path):
    """A live run reads its model's output size (not_learning's chance level ln C) and writes a
    `model` line; replayed, the Monitor is told it again: a run at chance is not learning, as live.
    Without the line, replay cannot know C (only the flat rule is left)."""
    from stability_callbacks import Monitor
    from stability_callbacks.runlog import RunLog
    ln10 = math.log(10)
    for with_model in (True, False):
        path = tmp_path / f"runlog-{with_model}.jsonl"
        log = RunLog(path)
        log.segment(0, 0, "start")
        if with_model:
            log.model(10)
        for s in range(1, 201):   # at chance from its start (random labels)
            log.step(StepRecord(s, {"loss": ln10 + 0.1 * math.exp(-s / 10) + 0.02 * math.sin(1.7 * s)}))
        log.close()
        recs = list(read_records(path))
        assert recs[0].num_outputs == (10 if with_model else None) and recs[1].num_outputs is None
        monitor = Monitor()
        kinds = [(f.kind, f.details.get("rule")) for r in recs for f in monitor.update(r) if f.severity != "info"]
        assert kinds == ([("not_learning", "chance")] if with_model else [])


def test_partly_unreadable_file_reports_ignored_lines_and_replays_the_rest(tmp_path):
    path = tmp_path / "broken.jsonl"
    path.write_bytes(b'{"step": 1, "loss": 2.0}\n{"step": 2, "loss": \n\xff\xfe garbage\n'
                     b'{"step": 3, "loss": 1.5}\n')
    skipped = []
    recs = list(read_records(path, on_ignore=lambda n, text, why: skipped.append((n, why))))
    assert [r.step for r in recs] == [1, 3]
    assert [n for n, _ in skipped] == [2, 3] and all("not JSON" in w for _, w in skipped)

    path = tmp_path / "broken.csv"
    path.write_text("step,loss\n1,2.0\n2,two\n3,1.5\n")
    skipped.clear()
    recs = list(read_records(path, on_ignore=lambda n, text, why: skipped.append((n, text))))
    assert [r.step for r in recs] == [1, 3] and skipped == [(3, "2,two")]


def test_unreadable_lines_without_callback_are_logged_once(tmp_path, caplog):
    path = tmp_path / "broken.jsonl"
    path.write_text('{"step": 1, "loss": 2.0}\nnot json\nnor this\n')
    recs = list(read_records(path))
    assert [r.step for r in recs] == [1]
    msgs = [r.getMessage() for r in caplog.records]
    assert len(msgs) == 1 and "ignored 2 unreadable line(s); first at line 2" in msgs[0]


def test_fatal_errors_name_the_file_and_line(tmp_path):
    with pytest.raises(LogFormatError, match="missing.log: no such file"):
        read_records(tmp_path / "missing.log")
    junk = tmp_path / "notes.txt"
    junk.write_text("hello\nthis is no training log\n")
    with pytest.raises(LogFormatError, match=r"notes\.txt: unknown log format"):
        read_records(junk)
    table = tmp_path / "t.csv"
    table.write_text("step,colour\n1,red\n")
    with pytest.raises(LogFormatError, match=r"t\.csv:1: no metric column"):
        list(read_records(table))
    empty = tmp_path / "empty.log"
    empty.write_text("iteration line? no\n")
    with pytest.raises(LogFormatError, match=r"empty\.log: no megatron records found"):
        list(read_records(empty, format="megatron"))
    assert str(LogFormatError("a.log", 7, "bad")) == "a.log:7: bad"


def test_tag_map_values_must_be_metric_keys(tmp_path):
    with pytest.raises(ValueError, match=r"tag_map\.foo: 'lossy' is not a metric key"):
        read_records(FIXTURES / "wandb_panel.csv", tag_map={"foo": "lossy"})


def test_tag_map_renames_and_drops_columns():
    recs = list(read_records(FIXTURES / "wandb_history.csv",
                             tag_map={"train/grad_norm": None, "eval/loss": "loss/eval"}))
    assert [r.step for r in recs] == [10, 20, 20, 30]
    assert recs[2].metrics == {"loss/eval": 2.3} and "grad_norm" not in recs[0].metrics


def test_reading_is_fast_and_streams():
    log = REAL / "mn_gpt2_1p5B_scaleup_20k.log"
    t0 = time.perf_counter()
    n = sum(1 for _ in read_records(log))
    elapsed = time.perf_counter() - t0
    assert n == 20344
    assert elapsed < 1.5, f"{elapsed:.2f}s for 20k lines"   # ~0.2 s measured on this machine


def test_progress_bar_on_large_inputs(monkeypatch, capsys):
    monkeypatch.setattr(source, "PROGRESS_MIN_BYTES", 0)
    recs = list(read_records(REAL / "llmc_gpt2_124M_adamw_oldformat.log", progress=True))
    assert len(recs) == 9536


# ---------------------------------------------------------------------------------------------
# The generic metric-line reader: the rules, one small log each (real logs: test_wild_logs.py).

def records_of(tmp_path, text: str, **kw):
    path = tmp_path / "run.log"
    path.write_text(text)
    return [(r.step, r.metrics) for r in read_records(path, **kw)]


NAN = float("nan")


@pytest.mark.parametrize("text, want", [
    # Prefixes, timestamps, quoting, fences and colour codes around the metrics.
    ("```\n> [rank0]: 2023-03-22 09:30:39 iter 2920: loss 3.45, lr 1e-4\n```\n",
     [(2920, {"loss": 3.45, "lr": 1e-4})]),
    # A logging handler's level (and logger) between the time and the key is no part of the key.
    ("2024-05-01 12:00:00,123 - __main__ - INFO - Iter 10: Train loss 2.363, Learning Rate 1.0e-05\n"
     "[12:00:01] WARNING Iter 20: Train loss 2.250, Learning Rate 1.0e-05\n",
     [(10, {"loss": 2.363, "lr": 1e-05}), (20, {"loss": 2.25, "lr": 1e-05, "loss_resolution": 1e-3})]),
    # absl / glog's prefix (JAX, TensorFlow: t5x prints the step in brackets after it).
    ("I1123 12:00:00.123456 140234 train.py:123] [100] loss=2.3456, learning_rate=0.001\n"
     "I1123 12:00:09.654321 140234 train.py:123] [200] loss=2.25, learning_rate=0.001\n",
     [(100, {"loss": 2.3456, "lr": 0.001}), (200, {"loss": 2.25, "lr": 0.001})]),
    ("INFO:root:\x1b[32mstep: 10  loss:  9.2100  grad_norm: 1.5  memory: 12.3GiB(15.6%)\x1b[39m\n",
     [(10, {"loss": 9.21, "grad_norm": 1.5, "loss_resolution": 1e-4})]),
    # Dict prints with single quotes and string values; JSON with nested fields.
    ("{'loss': '1.23', 'grad_norm': 'nan', 'learning_rate': '3e-05', 'epoch': 0.5}\n"
     "{'loss': 1.2, 'grad_norm': 0.9, 'learning_rate': 2e-05, 'epoch': 1.0}\n",
     [(1, {"loss": 1.23, "grad_norm": NAN, "lr": 3e-05}), (2, {"loss": 1.2, "grad_norm": 0.9, "lr": 2e-05})]),
    ('[log] {"step": 7, "train": {"loss": 2.5, "grad_norm": 0.3}, "eval": {"loss": 2.9}}\n',
     [(7, {"loss": 2.5, "grad_norm": 0.3, "eval_loss": 2.9})]),
    # Step N/M, units and %, `|` separated, key=value, the DeepSpeed engine line (cumulative).
    ("Step 10/1000 | loss 2.5 | lr 3.0e-4 | 412.3 ms | mfu 41%\n", [(10, {"loss": 2.5, "lr": 3e-4})]),
    ("[Rank 0] step=10, skipped=2, lr=[1e-05, 1e-05], mom=[(0.9, 0.95)]\n"
     "[Rank 0] step=20, skipped=5, lr=[2e-05, 2e-05], mom=[(0.9, 0.95)]\n",
     [(10, {"skipped": 2.0, "lr": 1e-05}), (20, {"skipped": 3.0, "lr": 2e-05})]),
    # Micro-batches of one optimizer step: one record, their mean loss.
    ("iter 0 step 0: loss 10.0\niter 1 step 1: loss 9.0 (optimizer.step)\niter 2 step 1: loss 8.5\n"
     "iter 3 step 2: loss 8.0 (optimizer.step)\n", [(1, {"loss": 9.5}), (2, {"loss": 8.25})]),
    # Evaluation is never the training loss; nanoGPT's split report is no record.
    ("step 0: train loss 10.98, val loss 10.99\niter 0: loss 10.95, time 12.3ms\n"
     "validation loss at iteration 10 | lm loss value: 7.17 |\niter 10: loss 9.54, time 3.2ms\n"
     "Epoch 1 | eval_loss: 2.2\n", [(0, {"loss": 10.95}), (10, {"loss": 9.54})]),
    # ... but a log whose records all say `train_loss` keeps the ones printed beside a test loss.
    ('{"train_loss": 3.2, "epoch": 1}\n{"train_loss": 3.1, "test_loss": 0.9, "epoch": 2}\n',
     [(1, {"loss": 3.2}), (2, {"loss": 3.1, "eval_loss": 0.9})]),
    # Run summaries and argument echoes are no records. (An evaluation's loss on a record's line is read beside
    # it: `eval_loss`.)
    ("python train.py --lr 3e-4\nlearning_rate: 0.0003\n{'loss': 2.0, 'epoch': 1.0}\n"
     "{'train_runtime': 6.1, 'train_loss': 2.1, 'epoch': 2.0}\nbest loss 1.9\n",
     [(1, {"loss": 2.0, "loss_resolution": 0.1})]),
    # Epoch headers + batch counters (Keras): (epoch - 1) x batches per epoch + batch.
    ("Epoch 1/3\n100/100 [====] - 1s - loss: 0.69 - val_loss: 0.70\nEpoch 2/3\n"
     " 50/100 [==>.] - ETA: 1s - loss: 0.60\n",
     [(100, {"loss": 0.69, "eval_loss": 0.7}), (150, {"loss": 0.6, "loss_resolution": 0.01})]),
    # DeepSpeed overflow lines fold into the next record; at the end each is a record.
    ("step 1 loss 2.0\n[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, "
     "reducing to 32768\nOVERFLOW! Rank 0 Skipping step. Attempted loss scale: 32768, reducing to 16384\n"
     "step 2 loss 1.9\nOVERFLOW! Rank 0 Skipping step. Attempted loss scale: 16384, reducing to 8192\n",
     [(1, {"loss": 2.0, "loss_resolution": 0.1}), (2, {"loss": 1.9, "skipped": 2.0, "loss_scale": 16384.0}),
      (3, {"skipped": 1.0, "loss_scale": 8192.0})]),
    # A NaN warning marks the step already printed, never a new one; a repeated step is one row.
    ("step 11 loss 2.0\nstep 12 grad_norm 3.0\nWARNING: loss is nan at step 12, skipping\n"
     "step 13 loss 2.2\nstep 13 loss 2.4\n",
     [(11, {"loss": 2.0, "loss_resolution": 0.1}), (12, {"grad_norm": 3.0, "loss": NAN}), (13, {"loss": 2.3})]),
    # The printed digits a float loses (`1.000000` reads back as 1.0) come along for the stall
    # rule; a mean of micro-batches or ranks is not printed, so it has none.
    ("iter 1: loss 1.000000\niter 2: loss 0.98\niter 3: loss 2.10\niter 3: loss 2.30\n",
     [(1, {"loss": 1.0, "loss_resolution": 1e-6}), (2, {"loss": 0.98}), (3, {"loss": 2.2})]),
    # `Total iter` is the global count, beside an epoch and a batch counter (PaddleSlim).
    ("Total iter: 0, epoch: 0, batch: 0, loss: [10.5]\nTotal iter: 10, epoch: 0, batch: 10, loss: [nan]\n",
     [(0, {"loss": 10.5}), (10, {"loss": NAN})]),
    # An overflow whose update went ahead (MindSpore `still update`): the scale, no skip.
    ("overflow, still update, loss scale adjust to 1024.0\nStep 1/9, loss: 2.5, cur_lr: 0.25\n"
     "overflow, still update, loss scale adjust to 512.0\n",
     [(1, {"loss": 2.5, "lr": 0.25, "loss_scale": 1024.0}), (2, {"loss_scale": 512.0})]),
    # Chinese key words: a step, and a test-set line that is evaluation.
    ("训练次数：100, Loss：1.5\n整体测试集上的Loss: 262.6\n训练次数：200, Loss：1.25\n",
     [(100, {"loss": 1.5}), (200, {"loss": 1.25})]),
    # `total` is the loss inside a group named for losses, and nothing outside one.
    ("[Epoch 1/30, Batch 5/100] [Losses: x 0.5, cls 0.25, total 1.5]\n"
     "[Epoch 2/30, Batch 1/100] [Losses: x 0.5, cls 0.25, total 1.25]\nstep 300 total 7 loss 2.5\n",
     [(5, {"loss": 1.5}), (101, {"loss": 1.25}), (300, {"loss": 2.5})]),
    # CamelCase `LearningRate`; a precision before a known key (insightface `Fp16 Grad Scale`).
    ("Speed 2183.37 samples/sec   Loss 2.5   LearningRate 0.001000   Epoch: 0   Global Step: 30   "
     "Fp16 Grad Scale:  0   Required: 144 hours\n", [(30, {"loss": 2.5, "lr": 0.001, "loss_scale": 0.0})]),
    # Nested counters `[e/E][b/N]` under a name that is no counter (Swin's `Train:`): the outer
    # one counts epochs, as `Epoch: [e][b/N]` does with its name.
    ("INFO Train: [3/300][370/1251]  lr 0.000166  loss 6.3568\n"
     "INFO Train: [3/300][380/1251]  lr 0.000166  loss 5.5428\n",
     [(2872, {"lr": 0.000166, "loss": 6.3568}), (2882, {"lr": 0.000166, "loss": 5.5428})]),
    # Prose: `Loss is x. Current learning rate is y.` (BigDL); the key is the sentence's subject.
    ("[Iteration 7] Throughput is 408.4 records/second. Loss is 1.25. Current learning rate is 0.04.\n"
     "[Iteration 8] Throughput is 398.7 records/second. Loss is Infinity. Current learning rate is 0.04.\n",
     [(7, {"loss": 1.25, "lr": 0.04}), (8, {"loss": float("inf"), "lr": 0.04})]),
    # Keras per-epoch lines that only print complete bars (samples or batches): nothing finer
    # than the epoch is printed, so the epoch is the step.
    ("Epoch 1/3\n60000/60000 [==============================] - 5s 83us/sample - loss: 0.5000\n"
     "Epoch 2/3\n60000/60000 [==============================] - 5s 81us/sample - loss: 0.4000 - val_loss: 0.45\n",
     [(1, {"loss": 0.5, "loss_resolution": 1e-4}), (2, {"loss": 0.4, "loss_resolution": 1e-4, "eval_loss": 0.45})]),
    # An epoch that is the only counter is the step; two records of one epoch: order of appearance.
    ("epoch: 1 loss: 2.3\nepoch: 2 loss: nan\n", [(1, {"loss": 2.3}), (2, {"loss": NAN})]),
    ("epoch 1 loss 2.0\nepoch 1 loss 1.9\nepoch 2 loss 1.8\n",
     [(1, {"loss": 2.0, "loss_resolution": 0.1}), (2, {"loss": 1.9}), (3, {"loss": 1.8})]),
    # `<iteration>: <value>` lines: a counter and one unnamed value, the loss (its NaN too).
    ("100: 2.5\n110: 2.4\n120: nan\n", [(100, {"loss": 2.5}), (110, {"loss": 2.4}), (120, {"loss": NAN})]),
    # A key of two words and a parenthesis: `(curr)` is the value, `(avg)` a statistic.
    ("iter 100 | loss train (curr): 2.345 | loss train (avg): 2.401\n", [(100, {"loss": 2.345})]),
    # mmengine prints the configured `base_lr` beside the scheduled `lr`.
    ("Epoch(train)  [1][ 50/500]  base_lr: 1.0000e-02 lr: 5.0000e-03  eta: 0:01:00  time: 0.5  loss: 1.2000\n",
     [(50, {"lr": 0.005, "loss": 1.2, "loss_resolution": 1e-4})]),
    # DeepSpeed's cumulative count in an excerpt: the first count is no delta of its step.
    ("[Rank 0] step=510, skipped=8, lr=[1e-05], mom=[(0.9, 0.95)]\n"
     "[Rank 0] step=520, skipped=9, lr=[1e-05], mom=[(0.9, 0.95)]\n",
     [(510, {"lr": 1e-05}), (520, {"lr": 1e-05, "skipped": 1.0})]),
    # A table: a header row of names, rows of values (HF notebook tables, ultralytics).
    ("Step | Training Loss | Validation Loss | reward\n-- | -- | -- | --\n1 | 0.500000 | 0.6 | 1.0\n"
     "2 | 0.400000 | No log | 1.5\n",
     [(1, {"loss": 0.5, "loss_resolution": 1e-6, "eval_loss": 0.6}), (2, {"loss": 0.4, "loss_resolution": 1e-6})]),
    # Named terms of the objective and no total: the loss is their sum.
    ("      Epoch    GPU_mem   box_loss   cls_loss   dfl_loss  Instances       Size\n"
     "        1/3      1.95G        1.0        2.0        0.5         33        640: 100%|##| 8/8 [00:02<00:00]\n",
     [(1, {"loss": 3.5})]),
])
def test_generic_reader_rules(tmp_path, text, want):
    got = records_of(tmp_path, text)
    assert [s for s, _ in got] == [s for s, _ in want]
    for (_, g), (_, w) in zip(got, want):
        assert g.keys() == w.keys(), (g, w)
        for k, v in w.items():
            assert g[k] == pytest.approx(v, nan_ok=True), (k, g, w)


def test_a_log_without_metrics_says_what_was_looked_for_and_what_came_closest(tmp_path):
    path = tmp_path / "odd.log"
    path.write_text("starting\n" + "".join(f"ep {e} mse_err {1 / (e + 1):.3f} acc 0.{e}\n"
                                            for e in range(5)) + "done\n")
    with pytest.raises(LogFormatError) as e:
        read_records(path)
    msg = str(e.value)
    assert msg.startswith(f"{path}: unknown log format: no per-step training metrics in 7 line(s).")
    assert "looked for: a step (step, iter, iteration" in msg
    # The closest lines (the most keyed numbers, first ones first) and what to paste: whole
    # commands, quoted for the shell (test_suggestions.py pastes them).
    assert "closest lines:\n    line 2: ep 0 mse_err 1.000 acc 0.0\n    line 3: ep 1 mse_err 0.500" in msg
    assert f"\n    stability-callbacks replay {path} --keys step=ep,loss=mse_err\n" in msg
    # Saying it explicitly, either way suggested, reads the log.
    want = [(e, {"loss": float(f"{1 / (e + 1):.3f}")}) for e in range(5)]
    for e in (0, 1, 3, 4):   # 1.000, 0.500, 0.250, 0.200: the printed digits the float loses
        want[e][1]["loss_resolution"] = 1e-3
    assert [(r.step, r.metrics) for r in read_records(path, user_keys=parse_keys("step=ep,loss=mse_err"))] \
        == want
    pat = compile_pattern(msg.split("--pattern '")[1].split("'")[0])
    assert [(r.step, r.metrics) for r in read_records(path, pattern=pat)] == want


def test_the_hint_never_names_a_counter_that_repeats_as_the_step(tmp_path):
    path = tmp_path / "odd.log"
    path.write_text("".join(f"ep 0 mse_err {1 / (b + 1):.3f} acc 0.{b}\n" for b in range(5)))
    with pytest.raises(LogFormatError) as e:
        read_records(path)
    assert f"stability-callbacks replay {path} --keys loss=mse_err\n" in str(e.value)


def test_a_megatron_excerpt_after_a_sentence_with_commas_is_megatron(tmp_path):
    path = tmp_path / "issue.log"
    path.write_text("Hi, the loss spikes at iteration 20, with bf16, TP=2, logs below:\n\n" + "".join(
        f" iteration       {i}/    1000 | consumed samples:     {i * 512} | learning rate: 1.000E-05 | "
        f"lm loss: 7.5E+00 | loss scale: 1.0 | number of skipped iterations:   0 | "
        f"number of nan iterations:   0 |\n" for i in range(10, 13)))
    assert detect_format(path) == "megatron"
    assert [r.step for r in read_records(path)] == [10, 11, 12]


def test_keys_and_pattern_flags_are_checked():
    assert parse_keys("step=it, loss=Train Loss") == {"it": "step", "Train Loss": "loss"}
    with pytest.raises(ValueError, match=r"--keys: 'lossy' is not step or a metric key"):
        parse_keys("lossy=x")
    with pytest.raises(ValueError, match=r"--keys: 'step' is not OURS=THEIRS"):
        parse_keys("step")
    with pytest.raises(ValueError, match=r"--pattern: named groups must be step, epoch and metric keys"):
        compile_pattern(r"(?P<stp>\d+) (?P<loss>\S+)")
    with pytest.raises(ValueError, match=r"--pattern: not a regular expression"):
        compile_pattern(r"(?P<step>\d+")


def test_generic_reading_keeps_pace_with_the_format_readers():
    # The 20k-step modded-nanogpt log through the generic reader (it was a dedicated reader's).
    log = REAL / "mn_gpt2_1p5B_scaleup_20k.log"
    t0 = time.perf_counter()
    n = sum(1 for _ in read_records(log, format="generic"))
    assert n == 20344
    assert time.perf_counter() - t0 < 1.5


def test_a_followed_log_waits_for_megatron_behind_deepspeed_lines(monkeypatch):
    from stability_callbacks.replay import readers
    ds = "[Rank 0] step=10, skipped=0, lr=[1e-05], mom=[(0.9, 0.95)]"
    mega = (" iteration       10/    1000 | consumed samples:     5120 | learning rate: 1.000E-05 | "
            "lm loss: 7.5E+00 | loss scale: 4096.0 | number of skipped iterations:   0 |")
    lines = [(1, ds), (1, None), (1, None), (2, mega), (3, ds)]
    # Idle ticks do not settle DeepSpeed's lines at once: Megatron's first line decides.
    fmt, consumed = readers.detect_lines("run.log", iter(lines))
    assert fmt == "megatron" and consumed == [(1, ds), (2, mega)]
    # A log that stays DeepSpeed-only is the generic reader's once the wait is over.
    monkeypatch.setattr(readers.sniff, "SETTLE_S", 0.0)
    assert readers.detect_lines("run.log", iter(lines))[0] == "generic"
