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
from stability_callbacks.replay.readers import LogFormatError, ReadAccount, read_records

NAN = float("nan")


def _loss(s: float) -> float:
    return round(2.0 + 8.0 / math.sqrt(s + 1), 4)


def records_of(tmp_path, text: str, name: str = "run.log"):
    path = tmp_path / name
    path.write_text(text)
    account = ReadAccount(path)
    got = [(r.step, {k: v for k, v in r.metrics.items() if k not in ("loss_resolution", "loss_window")})
           for r in read_records(path, account=account)]
    return got, account


def _same(got, want):
    assert [s for s, _ in got] == [s for s, _ in want]
    for (_, g), (_, w) in zip(got, want):
        assert g == pytest.approx(w, nan_ok=True)


def _replay(capsys, *argv) -> tuple[int, str, str]:
    code = main(["replay", *map(str, argv)])
    out = capsys.readouterr()
    return code, out.out, out.err


def _replay_json(capsys, path, *argv) -> tuple[int, str, list[dict]]:
    """``replay PATH ARGV --json``: the exit code, standard output and the findings (the read
    account, the first JSON line, left out)."""
    out_json = path.parent / "f.jsonl"
    code, out, _ = _replay(capsys, path, *argv, "--json", out_json)
    return code, out, [json.loads(x) for x in out_json.read_text().splitlines()[1:]]


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
     [1, 2, 3, 4], "  steps numbered by order of appearance (the records print no counter taken for the step: "
                   "step N is the N-th record)"),
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


# -- the third pass (issue 32's second held-out scoring) ---------------------------------------------
# -- 1. `name value` with a negative value; a summary line after the records -------------------------

def _falling(s: int) -> str:
    return f"{0.52 - 0.05 * s:.4f}"    # a loss that runs away below zero from step 11


NEGATIVE = [
    # the counter unnamed (watched across its lines, signs folded), the loss above zero at first
    ("a word before the counter", lambda s: f"train {s} loss {_falling(s)} reward {s / 10:.1f}"),
    ("a bare counter between bars", lambda s: f"Ep 3 | {s} | loss {_falling(s)}"),
    ("padded, a timestamp", lambda s: f"2024-05-01 10:00:{s % 60:02d} it {s:4d}  loss  {_falling(s):>8}  lr 1e-4"),
    ("tabs", lambda s: f"{s}\tpolicy_loss\t{_falling(s)}\tvalue_loss\t0.1"),
]


@pytest.mark.parametrize("line", [m for _, m in NEGATIVE], ids=[n for n, _ in NEGATIVE])
def test_a_negative_value_after_its_name_and_a_space_keeps_its_sign(tmp_path, line):
    got, _ = records_of(tmp_path, "".join(line(s) + "\n" for s in range(1, 31)))
    want = [(s, float(_falling(s)) + (0.1 if "value_loss" in line(1) else 0.0)) for s in range(1, 31)]
    assert [(s, m["loss"]) for s, m in got] == [(s, pytest.approx(v)) for s, v in want]


SUMMARY = "run summary (a line of another template that repeats the loss of the record before it, with no step or " \
    "one behind it)"


@pytest.mark.parametrize("summary, reason", [
    ("[1] loss nan reward 0.0", SUMMARY), ("done: loss nan reward 0.0", SUMMARY),
    ("final loss nan reward 0.0", "a statistic or terms of the loss (the log prints the loss itself)"),
    ("Epoch 1 | loss nan | reward 0.0", "epoch summary or another loop (the log's records print a finer counter)")])
def test_a_summary_line_after_the_records_is_no_record_going_back(tmp_path, capsys, summary, reason):
    """An epoch's or run's summary, printed once after the records in another template, repeating
    the last loss: read as a record, it went back to step 1 (a false resume) or on to a step no
    batch was trained at, and its NaN was a second one ("nothing was trained before step 1")."""
    text = "".join(f"train {s} loss {'nan' if s > 30 else _falling(s)} reward {s / 10:.1f}\n" for s in range(1, 36))
    path = tmp_path / "rl.log"
    path.write_text(text + summary + "\n")
    got, account = records_of(tmp_path, text + summary + "\n")
    assert [s for s, _ in got] == list(range(1, 36))
    assert account.ignored == {reason: [1, 36]}
    code, out, found = _replay_json(capsys, path)
    assert code == 1 and [(f["step"], f["kind"]) for f in found] == [(31, "nonfinite"), (31, "rollback_advice")]


