"""The shapes the print-format sweeps of the seventeenth round found (docs/replay.md, The print-format
sweeps): each tool's print format taken from its source, a log written here in that shape, and what
the reader and the detectors must make of it."""
from __future__ import annotations

import json
import math
import random

import pytest

from shapes import records_of, replay_json
from stability_callbacks.replay.readers import assemble, read_records


def _loud(found: list[dict]) -> list[dict]:
    """The findings at warning or above."""
    return [f for f in found if f["severity"] != "info"]


def _quiet_for_seeds(capsys, path, make, seeds: int) -> None:
    """``make(seed)`` written to ``path`` and replayed for each seed: no warning or critical on any."""
    for seed in range(seeds):
        path.write_text(make(seed))
        assert _loud(replay_json(capsys, path)[2]) == [], seed


def _wenet(epochs: int, v3: bool, spike_at: int | None = None) -> str:
    # WeNet's executor: `TRAIN Batch {epoch}/{batch_idx} loss {:.6f} loss_att .. lr {:.8f} rank 0` (v2), and
    # `TRAIN | steps/sec {:.3f}| Batch {epoch}/{batch_idx} loss ..` (v3), its cross-validation's `CV Batch
    # e/b .. history loss` lines after each epoch, then `Epoch e CV info cv_loss ..`
    lines = []
    for e in range(epochs):
        for b in range(0, 1000, 20):
            s = e * 1000 + b
            x = 20.0 + 120.0 * math.exp(-s / 800.0) * (1.0 + 0.02 * math.sin(s))
            x *= 8.0 if s == spike_at else 1.0
            head = "TRAIN | steps/sec 1.900| Batch" if v3 else "TRAIN Batch"
            lines.append(f"2026-11-30 10:00:00,000 DEBUG {head} {e}/{b} loss {x:.6f} loss_att {0.9 * x:.6f} "
                         f"loss_ctc {1.3 * x:.6f} lr {min(1e-3, (s + 1) * 1e-6):.8f} rank 0")
        for b in range(0, 300, 100):
            head = "CV | steps/sec 5.100| Batch" if v3 else "CV Batch"
            lines.append(f"2026-11-30 10:00:00,000 DEBUG {head} {e}/{b} loss 18.5 loss_att 17.1 loss_ctc 22.3 "
                         f"history loss 18.5")
        lines.append(f"2026-11-30 10:00:00,000 INFO Epoch {e} CV info cv_loss 18.5")
    return "\n".join(lines) + "\n"


def test_wenets_batch_epoch_slash_count_is_the_epoch_and_the_count_within_it(tmp_path):
    # `Batch 0/20`, `Batch 0/40`: the number after the slash moves while the one before stays, so it is no
    # total but the count. Before, read as a count of 0 out of 20, then 40 ...: 3 records out of 150, a spike
    # missed; and the `CV` lines were records
    for v3 in (False, True):
        got, account = records_of(tmp_path, _wenet(3, v3))
        steps = [s for s, _ in got]
        assert len(got) == 150 and steps == sorted(steps) and len(set(steps)) == 150, v3
        assert [m["loss"] for _, m in got[:2]] == [round(20.0 + 120.0, 6), round(
            20.0 + 120.0 * math.exp(-20 / 800.0) * (1.0 + 0.02 * math.sin(20)), 6)]
        assert account.ignored["evaluation"][0] == 12 and account.numbering == {"counter": [
            ("Batch /N" if v3 else "TRAIN Batch /N")]}


def test_wenets_spike_is_found_at_its_batch(tmp_path, capsys):
    path = tmp_path / "train.log"
    path.write_text(_wenet(3, False, spike_at=1960))
    _, _, found = replay_json(capsys, path)
    spikes = [f for f in found if f["kind"] == "loss_spike" and f["severity"] == "warning"]
    # epoch 1's batch 960, each epoch the largest count printed + 1 long (it counts from 0; the note says so)
    assert [f["step"] for f in spikes] == [1 * 981 + 960]


def test_a_count_whose_total_stays_is_read_as_before(tmp_path):
    # `Step [k/500]`: the total the same on every line: a count and its total, as ever
    got, account = records_of(tmp_path, "".join(f"Step [{k}/500] loss: {2.0 - k / 1000:.4f}\n" for k in range(1, 60)))
    assert [s for s, _ in got] == list(range(1, 60))


def test_a_save_line_heads_no_records(tmp_path):
    # pix2pixHD: `(epoch: e, iters: i, ..)` counts iterations within the epoch, and after each epoch `saving the
    # model at the end of epoch e, iters N` prints the run's total. Before, that total was read as a step
    # header's count: the epochs 2,000 long instead of 1,000, every step after the first epoch wrong
    lines = []
    for e in range(1, 5):
        lines += [f"(epoch: {e}, iters: {i}, time: 0.088) G_GAN: 1.304 G_GAN_Feat: 7.737 D_real: 0.498 D_fake: 0.518 "
                  for i in range(100, 1001, 100)]
        lines += [f"End of epoch {e} / 200 \t Time Taken: 312 sec", f"saving the model at the end of epoch {e}, iters {e * 1000}"]
    got, account = records_of(tmp_path, "\n".join(lines) + "\n")
    assert [s for s, _ in got] == list(range(100, 4001, 100))
    assert account.ignored["a checkpoint's save (no header of the records after it)"] == [4, 12]


def test_fairseqs_json_epoch_summary_is_no_record(tmp_path):
    # fairseq's `--log-format json`: interval records `{"epoch": 1, "update": 0.5, "loss": .., "num_updates": ..}`,
    # and after each epoch `| train | {"epoch": 1, "train_loss": .., "train_num_updates": 1563, ..}`, the epoch's
    # mean. Before, a record of its own at the epoch's last update (an epoch's mean beside the last interval)
    lines = []
    for e in range(1, 4):
        for u in range(100, 1501, 100):
            n = (e - 1) * 1563 + u
            lines.append(f'2024-02-01 15:37:43 | INFO | train_inner | {{"epoch": {e}, "update": {e - 1 + u / 1563:.3f}, '
                         f'"loss": "{9.0 - n / 1000:.3f}", "lr": "0.0005", "num_updates": "{n}"}}')
        lines.append(f'2024-02-01 15:37:43 | INFO | valid | {{"epoch": {e}, "valid_loss": "6.883", "valid_num_updates": '
                     f'"{e * 1563}"}}')
        lines.append(f'2024-02-01 15:37:43 | INFO | train | {{"epoch": {e}, "train_loss": "{9.5 - e:.3f}", "train_lr": '
                     f'"0.0005", "train_num_updates": "{e * 1563}"}}')
    got, account = records_of(tmp_path, "\n".join(lines) + "\n")
    assert len(got) == 45 and account.keys["loss"] == ["loss"] and got[15][0] == 1563 + 100
    assert account.ignored["epoch summary or another loop (the log's records print a finer counter)"][0] == 3


