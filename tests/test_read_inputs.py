"""What replay reads, and that it says so: input sanity (binary files refused with a reason, gzip
read as is), streams read in full (stdin, FIFOs), TensorBoard tags, trainer_state.json as the
Trainer's own history, the account of what was read (printed, and the first --json record), exit 2
without a training loss, and findings on logs that print no step numbers."""
from __future__ import annotations

import gzip
import json
import os
import random
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import pytest

from stability_callbacks import Monitor
from stability_callbacks.cli import main
from stability_callbacks.replay.readers import LogFormatError, ReadAccount, read_records

WILD = Path(__file__).parent / "data" / "wild_logs"


def _steps(n: int, nan_at: int | None = None) -> str:
    return "".join(f"step {s} | loss {'nan' if s == nan_at else f'{2.0 + 1.0 / s:.4f}'}\n"
                   for s in range(1, n + 1))


def _replay(capsys, *argv) -> tuple[int, str, str]:
    code = main(["replay", *map(str, argv)])
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("name, content, reason", [
    ("model.safetensors", (24).to_bytes(8, "little") + b'{"__metadata__":{"a":"b"}}' + bytes(64),
     "a safetensors file"),
    ("optimizer.pt", None, "a zip archive (a torch .pt/.pth checkpoint"),
    ("ls", b"\x7fELF\x02\x01\x01\x00" + bytes(200), "an ELF executable"),
    ("noise.log", random.Random(0).randbytes(4096), "binary data"),
])
def test_files_that_are_no_text_log_exit_2_with_a_reason(tmp_path, capsys, name, content, reason):
    path = tmp_path / name
    if content is None:
        with zipfile.ZipFile(path, "w") as z:          # torch.save's format
            z.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
    else:
        path.write_bytes(content)
    code, out, err = _replay(capsys, path)
    assert code == 2 and out == ""
    assert err.startswith(f"error: {path}: not a text log: {reason}") and err.count("\n") == 1


def test_a_gzipped_log_is_read_as_is(tmp_path):
    path = tmp_path / "train.log.gz"
    path.write_bytes(gzip.compress(_steps(50).encode()))
    recs = list(read_records(path))
    assert [r.step for r in recs] == list(range(1, 51)) and recs[-1].metrics["loss"] == 2.02


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_carrying_200_steps_gives_200_steps(tmp_path):
    fifo = tmp_path / "train.fifo"
    os.mkfifo(fifo)

    def write():
        with open(fifo, "w") as f:
            for line in _steps(200).splitlines(keepends=True):
                f.write(line)
                f.flush()

    writer = threading.Thread(target=write)
    writer.start()
    recs = list(read_records(fifo))
    writer.join(10)
    assert [r.step for r in recs] == list(range(1, 201))


