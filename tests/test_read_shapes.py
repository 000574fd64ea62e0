"""The shapes a held-out scoring of issue 32's reader found it misreading (the scorer named only
their classes), each written here in that shape with variants of other printers, separators and
frameworks, asserting the exact records and what the account says: per-epoch histories printed
as bracketed arrays, progress lines with no key names, counters of samples, counters that restart
every epoch with no epoch length, dicts glued to progress bars, a table row that repeats a step,
intervals printed as ranges, and what findings and refusals say about how a step was numbered."""
from __future__ import annotations

import json
import math
import pprint
import shlex
import textwrap

import pytest

from stability_callbacks.cli import main
from stability_callbacks.replay.readers import LogFormatError, ReadAccount, read_records, source

from shapes import NAN, records_of
from shapes import loss as _loss
from shapes import replay_json as _replay_json
from shapes import same as _same


# -- 1. a per-epoch history printed as bracketed arrays ------------------------------------------

EPOCHS = 12
HISTORY = {"loss": [_loss(e) for e in range(EPOCHS)], "accuracy": [round(0.5 + e / 40, 3) for e in range(EPOCHS)],
           "val_loss": [_loss(e) + 0.1 for e in range(EPOCHS)], "val_accuracy": [0.45] * EPOCHS}
HISTORY_RECORDS = [(e + 1, {"loss": _loss(e)}) for e in range(EPOCHS)]


def _numpy_style(history: dict) -> str:
    """``loss: [0.69 0.52 ...]`` as numpy prints an array, wrapped at 75 characters."""
    out = []
    for key, values in history.items():
        body = textwrap.fill(" ".join(f"{v:.4f}" for v in values), 72, subsequent_indent=" ")
        out.append(f"{key}: [{body}]")
    return "\n".join(out) + "\n"


HISTORIES = [
    # Keras' History.history printed as a dict, wrapped by the terminal at 80 characters.
    ("dict wrapped", "Training finished\n" + "\n".join(textwrap.wrap(str(HISTORY), 80)) + "\nSaved model to out/\n"),
    # pprint: one element per line, keys sorted (accuracy before loss).
    ("pprint", "history:\n" + pprint.pformat(HISTORY, width=60) + "\n"),
    # json.dump(history.history, f, indent=2): a JSON document, the key alone on its line.
    ("json indent", json.dumps(HISTORY, indent=2) + "\n"),
    # numpy arrays printed per key.
    ("numpy style", _numpy_style(HISTORY)),
]


@pytest.mark.parametrize("text", [t for _, t in HISTORIES], ids=[n for n, _ in HISTORIES])
def test_a_history_printed_as_arrays_is_one_record_per_epoch(tmp_path, text):
    got, account = records_of(tmp_path, text)
    _same(got, [(e, {k: v for k, v in m.items()}) for e, m in HISTORY_RECORDS])
    said = account.lines()
    assert "  steps numbered by the epoch (no count finer than the epoch moves from record to record: step N is " \
        "epoch N)" in said
    assert any(line.startswith("  note: a history printed as arrays (line ") and line.endswith(
        f"): element k of each array is epoch k, {EPOCHS} epochs") for line in said), said


def test_a_nan_inside_a_history_is_found_at_its_epoch(tmp_path, capsys):
    history = dict(HISTORY, loss=HISTORY["loss"][:7] + [NAN] * 5)
    path = tmp_path / "h.log"
    path.write_text("\n".join(textwrap.wrap(str(history), 80)) + "\n")
    code, out, found = _replay_json(capsys, path)
    nonfinite = next(f for f in found if f["kind"] == "nonfinite")
    assert code == 1 and nonfinite["step"] == 8
    assert "record number" not in nonfinite["message"] and "step_is_record_number" not in nonfinite["details"]


def test_a_history_printed_after_the_epochs_it_sums_up_adds_no_record(tmp_path):
    epochs = "".join(f"Epoch {e + 1}/{EPOCHS}\n100/100 [====] - 2s - loss: {_loss(e)} - accuracy: 0.5\n"
                     for e in range(EPOCHS))
    got, account = records_of(tmp_path, epochs + str(HISTORY) + "\n")
    _same(got, HISTORY_RECORDS)
    assert account.ignored["run summary (a history of the records above, printed as arrays)"] == [1, 2 * EPOCHS + 1]


def test_lists_that_are_no_history_stay_what_they_were(tmp_path):
    # A one-element list beside the step (PaddleSlim), a list of param-group LRs (DeepSpeed).
    text = "".join(f"Total iter: {s}, epoch: 0, batch: {s}, loss: [{_loss(s)}]\n" for s in (0, 10, 20))
    got, _ = records_of(tmp_path, text)
    assert got == [(s, {"loss": _loss(s)}) for s in (0, 10, 20)]
    text = "".join(f"step={s}, skipped=0, lr=[1e-05, 1e-05], loss={_loss(s)}\n" for s in (10, 20, 30))
    got, _ = records_of(tmp_path, text)
    assert [s for s, _ in got] == [10, 20, 30] and all(m["loss"] == _loss(s) for s, m in got)


# -- 2 and 10. progress lines with no key names, inside other prints -----------------------------

def _seq2seq(values) -> str:
    """The PyTorch seq2seq tutorial: `%s (%d %d%%) %.4f` (elapsed (- remaining), iteration,
    percent, the loss averaged over the print interval), after its data preparation prints."""
    pre = ["Reading lines...", "Read 135842 sentence pairs", "Trimmed to 11445 sentence pairs",
           "Counting words...", "Counted words:", "fra 4601", "eng 2991", "['je suis las .', 'i am tired .']"]
    out = []
    for k, v in enumerate(values, start=1):
        it = 5000 * k
        out.append(f"{it // 12000}m {it // 200 % 60}s (- {(75000 - it) // 12000}m {(75000 - it) // 200 % 60}s) "
                   f"({it} {it * 100 // 75000}%) {v:.4f}")
    return "\n".join(pre + out) + "\n"


def _char_rnn(values) -> str:
    """The char-RNN classification tutorial: `%d %d%% (%s) %.4f %s / %s %s`."""
    out = ["Found 18 categories", "Loaded 20074 names", "['Abandonato', 'Abatangelo']"]
    for k, v in enumerate(values, start=1):
        out.append(f"{5000 * k} {5 * k}% ({k // 2}m {k * 7 % 60}s) {v:.4f} Nyilas / Greek ✗ (Hungarian)")
    return "\n".join(out) + "\n"


GUESS = "the unnamed number that varies beside the counter on the log's progress lines (a guess: the log names no loss)"


def _bar(values) -> str:
    """A hand-made bar: `[  500/10000] 00:08<02:38 2.3456`."""
    return "Loading data\nvocab size 32000\n" + "".join(
        f"[{500 * k:5d}/10000] {500 * k // 60 % 60:02d}:{500 * k % 60:02d}<02:38 {v:.4f}\n" for k, v in enumerate(values, 1))