def _d3rlpy(epochs: int, spike_at: int | None = None) -> str:
    # d3rlpy: a complete tqdm bar per epoch (`loss=` to tqdm's 3 digits), then its structlog line with the
    # epoch's mean loss and the global step
    lines = []
    for e in range(1, epochs + 1):
        x = 0.01 + 0.2 * 0.9 ** e
        x *= 20.0 if e == spike_at else 1.0
        lines.append(f"Epoch {e}/100: 100%|██████████| 1000/1000 [00:03<00:00, 301.22it/s, loss={x:.3g}]")
        lines.append(f"2024-03-01 10:01.01 [info     ] DQN_20240301100000: epoch={e} step={e * 1000} epoch={e} "
                     f"metrics={{'time_sample_batch': 0.00012, 'loss': {x!r}, 'time_step': 0.0031}} step={e * 1000}")
    return "\n".join(lines) + "\n"


def test_a_complete_bar_then_the_same_loss_with_a_step_is_one_record(tmp_path, capsys):
    # before: the bar numbered by its epoch (1, 2, ..) beside the line's step (1000, 2000, ..): a resume every
    # epoch, and a spike missed
    got, account = records_of(tmp_path, _d3rlpy(60))
    assert [s for s, _ in got] == [1000 * e for e in range(1, 61)] and account.numbering == {"counter": ["step"]}
    assert got[0][1]["loss"] == 0.01 + 0.2 * 0.9
    path = tmp_path / "d3.log"
    path.write_text(_d3rlpy(60, spike_at=40))
    _, _, found = replay_json(capsys, path)
    assert [(f["kind"], f["step"]) for f in found if f["severity"] != "info"] == [("loss_spike", 40000)]


def test_a_model_summarys_rows_are_no_records(tmp_path, capsys):
    # Lightning prints its model summary first: `1 | criterion | CrossEntropyLoss | 0 | train`. Before, that row
    # was a record (loss 0 named `CrossEntropyLoss`), the log's loss named so, and every bar line printing
    # `train_loss=` beside `val_loss=` then taken for an evaluation: 50 records of 250, a spike missed
    head = ("  | Name      | Type               | Params | Mode \n" + "-" * 57 + "\n"
            "0 | model     | ResNet             | 11.2 M | train\n1 | criterion | CrossEntropyLoss   | 0      | train\n"
            + "-" * 57 + "\n11.2 M    Trainable params\n0         Non-trainable params\n")
    lines = []
    for e in range(5):
        val = "" if e == 0 else ", val_loss=1.370, val_acc=0.431"
        for b in range(1, 51):
            x = 2.3 * 0.99 ** (e * 50 + b) * (8.0 if e * 50 + b == 137 else 1.0)
            lines.append(f"Epoch {e}: {2 * b}%|█| {b}/50 [00:03<00:00, 15.00it/s, v_num=0, train_loss={x:.3f}{val}]")
    path = tmp_path / "pl.log"
    path.write_text(head + "\r".join(lines) + "\n")
    got, account = records_of(tmp_path, path.read_text())
    assert len(got) == 250 and account.keys["loss"] == ["train_loss"]
    _, _, found = replay_json(capsys, path)
    assert [(f["kind"], f["step"]) for f in found if f["severity"] != "info"] == [("loss_spike", 137)]


def test_deepspeechs_bar_opening_at_zero_and_its_validation_are_no_records(tmp_path, capsys):
    # Mozilla DeepSpeech (progressbar2, one line per update off a terminal): each epoch's bar opens with
    # `Steps: 0 | Loss: 0.000000`, and its validation bar prints `| Validation | Elapsed Time: ..`. Before: five
    # critical stalls on a healthy run (the zeros), and the validation's losses read as training records
    lines = []
    for e in range(6):
        for phase, n in (("  Training", 40), ("Validation", 10)):
            for k in range(n + 1):
                x = 0.0 if k == 0 else (130.0 if phase == "Validation" else 60.0 + 160.0 * 0.93 ** (e * 40 + k) + math.sin(e * 40 + k))
                tail = " | Dataset: /data/cv/dev.csv" if phase == "Validation" else ""
                lines.append(f"Epoch {e} | {phase} | Elapsed Time: 0:00:{k % 60:02d} | Steps: {k} | Loss: {x:.6f}{tail}")
    path = tmp_path / "ds.log"
    path.write_text("\n".join(lines) + "\n")
    got, account = records_of(tmp_path, path.read_text())
    assert len(got) == 240 and all(m["loss"] > 50 for _, m in got)
    assert account.ignored["evaluation"][0] == 66
    _, _, found = replay_json(capsys, path)
    assert _loud(found) == []


def _lightning1(seed: int, rise_from: int | None = None) -> str:
    # Lightning 1.x's bar: `loss=` is the mean of the last 20 training losses (its running loss), printed
    # first, before `v_num`; here a diffusion loss (±28% a batch) and, for the incident, a rise x4 over 100 steps
    rng = random.Random(seed)
    raw, frames = [], []
    for s in range(1, 301):
        x = (0.075 + 0.12 * math.exp(-s / 25)) * math.exp(rng.gauss(0.0, 0.25)) * (4.0 ** min(1.0, (s - rise_from) / 100) if rise_from and s > rise_from else 1.0)
        raw.append(x)
        mean = sum(raw[-20:]) / len(raw[-20:])
        e, b = divmod(s - 1, 150)
        frames.append(f"Epoch {e}:  {b * 100 // 150}%|█| {b + 1}/150 [00:01<01:08,  1.60it/s, loss={mean:.3g}, v_num=0]")
    return "\r".join(frames) + "\n"


def test_lightning1s_running_loss_is_judged_as_a_window_mean(tmp_path, capsys):
    # before: its steps moved it by a twentieth of a batch's change, so the divergence rule took its noise for
    # that small and called the running mean's wander over 20 batches a critical divergence (16 runs of 20)
    path = tmp_path / "pl1.log"
    _quiet_for_seeds(capsys, path, _lightning1, 10)
    path.write_text(_lightning1(0, rise_from=150))
    _, _, found = replay_json(capsys, path)
    assert {f["kind"] for f in found if f["severity"] == "critical"} >= {"divergence"}