def test_a_second_run_in_another_template_is_not_a_summary(tmp_path):
    # a line of another template behind the last step that repeats no loss: a record, as before
    text = "".join(f"train {s} loss {_falling(s)}\n" for s in range(1, 11)) + \
        "".join(f"[{s}] loss {0.9 - 0.01 * s:.4f}\n" for s in range(1, 4))
    got, _ = records_of(tmp_path, text)
    assert [s for s, _ in got] == list(range(1, 11)) + [1, 2, 3]


# -- 5. a training loss worded as an "evaluation metric" ---------------------------------------------

def _epoch_loss(e: int) -> str:
    return f"{2.0 / (e + 1) + 0.3:.4f}"


WORDED_AS_EVALUATION = [
    # the epoch in brackets, the split in the name
    ("train-loss", lambda e: [f"[{e}] Evaluation metric train-loss: {_epoch_loss(e)}"], "Evaluation metric train-loss"),
    # the split after the quoted name
    ("on training set", lambda e: [f"Epoch[{e}] evaluation metric 'loss' on training set: {_epoch_loss(e)}"],
     "loss on training set"),
    # beside the validation split's line, which stays an evaluation
    ("beside val", lambda e: [f"[{e}] Evaluation metric training_loss={_epoch_loss(e)}",
                              f"[{e}] Evaluation metric val_loss={float(_epoch_loss(e)) + 0.1:.4f}"],
     "Evaluation metric training_loss"),
]


@pytest.mark.parametrize("lines, said", [r[1:] for r in WORDED_AS_EVALUATION], ids=[r[0] for r in WORDED_AS_EVALUATION])
def test_a_training_loss_worded_as_an_evaluation_metric_is_the_training_loss(tmp_path, lines, said):
    text = "".join(line + "\n" for e in range(1, 11) for line in lines(e)) + "Final train-loss: 0.45\n"
    got, account = records_of(tmp_path, text)
    assert [(s, m["loss"]) for s, m in got] == [(e, float(_epoch_loss(e))) for e in range(1, 11)]
    assert account.keys["loss"] == [said]
    assert account.ignored.get("evaluation", [0])[0] == 10 * (len(lines(1)) - 1)   # the val lines


@pytest.mark.parametrize("line", ["[{e}] Evaluation metric val-loss: {x}", "Epoch[{e}] evaluation metric 'loss' on "
                                  "validation set: {x}", "[{e}] Test metric train-loss: {x}"])
def test_an_evaluation_metric_of_another_split_stays_an_evaluation(tmp_path, line):
    text = "".join(f"step {s} loss {_loss(s):.4f}\n" for s in range(1, 11)) + \
        "".join(line.format(e=e, x=_epoch_loss(e)) + "\n" for e in range(1, 4))
    got, account = records_of(tmp_path, text)
    assert [s for s, _ in got] == list(range(1, 11)) and account.ignored["evaluation"][0] == 3


# -- 2. several records on one line (text re-wrapped) -----------------------------------------------

SEVERAL = "records read from lines that hold several (a template repeated within the line: text re-wrapped)"
CUT = "records cut by a line's end, read with the next line"


def _rewrapped(record, width: int | None, per_line: int = 2) -> str:
    """Records of one template joined by spaces, wrapped at ``width`` (e-mail, a forum), or
    ``per_line`` whole records to a line."""
    records = [record(s) for s in range(1, 21)]
    if width is None:
        return "\n".join(" ".join(records[i:i + per_line]) for i in range(0, 20, per_line)) + "\n"
    return textwrap.fill(" ".join(records), width) + "\n"


REWRAPPED = [
    ("named step, two a line", lambda s: f"step {10 * s} | loss {_loss(s):.4f} | lr 1e-4", None, 10 * 1),
    ("named step, wrapped at 72", lambda s: f"step {10 * s} | loss {_loss(s):.4f} | lr 1e-4", 72, 10),
    ("unnamed counter in brackets, wrapped at 60", lambda s: f"[{10 * s}] loss={_loss(s):.4f}", 60, 10),
    ("Keras epochs, wrapped at 76", lambda s: f"Epoch {s}/20 - loss: {_loss(s):.4f} - acc: 0.{s:02d}", 76, 1),
    ("a timestamp opens each record", lambda s: f"[2024-01-01 10:{s:02d}:00] it {s} loss {_loss(s):.4f}", 90, 1),
    ("nanoGPT, wrapped at 80", lambda s: f"iter {10 * s}: loss {_loss(s):.4f}, time 120.5ms, mfu 30.1%", 80, 10),
    # HF's dicts wrapped at 100: a line holds one whole record and the next one's first value
    ("dicts, wrapped at 100", lambda s: "{'loss': %.4f, 'grad_norm': 1.%02d, 'learning_rate': 5e-05, 'epoch': %.2f}"
     % (_loss(s), s, s / 100), 100, 1),
]