def _named_counter(values) -> str:
    """The counter named, the value not: `Iteration 500 | elapsed 5s | 2.3456`."""
    return "Loading data\n" + "".join(f"Iteration {500 * k} | elapsed {5 * k}s | {v:.4f}\n" for k, v in enumerate(values, 1))


@pytest.mark.parametrize("make, loss, counter", [(_seq2seq, "#7", "#5"), (_char_rnn, "#5", "#1"), (_bar, "#7", "#1"),
                                                 (_named_counter, "#3", "Iteration")],
                         ids=["seq2seq", "char-rnn", "bar", "named counter"])
def test_progress_lines_with_no_names_are_read_with_the_loss_said_to_be_a_guess(tmp_path, make, loss, counter):
    values = [_loss(k) for k in range(1, 15)]
    got, account = records_of(tmp_path, make(values))
    step = 500 if make in (_bar, _named_counter) else 5000
    assert got == [(step * k, {"loss": round(v, 4)}) for k, v in enumerate(values, start=1)]
    assert account.keys["loss"] == [f"{loss} ({GUESS})"]
    assert account.lines()[2] == f"  steps numbered by the log's counter: {counter!r}"
    assert any(line.startswith("  note: the log names no loss: the loss is a guess") for line in account.lines())


@pytest.mark.parametrize("extra", ["", "error_rate: [0.5, 0.4, 0.35, 0.3]\n"], ids=["counts", "an error-rate array"])
def test_progress_lines_whose_number_climbs_are_refused_and_the_suggestions_point_at_them(tmp_path, capsys, extra):
    # The one unnamed number climbs like an accuracy: no guess; the closest line is a progress
    # line (not a data preparation count, nor an array of error rates), and every suggestion
    # reads the progress lines when pasted.
    text = extra + _seq2seq([0.1 + k / 20 for k in range(1, 15)])
    path = tmp_path / "tut.log"
    path.write_text(text)
    with pytest.raises(LogFormatError) as e:
        read_records(path)
    said = str(e.value).splitlines()
    closest = said[said.index("  closest lines:") + 1]
    assert closest == f"    line {9 + bool(extra)}: 0m 25s (- 5m 50s) (5000 6%) 0.1500", said
    pasted = [line.strip() for line in said if line.strip().startswith("stability-callbacks replay ")]
    assert pasted and all("Read" not in c and "fra" not in c and "error" not in c for c in pasted), pasted
    for command in pasted:
        code = main(shlex.split(command)[1:] + ["--json", str(tmp_path / "r.jsonl")])
        capsys.readouterr()
        read = json.loads((tmp_path / "r.jsonl").read_text().splitlines()[0])
        assert code in (0, 1) and read["steps"] == read["steps_with_loss"] == 14, command


def test_an_error_rate_is_never_suggested_as_the_loss(tmp_path):
    path = tmp_path / "e.log"
    path.write_text("".join(f"it {i} acc {0.5 + i / 100:.3f} error_rate {0.5 - i / 100:.3f}\n" for i in range(1, 9)))
    with pytest.raises(LogFormatError) as e:
        read_records(path)
    assert "loss=error_rate" not in str(e.value) and "(?P<loss>" not in str(e.value).split("error_rate")[-1]


# -- 3 and 12. a counter of samples ----------------------------------------------------------------

def _mnist(epochs=(1, 2), nan_at=None) -> str:
    """The PyTorch MNIST example: `batch_idx * len(data)` samples of 60000, every 10 batches of 64."""
    out = []
    for e in epochs:
        for b in range(0, 938, 10):
            loss = "nan" if (e, b) == nan_at else f"{_loss(b / 10 + 94 * (e - 1)):.6f}"
            out.append(f"Train Epoch: {e} [{b * 64}/60000 ({100. * b / 938:.0f}%)]\tLoss: {loss}")
        out.append(f"\nTest set: Average loss: 0.0{e}41, Accuracy: 98{e}0/10000 (98%)\n")
    return "\n".join(out) + "\n"