def test_a_namespace_that_names_nothing_leaves_the_loss_and_the_step_their_names(tmp_path):
    # Detectron's `json_stats: {"iter": 20, "loss": "1.83", "loss_bbox": .., "loss_cls": ..}` and ESPnet1's chainer
    # reports `{"main/loss_ctc": .., "main/loss_att": .., "main/loss": ..}`: before, `json_stats/loss` and
    # `main/loss` were terms, summed with the terms they total (the loss about twice itself), and
    # `json_stats/iter` no step
    text = "".join(f'json_stats: {{"accuracy_cls": "0.57", "eta": "0:15:30", "iter": {i}, "loss": "{2.0 - i / 1e3:.6f}", '
                   f'"loss_bbox": "0.17", "loss_cls": "{1.0 - i / 1e3:.6f}", "lr": "0.006667", "mem": 6843}}\n'
                   for i in range(0, 1000, 20))
    got, account = records_of(tmp_path, text)
    assert [s for s, _ in got] == list(range(0, 1000, 20)) and got[1][1]["loss"] == 1.98
    assert account.keys["loss"] == ["loss"]
    rows = ",\n".join(f'    {{"main/loss_ctc": {230 - i / 10}, "main/loss_att": {150 - i / 10}, "main/loss": {174 - i / 10}, '
                      f'"epoch": 0, "iteration": {i}}}' for i in range(100, 3001, 100))
    got, account = records_of(tmp_path, "[\n" + rows + "\n]\n", name="log")
    assert got[0] == (100, {"loss": 164.0}) and account.keys["loss"] == ["main/loss"]


def test_litgpts_optimizer_step_staying_as_an_epoch_ends_is_still_its_step(tmp_path, capsys):
    # litgpt's finetune: `Epoch 1 | iter 96 step 24 | loss train: 1.127, val: n/a | iter time: ..` on every micro-
    # batch (4 per step), the step the optimizer steps done so far; an epoch of 97 micro-batches ends inside
    # an accumulation, so `step 24` is printed in both epochs. Before: "'step' stays while the epoch moves",
    # the records numbered by order and epoch, a not_learning warning on a healthy run
    lines, it = [], 0
    for e in range(1, 6):
        for _ in range(97):
            it += 1
            x = 1.1 + 0.9 * math.exp(-it / 60.0) + 0.02 * math.sin(it)
            lines.append(f"Epoch {e} | iter {it} step {it // 4} | loss train: {x:.3f}, val: n/a | iter time: 97.04 ms"
                         + (" (step)" if it % 4 == 0 else ""))
    path = tmp_path / "litgpt.log"
    path.write_text("\n".join(lines) + "\n")
    got, account = records_of(tmp_path, path.read_text())
    steps = [s for s, _ in got]
    assert steps == sorted(steps) and steps[-1] == 485 // 4 and account.numbering == {"counter": ["step"]}
    _, _, found = replay_json(capsys, path)
    assert _loud(found) == []


def test_basicsrs_loss_dict_names_are_terms_of_the_loss(tmp_path):
    # BasicSR / Real-ESRGAN: `[train..][epoch:  0, iter:     100, lr:(1.000e-04,)] [eta: .., time (data): 0.781
    # (0.004)] l_g_pix: 4.0380e-02 l_g_percep: 2.9297e+00 l_g_gan: .. l_d_real: .. out_d_real: ..`: before, refused
    text = "".join(f"2022-03-14 09:12:46,137 INFO: [train..][epoch:  0, iter: {i:7,d}, lr:(1.000e-04,)] [eta: 3 days, "
                   f"14:38:42, time (data): 0.781 (0.004)] l_g_pix: {0.04 - i / 1e7:.4e} l_g_gan: 7.7083e-02 "
                   f"l_d_real: 5.7633e-01 out_d_real: 1.0001e+00 \n" for i in range(100, 5001, 100))
    got, account = records_of(tmp_path, text)
    assert [s for s, _ in got] == list(range(100, 5001, 100))
    assert account.keys["loss"] == ["l_g_pix + l_g_gan + l_d_real (the sum of the terms printed)"]


def test_rsl_rls_learning_iteration_numbers_its_blocks(tmp_path):
    # rsl_rl (legged_gym, Isaac Lab): a block per iteration under `Learning iteration 100/1500`, centred and
    # bold. Before, the header's words were taken as one unknown name: the records numbered in order, and a
    # resumed run's NaN dated by its place in the log
    blocks = []
    for it in range(300, 400):
        blocks.append("#" * 80 + f"\n\x1b[1m{'Learning iteration ' + str(it) + '/1500':^80}\x1b[0m \n\n"
                      f"{'Total steps:':>40} {it * 98304} \n{'Mean value loss:':>40} {0.05 + it / 1e4:.4f}\n"
                      f"{'Mean surrogate loss:':>40} -0.0043\n{'Mean reward:':>40} {it / 100:.2f}\n" + "-" * 80 + "\n"
                      f"{'Iteration time:':>40} 0.60s\n")
    got, account = records_of(tmp_path, "\n".join(blocks))
    assert [s for s, _ in got] == list(range(300, 400)) and account.numbering == {"counter": ["iteration"]}


def test_guided_diffusions_lg_loss_scale_is_the_scales_log2(tmp_path, capsys):
    # guided-diffusion's fp16 trainer logs `lg_loss_scale` (its scale's log2; `Found NaN, decreased lg_loss_scale
    # to ..` as it drops): before, an unknown name, and a collapse of the scale missed
    rows = ["grad_norm,lg_loss_scale,loss,mse,samples,step"]
    for i in range(160):
        lg = 20.0 + i * 0.001 if i < 140 else 20.0 - (i - 139)
        rows.append(f"1.2,{lg},{0.05 + 0.5 * math.exp(-i / 20)},0.04,{128 * (i + 1)},{i * 10}")
    path = tmp_path / "progress.csv"
    path.write_text("\n".join(rows) + "\n")
    _, _, found = replay_json(capsys, path)
    assert ("loss_scale_collapse", "critical") in {(f["kind"], f["severity"]) for f in found}


def test_mxnets_evaluation_metric_line_prints_the_training_metric(tmp_path):
    # GluonTS's MXNet trainer logs each epoch's training loss as `Epoch[3] Evaluation metric 'epoch_loss'=4.91`
    # (a validation's as 'validation_epoch_loss'): before, an evaluation, and a log without bars refused
    lines = []
    for e in range(40):
        lines += [f"INFO:gluonts.mx.trainer._base:Epoch[{e}] Learning rate is 0.001",
                  f"INFO:gluonts.mx.trainer._base:Epoch[{e}] Elapsed time 2.512 seconds",
                  f"INFO:gluonts.mx.trainer._base:Epoch[{e}] Evaluation metric 'epoch_loss'={3 + 2 * 0.9 ** e:.6f}",
                  f"INFO:gluonts.mx.trainer._base:Epoch[{e}] Evaluation metric 'validation_epoch_loss'=5.5"]
    got, account = records_of(tmp_path, "\n".join(lines) + "\n")
    assert len(got) == 40 and account.keys["loss"] == ["epoch_loss"] and got[0][1]["loss"] == 5.0