@pytest.mark.parametrize("record, width, unit", [r[1:] for r in REWRAPPED], ids=[r[0] for r in REWRAPPED])
def test_every_record_of_a_line_that_holds_several_is_read_and_said(tmp_path, record, width, unit):
    text = _rewrapped(record, width)
    got, account = records_of(tmp_path, text)
    assert [(s, m["loss"]) for s, m in got] == [(unit * s, round(_loss(s), 4)) for s in range(1, 21)]
    said = {what: n for what, (n, _) in account.changed.items()}
    # the records of lines that hold several are said; a record cut at a line's end is read with the next
    assert said[SEVERAL] >= 20 - len(text.splitlines()) and (CUT in said) == (width is not None)
    assert any(line.startswith("  records merged, split, dropped or marked: ") for line in account.lines())


def test_a_line_that_starts_inside_a_record_drops_that_part_and_says_so(tmp_path):
    # an excerpt whose first line starts in the middle of a record (its step on no line)
    text = "2.9500 | lr 1e-4 step 20 | loss 2.9000 | lr 1e-4 step 30 | loss 2.8500 | lr 1e-4\n" \
        "step 40 | loss 2.8000 | lr 1e-4\n"
    got, account = records_of(tmp_path, text)
    assert [(s, m["loss"]) for s, m in got] == [(20, 2.9), (30, 2.85), (40, 2.8)]
    assert account.changed["partial records dropped at a line's start (the line cuts the record's start, printed "
                           "on no line)"] == [1, 1]


@pytest.mark.parametrize("line", ["loss: 2.3 (2.4) | acc: 0.5 (0.6)", "step 10 | loss 2.3 | lr 1e-4 | step_time 0.5",
                                  "Loss: 2.3 (Loss: 2.4)",
                                  "Epoch 1/10 | batch 100/500 | loss 2.3", "it 5 loss 2.3 loss_cls 1.1 loss_box 1.2"])
def test_a_line_of_one_record_is_not_split(tmp_path, line):
    _, account = records_of(tmp_path, "".join(line.replace("2.3", f"{_loss(s):.4f}") + "\n" for s in range(5)))
    assert SEVERAL not in account.changed


# -- 3. headerless space-aligned columns, an `a/b` epoch counter first --------------------------------

def _columns(counter, first_column_rises: bool = False, loss_rises: bool = False) -> str:
    """Train loss, train acc, val loss, val acc under a header an excerpt missed."""
    out = ["Loading data...", "Model: 1.2M parameters"]
    for e in range(1, 31):
        loss = 0.5 + 0.06 * e if loss_rises else 2.3026 * math.exp(-e / 15) + 0.2
        cols = [f"{loss:.4f}", f"{0.1 + e / 60:.4f}", f"{loss + 0.05:.4f}", f"{0.1135 + e / 70:.4f}"]
        if first_column_rises:
            cols = cols[1:2] + cols[:1] + cols[2:]
        out.append(counter(e) + "   ".join(cols))
    return "\n".join(out) + "\n"


COLUMN_GUESSES = [
    ("a/b first", lambda e: f"{e:3d}/50   ", False, "#3"),
    ("Epoch a/b", lambda e: f"Epoch {e}/50   ", False, "#3"),
    ("the accuracy first", lambda e: f"{e:3d}/50   ", True, "#4"),
    ("a bare epoch, tabs", lambda e: f"{e}\t", False, "#2"),
]