def test_a_counter_of_samples_numbers_steps_by_its_unit_and_says_so(tmp_path):
    got, account = records_of(tmp_path, _mnist())
    want = [((e - 1) * 94 + b // 10, {"loss": _loss(b / 10 + 94 * (e - 1))}) for e in (1, 2) for b in range(0, 938, 10)]
    _same(got, want)
    said = account.lines()
    assert said[2] == "  steps numbered by the log's counter of samples seen, divided by 640: \"a bar's count\""
    assert "  note: \"a bar's count\" counts samples, not batches (its counts are multiples of 640, which " \
           "holds a power of two >= 32, as a batch size does and a print interval of batches does not): steps " \
           "are samples seen / 640, 94 to an epoch of 60,000" in said
    assert "step counter" not in " ".join(said)


def test_a_finding_at_a_step_of_samples_says_how_to_find_it(tmp_path, capsys):
    path = tmp_path / "mnist.log"
    path.write_text(_mnist(nan_at=(2, 500)))
    code, out, found = _replay_json(capsys, path)
    nonfinite = next(f for f in found if f["kind"] == "nonfinite")
    assert code == 1 and nonfinite["step"] == 94 + 50
    assert nonfinite["message"].endswith("(step 144 is not printed by the log: its counter counts samples, "
                                         "and steps are samples seen / 640, 94 to an epoch)")
    advice = next(f for f in found if f["kind"] == "rollback_advice")
    assert "skip_steps" not in advice["details"] and "checkpoint_step" not in advice["details"]


def test_old_keras_bars_count_samples(tmp_path):
    # Keras 1/2 printed samples: `  32/60000 [....] - ETA: 52s - loss: 2.3`, redrawn with `\r`.
    out = []
    for e in (1, 2):
        bars = [f"{n:5d}/60000 [..............................] - ETA: 52s - loss: {_loss(n / 32):.4f}"
                for n in range(32, 60000, 3200)]
        out += [f"Epoch {e}/2", "\r".join(bars + ["60000/60000 [====] - 5s - loss: 2.1 - val_loss: 2.3"])]
    got, _ = records_of(tmp_path, "\n".join(out) + "\n")
    per_epoch = [(n // 32, {"loss": _loss(n / 32)}) for n in range(32, 60000, 3200)] + [(1875, {"loss": 2.1})]
    _same(got, per_epoch + [(1875 + s, m) for s, m in per_epoch])


def test_open_clip_counts_samples_of_its_batch_size(tmp_path):
    # open_clip: `[num_samples/samples_per_epoch (pct%)]`, num_samples = (i + 1) x batch size.
    text = "".join(f"2024-01-01,00:00:00 | INFO | Train Epoch: 0 [{(i + 1) * 64:>6d}/109468 ({(i + 1) * 6400 // 109468:.0f}%)] "
                   f"Data (t): 0.011 Batch (t): 0.41, 156.1/s, 156.1/s/gpu LR: 0.000010 Logit Scale: 14.286 "
                   f"Contrastive_loss: {_loss(i):.4g} ({_loss(i):.4g}) Loss: {_loss(i):.4g} ({_loss(i):.4g})\n"
                   for i in range(0, 1000, 100))
    got, _ = records_of(tmp_path, text)
    assert [s for s, _ in got] == list(range(1, 1001, 100))


def test_a_batch_counter_printed_every_100_batches_is_no_counter_of_samples(tmp_path):
    text = "".join(f"Epoch: [3][{b:4d}/5005]\tTime 0.3\tLoss {_loss(b):.4f}\n" for b in range(0, 1000, 100))
    got, account = records_of(tmp_path, text)
    assert [s for s, _ in got] == [2 * 5005 + b for b in range(0, 1000, 100)]
    assert "samples" not in " ".join(account.lines())


# -- 4 and 8. a counter that restarts every epoch, no epoch length printed -------------------------

IMAGES = [96 * k for k in (1, 11, 21, 31, 41, 50)]   # the last batch of an epoch is short
RESTARTS = [
    # Images counted within an epoch, from a value that is not round; the epoch on the line.
    ("images in the line", "".join(f"Epoch: {e} | imgs: {n} | loss: {_loss(e * 50 + n / 96):.4f}\n"
                                    for e in (3, 4, 5) for n in IMAGES),
     [((e - 3) * 4800 + n, _loss(e * 50 + n / 96)) for e in (3, 4, 5) for n in IMAGES],
     "'imgs' restarts at every epoch and the log prints no epoch length: steps are (epoch - 3) x 4,800 "
     "(the largest 'imgs' of an epoch) + 'imgs'"),
    # `[epoch][batch]` with no batch total, from batch 0 of a late epoch: below the epochs done,
    # it cannot be the run's step; the records are numbered in order, all of them.
    ("[e][b] from batch 0", "".join(f"[{e}][{b}] loss: {_loss(e * 500 + b):.4f} lr: 0.01\n"
                                     for e in (37, 38, 39) for b in range(0, 500, 100)),
     [(k, _loss(e * 500 + b)) for k, (e, b) in enumerate(((e, b) for e in (37, 38, 39) for b in range(0, 500, 100)), 1)],
     "'(unnamed)' counts within an epoch and the log prints no epoch length: the records are numbered in "
     "order, for the whole log"),
    # Epoch headers above the lines, the counter named as an iteration.
    ("epoch headers", "".join(f"==> Epoch {e}\n" + "".join(f"iter {n} loss {_loss(e * 50 + n):.4f}\n"
                                                            for n in (37, 74, 111, 148)) for e in (1, 2)),
     [((e - 1) * 148 + n, _loss(e * 50 + n)) for e in (1, 2) for n in (37, 74, 111, 148)],
     "'iter' restarts at every epoch and the log prints no epoch length: steps are (epoch - 1) x 148 "
     "(the largest 'iter' of an epoch) + 'iter'"),
]


@pytest.mark.parametrize("text, want, note", [r[1:] for r in RESTARTS], ids=[r[0] for r in RESTARTS])
def test_a_counter_that_restarts_every_epoch_numbers_the_whole_log_one_way(tmp_path, text, want, note):
    got, account = records_of(tmp_path, text)
    assert [(s, m["loss"]) for s, m in got] == want
    said = account.lines()
    assert f"  note: {note}" in said, said
    assert not any("parts of the log" in line for line in said), said


# -- 5. dicts glued to the redraws of a progress bar -----------------------------------------------

def _glued(n: int, nan_at: int, first: str) -> str:
    """A record's `print(dict)` glued to tqdm's redraw (no `\\r` after it). A training loop's
    body prints while the bar shows the batches done before its own (`first`: "alone", printed
    before any bar, or "at 0", glued to `0/100`); HF's Trainer updates the bar, then prints
    ("updated": the bar shows the record's step)."""
    out = []
    for s in range(1, n + 1):
        loss = "nan" if s == nan_at else _loss(s)
        record = "{'loss': %s, 'learning_rate': 5e-05, 'epoch': %.2f}" % (loss, s / 100)
        shown = s if first == "updated" else s - 1
        bar = f"\r {shown}%|#         | {shown}/100 [00:0{s % 10}<00:10,  9.90it/s]"
        out.append(record if first == "alone" and s == 1 else bar + record)
    return "\n".join(out) + "\n"


@pytest.mark.parametrize("first", ["alone", "at 0", "updated"])
def test_a_dict_glued_after_a_bar_is_numbered_by_what_the_bar_shows(tmp_path, capsys, first):
    path = tmp_path / "glued.log"
    path.write_text(_glued(30, 21, first))
    got = [(r.step, r.metrics["loss"]) for r in read_records(path)]
    _same([(s, {"loss": v}) for s, v in got], [(s, {"loss": NAN if s == 21 else _loss(s)}) for s in range(1, 31)])
    code, out, found = _replay_json(capsys, path)
    assert code == 1 and next(f for f in found if f["kind"] == "nonfinite")["step"] == 21
    note = ("  note: records printed right after a progress bar's redraw are numbered by its count + 1 "
            "(the bar shows the batches done before the one they report)")
    assert (note in out.splitlines()) == (first != "updated")


def test_a_record_numbered_by_order_never_merges_with_a_printed_step(tmp_path):
    got, account = records_of(tmp_path, "{'loss': 3.0}\n" + "".join(f"step {s} loss {_loss(s)}\n" for s in (1, 2, 3)))
    assert got == [(0, {"loss": 3.0})] + [(s, {"loss": _loss(s)}) for s in (1, 2, 3)]
    assert "  note: a record printed before the log's first step (1) is numbered 0" in account.lines()


# -- 6. a step printed again: ranks, or a re-logged step -------------------------------------------

TABLE_STEPS = list(range(100, 1100, 100))
RELOGGED = [
    ("text table", "***** Running training *****\n  step   train_loss   eval_loss\n"
     + "".join(f"  {s:<6d} {_loss(s / 10):<12.6f} {_loss(s / 10) + 0.1:.6f}\n" for s in TABLE_STEPS)
     + f"  1000   {_loss(50):<12.6f} {_loss(100) + 0.1:.6f}\n", "run.log"),
    ("tab-separated, W&B's Step", "Step\tTraining Loss\tValidation Loss\n"
     + "".join(f"{s}\t{_loss(s / 10):.6f}\t{_loss(s / 10) + 0.1:.6f}\n" for s in TABLE_STEPS)
     + f"1000\t{_loss(50):.6f}\t{_loss(100) + 0.1:.6f}\n", "t.tsv"),
    ("markdown table", "| Step | Training Loss | Validation Loss |\n|---|---|---|\n"
     + "".join(f"| {s} | {_loss(s / 10):.6f} | {_loss(s / 10) + 0.1:.6f} |\n" for s in TABLE_STEPS)
     + f"| 1000 | {_loss(50):.6f} | {_loss(100) + 0.1:.6f} |\n", "run.log"),
    ("json lines", "".join(json.dumps({"step": s, "loss": _loss(s / 10)}) + "\n" for s in TABLE_STEPS)
     + json.dumps({"step": 1000, "loss": _loss(50)}) + "\n", "log.jsonl"),
    ("csv by the rules", "global_step,train_loss,eval_acc\n" + "".join(f"{s},{_loss(s / 10)},0.5\n" for s in TABLE_STEPS)
     + f"1000,{_loss(50)},0.5\n", "m.csv"),
]


@pytest.mark.parametrize("text, name", [r[1:] for r in RELOGGED], ids=[r[0] for r in RELOGGED])
def test_a_step_logged_again_after_steps_logged_once_is_a_record_of_its_own(tmp_path, text, name):
    got, account = records_of(tmp_path, text, name)
    assert [(s, m["loss"]) for s, m in got] == [(s, pytest.approx(_loss(s / 10))) for s in TABLE_STEPS] \
        + [(1000, pytest.approx(_loss(50)))]
    assert any(line.startswith("  note: step 1,000 was printed again with another loss") and
               line.endswith("a re-logged step (a resumed run, a summary row), kept as a record of its own")
               for line in account.lines()), account.lines()


def test_ranks_that_print_every_step_are_still_one_record_per_step(tmp_path):
    text = "".join(f"[rank{r}]: step {s} loss {_loss(s) + r / 1000:.4f}\n" for s in (1, 2, 3, 4) for r in (0, 1))
    got, _ = records_of(tmp_path, text)
    assert got == [(s, {"loss": pytest.approx(_loss(s) + 0.0005)}) for s in (1, 2, 3, 4)]


# -- 7. intervals printed as ranges ----------------------------------------------------------------

RANGES = [
    ("batches a-b", "".join(f"batches {s - 100}-{s}: loss {_loss(s)}\n" for s in range(100, 800, 100))),
    ("[a:b]", "".join(f"[{s - 100}:{s}] loss={_loss(s)}\n" for s in range(100, 800, 100))),
    ("steps a - b", "".join(f"steps {s - 100} - {s}: avg loss {_loss(s)}\n" for s in range(100, 800, 100))),
    ("(a–b)", "".join(f"iters ({s - 100}–{s}) | loss {_loss(s)}\n" for s in range(100, 800, 100))),
]


@pytest.mark.parametrize("text", [t for _, t in RANGES], ids=[n for n, _ in RANGES])
def test_an_interval_printed_as_a_range_is_numbered_by_its_end(tmp_path, text):
    got, account = records_of(tmp_path, text)
    assert got == [(s, {"loss": _loss(s)}) for s in range(100, 800, 100)]
    assert not account.order_numbered


def test_a_time_of_day_is_no_range(tmp_path):
    got, _ = records_of(tmp_path, "".join(f"[12:{10 + s}] step {s} loss {_loss(s)}\n" for s in (1, 2, 3)))
    assert got == [(s, {"loss": _loss(s)}) for s in (1, 2, 3)]


# -- 9. a finding's caveat describes how its own step was numbered ---------------------------------

def test_a_finding_at_a_printed_step_carries_no_caveat_and_its_advice_names_the_checkpoint(tmp_path, capsys):
    # The first records print no step (numbered in order); then the log prints its epochs.
    head = "".join(f"loss: {_loss(k):.4f}\n" for k in range(3))
    body = "".join(f"epoch {e} loss: {'nan' if e == 40 else f'{_loss(e):.4f}'} lr: 0.001\n" for e in range(10, 50))
    path = tmp_path / "mixed.log"
    path.write_text(head + body)
    code, out, found = _replay_json(capsys, path)
    nonfinite = next(f for f in found if f["kind"] == "nonfinite")
    assert code == 1 and nonfinite["step"] == 40
    assert "record" not in nonfinite["message"] and "step_is_record_number" not in nonfinite["details"]
    advice = next(f for f in found if f["kind"] == "rollback_advice")
    assert advice["details"]["skip_steps"][1] == 40 and "step_is_record_number" not in advice["details"]


def test_a_finding_in_a_part_numbered_by_order_says_how_that_part_was_numbered(tmp_path, capsys):
    head = "".join(f"step {s} loss {_loss(s):.4f}\n" for s in range(1, 41))
    tail = "".join(f"loss: {'nan' if k == 5 else f'{_loss(40 + k):.4f}'}\n" for k in range(1, 11))
    path = tmp_path / "tail.log"
    path.write_text(head + tail)
    code, out, found = _replay_json(capsys, path)
    nonfinite = next(f for f in found if f["kind"] == "nonfinite")
    assert nonfinite["step"] == 45 and nonfinite["details"]["step_is_record_number"] is True
    assert nonfinite["message"].endswith(
        "(step 45 is not printed by the log: it is the 5th record after step 40, the last step before "
        "records that print none: find it by counting records from there)")
    assert "which prints no step numbers" not in out


# -- 11. prose about NaN is no NaN warning ---------------------------------------------------------

@pytest.mark.parametrize("prose", ["loss check: no NaN found", "loss is not nan at step 3",
                                   "No inf or NaN detected in gradients"])
def test_prose_saying_there_was_no_nan_is_no_nan_warning(tmp_path, prose):
    text = "".join(f"step {s} | lr 0.001\n" for s in (1, 2, 3)) + prose + "\n" + "step 4 | loss 2.0\n"
    got, account = records_of(tmp_path, text)
    assert not any(math.isnan(m.get("loss", 0.0)) for _, m in got)
    assert not any(reason.startswith("NaN warning") for reason in account.ignored)


def test_a_nan_warning_still_marks_the_step_before_it(tmp_path):
    text = "step 1 | lr 0.001\nstep 2 | lr 0.001\nWARNING: loss is nan at step 2\nstep 3 | loss 2.0\n"
    got, account = records_of(tmp_path, text)
    assert math.isnan(got[1][1]["loss"]) and "NaN warning (marks the step before it)" in account.ignored


# -- the account says one numbering where one numbers every record ----------------------------------

def _bars_under_epoch_headers() -> str:
    """stable-dreamfusion's shape: an epoch header, its complete bar, an evaluation bar (no lr), the
    next header and its bar's redraws. The records are epoch x bar count; the reader first tries the
    epoch alone for the first bar."""
    bar = "loss={l:.4f} ({l:.4f}), lr=0.050000: : {p:3d}% {n}/100 [00:{t:02d}<00:{r:02d},  5.39it/s]\n"
    return ("==> [2023-07-17_21-23-40] Start Training /run/trial Epoch 81/300, lr=0.050000 ...\n"
            + bar.format(l=1.0, p=100, n=100, t=18, r=0)
            + "==> [2023-07-17_21-23-59] Finished Epoch 81/300. CPU=3.9GB, GPU=8.0GB.\n"
            + "++> Evaluate /run/trial at epoch 81 ...\n"
            + "loss=0.0000 (0.0000): : 100% 8/8 [00:00<00:00, 53.78it/s]\n++> Evaluate epoch 81 Finished.\n"
            + "==> [2023-07-17_21-23-59] Start Training /run/trial Epoch 82/300, lr=0.050000 ...\n"
            + "".join(bar.format(l=_loss(n), p=n, n=n, t=n // 5, r=(100 - n) // 5) for n in (50, 51, 52)))


@pytest.mark.parametrize("text, want, said", [
    (_bars_under_epoch_headers(), [8100, 8150, 8151, 8152], "  steps numbered by the log's counter: \"a bar's count\""),
    # an epoch printed on every line that never moves numbers nothing: the records are in order
    ("".join(f"training loss(epoch 0): part_loss: 0.5, total_loss: {_loss(s):.3f}\n" for s in range(4)),
     [1, 2, 3, 4], "  steps numbered by order of appearance (step N is the N-th record of the log, whose records "
                   "print no counter finer than their epoch)"),
], ids=["complete bar, then a header", "an epoch that never moves"])
def test_a_numbering_first_tried_and_given_up_is_not_said(tmp_path, text, want, said):
    got, account = records_of(tmp_path, text)
    assert [s for s, _ in got] == want
    numbering = [line for line in account.lines() if "numbered" in line]
    assert numbering == [said], numbering


def test_a_possessive_is_part_of_the_name_and_a_validation_loss_stays_out(tmp_path):
    """LightGBM: `[10]\ttraining's binary_logloss: 0.45\tvalid_1's binary_logloss: 0.47`. Read as a
    quote, the apostrophe left `s binary_logloss` twice, and the loss was the sum of both splits."""
    text = "".join(f"[{s}]\ttraining's binary_logloss: {_loss(s):.5f}\tvalid_1's binary_logloss: 0.47\n"
                   for s in range(1, 31))
    got, account = records_of(tmp_path, text)
    assert [(s, m["loss"]) for s, m in got] == [(s, round(_loss(s), 5)) for s in range(1, 31)]
    assert account.keys["loss"] == ["training binary_logloss"]


def test_rollback_advice_on_a_log_of_epochs_counts_epochs(tmp_path, capsys):
    """Keras at verbose=2 prints one line per epoch: a step there is an epoch's batches, and no
    framework's command (which counts optimizer steps) can be made from it."""
    path = tmp_path / "keras.log"
    path.write_text("".join(f"Epoch {e}/12\n1875/1875 - 5s - loss: {'nan' if e >= 7 else f'{_loss(e):.4f}'} "
                            f"- accuracy: 0.91\n" for e in range(1, 13)))
    code, out, found = _replay_json(capsys, path, "--advice", "all")
    advice = next(f for f in found if f["kind"] == "rollback_advice")
    assert code == 1 and advice["step"] == 7 and advice["details"]["step_unit"] == "epoch"
    assert "skip the batches of epochs 7-7 (1 epoch)" in advice["message"] and " step" not in advice["message"]
    assert "    (the log's steps are epochs: a framework's command names optimizer steps, which the log does " \
           "not print)" in out
    assert "    hf: " not in out and "    megatron: " not in out
    # a divergence's own message names the epochs its advice names (it said "at step 40")
    path.write_text("".join(f"Epoch {e}/70\n1875/1875 - 5s - loss: {0.3 * 0.95 ** min(e, 40) * 1.03 ** max(e - 40, 0) * (1 + 0.04 * (-1) ** e):.4f}"
                            f" - accuracy: 0.91\n" for e in range(1, 71)))
    code, out, found = _replay_json(capsys, path)
    said = [f["message"] for f in found if f["kind"] == "divergence"]
    assert said and " at epoch " in said[0] and " at step " not in said[0]


def test_mindspore_loss_is_a_field(tmp_path):
    """MindSpore's LossMonitor: `epoch: 1 step: 100, loss is 2.302585`."""
    got, account = records_of(tmp_path, "".join(f"epoch: 1 step: {s * 10}, loss is {_loss(s):.6f}\n"
                                                 for s in range(1, 21)))
    assert [(s, m["loss"]) for s, m in got] == [(s * 10, round(_loss(s), 6)) for s in range(1, 21)]
    assert account.keys["loss"] == ["loss"]


@pytest.mark.parametrize("name, said", [
    ("run-gpt_small-tag-train_loss.csv", "Value (the tag 'train_loss' in the file's name)"),
    ("run-a-tag-Loss_train.csv", "Value (the tag 'Loss_train' in the file's name)"),
    ("scalars.csv", None),
])
def test_a_tensorboard_scalar_export_is_the_metric_its_file_names(tmp_path, name, said):
    """TensorBoard's download of one tag: `Wall time,Step,Value`, the tag only in the file's name."""
    path = tmp_path / name
    path.write_text("Wall time,Step,Value\n" + "".join(f"{1.69e9 + s:.3f},{s * 10},{_loss(s)}\n" for s in range(1, 21)))
    if said is None:
        with pytest.raises(LogFormatError, match=r"scalars\.csv:1: a TensorBoard scalar export .* 'scalars' names "
                                                 r"no training loss.*--keys loss=Value"):
            list(read_records(path))
        return
    account = ReadAccount(path)
    got = [(r.step, r.metrics["loss"]) for r in read_records(path, account=account)]
    assert got == [(s * 10, _loss(s)) for s in range(1, 21)]
    assert account.format == "tensorboard-csv" and account.keys["loss"] == [said]


@pytest.mark.parametrize("epochs, losses, want", [
    (range(1, 6), ["2.30"] * 5, [(5, "not_learning")]),                       # frozen over 5 epochs
    (range(1, 6), ["2.30", "2.10", "1.95", "1.83", "1.75"], []),              # it learns
    (range(40, 45), ["0.31"] * 5, []),                                         # mid-run: converged?
    (range(1, 5), ["2.30"] * 4, []),                                           # 3 first points, 1 after
], ids=["frozen", "falling", "mid-run", "four epochs"])
def test_a_log_of_epochs_meets_the_step_horizon_with_each_epoch(tmp_path, capsys, epochs, losses, want):
    """`not_learning` waits 50 optimizer steps as well as its points; on a log that prints one line
    per epoch and nothing finer, each step is a pass over the data: the points decide."""
    path = tmp_path / "epochs.log"
    path.write_text("".join(f"Epoch {e}/80\n469/469 - 3s - loss: {x} - accuracy: 0.1000\n"
                            for e, x in zip(epochs, losses)))
    code, out, found = _replay_json(capsys, path)
    assert [(f["step"], f["kind"]) for f in found if f["severity"] != "info"] == want
    if want:
        assert "the 2 epochs from epoch 4 to 5 (a horizon of at least 2 points, every point having printed the " \
               "same value; the log's steps are epochs, each a pass over the data)" in found[0]["message"]


def test_a_step_that_stays_while_the_epoch_moves_numbers_nothing(tmp_path):
    """Epoch summaries that print the epoch's batch count under a step's name (`steps 469`): taken
    as the step, every epoch was one record (their mean), a NaN among them averaged away."""
    losses = [f"{2.3 - 0.1 * e:.4f}" for e in range(1, 7)] + ["nan", "nan"]
    got, account = records_of(tmp_path, "".join(f"Epoch {e} finished: steps 469, train_loss {x}, acc 0.{e}\n"
                                                 for e, x in enumerate(losses, 1)))
    _same(got, [(e, {"loss": float(x)}) for e, x in enumerate(losses, 1)])
    assert account.numbering == {"epoch": []}
    assert any("'steps' stays at 469 while the epoch moves" in n for n in account.notes)


def test_an_unnamed_count_that_restarts_under_epoch_headers_counts_within_the_epoch(tmp_path):
    """A bar without a total (`100it [00:10, loss=1.8]`) under `Epoch N` headers: it restarts with
    every epoch; as printed, the steps went back at each epoch (a false rollback each time)."""
    text = "".join(f"Epoch {e}\n" + "".join(f"{b}it [00:10,  9.9it/s, loss={_loss(e * 3 + b // 100):.4f}]\n"
                                            for b in (100, 200, 300)) for e in range(1, 5))
    got, account = records_of(tmp_path, text)
    assert [s for s, _ in got] == list(range(100, 1300, 100))
    assert any("restarts at every epoch" in n and "(epoch - 1) x 300" in n for n in account.notes)


def test_a_total_named_after_the_loss_is_the_loss_not_a_term(tmp_path):
    """`loss_cls .. loss_box .. loss_total ..`: the total is the loss; summed with its own terms,
    the loss was twice what any line prints."""
    got, account = records_of(tmp_path, "".join(f"iter {s} loss_cls {1 + 0.01 * s:.3f} loss_box 0.500 "
                                                 f"loss_total {1.5 + 0.01 * s:.3f}\n" for s in range(1, 21)))
    assert [(s, m["loss"]) for s, m in got] == [(s, round(1.5 + 0.01 * s, 3)) for s in range(1, 21)]
    assert account.keys["loss"] == ["loss_total"]


def test_a_perplexity_alone_is_read_as_its_log(tmp_path, capsys):
    """The word-language-model example prints `ppl` and no loss: a perplexity is e^loss; its NaN is
    the run's NaN. A lone `ppl: x` line with no counter of its own stays an evaluation's."""
    text = "".join(f"| epoch 1 | {s * 200:5d}/ 2983 batches | lr 20.00 | ms/batch 30.0 | ppl "
                   f"{'nan' if s > 9 else f'{math.exp(6 - 0.1 * s):8.2f}'}\n" for s in range(1, 14))
    got, account = records_of(tmp_path, text)
    assert [s for s, _ in got] == [200 * s for s in range(1, 14)]
    assert math.isclose(got[0][1]["loss"], 5.9, abs_tol=1e-4) and math.isnan(got[9][1]["loss"])
    assert account.keys["loss"] == ["log(ppl) (the log prints a perplexity, e^loss, and no loss)"]
    lone, _ = records_of(tmp_path, "".join(f"step {s} loss {_loss(s):.4f}\n" for s in range(1, 11))
                         + "***** Evaluating perplexity, Epoch 0/16 *****\nppl: 4998.29\n", name="lone.log")
    assert [s for s, _ in lone] == list(range(1, 11))


def test_a_redraw_of_the_same_count_does_not_undo_its_nan(tmp_path):
    """A bar redrawn at one count with another postfix: its last values count, but a NaN printed
    at that count stays (before, the finite redraw after it erased the step's only NaN)."""
    bar = " {n}%|#   | {n}/100 [00:0{t}<00:10,  9.9it/s, loss={x}]\n"
    text = "".join(bar.format(n=n, t=n % 10, x=f"{_loss(n):.4f}") for n in range(1, 5))
    text += bar.format(n=5, t=5, x="nan") + bar.format(n=5, t=6, x="2.3000")
    text += "".join(bar.format(n=n, t=n % 10, x=f"{_loss(n):.4f}") for n in range(6, 9))
    got, _ = records_of(tmp_path, text)
    assert [s for s, _ in got] == list(range(1, 9)) and math.isnan(got[4][1]["loss"])


def _nan_run(fmt: str, n: int = 30, nan_at: int = 25) -> list[str]:
    """``n`` records of a falling loss printed with ``fmt`` (``{i}``: step, ``{l}``: loss), NaN from ``nan_at``."""
    return [fmt.format(i=10 * i, l=_loss(i) if i < nan_at else math.nan) for i in range(1, n + 1)]


@pytest.mark.parametrize("prose", [
    "The log shows loss = 0.4123 then nan:",
    "I get `loss: 1.2345` at the start and then",
    "> My loss went from 2.3 to nan after 250 steps, see below",
])
def test_a_posts_prose_around_its_fenced_log_is_no_record(tmp_path, prose):
    # an issue's text: a sentence that quotes a number, then the log in a fence. Before, the sentence was
    # record 1 and every record after it one step late (a NaN at record 26, not 25)
    for body in (_nan_run("{l:.4f}"), _nan_run("loss: {l:.4f}")):
        got, account = records_of(tmp_path, "\n".join([prose, "", "```text", *body, "```", "Any idea?"]) + "\n")
        assert len(got) == 30 and [s for s, _ in got][:2] == [1, 2]
        assert got[24][1]["loss"] != got[24][1]["loss"] and got[23][1]["loss"] == _loss(24)
        assert account.ignored[source.PROSE] == [1, 1]


def test_a_sentence_in_a_log_with_no_fence_is_read_as_before(tmp_path):
    # only a markdown post's prose is no record: a program's line of four words keeps its numbers
    got, _ = records_of(tmp_path, "\n".join(_nan_run("step {i} | loss {l:.4f} | time per step in seconds 0.31")) + "\n")
    assert len(got) == 30 and got[0] == (10, {"loss": _loss(1)})


def test_a_pretty_printed_json_history_with_nested_metrics_is_one_record_each(tmp_path):
    # `{"train": {"loss": .., "lr": ..}, "step": 10}` printed with indent=2: the step after the nested object
    # closes. Before, the nested object's `}` ended the record: the loss numbered in order, the step a header
    rows = [{"train": {"loss": _loss(i) if i < 25 else math.nan, "lr": 1e-3}, "val": {"loss": 9.5}, "step": 10 * i}
            for i in range(1, 31)]
    for text in (json.dumps(rows, indent=2), "\n".join(json.dumps(r, indent=4) for r in rows),
                 "Here is the history:\n" + json.dumps(rows, indent=2) + "\nThe loss is NaN after that.\n"):
        got, account = records_of(tmp_path, text + "\n")
        assert [s for s, _ in got] == [10 * i for i in range(1, 31)]
        assert got[0][1] == {"loss": _loss(1), "lr": 1e-3} and got[24][1]["loss"] != got[24][1]["loss"]
        assert account.numbering == {"counter": ["step"]}


@pytest.mark.parametrize("fmt, name", [("iter {i}: average loss over the window = {l:.4f}", "average loss over the window"),
                                       ("Epoch {i} | mean loss of the batch: {l:.4f} | acc 0.5", "mean loss of the batch"),
                                       ("step {i}, loss per token: {l:.4f}, lr: 0.001", "loss per token")])
def test_a_loss_named_with_the_span_it_was_taken_over_is_the_loss(tmp_path, fmt, name):
    # the phrase after the loss (`over the window`, `of the batch`, `per token`) names no other quantity.
    # Before, the first two were refused (`window` marks a setting; `mean loss of` a statistic of nothing)
    got, account = records_of(tmp_path, "\n".join(_nan_run(fmt)) + "\n")
    assert [s for s, _ in got] == [10 * i for i in range(1, 31)] and got[0][1]["loss"] == _loss(1)
    assert account.keys["loss"][0].split(" (")[0] == name


@pytest.mark.parametrize("fmt, name, eval_name", [
    ("epoch {s}: trn_loss {l:.4f} tst_loss {v:.4f}", "trn_loss", "tst_loss"),
    ("Epoch {s}: loss_tr={l:.4f} loss_te={v:.4f}", "loss_tr", "loss_te"),
    ("Epoch {s} trainLoss: {l:.4f} valLoss: {v:.4f}", "trainLoss", "valLoss"),
])
def test_a_training_and_a_test_loss_named_by_abbreviated_or_camelcase_splits_are_not_summed(tmp_path, fmt, name, eval_name):
    # before, `trn_loss + tst_loss` (and `loss_tr + loss_te`, `trainLoss + valLoss`) were read as the loss's
    # terms and summed: the evaluation's loss in the training loss
    text = "\n".join(fmt.format(s=s, l=_loss(s), v=_loss(s) + 0.3) for s in range(1, 31)) + "\n"
    got, account = records_of(tmp_path, text)
    assert got == [(s, {"loss": _loss(s)}) for s in range(1, 31)]
    assert account.keys["loss"] == [name] and account.keys["eval_loss"] == [eval_name]


@pytest.mark.parametrize("name, role", [("AvgCost", ("statistic", None, 0)), ("CurrentCost", ("metric", "loss", 1)),
                                        ("gradNorm", ("metric", "grad_norm", 1)), ("lossG", ("component", "loss", 0)),
                                        ("learningRate", ("metric", "lr", 1)), ("testAcc", ("eval", None, 0))])
def test_camelcase_names_are_read_word_by_word(name, role):
    from stability_callbacks.replay.readers.vocabulary import classify
    assert classify(name) == role


def _paddle_v2(passes: int, nan_at: tuple[int, int] | None = None) -> str:
    # PaddlePaddle v2's book examples: `Pass %d, Batch %d, Cost %f, %s` every 100 batches, a dot per batch
    # between, then `Test with Pass %d, Cost %f, %s` after each pass (paddle/v2 event_handler)
    lines = []
    for p in range(passes):
        for b in range(0, 400, 100):
            cost = math.nan if (p, b) == nan_at else _loss(p * 4 + b // 100)
            lines += [f"Pass {p}, Batch {b}, Cost {cost:.6f}, {{'classification_error_evaluator': 0.4}}", "." * 99]
        lines.append(f"Test with Pass {p}, Cost {9.5:.6f}, {{'classification_error_evaluator': 0.31}}")
    return "\n".join(lines) + "\n"


def test_paddles_passes_are_epochs_and_its_test_lines_evaluations(tmp_path, capsys):
    # before, `Test with Pass 0, Cost ..` was a record (the test cost read as the training loss) and the
    # batches restarting every pass numbered the log in 9 parts
    got, account = records_of(tmp_path, _paddle_v2(5))
    assert len(got) == 20 and [s for s, _ in got] == sorted({s for s, _ in got})
    assert [m["loss"] for _, m in got] == [_loss(k) for k in range(20)]
    assert account.ignored["evaluation"] == [5, 9]
    path = tmp_path / "paddle.log"
    path.write_text(_paddle_v2(5, nan_at=(3, 200)))
    code, _, found = _replay_json(capsys, path)
    assert code == 1 and [(f["kind"], f["severity"]) for f in found][:1] == [("nonfinite", "critical")]


def _keras_regression(xs) -> str:
    return "".join(f"Epoch {e}/{len(xs)}\n100/100 [==============================] - 1s 5ms/step - loss: {x:.4f} - mae: "
                   f"{x ** 0.5:.4f} - val_loss: {1.05 * x:.4f}\n" for e, x in enumerate(xs, 1))


def test_a_regressions_first_epoch_mean_falling_433x_is_no_collapse(tmp_path, capsys):
    # a mean squared error on unscaled targets: its first epoch's mean holds the untrained model's errors.
    # Before, a critical stall ("the loss was masked to 0 ... or the loss path broke") at epoch 2
    xs = [15234.5, 35.2, 20.1, 15.3, 12.2, 10.9, 10.1, 9.7, 9.4, 9.2, 9.1, 9.0]
    path = tmp_path / "fit.log"
    path.write_text(_keras_regression(xs))
    assert _replay_json(capsys, path)[2] == []
    # a fall to exactly zero is still one, from the first epoch too
    for ys, at in ((xs + [0.0], 13), ([15234.5, 0.0], 2)):
        path.write_text(_keras_regression(ys))
        assert [(f["step"], f["kind"], f["severity"]) for f in _replay_json(capsys, path)[2]][:1] == [(at, "stall", "critical")]


@pytest.mark.parametrize("note", ["   <-- here it breaks", "  # nan from here", "  // ???"])
def test_a_note_after_a_value_in_a_pretty_printed_history_keeps_its_record_whole(tmp_path, note):
    # a person's note after the value that broke (`"loss": NaN,   <-- here it breaks`). Before, the line ended the
    # record's block: the record split in two, the rest numbered in order
    rows = [{"epoch": round(i / 10, 2), "grad_norm": 1.2, "learning_rate": 1e-4, "loss": _loss(i) if i < 15 else math.nan,
             "step": 10 * i} for i in range(1, 21)]
    text = "\n".join(line + (note if '"loss": NaN' in line else "") for line in json.dumps(rows, indent=2).split("\n"))
    got, account = records_of(tmp_path, text + "\n")
    assert [s for s, _ in got] == [10 * i for i in range(1, 21)] and account.numbering == {"counter": ["step"]}
    assert got[14][1]["loss"] != got[14][1]["loss"] and got[13][1]["loss"] == _loss(14)


# -- the twenty-first scoring's classes --------------------------------------------------------------------

def test_a_tutorials_unnamed_loss_gone_nan_a_few_lines_in_is_still_guessed(tmp_path, capsys):
    # the PyTorch name-classification tutorial's `5000 5% (0m 4s) 2.2001 Kaminski / Polish ✗ (Greek)`, its loss NaN
    # from the third line. Before, refused: the column did not "fall like a loss" over NaNs (the suggestion was right)
    lines = ["```"] + [f"{it} {it // 1000}% (0m {it % 60}s) {_loss(it) if it < 15000 else math.nan:.4f} Kaminski / "
                       f"Polish {'✓' if it % 2 else '✗ (Greek)'}" for it in range(5000, 100001, 5000)] + ["```"]
    path = tmp_path / "tutorial.log"
    path.write_text("\n".join(lines) + "\n")
    code, _, found = _replay_json(capsys, path)
    assert code == 1 and [(f["step"], f["kind"]) for f in found][:1] == [(15000, "nonfinite")]


@pytest.mark.parametrize("fmt", ["tensor({v}, device='cuda:0')", "tensor({v})"])
def test_bare_tensors_printed_one_per_step_with_no_grad_fn_are_the_loss(tmp_path, capsys, fmt):
    # `print(loss.detach())` every step. Before, refused: the refusal's template held the tensor's text (a
    # `grad_fn` one was read already)
    path = tmp_path / "tensors.log"
    path.write_text("".join(fmt.format(v=f"{_loss(s):.4f}" if s < 30 else "nan") + "\n" for s in range(1, 41)))
    code, _, found = _replay_json(capsys, path)
    assert code == 1 and [(f["step"], f["kind"]) for f in found][:1] == [(30, "nonfinite")]


def test_catboosts_lines_pasted_without_their_tabs_name_their_values(tmp_path, capsys):
    # `0:\tlearn: 0.68\ttest: 0.69\tbest: 0.69 (0)\ttotal: 52ms\tremaining: 10s` copied from a page that drops
    # tabs: `0:learn: 0.68test: 0.69best: ..`. Before, `test` and `best` were read as the units of the numbers before
    # them, and the run refused
    lines = [f"{i}:learn: {0.2 + 0.5 * math.exp(-i / 30) if i < 120 else math.nan:.7f}test: "
             f"{0.25 + 0.5 * math.exp(-i / 30) if i < 120 else math.nan:.7f}best: 0.3000000 ({i})total: "
             f"{52.3 + i / 2:.1f}msremaining: {10.2 - i / 20:.2f}s" for i in range(200)]
    path = tmp_path / "catboost.log"
    path.write_text("\n".join(lines) + "\n")
    code, _, found = _replay_json(capsys, path)
    assert code == 1 and [(f["step"], f["kind"]) for f in found][:1] == [(120, "nonfinite")]


@pytest.mark.parametrize("fmt, name", [("step_{s} loss_{l:.4f}", "step"), ("global_step_{s} loss_-{l:.4f}", "global_step"),
                                       ("iter_{s} loss_{l:.4f} lr_0.001", "iter")])
def test_a_counter_glued_to_its_name_by_an_underscore_numbers_the_records(tmp_path, fmt, name):
    # before, `step_1200` was digits inside a name (`resnet_50`): the records numbered in order
    got, account = records_of(tmp_path, "\n".join(fmt.format(s=10 * s, l=_loss(s)) for s in range(1, 31)) + "\n")
    assert [s for s, _ in got] == [10 * s for s in range(1, 31)] and account.numbering == {"counter": [name]}


def test_keras_complete_bars_pasted_without_their_epoch_lines_are_one_epoch_each(tmp_path):
    # `1875/1875 [====] - 5s 3ms/step - loss: 0.41 - ..` once per epoch, the `Epoch N/M` lines left out. Before, each
    # was a redraw of the one before: 20 epochs read as one record
    lines = [f"1875/1875 [==============================] - 5s 3ms/step - loss: {0.9 ** e:.4f} - accuracy: 0.9 - "
             f"val_loss: {1.1 * 0.9 ** e:.4f}" for e in range(1, 21)]
    got, account = records_of(tmp_path, "\n".join(lines) + "\n")
    assert [s for s, _ in got] == [1875 * e for e in range(1, 21)]
    assert [m["loss"] for _, m in got] == [round(0.9 ** e, 4) for e in range(1, 21)]


def test_a_dcgan_whose_discriminator_wins_at_one_percent_of_the_sum_is_found(tmp_path, capsys):
    # the DCGAN tutorial's `[e/5][i/1583]\tLoss_D: 0.0562\tLoss_G: 7.2019\tD(x): ..`: the discriminator at 0.3-0.8%
    # of the sum from step 3000, the sum doubled since its low. Before, only a discriminator within 0.1% of it had
    # won: nothing found
    lines = []
    for e in range(5):
        for i in range(0, 1583, 50):
            s = e * 1583 + i
            d, g = (0.4 + 0.3 * math.sin(s), 2.5 + math.cos(s)) if s < 3000 else (0.04 + 0.02 * math.sin(s), 7.2 + math.cos(s))
            lines.append(f"[{e}/5][{i}/1583]\tLoss_D: {d:.4f}\tLoss_G: {g:.4f}\tD(x): 0.9700\tD(G(z)): 0.0200 / 0.0010")
    path = tmp_path / "dcgan.log"
    path.write_text("\n".join(lines) + "\n")
    code, _, found = _replay_json(capsys, path)
    loud = [(f["kind"], f["details"].get("rule")) for f in found if f["severity"] != "info"]
    assert code == 0 and loud == [("stall", "player")]


@pytest.mark.parametrize("name", ["|grad|", "||g||", "||grad||_2", "\u2016\u2207\u2016"])
def test_a_norms_bars_around_the_gradient_name_the_grad_norm(tmp_path, name):
    # before, the bars were cuts and the name inside them no key: the grad norm not read
    got, account = records_of(tmp_path, "".join(f"epoch {e} | loss {_loss(e):.4f} | {name} {0.5 + e / 100:.3f}\n"
                                                for e in range(1, 31)))
    assert got[0] == (1, {"loss": _loss(1), "grad_norm": 0.51}) and account.keys["grad_norm"] == [name]


def test_a_short_log_that_jumps_at_its_second_record_and_stays_is_a_warning_at_its_end(tmp_path, capsys):
    # one loss per record, no step: 0.5, then 15, 16, 14, 15.5. The cold start's median took the spike's points in
    # (the 14 below it), so the end did not call it stayed. Before, one info
    path = tmp_path / "short.log"
    path.write_text("".join(f"loss: {x}\n" for x in (0.5, 15, 16, 14, 15.5)))
    found = _replay_json(capsys, path)[2]
    assert [(f["step"], f["kind"], f["severity"]) for f in found] == [(2, "loss_spike", "info"), (5, "loss_spike", "warning")]
    assert found[1]["details"]["stayed_to_end"] is True


def test_detectrons_nan_error_then_its_loss_dict_is_one_record_at_the_iteration_it_names(tmp_path, capsys):
    # `FloatingPointError: Loss became infinite or NaN at iteration=3131!`, then `loss_dict = {'loss_cls': nan, ..}`
    # after the last record at 3119. Before, the dict, printing no step, took the step after the last: 3120
    lines = [f"[03/05 10:35:39 d2.utils.events]:  eta: 0:06:54  iter: {i}  total_loss: {_loss(i):.3f}  lr: 0.02"
             for i in range(19, 3120, 100)]
    lines += ["FloatingPointError: Loss became infinite or NaN at iteration=3131!",
              "loss_dict = {'loss_cls': nan, 'loss_box_reg': nan, 'loss_mask': 0.6931}"]
    path = tmp_path / "d2.log"
    path.write_text("\n".join(lines) + "\n")
    found = _replay_json(capsys, path)[2]
    assert [(f["step"], f["kind"], f["severity"]) for f in found][:1] == [(3131, "nonfinite", "critical")]