def test_a_notebooks_printed_output_is_the_log(tmp_path, capsys):
    # a Colab / Jupyter notebook saved with its outputs: HF's NotebookProgressCallback draws its table in HTML
    # (`<td>500</td><td>1.040000</td>`, its plain form a placeholder), other cells print text. Before, refused
    # ("no jsonl records found")
    rows = "".join(f"<tr><td>{s}</td><td>{(0.9 if s == 3600 else 0.3 - s / 1e5):.6f}</td><td>0.41</td></tr>\n"
                   for s in range(100, 6001, 100))
    nb = {"cells": [{"cell_type": "code", "source": ["trainer.train()"], "outputs": [
        {"output_type": "stream", "name": "stderr", "text": ["`use_cache = True` is incompatible with gradient checkpointing.\n"]},
        {"output_type": "display_data", "data": {
            "text/html": ["<div><progress value='6000' max='6000'></progress> [6000/6000 7:41:12, Epoch 3/4]</div>\n",
                          "<table border=\"1\"><thead><tr><th>Step</th><th>Training Loss</th><th>Validation Loss</th></tr>"
                          "</thead><tbody>\n", rows, "</tbody></table>\n"],
            "text/plain": ["<IPython.core.display.HTML object>"]}}]}], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path = tmp_path / "finetune.ipynb"
    path.write_text(json.dumps(nb, indent=1))
    code, out, found = replay_json(capsys, path)
    assert [(f["kind"], f["step"]) for f in found if f["severity"] != "info"] == [("loss_spike", 3600)]
    got, account = records_of(tmp_path, path.read_text(), name="finetune.ipynb")
    assert len(got) == 60 and account.keys["loss"] == ["Training Loss"] and "a Jupyter notebook" in account.notes[0]


def test_a_loss_of_1e300_among_the_records_takes_no_detector_down(tmp_path, capsys, caplog):
    # a fuzzed log: `loss 1e300` and `99999999999999999999` among ordinary records made a spike's noise so large
    # that its recovery level overflowed (`math range error`): loss_spike said it failed and went off
    rng = random.Random(153)
    lines = []
    for s in range(1, 120):
        v = f"{2.3 * math.exp(-s / 100) + 0.1:.4f}"
        if rng.random() < 0.08:
            v = rng.choice(["1e300", "99999999999999999999", "1e-300", "0", "inf"])
        lines.append(f"step {s} | loss {v} | lr 0.001 | grad_norm 1.5")
    path = tmp_path / "fuzz.log"
    path.write_text("\n".join(lines) + "\n")
    replay_json(capsys, path)
    assert [r.getMessage() for r in caplog.records if "failed" in r.getMessage()] == []


def _model_card(rows) -> str:
    # the results table the HF Trainer writes into a model card: `| Training Loss | Epoch | Step | Validation Loss |`
    head = "| Training Loss | Epoch | Step | Validation Loss | Accuracy |\n|:-------------:|:-----:|:----:|:---------------:|:--------:|\n"
    return head + "".join(f"| {t} | {e} | {s} | {v} | 0.81 |\n" for t, e, s, v in rows)


def test_an_evaluations_loss_not_finite_on_a_results_tables_rows_is_a_warning(tmp_path, capsys):
    # the seventeenth scoring's class: a results table whose validation loss is NaN on every row while the
    # training loss falls. Before, the validation column was not read: 0 findings
    rows = [(f"{1.2 * 0.9 ** e:.4f}", f"{e}.0", 500 * e, "nan") for e in range(1, 11)]
    path = tmp_path / "README.md"
    path.write_text(_model_card([(t, e, s, "inf") for t, e, s, _ in rows]))   # (infinite: the same; the
    _, _, found = replay_json(capsys, path)                                   # eighteenth scoring's class)
    assert [(f["kind"], f["severity"], f["step"]) for f in found if f["severity"] != "info"] == [("nonfinite", "warning", 500)]
    path.write_text(_model_card(rows))
    got = list(read_records(path))
    assert len(got) == 10 and math.isnan(got[0].metrics["eval_loss"]) and got[0].metrics["loss"] == 1.08
    _, _, found = replay_json(capsys, path)
    assert [(f["kind"], f["severity"], f["step"], f["signal"]) for f in found if f["severity"] != "info"] == [
        ("nonfinite", "warning", 500, "eval_loss")]


def test_an_evaluations_loss_that_stops_changing_says_the_weights_stopped(tmp_path, capsys):
    # the seventeenth scoring's class: every evaluation from some epoch on prints the same loss to every digit
    # while the training loss jitters on a plateau. Before: 0 findings
    rows = [(f"{1.5 * 0.7 ** min(e, 6) + 0.01 * math.sin(e):.4f}", f"{e}.0", 100 * e, f"{0.9 * 0.95 ** min(e, 6):.4f}")
            for e in range(1, 16)]
    path = tmp_path / "README.md"
    path.write_text(_model_card(rows))
    _, _, found = replay_json(capsys, path)
    assert [(f["kind"], f["severity"], f["step"]) for f in found if f["severity"] != "info"] == [("stall", "warning", 900)]
    # NeMo prints the last validation's loss on every step's line until the next: those repeats are one evaluation
    lines = [f"Training epoch 0, iteration {i}/999 | lr: 3e-05 | global_step: {i} | reduced_train_loss: "
             f"{1.2 + 0.05 * math.sin(i):.3f} | val_loss: {4.0 - (i // 25) * 0.01:.3f}" for i in range(1, 400)]
    path = tmp_path / "nemo.log"
    path.write_text("\n".join(lines) + "\n")
    _, _, found = replay_json(capsys, path)
    assert _loud(found) == []


def test_a_loss_exactly_zero_from_the_first_point_warns_without_the_lr(tmp_path, capsys):
    # a results table whose training loss prints 0.0 on every row (the seventeenth scoring's class; kohya's
    # `avr_loss=0`): before, silent without the LR logged (a GRPO start prints zeros too, and logs its grad norm)
    rows = [("0.0", f"{e}.0", 100 * e, f"{2.0 - e / 100:.4f}") for e in range(1, 9)]
    path = tmp_path / "README.md"
    path.write_text(_model_card(rows))
    _, _, found = replay_json(capsys, path)
    assert [(f["kind"], f["severity"], f["step"]) for f in found if f["severity"] != "info"] == [("stall", "warning", 300)]


def test_a_loss_not_finite_to_the_logs_end_says_so_at_the_end(tmp_path, capsys):
    # the seventeenth scoring's honesty class: a loss non-finite on every epoch from the first, the finding and
    # the advice speaking of one epoch's batches. The end of the replay now says every record after it was too
    path = tmp_path / "run.csv"
    path.write_text("epoch,loss\n1,2.3\n2,2.2\n3,2.1\n" + "".join(f"{e},nan\n" for e in range(4, 10)))
    _, _, found = replay_json(capsys, path)
    end = [f for f in found if f["kind"] == "nonfinite" and f["severity"] == "info"]
    assert [(f["step"], f["details"]["records"]) for f in end] == [(9, 6)]
    assert "not one bad batch" in end[0]["message"] and "epoch 4" in end[0]["message"]


def test_hfs_train_metrics_block_after_the_records_is_no_record(tmp_path):
    # HF's (LLaMA-Factory's) end of training: `***** train metrics *****` then `  train_loss = 0.8123` among
    # padded `key = value` lines. Before, that line was one more record, numbered in order after the last
    lines = [f"{{'loss': {2.0 - s / 1000:.4f}, 'grad_norm': 1.2, 'learning_rate': 1e-05, 'epoch': {s / 500:.2f}}}"
             for s in range(10, 1510, 10)]
    lines += ["{'train_runtime': 3450.12, 'train_samples_per_second': 6.956, 'train_loss': 1.25, 'epoch': 3.0}",
              "***** train metrics *****", "  epoch                    =        3.0",
              "  total_flos               = 123456789GF", "  train_loss               =     1.25",
              "  train_runtime            = 0:57:30.12"]
    got, account = records_of(tmp_path, "\n".join(lines) + "\n")
    assert len(got) == 150 and account.keys["loss"] == ["loss"]


def test_a_pretty_printed_dict_of_many_keys_is_one_record(tmp_path):
    # EasyLM: `tqdm.write("\n" + pprint.pformat(log_metrics) + "\n")`, one key per line, its values numpy arrays.
    # Before, only 3 lines were joined to the first: each record split in two, the steps numbered twice
    blocks = [f"{s}/7500 [00:00<00:00, 2.01it/s]\n{{'accuracy': array(0.2, dtype=float32),\n"
              f" 'dataset_example_index': {61 * s},\n 'dataset_total_tokens': {524288 * (s + 1)},\n"
              f" 'gradient_norm': array(2.5, dtype=float32),\n 'learning_rate': array(1.5e-07, dtype=float32),\n"
              f" 'loss': array({10.5 - s / 1000:.4f}, dtype=float32),\n 'param_norm': array(812.3, dtype=float32),\n"
              f" 'step': {s}}}\n" for s in range(0, 3000, 50)]
    got, account = records_of(tmp_path, "\n".join(blocks))
    assert [s for s, _ in got] == list(range(0, 3000, 50)) and account.numbering == {"counter": ["step"]}
    assert got[1][1] == {"grad_norm": 2.5, "lr": 1.5e-07, "loss": 10.45, "param_norm": 812.3}


def test_a_results_table_without_a_logged_training_loss_is_judged_on_its_evaluations(tmp_path, capsys):
    # a short fine-tune's model card: `No log` in every Training Loss cell (its logging interval longer than the
    # run), the validation loss NaN from epoch 4. Before, refused
    rows = [("No log", f"{e}.0", 7 * e, "nan" if e >= 4 else f"{0.69 - 0.01 * e:.4f}") for e in range(1, 11)]
    path = tmp_path / "README.md"
    path.write_text(_model_card(rows))
    code, out, found = replay_json(capsys, path)
    assert code == 0 and [(f["kind"], f["severity"], f["step"]) for f in found] == [("nonfinite", "warning", 28)]
    healthy = [("No log", f"{e}.0", 7 * e, f"{0.69 * 0.9 ** e:.4f}") for e in range(1, 11)]
    path.write_text(_model_card(healthy))
    code, out, found = replay_json(capsys, path)
    assert code == 0 and found == []


def _frame(nan_from: int | None = None) -> str:
    # `print(pd.DataFrame(trainer.state.log_history))` in a notebook: an unnamed index column, the training
    # columns NaN on the evaluation's rows and the evaluation's NaN on the training rows (pandas' missing value)
    lines = ["      loss  grad_norm  learning_rate     epoch  step  eval_loss  eval_runtime"]
    i = 0
    for s in range(10, 610, 10):
        bad = nan_from is not None and s >= nan_from
        x = "NaN" if bad else f"{2.3 * math.exp(-s / 300) + 0.5:.4f}"
        lines.append(f"{i:<3d} {x:>7}  {'NaN' if bad else '1.2':>9}  {5e-05:>13}  {s / 600:.6f}  {s:>4}  {'NaN':>9}  {'NaN':>12}")
        i += 1
        if s % 100 == 0:
            lines.append(f"{i:<3d} {'NaN':>7}  {'NaN':>9}  {'NaN':>13}  {s / 600:.6f}  {s:>4}  {1.1:>9}  {3.2:>12}")
            i += 1
    return "\n".join(lines) + "\n"


def test_a_pandas_frame_of_a_trainers_history_reads_its_rows(tmp_path, capsys):
    # before: the index column shifted every name by one (2 records of 60), and pandas' NaN (a missing value)
    # would be a NaN loss on every evaluation's row
    got, account = records_of(tmp_path, _frame())
    assert [s for s, _ in got] == list(range(10, 610, 10)) and got[0][1] == {"loss": 2.7246, "grad_norm": 1.2, "lr": 5e-05}
    path = tmp_path / "frame.log"
    path.write_text(_frame())
    assert replay_json(capsys, path)[2] == []
    path.write_text(_frame(nan_from=400))
    _, _, found = replay_json(capsys, path)
    assert [(f["kind"], f["severity"], f["step"]) for f in found if f["severity"] != "info"] == [
        ("nonfinite", "critical", 400), ("rollback_advice", "critical", 400)]


def test_a_game_log_ending_with_a_player_at_zero_says_so_at_its_end(tmp_path, capsys):
    # the seventeenth scoring's class: a GAN whose discriminator saturates within a handful of records (the
    # player rule wants 5 points in a row). Before: nothing but a jump at info
    path = tmp_path / "gan.log"
    path.write_text("[Epoch 0/200] [Batch 0/938] [D loss: 0.693100] [G loss: 0.701200]\n" + "".join(
        f"[Epoch 0/200] [Batch {b}/938] [D loss: 0.000000] [G loss: {g}]\n"
        for b, g in ((100, 27.63), (200, 27.59), (300, 27.7))))
    _, _, found = replay_json(capsys, path)
    end = [f for f in found if f["kind"] == "stall"]
    assert [(f["severity"], f["step"], f["onset_step"], f["details"]["points"]) for f in end] == [("info", 300, 100, 3)]


def test_acmes_learner_steps_number_its_learners_records(tmp_path):
    # ACME's terminal logger: `[Learner] Actor Episodes = 1 | Actor Steps = 250 | .. | Learner Steps = 1003 | ..
    # Total Loss = 1.041` beside `[Actor] ..` lines. Before, numbered by the actors' steps
    lines = []
    for i in range(1, 60):
        lines.append(f"I1130 07:00:06.047037 139872 terminal.py:91] [Learner] Actor Episodes = {i // 4} | Actor Steps = "
                     f"{125 * i} | Evaluator Episodes = 0 | Evaluator Steps = 0 | Learner Steps = {500 * i + 3} | "
                     f"Learner Walltime = {i:.3f} | Steps Per Second = 480.403 | Total Loss = {1.0 - i / 100:.3f}")
    got, account = records_of(tmp_path, "\n".join(lines) + "\n")
    assert [s for s, _ in got] == [500 * i + 3 for i in range(1, 60)] and account.numbering == {"counter": ["Learner Steps"]}


def _running_mean_log(seed: int) -> str:
    # the PyTorch tutorials' loop printing the epoch's running mean so far (`running_loss / (i + 1)`) to 3
    # decimals every 50 batches: late in an epoch it moves by a batch's difference over the batches so far
    rng = random.Random(seed)
    lines = []
    for e in range(1, 3):
        total = 0.0
        for i in range(1, 10001):
            total += max(0.05, 0.9 + 1.5 * math.exp(-((e - 1) * 10000 + i) / 300) + rng.gauss(0.0, 0.3))
            if i % 50 == 0:
                lines.append(f"[{e}, {i:5d}] loss: {total / i:.3f}")
    return "\n".join(lines) + "\n"


def test_an_epochs_running_mean_holding_its_last_digit_is_no_freeze(tmp_path, capsys):
    # the eighteenth scoring's false alarm: a cumulative within-epoch mean printed to a few decimals held its
    # last digit late in the epoch and was called a critical stall. The run's own moves before the repeats,
    # about one printed digit, make repeats likely: the frozen rule counts on them, not on a 0.1% floor
    path = tmp_path / "tutorial.log"
    _quiet_for_seeds(capsys, path, _running_mean_log, 6)
    # a loss that froze after moving is still frozen
    frozen = "".join(f"[1, {i:5d}] loss: {0.9 + 0.05 * math.sin(i) if i < 600 else 0.731:.3f}\n" for i in range(20, 1200, 20))
    path.write_text(frozen)
    _, _, found = replay_json(capsys, path)
    assert [(f["kind"], f["severity"]) for f in found if f["kind"] == "stall"] == [("stall", "critical")]


def test_a_records_line_wrapped_onto_an_indented_line_is_one_record(tmp_path):
    # the eighteenth scoring's class: a self-supervised run's records wrapped onto a second, indented line
    # holding the grad norm. Before, that line was dropped (or a record of its own): the grad norm lost
    text = "".join(f"Epoch: [3][{100 * i}/500]  total_loss: 6.9315  contrastive_loss: 6.9315\n"
                   f"    grad_norm: 1.2e-09  lr: 0.0300\n" for i in range(1, 8))
    got, account = records_of(tmp_path, text)
    assert len(got) == 7 and got[0][1] == {"loss": 6.9315, "grad_norm": 1.2e-09, "lr": 0.03}
    assert account.keys["grad_norm"] == ["grad_norm"]


def test_a_results_tables_bold_row_is_a_row(tmp_path):
    # a model card marking its best row in bold (`| **0.4120** | **3.0** | **1500** | **0.3900** |`): before, dropped
    rows = [(f"{0.9 - 0.1 * e:.4f}", f"{e}.0", 500 * e, f"{0.8 - 0.1 * e:.4f}") for e in range(1, 6)]
    text = _model_card(rows).replace("| 0.4000 | 5.0 | 2500 | 0.3000 | 0.81 |", "| **0.4000** | **5.0** | **2500** | **0.3000** | **0.81** |")
    got, _ = records_of(tmp_path, text)
    assert [s for s, _ in got] == [500, 1000, 1500, 2000, 2500] and got[-1][1]["loss"] == 0.4


def test_a_log_numbered_in_order_does_not_say_nothing_was_trained_before_its_first_record(tmp_path, capsys):
    # the eighteenth scoring's honesty class: an excerpt from mid-run whose records print no step, its first
    # record NaN: "nothing was trained before step 1" was said (step 1 is the reader's number for the first record)
    path = tmp_path / "excerpt.log"
    path.write_text("".join(f"epoch 2.{i:02d} loss {'nan' if i == 0 else 0.9} lr 1e-05\n" for i in range(0, 20)))
    _, _, found = replay_json(capsys, path)
    nf = [f for f in found if f["kind"] == "nonfinite" and f["severity"] == "critical"]
    assert len(nf) == 1 and "Nothing was trained before" not in nf[0]["message"]


def test_a_sanity_check_that_found_no_nan_marks_nothing(tmp_path, capsys):
    # the nineteenth scoring's honesty class: a debug line answering a NaN check (`Loss is NaN: False, Loss is Inf:
    # False`) beside records whose loss prints 0 was read as a warning that the loss was not finite: each zero
    # became a NaN with a critical finding the log contradicts
    lines = []
    for s in range(1, 30):
        lines.append(f"step {s} loss {0.0 if s > 20 else 2.0 - s / 20:.4f} lr 0.0001 grad_norm {0.0 if s > 20 else 1.1}")
        lines.append("Loss is NaN: False, Loss is Inf: False")
    path = tmp_path / "debug.log"
    path.write_text("\n".join(lines) + "\n")
    got, _ = records_of(tmp_path, path.read_text())
    assert [m["loss"] for _, m in got[20:23]] == [0.0, 0.0, 0.0]
    _, _, found = replay_json(capsys, path)
    assert not [f for f in found if f["kind"] == "nonfinite"]


def test_an_epoch_logs_spike_messages_count_epochs(tmp_path, capsys):
    # the nineteenth scoring's honesty class: "1 step after its onset" on a log whose steps are epochs
    path = tmp_path / "epochs.csv"
    path.write_text("epoch,loss\n" + "".join(f"{e},{x}\n" for e, x in enumerate(
        [2.0, 1.8, 1.7, 1.6, 1.55, 1.5, 1.45, 9.0, 1.4, 1.38, 1.36, 1.35], 1)))
    _, _, found = replay_json(capsys, path)
    said = {f["kind"]: f["message"] for f in found}
    assert "1 epoch after its onset at epoch 8" in said["spike_recovered"]
    assert "inside one epoch" in said["loss_spike"] and " step " not in said["spike_recovered"]


def test_a_second_run_in_the_same_log_is_said_as_one(tmp_path, capsys):
    # the nineteenth scoring's honesty class: two runs printed back to back, the second's epochs from 1 again,
    # were said as "rolled back and resumed"
    text = "".join(f"Epoch {e}/10 - loss: {1.0 * 0.9 ** e:.4f}\n" for e in range(1, 11)) * 2
    path = tmp_path / "two.log"
    path.write_text(text)
    _, _, found = replay_json(capsys, path)
    resumes = [f["message"] for f in found if f["kind"] == "resume"]
    assert len(resumes) == 1 and "a second run in the same log, or one rolled back to its start" in resumes[0]


# -- the third round (sweeps K and L) -------------------------------------------------------------------

def test_nanot5s_arrow_between_a_key_and_its_value_is_a_colon(tmp_path):
    # nanoT5's logging_utils: `[train] Step 100 out of 65536 | Loss --> 5.386 | Grad_l2 --> 0.314 | Lr --> 0.000 |`.
    # Before, refused: no key before any number
    lines = [f"11/30/2026 09:01:42 - INFO - Main - [train] Step {s} out of 65536 | Loss --> {_wave(s):.3f} | "
             f"Grad_l2 --> 0.314 | Weights_l2 --> 11004.200 | Lr --> 0.001 | Seconds_per_step --> 0.505 | "
             for s in range(100, 3100, 100)]
    got, account = records_of(tmp_path, "\n".join(lines) + "\n")
    assert [s for s, _ in got] == list(range(100, 3100, 100))
    assert got[0][1] == {"loss": round(_wave(100), 3), "grad_norm": 0.314, "lr": 0.001}
    assert account.keys["loss"] == ["Loss"] and account.numbering == {"counter": ["Step"]}


def _wave(s: int) -> float:
    return 2.0 + 3.0 * math.exp(-s / 900.0) + 0.02 * math.sin(s)


def _returnn(epochs: int, spike_at: int | None = None) -> str:
    # RETURNN's torch engine (_print_process): `ep E train, step i, ce .., fer .., num_seqs .., .. sec/step, elapsed
    # .., exp. remaining .., complete ..%`, the step counting within the epoch, a `start epoch E global train step G`
    # line before each epoch, the epoch's totals and its dev evaluation after it
    out, g = [], 0
    for ep in range(1, epochs + 1):
        out.append(f"start epoch {ep} global train step {g} with effective learning rate 0.0003 ...")
        out.append(f"ep {ep} train num_seqs: 1840")
        for st in range(80):
            ce = _wave(g) * (4.0 if g == spike_at else 1.0)
            out.append(f"ep {ep} train, step {st}, ce {ce:.3f}, fer 0.400, num_seqs 21, max_size:time 1390, 0.800 sec/step, "
                       f"elapsed 0:00:05, exp. remaining 0:00:59, complete {(st + 1) / 0.8:.2f}%")
            g += 1
        out.append(f"Epoch {ep}: Total train loss: ce 2.500 fer 0.400")
        out.append(f"ep {ep} dev eval, step 0, ce 2.862, fer 0.623, num_seqs 30, elapsed 0:00:01, complete 16.67%")
        out.append(f"Save model under output/models/epoch.{ep:03d}.pt")
    return "\n".join(out) + "\n"


def test_returnns_ce_is_the_loss_and_its_step_counts_within_the_epoch(tmp_path, capsys):
    # before, refused (`ce` named no loss); read with `--keys`, the step restarting every epoch gave 3 "resumes"
    # at step -1: the header's global step beside it had been taken for the records' count going on
    got, account = records_of(tmp_path, _returnn(4))
    assert [s for s, _ in got] == list(range(320)) and got[81][1]["loss"] == round(_wave(81), 3)
    assert account.keys["loss"] == ["ce"]
    path = tmp_path / "returnn.log"
    path.write_text(_returnn(4, spike_at=180))
    code, _, found = replay_json(capsys, path)
    assert [(f["step"], f["kind"], f["severity"]) for f in _loud(found)] == [(180, "loss_spike", "warning")]


def _yolov7(epochs: int) -> str:
    # YOLOv7's train.py: one tqdm bar per epoch under its header, its description `('%10s' * 2 + '%10.4g' * 6) %
    # ('%g/%g' % (epoch, epochs - 1), mem, *mloss, targets, img_size)`, redrawn with `\r` after each batch: the
    # epoch's running means of the box, objectness and class losses and their total
    from tqdm import tqdm
    out = []
    for ep in range(epochs):
        out.append(("\n" + "%10s" * 8) % ("Epoch", "gpu_mem", "box", "obj", "cls", "total", "labels", "img_size"))
        m, frames = [0.0, 0.0, 0.0], [tqdm.format_meter(0, 30, 0)]
        for i in range(30):
            f = math.exp(-(ep * 30 + i) / 700.0)
            li = [(0.028 + 0.05 * f) * (1 + 0.08 * math.sin(7 * i + k)) for k in range(3)]
            m = [(m[k] * i + li[k]) / (i + 1) for k in range(3)]
            desc = ("%10s" * 2 + "%10.4g" * 6) % (f"{ep}/{epochs - 1}", "7.41G", *m, sum(m), 60 + (7 * i) % 80, 640)
            frames.append(tqdm.format_meter(i + 1, 30, (i + 1) * 0.27, prefix=desc))
        out.append("\r".join(frames))
    return "\n".join(out) + "\n"


def test_yolov7s_bar_redrawn_on_one_line_keeps_its_last_running_means(tmp_path):
    # before, the 30 redraws of an epoch's bar were averaged as ranks printing one step: 0.0764 read for an
    # epoch whose bar ended at 0.1283
    got, account = records_of(tmp_path, _yolov7(40))
    assert [s for s, _ in got] == list(range(40))
    assert account.changed[assemble.MERGED[0]][0] == 40 * 29
    last = _yolov7(40).split("\n")[2].split("\r")[-1].split()[5]   # the total of the epoch's last redraw
    assert got[0][1]["loss"] == float(last)


def _keras_epochs(n: int, step_up_at: int) -> str:
    out, x = [], 1.0
    for e in range(1, n + 1):
        x = x * 0.97 if e < step_up_at else x
        v = x * (4.0 if e >= step_up_at else 1.0) * (1.0 + 0.01 * math.sin(e))
        out += [f"Epoch {e}/{n}", f"500/500 [==============================] - 3s 6ms/step - loss: {v:.4f} - accuracy: 0.8"]
    return "\n".join(out) + "\n"


def test_a_spike_that_stays_on_an_epoch_log_is_unrecovered_after_ten_epochs(tmp_path, capsys):
    # an epoch holds many optimizer steps: 300 steps of the horizon are never reached by 50 epochs. Before, the
    # step-up at epoch 30 was a warning and nothing after, for 20 epochs at x4
    path = tmp_path / "fit.log"
    path.write_text(_keras_epochs(50, 30))
    code, _, found = replay_json(capsys, path)
    assert [(f["step"], f["kind"], f["severity"]) for f in _loud(found)] == [
        (30, "loss_spike", "warning"), (39, "spike_unrecovered", "critical"), (39, "rollback_advice", "critical")]


def test_a_warmup_printed_to_four_decimals_is_one_warmup(tmp_path, capsys):
    # DINOv2's MetricLogger: `lr: 0.0012 (0.0007)` every 10 iterations, the LR rising 3.2e-6 an iteration: a
    # staircase, flat for 3 prints between its steps. Before, each plateau ended a warmup: 6 `warmup_end`s
    lines = [f"I20261130 09:00:00 1234 dinov2 helpers.py:103] Training  [{it:>5}/3000]  eta: 0:10:00  "
             f"lr: {4e-3 * min(it, 1250) / 1250:.4f} (0.0010)  total_loss: {_wave(it):.4f} ({_wave(it) + 0.1:.4f})  "
             f"time: 0.500000  data: 0.010000  max mem: 30000" for it in range(0, 3000, 10)]
    path = tmp_path / "dinov2.log"
    path.write_text("\n".join(lines) + "\n")
    code, _, found = replay_json(capsys, path)
    # (at 1240 the print reaches 0.0040 already: the last rise it shows)
    assert [(f["step"], f["kind"]) for f in found] == [(1240, "warmup_end")]


def test_a_bar_whose_total_doubles_goes_on_from_the_epochs_before_it(tmp_path):
    # bubbliiiing's YOLO trainers: `Epoch e/100: ..| i/60 [.., loss=.., lr=..]`, 120 batches an epoch once the
    # backbone unfreezes (its batch halved). Before, every epoch was numbered (epoch - 1) x 120 from then on:
    # steps 3,000-6,000 never printed, an event at epoch 70 said at step 8,282 instead of 5,282
    from tqdm import tqdm
    lines = []
    for e in range(1, 101):
        total = 60 if e <= 50 else 120
        lines.append("\r".join(tqdm.format_meter(i, total, i * 0.17, prefix=f"Epoch {e}/100", postfix=(
            f"loss={_wave(e * 100 + i):.3g}, lr=0.001")) for i in range(2, total + 1, 2)))
    got, account = records_of(tmp_path, "\n".join(lines) + "\n")
    steps = [s for s, _ in got]
    assert steps[:2] == [2, 4] and steps[-1] == 50 * 60 + 50 * 120 and steps == sorted(set(steps))
    assert len(steps) == 50 * 30 + 50 * 60 and got[steps.index(50 * 60 + 19 * 120 + 2)][1]["loss"] == float(
        f"{_wave(7002):.3g}")   # epoch 70's first
    assert any("counts to 120 from epoch 51: steps go on from 3,000" in n for n in account.notes)


def test_a_loss_flat_through_a_warmup_the_log_ends_in_is_said_too_early_to_tell(tmp_path, capsys):
    # SwAV's `Epoch: [e][it]  ..  Loss 8.0064 (8.0064)  Lr: ..` collapsed at ln 3000 while its 10-epoch warmup ramps
    # the LR: `not_learning` waits the warmup out, and the log ends inside it. Before, no finding at all
    rng = random.Random(0)
    lines = [f"INFO - 11/30/26 09:00:00 - 0:00:{it % 60:02d} - Epoch: [{e}][{it}]\tTime 0.5 (0.5)\tData 0.01 (0.01)\t"
             f"Loss {8.0064 + rng.gauss(0, 0.002):.4f} ({8.0064:.4f})\tLr: {0.3 + 4.5 * (e * 2502 + it) / 25020:.4f}"
             for e in range(6) for it in range(0, 2502, 50)]
    path = tmp_path / "swav.log"
    path.write_text("\n".join(lines) + "\n")
    code, _, found = replay_json(capsys, path)
    assert code == 0 and [(f["kind"], f["severity"], f["details"].get("in_warmup")) for f in found] == [
        ("not_learning", "info", True)]
    assert "the LR was still warming up when the log ended" in found[0]["message"]


def test_a_bars_redraws_glued_without_their_carriage_returns_are_redraws(tmp_path):
    # ultralytics' epoch bar pasted from a Colab cell, its `\r`s lost: `.. 1/8 [00:00<00:04, 1.67it/s]       1/40 2.38G
    # 1.385 ..`. Before, one record per epoch from the first redraw's first column (its box loss after batch 1): a
    # NaN from batch 3 found an epoch late
    from tqdm import tqdm
    lines = []
    for e in range(1, 41):
        lines.append(("%11s" * 7) % ("Epoch", "GPU_mem", "box_loss", "cls_loss", "dfl_loss", "Instances", "Size"))
        draws = [tqdm.format_meter(0, 8, 0)]
        for b in range(1, 9):
            box = math.nan if (e, b) >= (23, 3) else 1.4 - e / 100 + 0.01 * b
            desc = ("%11s" * 2 + "%11.4g" * 5) % (f"{e}/40", "2.32G", box, 3.0 - e / 50, 1.5, 53, 640)
            draws.append(tqdm.format_meter(b, 8, b * 0.6, prefix=desc))
        lines.append("       ".join(draws))
    got, account = records_of(tmp_path, "\n".join(lines) + "\n")
    assert [s for s, _ in got] == list(range(1, 41)) and account.keys["loss"][0].startswith("box_loss + cls_loss + dfl_loss")
    assert got[21][1]["loss"] == pytest.approx(1.4 - 0.22 + 0.08 + 3.0 - 22 / 50 + 1.5, abs=2e-3)   # epoch 22's last draw
    assert got[22][1]["loss"] != got[22][1]["loss"]