@pytest.mark.parametrize("counter, acc_first, loss", [r[1:] for r in COLUMN_GUESSES], ids=[r[0] for r in COLUMN_GUESSES])
def test_columns_with_no_names_are_read_by_a_guessed_loss_said_to_be_a_guess(tmp_path, counter, acc_first, loss):
    text = _columns(counter, acc_first)
    got, account = records_of(tmp_path, text.replace("   ", "\t") if "\t" in counter(1) else text)
    want = [(e, round(2.3026 * math.exp(-e / 15) + 0.2, 4)) for e in range(1, 31)]
    assert [(s, m["loss"]) for s, m in got] == want
    assert account.keys["loss"][0].startswith(f"{loss} (the first unnamed number after the counter that falls like "
                                              "a loss, of 4 unnamed numbers")
    assert any(n.startswith("the log names no loss: the loss is a guess") for n in account.notes)


def test_columns_none_of_which_falls_are_refused_with_suggestions_that_agree_and_read_the_log(tmp_path, capsys):
    path = tmp_path / "cols.log"
    path.write_text(_columns(lambda e: f"{e:3d}/50   ", loss_rises=True))
    with pytest.raises(LogFormatError) as e:
        read_records(path)
    pasted = [line.strip() for line in str(e.value).splitlines() if line.strip().startswith("stability-callbacks ")]
    assert len(pasted) == 2 and "--keys step=1,loss=3" in pasted[0] and "(?P<loss>" in pasted[1]
    for command in pasted:
        code = main(shlex.split(command)[1:] + ["--json", str(tmp_path / "r.jsonl")])
        capsys.readouterr()
        read = json.loads((tmp_path / "r.jsonl").read_text().splitlines()[0])
        assert code in (0, 1) and read["steps"] == read["steps_with_loss"] == 30, command
    # both read the same column: the first after the counter
    assert [r.metrics["loss"] for r in read_records(path, user_keys={"1": "step", "3": "loss"})][:2] == [0.56, 0.62]


# -- 8. a NaN printed as 0, announced by a warning line ------------------------------------------------

NAN_READ = "records whose loss prints 0 read as NaN: a warning line beside them says the loss was not finite"
SKIP_READ = ("records whose loss prints 0 marked skipped (skipped=1, no loss read): a warning line beside them says "
             "the step was skipped")


def _zero_with_warning(warning: str, after: bool, record=lambda s, x: f"step {s} loss {x:.4f} lr 1e-4") -> str:
    out = []
    for s in range(1, 41):
        if s == 25 and not after:
            out.append(warning)
        out.append(record(s, 0.0 if s == 25 else 2.5 - 0.01 * s))
        if s == 25 and after:
            out.append(warning)
    return "\n".join(out) + "\n"


@pytest.mark.parametrize("warning, after, said, finding", [
    ("WARNING: non-finite loss, skipping batch", False, NAN_READ, "nonfinite"),
    ("loss is nan, setting to 0", True, NAN_READ, "nonfinite"),
    ("[W] step 25: loss became inf, replaced by 0", True, NAN_READ, "nonfinite"),
    ("Skipping step: gradients contain inf", True, SKIP_READ, None),
    ("Gradient overflow. Skipping step", False, SKIP_READ, None),
], ids=["non-finite before", "nan after", "inf after, a step on it", "skip after", "overflow before"])
def test_a_zero_loss_beside_a_warning_line_is_what_the_warning_says(tmp_path, capsys, warning, after, said, finding):
    path = tmp_path / "w.log"
    path.write_text(_zero_with_warning(warning, after))
    got, account = records_of(tmp_path, path.read_text())
    marked = dict(got)[25]
    assert (math.isnan(marked["loss"]) if finding else "loss" not in marked)
    assert marked.get("skipped") == (1.0 if "skip" in warning.lower() else None)
    assert account.changed[said][0] == 1
    code, out, found = _replay_json(capsys, path)
    assert [(f["step"], f["kind"]) for f in found if f["severity"] != "info"] == (
        [(25, "nonfinite"), (25, "rollback_advice")] if finding else [])
    assert "stall" not in out


def test_a_warning_beside_no_zero_loss_changes_nothing(tmp_path):
    text = "".join(f"step {s} loss {2.5 - 0.01 * s:.4f}\n" + ("Skipping batch 3: bad sample\n" if s == 3 else "")
                   for s in range(1, 9))
    got, account = records_of(tmp_path, text)
    assert all("skipped" not in m and m["loss"] > 2 for _, m in got) and not account.changed


# -- 4. the account says every merge ----------------------------------------------------------------