def test_standard_input_is_read_in_full():
    r = subprocess.run([sys.executable, "-m", "stability_callbacks", "replay", "-", "--json", "-"],
                       input=_steps(200), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    read = json.loads(r.stdout.splitlines()[0])
    assert read["type"] == "read" and read["path"] == "-" and read["steps"] == 200


def test_a_tensorboard_run_without_a_loss_tag_exits_2_naming_its_tags(tmp_path, capsys):
    torch_tb = pytest.importorskip("torch.utils.tensorboard")
    writer = torch_tb.SummaryWriter(str(tmp_path / "run"))
    for step in range(20):
        writer.add_scalar("grad_norm", 0.5, step)
        writer.add_scalar("throughput/tps", 1000.0, step)
    writer.close()
    code, out, err = _replay(capsys, tmp_path)
    assert code == 2
    assert "no training loss among the TensorBoard tags (grad_norm, throughput/tps)" in err
    # --keys names a tag as the loss.
    recs = list(read_records(tmp_path, user_keys={"throughput/tps": "loss"}))
    assert len(recs) == 20 and recs[0].metrics == {"loss": 1000.0, "grad_norm": 0.5}


def test_tensorboard_tags_of_torchtitan_olmo_core_and_lightning_map(tmp_path):
    torch_tb = pytest.importorskip("torch.utils.tensorboard")
    for run, tags in {"titan": ("loss_metrics/global_avg_loss", "grad_norm", "lr"),
                      "olmo": ("train/CE loss", "optim/total grad norm", "optim/LR (group 0)"),
                      "lightning": ("train_loss_step", "train_loss_epoch", "lr-AdamW")}.items():
        writer = torch_tb.SummaryWriter(str(tmp_path / run))
        for step in range(3):
            for i, tag in enumerate(tags):
                writer.add_scalar(tag, float(i + 1), step)
        writer.close()
        account = ReadAccount(run)
        recs = list(read_records(tmp_path / run, account=account))
        got = {k: v for k, v in recs[0].metrics.items()}
        want = {"titan": {"loss": 1.0, "grad_norm": 2.0, "lr": 3.0},
                "olmo": {"loss": 1.0, "grad_norm": 2.0, "lr": 3.0},
                "lightning": {"loss": 1.0, "lr": 3.0}}[run]
        assert got == want, run
        assert account.keys["loss"] == [tags[0]]


def test_trainer_state_of_a_run_with_our_callback_is_the_trainers_history(tmp_path):
    # log_history as the HF Trainer writes it when our callback logs through trainer.log:
    # our entry and the Trainer's own at each logging step (the same `step`).
    history = []
    for step in range(10, 610, 10):
        history.append({"stability/loss": 2.0 + 1 / step, "stability/grad_norm": 0.5, "step": step})
        history.append({"loss": 2.1 + 1 / step, "grad_norm": 0.6, "learning_rate": 1e-4,
                        "epoch": step / 600, "step": step})
    history.append({"eval_loss": 2.3, "step": 600})
    history.append({"train_runtime": 99.0, "train_loss": 2.2, "step": 600})
    path = tmp_path / "trainer_state.json"
    path.write_text(json.dumps({"global_step": 600, "log_history": history}, indent=2))
    recs = list(read_records(path))
    assert [r.step for r in recs] == list(range(10, 610, 10))
    assert recs[0].metrics == {"loss": 2.1, "grad_norm": 0.5, "lr": 1e-4}   # ours over the mean
    monitor = Monitor()
    kinds = {f.kind for r in recs for f in monitor.update(r)}
    assert not kinds & {"resume", "resume_spike", "lr_anomaly"}


def test_replay_says_what_it_read_first(capsys, tmp_path):
    log = tmp_path / "run.log"
    log.write_text("starting\n" + _steps(30) + "step 30 | val loss 2.5\n")
    code, out, _ = _replay(capsys, log, "--json", tmp_path / "f.jsonl")
    assert code == 0
    assert out.splitlines()[:4] == [
        "read 30 steps (generic)", "  keys: loss <- 'loss'",
        "  steps numbered by the log's counter: 'step'",
        "  lines ignored: 1 no numbers (first: line 1); 1 evaluation (first: line 32)"]
    read = json.loads((tmp_path / "f.jsonl").read_text().splitlines()[0])
    assert read == {"type": "read", "path": str(log), "format": "generic", "steps": 30,
                    "steps_with_loss": 30, "keys": {"loss": ["loss"]},
                    "steps_numbered_by": {"the log": ["step"]}, "numbering_parts": [],
                    "ignored_lines": {"no numbers": {"lines": 1, "first_line": 1},
                                      "evaluation": {"lines": 1, "first_line": 32}}, "notes": []}


def test_no_training_loss_read_exits_2_with_nothing_to_judge(capsys, tmp_path):
    log = tmp_path / "lr_only.log"
    log.write_text("".join(f"step {s} | lr {1e-4 * s:.2e}\n" for s in range(1, 40)))
    code, out, err = _replay(capsys, log)
    assert code == 2 and out.startswith("read 39 steps (generic)")
    assert "no training loss was read and nothing else to judge (39 steps, keys: lr)" in err
    assert "findings" not in out   # no summary of 0 findings before the refusal


@pytest.mark.parametrize("steps", [1, 2, 3])
def test_a_log_of_one_or_two_steps_says_its_verdict_says_little(capsys, tmp_path, steps):
    log = tmp_path / "short.log"
    log.write_text("".join(f"step {s} | loss {2.3 - 0.1 * s:.2f}\n" for s in range(1, steps + 1)))
    code, out, _ = _replay(capsys, log)
    said = (f"note: only {steps} step{'s' * (steps != 1)} with a loss: too few to judge a spike or a trend "
            "against (a NaN or Inf is still found): the findings below say little")
    assert code == 0 and (said in out.splitlines()) == (steps < 3)


def test_a_log_without_a_loss_is_judged_on_its_other_signals(capsys, tmp_path):
    # A grad norm (or a loss scale, overflow skips) and no loss: judged on them, said first;
    # the exit code follows the findings as for any log.
    log = tmp_path / "gn_only.log"
    log.write_text("".join(f"step {s} | lr {1e-4 * s:.2e} | grad_norm {0.5 + s / 1000:.3f}\n"
                           for s in range(1, 40)))
    code, out, err = _replay(capsys, log)
    assert code == 0 and out.splitlines()[:2] == ["no training loss read; judged on: grad_norm",
                                                  "read 39 steps (generic)"]
    log = tmp_path / "ds_fp16.log"
    scales = [2 ** (16 - i) for i in range(17)]
    log.write_text("".join(f"[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: {a}, "
                           f"reducing to {b}\n" for a, b in zip(scales, scales[1:])))
    code, out, err = _replay(capsys, log, "--json", tmp_path / "f.jsonl")
    assert out.splitlines()[0] == "no training loss read; judged on: loss_scale, skipped"
    findings = [json.loads(x) for x in (tmp_path / "f.jsonl").read_text().splitlines()[1:]]
    assert "loss_scale_collapse" in {f["kind"] for f in findings}
    assert code == (1 if any(f["severity"] == "critical" for f in findings) else 0)


def test_findings_on_a_log_without_step_numbers_say_so_and_advise_no_batches(capsys, tmp_path):
    log = tmp_path / "hf.log"
    lines = [f"{{'loss': {2.0 + 0.3 / (i + 1):.4f}, 'grad_norm': 0.5, 'learning_rate': 1e-05, 'epoch': {i / 100:.2f}}}"
             for i in range(1, 81)]
    lines[69] = "{'loss': nan, 'grad_norm': nan, 'learning_rate': 1e-05, 'epoch': 0.7}"
    log.write_text("\n".join(lines) + "\n")
    code, out, err = _replay(capsys, log, "--json", tmp_path / "f.jsonl")
    assert code == 1
    assert "steps numbered by order of appearance" in out
    findings = [json.loads(x) for x in (tmp_path / "f.jsonl").read_text().splitlines()[1:]]
    nonfinite = next(f for f in findings if f["kind"] == "nonfinite")
    assert nonfinite["step"] == 70 and "record number 70 of the log" in nonfinite["message"]
    advice = [f for f in findings if f["kind"] == "rollback_advice"]
    assert advice and all("skip_steps" not in f["details"] and f["details"]["step_is_record_number"]
                          for f in advice)
    said = " ".join(out.split())
    assert "--skip-train-iteration-range" not in said and "no checkpoint step or batches to skip" in said


def test_sniffing_never_throws_on_what_it_reads(tmp_path):
    # A CSV-looking first line that the csv module rejects; a first line of prose with commas.
    odd = tmp_path / "odd.log"
    odd.write_text('a,"b\n' + _steps(5))
    assert [r.step for r in read_records(odd)] == [1, 2, 3, 4, 5]


def test_cost_is_linear_on_repeated_steps_and_one_giant_line(tmp_path):
    import time
    repeated = tmp_path / "repeated.log"
    repeated.write_text("".join(f"step 7 loss {1.0 + (i % 7) / 10}\n" for i in range(40_000)))
    giant = tmp_path / "giant.log"
    giant.write_text(" ".join(f"step {s // 50} loss {2.0 + s % 3}" for s in range(20_000)) + "\n")
    # (a step that stays over all its lines with losses that differ is no step: 40,000 records in order)
    for path, n, bound_s in ((repeated, 40_000, 3.0), (giant, 400, 5.0)):   # ~0.3 s and ~1 s measured
        t0 = time.perf_counter()
        recs = list(read_records(path))
        assert len(recs) == n and time.perf_counter() - t0 < bound_s, path.name
    assert [r.metrics["loss"] for r in list(read_records(repeated))[:8]] == [1.0, 1.1, 1.2, 1.3, 1.4, 1.5, 1.6, 1.0]


@pytest.mark.parametrize("name, steps, first_loss, last_loss", [
    ("f_trl_sft_gemma3_mps_packing_first10_healthy", list(range(1, 11)), 2.4266, 1.8829),
    ("f_trl_gen_grpo_rewards_gradnorm_blip37", list(range(1, 61)), None, None),
    ("f_lightning_csvlogger_tiny_regression", [4, 9, 14, 19, 24, 29, 34, 39, 44, 49, 54, 59], 2.1462912559509277, None),
])
def test_trl_and_lightning_logs_read_with_their_steps_and_loss(name, steps, first_loss, last_loss):
    log = WILD / next(lab["log"] for f in WILD.glob("labels.*.json") for lab in json.loads(f.read_text())
                      if lab["name"] == name)
    account = ReadAccount(log)
    recs = list(read_records(log, account=account))
    assert [r.step for r in recs] == steps and all("loss" in r.metrics for r in recs)
    if first_loss is not None:
        assert recs[0].metrics["loss"] == first_loss
    if last_loss is not None:
        assert recs[-1].metrics["loss"] == last_loss
    if name.startswith("f_lightning"):
        assert account.keys["loss"] == ["train_loss_step"] and account.format == "csv"
    else:   # `mean_token_accuracy`, `completions/mean_length`: other numbers, never a reason to drop
        assert account.numbering == {"order": []}


def test_unreadable_input_errors_name_the_file_in_one_line(tmp_path):
    with pytest.raises(LogFormatError, match=r"missing\.log: no such file$"):
        read_records(tmp_path / "missing.log")
    bad = tmp_path / "bad.log.gz"
    bad.write_bytes(b"\x1f\x8b\x08\x00garbage")
    with pytest.raises(LogFormatError, match=r"bad\.log\.gz: a gzip file that does not unpack"):
        read_records(bad)


def test_garbled_logs_never_take_replay_down(tmp_path, capsys):
    # random lines of the pieces logs are made of (names, brackets, bars, NaN and inf, wrapped
    # scalars, colour codes, carriage returns, foreign colons): replay reads them, refuses them or
    # judges them, with an exit code and no traceback, and no detector turned off (before: a bar's
    # count of inf raised out of the reader)
    rng = random.Random(1)
    pieces = ["step", "loss", "lr", "epoch", "Epoch", "iter", "[", "]", "(", ")", "{", "}", ":", "=", "|", ",", " - ", "/",
              "%", "nan", "inf", "-inf", "tensor(", "grad_norm", "val_loss", "\t", "\r", "\b", "\x1b[32m", "loss_scale",
              "skipped", "overflow", "Skipping step", "1/100", "100/100", "[====>...]", "ETA:", "it/s", '{"loss":',
              '"step":', "loss: [", "，", "：", "损失", "D:", "G:", "array(", "np.float32(", "tf.Tensor(", '"', "'",
              "> ", "```", "WARNING", "1,000", "1.2e+05", "1e-300", "1e300", "0.000", "-0.5", "12:30:45", "2024-01-01"]
    for trial in range(40):
        template = [rng.choice(pieces) for _ in range(rng.randint(1, 12))]
        lines = []
        for i in range(rng.randint(1, 120)):
            parts = []
            for piece in template:
                parts.append(piece if rng.random() < 0.85 else rng.choice(pieces))
                if rng.random() < 0.6:
                    parts.append(str(rng.choice([i, i * 10, round(rng.random() * 3, 4), rng.randint(0, 5), -1.5, 0])))
                parts.append(" " if rng.random() < 0.7 else "")
            lines.append("".join(parts))
        path = tmp_path / f"x{trial}{rng.choice(['.log', '.txt', '.csv', '.jsonl'])}"
        path.write_text("\n".join(lines) + "\n")
        try:
            code = main(["replay", str(path), "--json", str(tmp_path / "out.jsonl")])
        except SystemExit as e:
            code = e.code
        err = capsys.readouterr().err
        assert code in (0, 1, 2) and "Traceback (most recent call last)" not in err and "failed at step" not in err, \
            (trial, lines[:3], err[-800:])