@pytest.mark.parametrize("text, said, n", [
    # two ranks print every step
    ("".join(f"[rank{r}]: step {s} loss {_loss(s):.4f}\n" for s in range(1, 6) for r in (0, 1)),
     "records merged into the one before: the same step printed again (ranks, repeats: their mean loss)", 5),
    # a bar redrawn at one count
    ("".join(f" {n}%|#   | {n}/100 [00:0{t}<00:10,  9.9it/s, loss={_loss(n + t):.4f}]\n" for n in (1, 2, 3) for t in (1, 2)),
     "records merged into the one before: a progress bar redrawn at its count, or a record printed again in another "
     "form (its last values kept)", 3),
    # terms of one step on lines of their own
    ("".join(f"discriminator loss at step {s}: 0.69\ngenerator loss at step {s}: 1.{s}\n" for s in range(1, 5)),
     "records merged into the one before: terms of one step's loss on lines of their own (their sum)", 4),
], ids=["ranks", "a bar redrawn", "terms"])
def test_records_merged_into_one_are_counted_in_the_account(tmp_path, text, said, n):
    got, account = records_of(tmp_path, text)
    assert account.changed[said][0] == n
    assert any(line.startswith("  records merged, split, dropped or marked: ") and f"{n} {said}" in line
               for line in account.lines())


def test_a_log_of_epochs_with_complete_bars_does_not_say_nothing_finer_is_printed(tmp_path):
    got, account = records_of(tmp_path, "".join(f"Epoch {e}/5\n469/469 [====] - 3s - loss: {_loss(e):.4f}\n"
                                                 for e in range(1, 6)))
    assert [s for s, _ in got] == [1, 2, 3, 4, 5]
    assert "  steps numbered by the epoch (no count finer than the epoch moves from record to record: step N is " \
           "epoch N)" in account.lines()
    assert "nothing finer" not in " ".join(account.lines())


# -- 9. a named counter within an epoch, no epoch length, restarting each epoch ------------------------

@pytest.mark.parametrize("name", ["step", "it", "batch"])
@pytest.mark.parametrize("where", ["header", "on the line"])
def test_a_named_count_that_restarts_every_epoch_gives_not_learning_its_real_step_span(tmp_path, capsys, name, where):
    """A loss at chance (it wavers, never falls) over 5 epochs of 10 prints, counted 10..100 in
    every epoch: numbered in order (1..50), the horizon of not_learning (in steps) was never met."""
    lines = []
    for e in range(1, 6):
        if where == "header":
            lines.append(f"Epoch {e}")
        for k, b in enumerate(range(10, 110, 10)):
            prefix = "" if where == "header" else f"epoch {e} "
            lines.append(f"{prefix}{name} {b} loss {2.3026 + 0.003 * math.sin(1.7 * (10 * e + k)):.4f}")
    path = tmp_path / "flat.log"
    path.write_text("\n".join(lines) + "\n")
    got, account = records_of(tmp_path, path.read_text())
    assert [s for s, _ in got] == [(e - 1) * 100 + b for e in range(1, 6) for b in range(10, 110, 10)]
    assert f"  note: {name!r} restarts at every epoch and the log prints no epoch length: steps are (epoch - 1) x 100 " \
           f"(the largest {name!r} of an epoch) + {name!r}" in account.lines()
    code, out, found = _replay_json(capsys, path)
    kinds = [(f["kind"], f["step"]) for f in found if f["severity"] != "info"]
    assert [k for k, _ in kinds] == ["not_learning"] and kinds[0][1] > 50, kinds


# -- 7. a fit log cut inside an epoch ------------------------------------------------------------------

def _fit_cut(bar, nan_last: bool = False) -> str:
    """Keras' `fit`: epochs printed complete, then the last one in progress where the excerpt ends."""
    out = []
    for e in range(1, 6):
        out += [f"Epoch {e}/10", bar(469, f"{2.3 - 0.2 * e:.4f}")]
    out.append("Epoch 6/10")
    out += [bar(k, "nan" if nan_last and k == 200 else f"{1.3 - 0.0001 * k:.4f}") for k in (1, 50, 120, 200)]
    return "\n".join(out) + "\n"


FIT_BARS = [
    ("keras 3", lambda k, x: f"{k:3d}/469 ━━━━━━━━━━━━━━━━━━━━ 3s 6ms/step - accuracy: 0.6000 - loss: {x}"),
    ("keras 2", lambda k, x: f"{k:3d}/469 [==============================] - ETA: 2s - loss: {x} - acc: 0.6"),
]


@pytest.mark.parametrize("bar", [b for _, b in FIT_BARS], ids=[n for n, _ in FIT_BARS])
def test_a_fit_log_cut_inside_an_epoch_is_numbered_one_way(tmp_path, capsys, bar):
    got, account = records_of(tmp_path, _fit_cut(bar))
    assert [(s, m["loss"]) for s, m in got] == [(e, round(2.3 - 0.2 * e, 4)) for e in range(1, 6)] + [(6, 1.28)]
    said = account.lines()
    assert [line for line in said if line.startswith("  steps numbered")] == [
        "  steps numbered by the epoch (no count finer than the epoch moves from record to record: step N is epoch N)"]
    assert any(n.startswith("\"a bar's count\" stops below its total after epochs printed only complete") for n in
               account.notes)
    path = tmp_path / "cut.log"
    path.write_text(_fit_cut(bar, nan_last=True))
    code, out, found = _replay_json(capsys, path)
    assert code == 1 and next(f for f in found if f["kind"] == "nonfinite")["step"] == 6


# -- 6. multi-line epoch blocks: a header, a learning-rate line, the epoch's final bar ------------------

def _epoch_blocks(header: str, redraws: bool = False) -> str:
    out = []
    for e in range(1, 8):
        out += [header.format(e=e), f"Learning rate: {0.1 * 0.9 ** e:.6f}"]
        final = f"100%|██████████| 469/469 [00:12<00:00, 38.1it/s, loss={2.3 - 0.2 * e:.4f}]"
        out.append("\r".join([f" 21%|██        | 100/469 [00:03<00:09, 38.1it/s, loss={2.4 - 0.2 * e:.4f}]"] * redraws
                             + [final]))
    return "\n".join(out) + "\n"


@pytest.mark.parametrize("header, lr", [("Epoch {e}/20", True), ("[{e}/20]", True), ("===== Epoch {e} of 20", True),
                                        # a header of one key and one value makes a block with the LR line
                                        # below it (one line: the epoch's header, its LR not attached)
                                        ("Epoch {e}", False), ("Starting epoch {e}", False)])
def test_an_epoch_block_is_one_record_at_its_epoch_with_its_learning_rate(tmp_path, header, lr):
    got, account = records_of(tmp_path, _epoch_blocks(header))
    assert got == [(e, {"loss": round(2.3 - 0.2 * e, 4), **({"lr": round(0.1 * 0.9 ** e, 6)} if lr else {})})
                   for e in range(1, 8)]
    said = account.lines()
    assert "  steps numbered by the epoch (no count finer than the epoch moves from record to record: step N is " \
           "epoch N)" in said and not account.changed


def test_an_epoch_block_whose_bar_is_redrawn_numbers_batches_and_says_how(tmp_path):
    got, account = records_of(tmp_path, _epoch_blocks("Epoch {e}/20", redraws=True))
    # the LR line goes into the first record of its epoch (the one printed after it)
    assert [(s, m["loss"], m.get("lr")) for s, m in got] == [
        (s, round(x, 4), lr) for e in range(1, 8)
        for s, x, lr in (((e - 1) * 469 + 100, 2.4 - 0.2 * e, round(0.1 * 0.9 ** e, 6)),
                         ((e - 1) * 469 + 469, 2.3 - 0.2 * e, None))]
    assert "  note: \"a bar's count\" counts batches within an epoch of 469: steps are (epoch - 1) x 469 + " \
           "\"a bar's count\"" in account.lines()


def test_a_record_cut_by_the_end_of_the_log_is_dropped_and_said(tmp_path):
    got, account = records_of(tmp_path, "step 10 | loss 2.9 | lr 1e-4 step 20 | loss 2.8 | lr 1e-4 step 30 | loss\n")
    assert [(s, m["loss"]) for s, m in got] == [(10, 2.9), (20, 2.8)]
    assert account.changed == {SEVERAL: [2, 1], "partial records dropped at a line's end (no line goes on with it)": [1, 1]}


def test_the_search_for_records_repeated_on_a_line_stays_linear(tmp_path):
    # 10,000 numbers between the same piece, a name only at the end: no period is searched past 64
    import time
    path = tmp_path / "wide.log"
    path.write_text(" | ".join(str(i) for i in range(10000)) + " | loss 2.3\n")
    start = time.process_time()
    list(read_records(path))
    assert time.process_time() - start < 1.5      # 0.3 s; 3.5 s before the bound
