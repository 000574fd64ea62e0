"""The shapes of issue 32's second held-out scoring that the third pass of the reader read
(the scorer named only their classes; docs/replay.md, The third pass), each written here in that
shape with variants: `name value` with a negative value and a summary line after the records,
several records on one line, columns with no names, the account's word on merges, a training
loss worded as an evaluation, epoch blocks over several lines, a fit log cut inside an epoch, a
NaN printed as 0 beside a warning, and a named count that restarts every epoch. Then the fourth
pass's (the third held-out scoring's classes, docs/replay.md, The fourth pass): a warning that
says the loss was not finite and the step skipped, a classification report after the epochs,
trainer dicts between bars, a bar drawn twice per step, a count that stays, records above the
first epoch header, the loss said in prose, and refusal suggestions beside banners."""
from __future__ import annotations

import json
import math
import random
import shlex
import textwrap

import pytest

from shapes import NAN, records_of
from shapes import loss as _loss
from shapes import replay, replay_json as _replay_json
from stability_callbacks import Monitor, StepRecord
from stability_callbacks.cli import main
from stability_callbacks.replay.readers import LogFormatError, read_records
from stability_callbacks.replay.readers import tokens


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


@pytest.mark.parametrize("sep", [",", ", ", ";", "\t", " "])
def test_a_headerless_two_column_table_keeps_a_negative_values_sign(tmp_path, sep):
    # `1,-1.19`: the minus is the value's sign, not the separator's (a flow's NLL; before: refused)
    got, _ = records_of(tmp_path, "".join(f"{s}{sep}{_falling(s)}\n" for s in range(1, 31)), name="nll.csv")
    assert [(s, m["loss"]) for s, m in got] == [(s, pytest.approx(float(_falling(s)))) for s in range(1, 31)]


SUMMARY = ("records merged into the one before: a summary in another template that prints its loss again, with no "
           "step or one behind it (its other values, totals or means over the run, left out)")


@pytest.mark.parametrize("summary, reason", [
    ("[1] loss nan lr 0.0 grad_norm 0.5", SUMMARY), ("done: loss nan lr 0.0", SUMMARY),
    ("final loss nan lr 0.0", "a statistic or terms of the loss (the log prints the loss itself)"),
    ("Epoch 1 | loss nan | lr 0.0", "epoch summary or another loop (the log's records print a finer counter)")])
def test_a_summary_line_after_the_records_is_no_record_going_back(tmp_path, capsys, summary, reason):
    """An epoch's or run's summary, printed once after the records in another template, repeating
    the last loss: read as a record, it went back to step 1 (a false resume) or on to a step no
    batch was trained at, and its NaN was a second one ("nothing was trained before step 1").
    Merged into the last record, it adds nothing to it (its other numbers are the run's)."""
    text = "".join(f"train {s} loss {'nan' if s > 30 else _falling(s)} lr {s / 1000:.3f}\n" for s in range(1, 36))
    path = tmp_path / "rl.log"
    path.write_text(text + summary + "\n")
    got, account = records_of(tmp_path, text + summary + "\n")
    assert [s for s, _ in got] == list(range(1, 36))
    said = account.changed if reason == SUMMARY else account.ignored
    assert said == {reason: [1, 36]}
    last = got[-1][1]
    assert last["lr"] == 0.035 and "grad_norm" not in last   # (the fourth pass: a summary adds no value)
    code, out, found = _replay_json(capsys, path)
    assert code == 1 and [(f["step"], f["kind"]) for f in found] == [
        (31, "nonfinite"), (31, "rollback_advice"), (35, "nonfinite")]   # (the last: NaN to the log's end, info)


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
    # the fourth pass: a line that says the loss was not finite AND that the step is skipped (the
    # value printed in it, or no loss named) reads the zero as NaN, never as a skip alone
    ("WARNING: non-finite loss (nan), skipping batch", True, NAN_READ, "nonfinite"),
    ("WARNING: non-finite loss (nan), skipping batch", False, NAN_READ, "nonfinite"),
    ("Loss is nan, skipping this step", False, NAN_READ, "nonfinite"),
    ("Non-finite loss detected (inf); skipping batch", True, NAN_READ, "nonfinite"),
    ("Loss: nan, skipping batch", True, NAN_READ, "nonfinite"),
    ("NaN detected, skipping this batch", False, NAN_READ, "nonfinite"),
], ids=["non-finite before", "nan after", "inf after, a step on it", "skip after", "overflow before",
        "(nan) skipping after", "(nan) skipping before", "nan skipping before", "(inf) skipping after",
        "Loss: nan skipping after", "no loss named before"])
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


@pytest.mark.parametrize("line", [
    "Epoch 1 Step 25: loss=nan (non-finite, skipping step)",
    "[WARNING] step 25: loss = nan, skipping update\nEpoch 1 Step 25: loss=0.0000",
], ids=["a record that says it skips", "a warning with the step, the record after"])
def test_a_nan_printed_with_its_step_and_skipping_words_is_found_at_that_step(tmp_path, capsys, line):
    # the record line says non-finite and skipping: still the step's record (never a warning that
    # marks nothing: a wrong all-clear)
    path = tmp_path / "w.log"
    path.write_text("".join((line if s == 25 else f"Epoch 1 Step {s}: loss={2.5 - 0.01 * s:.4f}") + "\n"
                            for s in range(1, 41)))
    code, _, found = _replay_json(capsys, path)
    assert code == 1 and [(f["step"], f["kind"]) for f in found] == [(25, "nonfinite"), (25, "rollback_advice"),
                                                                     (35, "saves_resumed")]


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


# == the fourth pass (issue 32's third held-out scoring) ===============================================

# -- 2. a classification report after an epoch table -------------------------------------------------

REPORT = """
              precision    recall  f1-score   support

           0       0.91      0.88      0.89       980
           1       0.95      0.97      0.96      1135
           2       0.86      0.84      0.85      1032
           3       0.83      0.85      0.84      1010

    accuracy                           0.89      4157
   macro avg       0.89      0.89      0.88      4157
weighted avg       0.89      0.89      0.89      4157
"""


@pytest.mark.parametrize("header, row", [
    ("", lambda e: f"{e:5d}  {1.2 * 0.8 ** e:.4f}  {1.3 * 0.82 ** e:.4f}  {0.6 + 0.03 * e:.4f}"),
    ("", lambda e: f"{e:3d}/10  {1.2 * 0.8 ** e:.4f}  {0.6 + 0.03 * e:.4f}  {1.3 * 0.82 ** e:.4f}  {0.62 + 0.03 * e:.4f}"),
    ("epoch train_loss val_loss val_acc\n", lambda e: f"{e} {1.2 * 0.8 ** e:.4f} {1.3 * 0.82 ** e:.4f} {0.6 + 0.03 * e:.4f}"),
], ids=["unnamed columns", "unnamed, a/b counter", "a header"])
def test_a_classification_report_after_the_epochs_is_no_training_record(tmp_path, capsys, header, row):
    """sklearn's classification_report printed after the epochs: its rows (a class number, three
    scores in [0, 1], the support) were read as records 0-9 after epoch 10 (a false resume) and
    its `accuracy` lines as a step 87 (a guessed pattern's step inside `0.87`)."""
    path = tmp_path / "fit.log"
    path.write_text(header + "".join(row(e) + "\n" for e in range(1, 11)) + REPORT)
    got, account = records_of(tmp_path, path.read_text())
    assert [(s, m["loss"]) for s, m in got] == [(e, round(1.2 * 0.8 ** e, 4)) for e in range(1, 11)]
    assert not account.changed
    code, _, found = _replay_json(capsys, path)
    assert code == 0 and found == []


# -- 3. HF Trainer dicts between progress bars that print the step -------------------------------------

def _hf_bar(n: int, total: int = 1000) -> str:
    pct = 100 * n // total
    return f" {pct:3d}%|{'█' * (pct // 10):<10}| {n}/{total} [00:{n // 5 % 60:02d}<03:10,  5.00it/s]"


def _hf_dict(n: int, nan_from: int) -> str:
    return str({"loss": NAN if n >= nan_from else _loss(n), "grad_norm": 1.2, "learning_rate": 5e-05,
                "epoch": round(n / 1000, 2)})


@pytest.mark.parametrize("redraw, gap", [("\n", ""), ("\r", ""), ("\n", "\n")],
                         ids=["a bar a line", "redraws joined by \\r", "a blank line between"])
def test_a_trainer_dict_printed_after_a_bar_is_the_record_of_the_bar_s_count(tmp_path, capsys, redraw, gap):
    """HF's Trainer console: the bar redrawn every 10 steps, a dict printed every 50 right after
    the bar's draw at that count. Before, the dicts were numbered 1, 2, 3, ... ('the records print
    no counter') and a NaN at step 600 was dated step 12."""
    text = "".join(redraw + _hf_bar(n) + (f"\n{gap}{_hf_dict(n, 600)}\n" if n % 50 == 0 else "")
                   for n in range(10, 1001, 10))
    path = tmp_path / "trainer.log"
    path.write_text(text)
    got, account = records_of(tmp_path, text)
    assert [s for s, _ in got] == list(range(50, 1001, 50)) and got[0][1]["loss"] == _loss(50)
    said = account.lines()
    assert "  steps numbered by the log's counter: 'the count of the progress bar drawn on the line before'" in said
    assert "print no counter" not in said
    code, _, found = _replay_json(capsys, path)
    assert code == 1 and [(f["step"], f["kind"]) for f in found][:2] == [(600, "nonfinite"), (600, "rollback_advice")]


# -- 4. a progress bar redrawn twice per step -----------------------------------------------------------

REDRAWN = ("records merged into the one before: a progress bar redrawn at its count, or a record printed again in "
           "another form (its last values kept)")
RANKS = "records merged into the one before: the same step printed again (ranks, repeats: their mean loss)"


@pytest.mark.parametrize("bar", [
    lambda n, x: f"Epoch 1:  {n // 2:3d}%|{'█' * (n // 20):<10}| {n}/200 [00:10<03:10,  5.00it/s, loss={x:.4f}]",
    lambda n, x: f"Training: {n}/200 loss={x:.4f}",
    lambda n, x: f"step {n}/200 | loss {x:.4f}",
], ids=["tqdm postfix", "a count and its total", "a named count and its total"])
def test_a_bar_drawn_twice_at_each_count_keeps_its_last_draw(tmp_path, bar):
    """Drawn before and after the optimizer step: the two draws were one record whose loss was
    their mean (a loss no line prints); a redraw keeps the bar's newest state."""
    text = "".join(bar(n, _loss(n) + 0.3) + "\n" + bar(n, _loss(n)) + "\n" for n in range(1, 201))
    got, account = records_of(tmp_path, text)
    assert [(s, m["loss"]) for s, m in got] == [(n, _loss(n)) for n in range(1, 201)]
    assert account.changed == {REDRAWN: [200, 2]}


@pytest.mark.parametrize("more", ["", " | tokens {t}", " | samples {t}"], ids=["loss alone", "tokens", "samples"])
def test_ranks_printing_one_step_are_still_their_mean(tmp_path, more):
    # (an amount that grows from rank to rank is no count of the loop: the step stays the step)
    text = "".join(f"[rank{r}] step {n} | loss {_loss(n) + 0.01 * r:.4f}{more.format(t=8000 + 37 * r)}\n"
                   for n in range(1, 41) for r in (0, 1))
    got, account = records_of(tmp_path, text)
    assert [(s, m["loss"]) for s, m in got] == [(n, pytest.approx(_loss(n) + 0.005)) for n in range(1, 41)]
    assert account.changed == {RANKS: [40, 2]}


# -- 5. interval summaries that open with a constant count ----------------------------------------------

def _rl_loss(n: int) -> float:
    return NAN if n == 30 else round(0.5 + 2 / math.sqrt(n + 1), 4)


STAYS_ORDER = ("  steps numbered by order of appearance (step N is the N-th record of the log, whose counter {name!r} "
               "stays at {value:,} over its records with other losses: a rollout's length or an interval's size, no step)")


@pytest.mark.parametrize("line, name, said", [
    (lambda n: f"Iteration: 500 | Episode: {n} | loss: {_rl_loss(n):.4f}", "Episode", "'Iteration' stays at 500"),
    (lambda n: f"[2048 steps] episode {n} policy_loss {_rl_loss(n):.4f} value_loss 0.5", "episode",
     "'(unnamed)' stays at 2,048"),
    (lambda n: f"Iteration: 500\n  episode: {n}\n  loss: {_rl_loss(n):.4f}\n  reward: {n * 0.5:.1f}", "episode",
     "'Iteration' stays at 500"),
    (lambda n: f"Episode 10 | steps 2048 | loss {_rl_loss(n):.4f} | reward {n * 0.7:.2f}", "", "'steps' 2048"),
    (lambda n: f"Iteration: 500\n  loss: {_rl_loss(n):.4f}\n  reward: {n * 0.5:.1f}", "", "'Iteration' 500"),
], ids=["a named count beside", "an unnamed count before", "a block", "no other counter", "a block, no other counter"])
def test_a_count_that_stays_is_no_step(tmp_path, capsys, line, name, said):
    """An RL summary that opens with a constant (the rollout's length): taken as the step, every
    interval collapsed into one record, the mean of their losses. A count that goes up beside it
    numbers the records; with none, they are numbered in order; the account says which."""
    path = tmp_path / "rl.log"
    path.write_text("".join(line(n) + "\n" for n in range(1, 51)))
    got, account = records_of(tmp_path, path.read_text())
    assert [s for s, _ in got] == list(range(1, 51)) and got[0][1]["loss"] == pytest.approx(_rl_loss(1) + (
        0.5 if "value_loss" in line(1) else 0))
    said_lines = account.lines()
    if name:
        assert f"  steps numbered by the log's counter: {name!r}" in said_lines
        assert any(x.startswith(f"  note: {said.split(' stays')[0]} stays at") and f"the records are numbered by "
                   f"{name!r}" in x for x in said_lines)
    else:
        old, value = said.split()
        assert STAYS_ORDER.format(name=old.strip("'"), value=int(value)) in said_lines
    assert not account.changed
    code, _, found = _replay_json(capsys, path)
    assert code == 1 and [(f["step"], f["kind"]) for f in found][:2] == [(30, "nonfinite"), (30, "rollback_advice")]


# -- 6. a count within an epoch, no epoch length, the excerpt starting inside an epoch ------------------

@pytest.mark.parametrize("record", ["batch {b} | loss {x:.4f}", "  iter {b}: loss={x:.4f}", "[{b:4d}] loss: {x:.4f}"],
                         ids=["named", "named, indented", "unnamed"])
def test_records_before_the_first_epoch_header_are_that_epoch_s_end(tmp_path, record):
    """An excerpt that starts inside epoch 3 (batches 60-100, no header above them), then
    `Epoch 4/10` and its batches 10-100: before, 60 ... 100 then 10 (a false resume); now the
    records above the first header are the epoch before it, and its largest count the epoch's
    length."""
    lines = []
    for e in range(3, 9):
        lines += [f"Epoch {e}/10"] if e > 3 else []
        lines += [record.format(b=b, x=_loss((e - 1) * 100 + b)) for b in range(10, 101, 10) if e > 3 or b >= 60]
    got, account = records_of(tmp_path, "\n".join(lines) + "\n")
    assert [s for s, _ in got] == list(range(60, 610, 10))
    assert any(x.startswith("  note: ") and "restarts at every epoch and the log prints no epoch length: steps are "
               "(epoch - 3) x 100" in x for x in account.lines())


# -- 8. the loss printed only in prose, no counter ------------------------------------------------------

@pytest.mark.parametrize("say", ["the training loss is {x}", "Loss went down to {x}", "After this round the loss was {x}, nice"],
                         ids=["is", "went down to", "was, text after"])
def test_a_loss_said_in_prose_on_many_lines_is_read_in_order(tmp_path, capsys, say):
    """Refused before ('no per-step training metrics'); the number right after the word loss and
    a verb, on lines that say it in the same words, numbered in order and said to be a guess."""
    xs = [f"{_loss(n):.4f}" if n != 25 else "nan" for n in range(1, 41)]
    path = tmp_path / "prose.log"
    path.write_text("Starting training...\n" + "".join(say.format(x=x) + "\n" for x in xs) + "Done.\n")
    got, account = records_of(tmp_path, path.read_text())
    assert [(s, m["loss"]) for s, m in got] == [(n, pytest.approx(float(x), nan_ok=True)) for n, x in enumerate(xs, 1)]
    said = account.lines()
    assert "  steps numbered by order of appearance (the records print no counter taken for the step: step N is " \
           "the N-th record)" in said
    assert any(x.startswith("  note: the log prints the loss only in prose (") for x in said)
    code, _, found = _replay_json(capsys, path)
    assert code == 1 and [(f["step"], f["kind"]) for f in found][:1] == [(25, "nonfinite")]


@pytest.mark.parametrize("say", ["Step {n}: the loss is {x}", "[iteration {n}] loss went down to {x}"])
def test_a_loss_said_in_prose_beside_a_counter_is_numbered_by_it(tmp_path, capsys, say):
    """Before, numbered in order: the counter before the prose was dropped with the rest of the line."""
    xs = [f"{_loss(n):.4f}" if n != 25 else "nan" for n in range(1, 41)]
    path = tmp_path / "prose.log"
    path.write_text("".join(say.format(n=10 * n, x=x) + "\n" for n, x in enumerate(xs, 1)))
    got, account = records_of(tmp_path, path.read_text())
    assert [(s, m["loss"]) for s, m in got] == [(10 * n, pytest.approx(float(x), nan_ok=True)) for n, x in enumerate(xs, 1)]
    assert any(x.startswith("  note: the log prints the loss only in prose (") and "numbered by the counter" in x
               for x in account.lines())
    code, _, found = _replay_json(capsys, path)
    assert code == 1 and [(f["step"], f["kind"]) for f in found][:1] == [(250, "nonfinite")]


def test_a_loss_said_in_prose_twice_is_still_refused(tmp_path):
    path = tmp_path / "prose.log"
    path.write_text("the training loss is 2.31\nthe training loss is 2.05\n")
    with pytest.raises(LogFormatError):
        list(read_records(path))


# -- 9. refusal suggestions never name a banner's count --------------------------------------------------

BANNERS = "Found 50000 images belonging to 10 classes.\nFound 10000 images belonging to 10 classes.\n" \
          "Train on 60000 samples, validate on 10000 samples\n"


@pytest.mark.parametrize("line, keys", [
    (lambda n: f"{n * 1.5:.1f}s elapsed; value={_loss(n):.4f}", "--keys loss=value"),
    (lambda n: f"J = {_loss(n):.4f}", "--keys loss=1"),
], ids=["a named value after a time", "an unnamed value"])
def test_a_refusal_suggests_the_template_whose_float_varies_not_a_banner(tmp_path, capsys, line, keys):
    """Before, the suggestions named the count of `Found 50000 images ...` (printed once, no
    float in it) as the loss; they name the template whose float varies, and read the log."""
    path = tmp_path / "odd.log"
    path.write_text(BANNERS + "".join(line(n) + "\n" for n in range(1, 30)))
    with pytest.raises(LogFormatError) as e:
        read_records(path)
    pasted = [x.strip() for x in str(e.value).splitlines() if x.strip().startswith("stability-callbacks ")]
    assert len(pasted) == 2 and keys in pasted[0] and "Found" not in " ".join(pasted)
    # (a number named by its position is read on every line: the banners' counts too; the
    # pattern reads the template alone)
    for command in pasted if keys != "--keys loss=1" else pasted[1:]:
        code = main(shlex.split(command)[1:] + ["--json", str(tmp_path / "r.jsonl")])
        capsys.readouterr()
        read = json.loads((tmp_path / "r.jsonl").read_text().splitlines()[0])
        assert code in (0, 1) and read["steps_with_loss"] == 29, command


def test_a_refusal_with_only_banners_suggests_nothing(tmp_path):
    path = tmp_path / "odd.log"
    path.write_text(BANNERS)
    with pytest.raises(LogFormatError) as e:
        read_records(path)
    assert "stability-callbacks replay" not in str(e.value)


def test_a_first_epoch_cut_short_does_not_set_the_epoch_length(tmp_path):
    """The first epoch shown ends at batch 50 (the excerpt, or a resumed run's count), the others
    at 100: before, epoch 2 was numbered 60-150 by a length of 50 and epoch 3 from 210 (a gap of
    a length learned late); now each epoch after the first goes on from the one before, 100 long."""
    text = "".join(f"Epoch {e} | batch {b} | loss {_loss((e - 1) * 100 + b):.4f}\n"
                   for e in range(1, 7) for b in range(10, 101, 10) if e > 1 or b <= 50)
    got, account = records_of(tmp_path, text)
    assert [s for s, _ in got] == list(range(10, 560, 10))
    assert "  note: 'batch' went to 100 in the first whole epoch, higher than in the first one shown (cut): the " \
           "epochs after that are 100 long, each going on from the one before" in account.lines()


def test_a_progress_bar_counting_in_decimals_between_records_is_no_crash(tmp_path):
    # logging lines with a bar of decimal counts (`1.5/90.0`, a unit-scaled tqdm) between the
    # records: the bar is no record and its count no step; the records read as printed
    lines = []
    for i in range(1, 31):
        lines.append(f"2024-01-01 10:00:{i:02d} INFO Training: {i * 100 // 30:>3d}%|#####     | {i * 1.5:.1f}/45.0 "
                     f"[00:10<00:10, 5.00it/s]")
        if i % 5 == 0:
            lines.append(f"2024-01-01 10:00:{i:02d} INFO step {i} loss {2.3 - 0.01 * i:.4f}")
    got, account = records_of(tmp_path, "\n".join(lines) + "\n")
    assert got == [(i, {"loss": pytest.approx(2.3 - 0.01 * i)}) for i in range(5, 31, 5)]
    assert account.unreadable == 0


def test_a_loss_named_after_its_function_is_the_loss_where_no_other_is_printed(tmp_path):
    # one metric per line, train and eval split, the loss named after its function (no word
    # `loss`): `train/mse` is the loss; beside a printed `loss`, the printed loss wins
    lines = []
    for i in range(1, 21):
        lines += [f"step {i * 10}: train/mse {2.0 - 0.05 * i:.4f}", f"step {i * 10}: train/mae {1.0 - 0.02 * i:.4f}"]
        if i % 5 == 0:
            lines.append(f"step {i * 10}: eval/mse {2.2 - 0.05 * i:.4f}")
    got, account = records_of(tmp_path, "\n".join(lines) + "\n")
    assert got == [(i * 10, {"loss": pytest.approx(2.0 - 0.05 * i)}) for i in range(1, 21)]
    assert account.keys == {"loss": ["train/mse"]}
    got, account = records_of(tmp_path, "".join(f"[{i}] loss {3.0 - 0.1 * i:.3f} nll {2.0 - 0.05 * i:.3f}\n"
                                                 for i in range(1, 21)))
    assert [m["loss"] for _, m in got] == [pytest.approx(3.0 - 0.1 * i) for i in range(1, 21)]


def test_printed_loss_tensors_are_read_as_their_values(tmp_path):
    # a training loop's print(loss): `tensor(x, grad_fn=<NllLossBackward0>)` on its own line is the
    # loss (what backward() is called on), numbered by order; a NaN there is found
    lines = [f"tensor({'nan' if i > 30 else f'{2.3 - 0.02 * i:.4f}'}, grad_fn=<NllLossBackward0>)" for i in range(1, 41)]
    got, account = records_of(tmp_path, "\n".join(lines) + "\n")
    assert [s for s, _ in got] == list(range(1, 41)) and account.keys == {"loss": ["tensor_with_grad_fn"]}
    assert [m["loss"] for _, m in got][:2] == [pytest.approx(2.28), pytest.approx(2.26)]
    assert all(math.isnan(m["loss"]) for _, m in got[30:])
    # a named value printed as a tensor is that value
    got, _ = records_of(tmp_path, "".join(f"Epoch 1, batch {i}, loss: tensor({2.3 - 0.02 * i:.4f}, device='cuda:0', "
                                          f"grad_fn=<NllLossBackward0>)\n" for i in range(1, 21)))
    assert got == [(i, {"loss": pytest.approx(2.3 - 0.02 * i)}) for i in range(1, 21)]


def test_a_guessed_column_is_read_where_the_account_says_it_is(tmp_path):
    # headerless columns `epoch  batch  loss  aux  lr`, no names: the guess (loss #3, step #2)
    # is anchored at the line's start, so the records hold those columns, not the first two
    # (an unanchored pattern read the epoch as the step and the batch count as the loss)
    rows = [f"  {1 + i // 10:>3d}  {(i % 10 + 1) * 100:>6d}    {2.3 - 0.02 * i:.4f}    {1.3 - 0.01 * i:.4f}   0.0010"
            for i in range(40)]
    got, account = records_of(tmp_path, "\n".join(rows) + "\n")
    assert got[:3] == [(100, {"loss": pytest.approx(2.3)}), (200, {"loss": pytest.approx(2.28)}),
                       (300, {"loss": pytest.approx(2.26)})]
    assert account.keys["loss"][0].startswith("#3 ") and account.numbering == {"counter": ["#2"]}


def test_a_summary_dict_at_a_records_step_is_no_repeat_of_it(tmp_path):
    # logging lines of JSON: interval dicts, and after each epoch a summary dict of another form
    # at the last interval's step with the epoch's mean loss: the interval's loss stays as
    # printed (not a mean with the summary's), and the summary lines are said, not read
    lines, s = [], 0
    for e in range(1, 4):
        for _ in range(10):
            s += 10
            lines.append(f'2024-01-01 10:00:00,000 - train - INFO - {{"epoch": {e}, "iter": {s}, '
                         f'"loss": {2.3 - 0.01 * s:.4f}, "lr": 0.001}}')
        lines.append(f'2024-01-01 10:00:00,000 - train - INFO - {{"mode": "train", "epoch": {e}, "iter": {s}, '
                     f'"loss": {2.4 - 0.01 * s:.4f}, "time": 100.0}}')
    got, account = records_of(tmp_path, "\n".join(lines) + "\n")
    assert got == [(s, {"loss": pytest.approx(2.3 - 0.01 * s), "lr": 0.001}) for s in range(10, 301, 10)]
    assert account.ignored == {"a summary at a record's step (another form, another loss)": [3, 11]}


def test_a_grad_norm_printed_as_grad_or_a_nabla_is_the_grad_norm(tmp_path):
    got, account = records_of(tmp_path, "".join(f"step {i} loss {2.0 - 0.01 * i:.3f} ‖∇‖ {1.0 + 0.01 * i:.3f}\n"
                                                 for i in range(1, 11)))
    assert got[0] == (1, {"loss": pytest.approx(1.99), "grad_norm": pytest.approx(1.01)})
    got, _ = records_of(tmp_path, "".join(f"step {i} | loss {2.0 - 0.01 * i:.3f} | grad {1.0 + 0.01 * i:.3f} | "
                                          f"grad_norm {3.0:.1f}\n" for i in range(1, 11)))
    assert got[0][1]["grad_norm"] == 3.0   # a printed grad norm wins


def test_a_loss_printed_as_a_cross_entropy_below_zero_is_an_impossible_value(tmp_path, capsys):
    # a cross-entropy is never below zero: printed negative from its first step and falling (an
    # NLLLoss fed probabilities), it is the loss computed wrong: critical at once, from the name
    path = tmp_path / "run.log"
    path.write_text("".join(f"step {s} ce_loss {-0.1 * s - 0.05:.4f}\n" for s in range(1, 30)))
    code, _, found = _replay_json(capsys, path)
    assert code == 1 and [(f["step"], f["kind"], f["details"]["rule"]) for f in found if f["severity"] == "critical"][:1] == [
        (1, "stall", "impossible")]
    assert "printed as 'ce_loss' (a cross-entropy, which is never below zero)" in found[0]["message"]
    # the same numbers under a name that says nothing of it (a likelihood may be below zero): no such call
    path.write_text("".join(f"step {s} nll {-0.1 * s - 0.05:.4f}\n" for s in range(1, 30)))
    _, _, found = _replay_json(capsys, path)
    assert all(f["details"].get("rule") != "impossible" for f in found)


def test_identical_lines_of_several_hosts_interleaved_are_copies_not_resumes(tmp_path):
    # two hosts print the same lines in blocks of 10 steps: the step goes back to a step read
    # before, with the same values: a copy, dropped and said, not a run going back (a resume)
    rows = [f"step {s} loss {2.3 - 0.02 * s:.4f} lr 0.001" for blk in range(3) for _ in range(2)
            for s in range(blk * 10 + 1, blk * 10 + 11)]
    got, account = records_of(tmp_path, "\n".join(rows) + "\n")
    assert [s for s, _ in got] == list(range(1, 31))
    assert account.changed[next(k for k in account.changed if k.startswith("records dropped: a copy"))][0] >= 20


@pytest.mark.parametrize("form", ["Loss [{s}]: {x:.4f}", "loss@{s} = {x:.4f}", "loss({s}): {x:.4f}",
                                  "train loss {s} {x:.4f}"])
def test_an_index_between_a_name_and_its_value_is_the_step_not_the_loss(tmp_path, form):
    # the loss's name, an unlabelled integer that counts, then the value: the integer is the step
    # (a loss printed as an integer right before its own value is none)
    got, account = records_of(tmp_path, "".join(form.format(s=10 * s, x=2.3 - 0.02 * s) + "\n" for s in range(1, 21)))
    assert got[:2] == [(10, {"loss": pytest.approx(2.28)}), (20, {"loss": pytest.approx(2.26)})]


@pytest.mark.parametrize("per_epoch", [3, 10])
def test_a_headerless_tables_epoch_column_counts_the_restarting_iterations_beside_it(tmp_path, per_epoch):
    # `epoch  iter  loss` with no header: the iteration column restarts when the epoch column
    # goes up by one; steps are epoch x iteration (the epoch's length: the largest iteration
    # printed), whether the sampled lines show the epoch moving (short epochs) or not
    rows, want = [], []
    for e in range(1, 5):
        for k in range(1, per_epoch + 1):
            s = (e - 1) * per_epoch * 10 + k * 10
            rows.append(f"{e:5d} {k * 10:6d} {2.3 - 0.004 * s:10.4f}")
            want.append((s, pytest.approx(2.3 - 0.004 * s)))
    got, account = records_of(tmp_path, "\n".join(rows) + "\n")
    assert [(s, m["loss"]) for s, m in got] == want
    assert account.numbering == {"counter": ["#2"]}
    assert any(n.startswith("steps are epoch x iteration: the number before '#2' counts epochs") and
               f"{per_epoch * 10} iterations each (the largest '#2' printed before it restarts" in n
               for n in account.notes)


def test_a_headerless_tables_finest_counter_is_the_step(tmp_path):
    # `epoch  step  loss` with a global step and epochs of 2 rows: both columns count up, the
    # step moves on every row
    rows = [f"{1 + i // 2:4d} {(i + 1) * 50:7d} {2.3 - 0.01 * i:9.4f}" for i in range(30)]
    got, account = records_of(tmp_path, "\n".join(rows) + "\n")
    assert [s for s, _ in got] == [(i + 1) * 50 for i in range(30)] and account.numbering == {"counter": ["#2"]}


def test_a_counter_that_goes_back_elsewhere_than_its_start_is_a_resume_not_an_epoch(tmp_path):
    # the column before the step goes up by one as the step goes back to 60, not to its first
    # value: no epoch (a resume from a checkpoint, said as such by the detectors)
    rows = [f"{1:3d} {s:6d} {2.3 - 0.01 * s:8.4f}" for s in range(10, 101, 10)]
    rows += [f"2 {s:6d} {2.35 - 0.01 * s:8.4f}" for s in range(60, 201, 10)]
    got, account = records_of(tmp_path, "\n".join(rows) + "\n")
    assert [s for s, _ in got][9:12] == [100, 60, 70]
    assert not any(n.startswith("steps are epoch x iteration") for n in account.notes)


def test_a_gans_summed_discriminator_and_generator_terms_are_judged_as_an_objective(tmp_path, capsys):
    # DCGAN's prints: the players swing, then the discriminator wins and the generator's loss
    # climbs x4 (a game, not a run going wrong: before, critical divergences at steps 47 and 136,
    # not_learning and level_shift warnings); its NaN is still found
    lines = []
    for i in range(1, 301):
        d = 0.5 + 0.05 * math.sin(i / 3)
        g = 1.0 + 3.0 * min(max(i - 100, 0), 100) / 100 + 0.1 * math.sin(i / 7)
        lines.append(f"[{i // 100}/5][{i % 100}/100]\tLoss_D: {d:.4f}\tLoss_G: {g:.4f}\tD(x): 0.71\tD(G(z)): 0.2 / 0.1")
    path = tmp_path / "dcgan.log"
    path.write_text("\n".join(lines) + "\n")
    code, out, found = _replay_json(capsys, path)
    assert "the loss is a discriminator's and a generator's terms summed (Loss_D + Loss_G)" in out
    assert code == 0 and [f for f in found if f["severity"] != "info"] == []
    path.write_text("\n".join(lines[:250] + [lines[250].replace("Loss_G: ", "Loss_G: nan #")]) + "\n")
    code, _, found = _replay_json(capsys, path)
    assert ("nonfinite", "critical") in [(f["kind"], f["severity"]) for f in found]


def test_train_and_valid_lines_under_an_epochs_header_are_numbered_by_it(tmp_path):
    # `=== Epoch 3/20 ===`, then `train: loss=..` and `valid: loss=..`: the split that opens a line
    # labels it (before, the valid lines were read as records and every record numbered in order);
    # `val: n/a` later on a line stays a value of its own (litgpt)
    lines = []
    for e in range(1, 21):
        lines += [f"=== Epoch {e}/20 ===", f"train: loss={2.3 - 0.05 * e:.4f} acc=0.5",
                  f"valid: loss={2.5 - 0.04 * e:.4f} acc=0.5"]
    got, account = records_of(tmp_path, "\n".join(lines) + "\n")
    assert got == [(e, {"loss": pytest.approx(2.3 - 0.05 * e)}) for e in range(1, 21)]
    assert account.numbering == {"epoch": []} and account.ignored["evaluation"] == [20, 3]


def test_an_epochs_complete_bar_and_its_total_on_another_line_are_one_record(tmp_path):
    # each epoch: the bar at 100% with its running loss, then the epoch's total over 50 batches
    # on a line of its own: one record per epoch, the bar's (before: both read as records,
    # numbered alternately by epoch and by order, 39 parts, false spikes between the scales)
    lines = []
    for e in range(1, 21):
        loss = 2.3 - 0.1 * e
        lines += [f"Epoch {e}: 100%|██████████| 50/50 [00:02<00:00, 24.1it/s, loss={loss:.3f}]",
                  f"Epoch {e} - train loss: {loss * 50:.2f} - time 2.1s"]
    got, account = records_of(tmp_path, "\n".join(lines) + "\n")
    assert got == [(e, {"loss": pytest.approx(2.3 - 0.1 * e)}) for e in range(1, 21)]
    assert account.numbering == {"epoch": []}
    assert account.ignored == {"a summary at a record's step (another form, another loss)": [20, 2]}


@pytest.mark.parametrize("name", ["lr_group0", "lr/pg0", "lr_0", "learning_rate_0", "lr_backbone"])
def test_a_parameter_groups_lr_is_the_lr(tmp_path, name):
    # one LR per parameter group, by index or by part (YOLO's `lr/pg0`): the first printed is
    # the LR (a setting, `lr_decay`, `lr_min`, is not)
    lines = [f"step {s} | loss {2.3 - 0.01 * s:.4f} | {name} {1e-3 * min(1, s / 10):.2e} | lr_decay 0.1"
             for s in range(1, 31)]
    got, account = records_of(tmp_path, "\n".join(lines) + "\n")
    assert account.keys == {"loss": ["loss"], "lr": [name]} and got[0][1]["lr"] == pytest.approx(1e-4)


@pytest.mark.parametrize("name", ["e/b:", "Epoch/Iter", "ep/it ="])
def test_a_name_of_two_counters_over_two_numbers_is_an_epoch_and_its_batch(tmp_path, name):
    # `e/b: 2/30`: the name's parts name the value's, an epoch and a batch within it (before: a
    # count and its total, every record of an epoch merged into one, a NaN dated to its epoch)
    lines = [f"{name} {e}/{b} loss: {2.3 - 0.001 * (e * 100 + b):.4f}" for e in (1, 2, 3) for b in range(10, 101, 10)]
    got, account = records_of(tmp_path, "\n".join(lines) + "\n")
    assert [s for s, _ in got] == [(e - 1) * 100 + b for e in (1, 2, 3) for b in range(10, 101, 10)]
    assert account.numbering == {"counter": [name.split("/")[1].rstrip(":= ")]}
    # a count and its total under a name of both stays a count (`global_step/max_steps`)
    got, _ = records_of(tmp_path, "".join(f"iter/total {s}/500 loss: {2.3 - 0.001 * s:.4f}\n" for s in range(10, 301, 10)))
    assert [s for s, _ in got] == list(range(10, 301, 10))


def test_headerless_columns_whose_loss_is_nan_on_every_line_are_read_as_a_guess(tmp_path):
    # `  12   nan   nan   0.12`: no column falls like a loss; one NaN on every line is a loss gone
    # non-finite, the first after the counter (before: refused, the NaN missed)
    text = "".join(f"{s:4d}   nan   nan   0.{s:02d}\n" for s in range(1, 30))
    got, account = records_of(tmp_path, text)
    assert [s for s, _ in got] == list(range(1, 30)) and all(math.isnan(m["loss"]) for _, m in got)
    assert account.keys["loss"][0].startswith("#2 (the first unnamed number after the counter that is NaN or Inf")


@pytest.mark.parametrize("line", [
    "epoch {e} | train {t:.4f} | valid {v:.4f}",            # a split and no metric: a guess, said
    "Epoch {e}, train/val loss = {t:.4f} / {v:.4f}",        # a name of two splits over two numbers
])
def test_a_training_splits_value_beside_an_evaluations_is_the_loss(tmp_path, line):
    # before: refused, no metric named; the evaluation's value is never read
    text = "".join(line.format(e=e, t=2.3 - 0.05 * e, v=2.4 - 0.04 * e) + "\n" for e in range(1, 31))
    got, account = records_of(tmp_path, text)
    assert got == [(e, {"loss": pytest.approx(2.3 - 0.05 * e)}) for e in range(1, 31)]
    assert account.numbering == {"epoch": []}


def test_a_parameter_groups_index_in_its_keys_parentheses_stays_in_the_key(tmp_path):
    # OLMo-core: `optim/LR (group 0)=2e-05` (before: the key cut at the 0, the LR lost)
    text = "".join(f"[step={s}/100] train/CE loss={2.3 - 0.01 * s:.4f} optim/LR (group 0)={1e-5 * s:.6f}\n"
                   for s in range(1, 31))
    got, account = records_of(tmp_path, text)
    assert account.keys["lr"] and got[1] == (2, {"loss": pytest.approx(2.28), "lr": pytest.approx(2e-5)})


def test_an_epochs_loss_printed_again_under_another_name_is_one_record(tmp_path):
    # `Epoch 3: loss 0.52 acc 0.9`, then `Train loss: 0.52` (no counter): one record per epoch,
    # its NaN at its epoch (before: both lines records, numbered in order, the NaN at record 39)
    lines = []
    for e in range(1, 30):
        loss = f"{2.3 - 0.05 * e:.4f}" if e < 20 else "nan"
        lines += [f"Epoch {e}: loss {loss} acc 0.{e:02d}", f"Train loss: {loss}"]
    got, account = records_of(tmp_path, "\n".join(lines) + "\n")
    assert [s for s, _ in got] == list(range(1, 30)) and math.isnan(got[19][1]["loss"])
    assert account.numbering == {"epoch": []}
    assert account.changed == {"records merged into the one before: a summary in another template that prints its "
                               "loss again, with no step or one behind it (its other values, totals or means over "
                               "the run, left out)": [29, 2]}


def test_a_column_that_sums_the_ones_before_it_is_the_loss(tmp_path):
    # YOLOv5's rows under `Epoch gpu_mem box obj cls total labels img_size`: no name beside any
    # number; `total` is box + obj + cls on every row, the loss (before: the box term read)
    lines = []
    for e in range(30):
        box, obj, cls = 0.1 - 0.002 * e, 0.05 - 0.001 * e, 0.03 - 0.0005 * e
        lines += ["     Epoch   gpu_mem       box       obj       cls     total    labels  img_size",
                  f"    {e}/299     3.23G   {box:.5f}   {obj:.5f}   {cls:.5f}   {box + obj + cls:.5f}       214       "
                  f"640: 100%|##########| 8/8 [00:04<00:00,  1.65it/s]"]
    got, account = records_of(tmp_path, "\n".join(lines) + "\n")
    assert [(s, m["loss"]) for s, m in got][:2] == [(0, pytest.approx(0.18)), (1, pytest.approx(0.1765))]
    assert account.keys["loss"][0].startswith("#7 (the unnamed number that is the sum of the 3 right before it")


def test_loss_slash_names_without_a_loss_are_its_terms(tmp_path):
    # an actor-critic's `loss/pi` and `loss/v` blocks, no `loss` printed: its terms, summed (before:
    # read as per-stream losses of a loss never printed, and refused); the value term's inf is found
    lines = []
    for it in range(1, 30):
        lines += [f"----- iteration {it} -----", f"loss/pi: -0.0{it % 9}",
                  f"loss/v: {'inf' if it >= 20 else f'{5.0 - 0.1 * it:.4f}'}", ""]
    got, account = records_of(tmp_path, "\n".join(lines) + "\n")
    assert account.keys["loss"] == ["loss/pi + loss/v (the sum of the terms printed)"]
    assert [s for s, _ in got] == list(range(1, 30)) and got[0][1]["loss"] == pytest.approx(4.89)
    assert math.isinf(got[19][1]["loss"])


def test_a_gan_player_at_exactly_zero_has_won_outright(tmp_path, capsys):
    # DCGAN prints with the discriminator's loss 0.0000 on every line: the game has collapsed (a
    # warning at the 5th such point); a player at 0 once and back is no finding
    lines = [f"[{e}/50][{b}/100] Loss_D: 0.0000 Loss_G: {27.63 + 0.01 * math.sin(1.7 * (e * 100 + b)):.4f} D(x): 1.0000"
             for e in range(3) for b in range(0, 100, 10)]
    path = tmp_path / "gan.log"
    path.write_text("\n".join(lines) + "\n")
    code, _, found = _replay_json(capsys, path)
    assert [(f["step"], f["kind"], f["severity"], f["details"]["rule"]) for f in found] == [(40, "stall", "warning", "player")]
    path.write_text("".join(f"[0/50][{b}/100] Loss_D: {0.0 if b == 30 else 0.5 + 0.01 * (b % 3):.4f} "
                            f"Loss_G: {1.2 + 0.01 * (b % 5):.4f}\n" for b in range(0, 100, 5)))
    assert _replay_json(capsys, path)[2] == []
    # the discriminator printed just above 0 (0.0001-0.0012 beside a generator at 8 and climbing): it has won
    # as surely; before, no finding. A healthy game's discriminator near 0.01 beside 6 is none
    path.write_text("".join(f"[0/50][{b}/100] Loss_D: {0.0001 + 0.0001 * (b % 7):.4f} Loss_G: {8 + b / 10:.4f}\n"
                            for b in range(0, 100, 5)))
    assert [(f["step"], f["details"]["rule"]) for f in _replay_json(capsys, path)[2]] == [(20, "player")]
    rng = random.Random(3)
    path.write_text("".join(f"[0/50][{b}/100] Loss_D: {0.01 * math.exp(rng.gauss(0, 0.2)):.4f} "
                            f"Loss_G: {6 * math.exp(rng.gauss(0, 0.1)):.4f}\n" for b in range(0, 100, 5)))
    assert _replay_json(capsys, path)[2] == []
    # a CycleGAN's identity term nearing 0 in a healthy game is no player that won (the fifteenth scoring:
    # 5 warnings on a healthy log); its discriminators stay near 0.25
    path.write_text("".join(f"(epoch: 1, iters: {b}, time: 0.1) D_A: {0.25 * math.exp(rng.gauss(0, 0.1)):.3f} "
                            f"G_A: {0.9 * math.exp(rng.gauss(0, 0.1)):.3f} cycle_A: {1.2 * math.exp(rng.gauss(0, 0.1)):.3f} "
                            f"idt_A: {0.0004 + 0.0001 * (b % 3):.4f}\n" for b in range(100, 4100, 100)))
    assert [f for f in _replay_json(capsys, path)[2] if f["kind"] == "stall"] == []


def test_a_running_loss_under_epoch_headers_is_one_record_per_epoch(tmp_path, capsys):
    # `running loss: x` ten times per `Epoch e/30`, the accumulator of the epoch so far: it restarts
    # with each epoch (its first values one batch's, noisy), so its last value, the epoch's mean, is
    # the point (before: 300 records numbered in order, the restarts' sawtooth a spike and a
    # divergence warning on a healthy classifier near its floor)
    rng = random.Random(7)
    lines = []
    for e in range(1, 31):
        total, level = 0.0, 0.5 * math.exp(-e / 3) + 0.01
        lines.append(f"Epoch {e}/30")
        for b in range(1, 51):
            total += level * math.exp(rng.gauss(0, 1.0))
            if b % 5 == 0:
                lines.append(f"running loss: {total / b:.5f}")
    path = tmp_path / "run.log"
    path.write_text("\n".join(lines) + "\n")
    got, account = records_of(tmp_path, path.read_text())
    assert [s for s, _ in got] == list(range(1, 31)) and got[0][1]["loss"] == float(lines[10].split()[-1])
    assert account.numbering == {"epoch": []}
    code, _, found = _replay_json(capsys, path)
    assert [f for f in found if f["severity"] != "info"] == []


def test_an_epochs_length_is_found_from_prints_on_a_grid_of_the_whole_run(tmp_path):
    # epochs of 391 iterations, the loss printed every 50 optimizer steps of the run: epoch 1 at
    # 50..350, epoch 2 at 9, 59, .. (step 400, 450): the epoch is 350 + 50 - 9 = 391 long and the
    # steps fall on the run's grid (before: 350, the largest print, every later step off)
    lines = []
    for s in range(50, 1601, 50):
        e, it = (s - 1) // 391 + 1, (s - 1) % 391 + 1
        lines.append(f"Epoch {e} | iter {it} | loss {2.3 - 0.001 * s:.4f}")
    got, account = records_of(tmp_path, "\n".join(lines) + "\n")
    assert [s for s, _ in got] == list(range(50, 1601, 50))
    assert any("x 391 (its largest print + the gap between prints (50) - the next epoch's first" in n
               for n in account.notes)


@pytest.mark.parametrize("name", ["L.r.", "lrate", "learn.rate"])
def test_an_abbreviated_lr_is_the_lr(tmp_path, name):
    lines = [f"Up. {s * 100} : Cost {2.3 - 0.01 * s:.4f} : {name} {1e-4 * min(1, s / 5):.4e}" for s in range(1, 21)]
    got, account = records_of(tmp_path, "\n".join(lines) + "\n")
    assert account.keys["lr"] == [name] and got[0][1]["lr"] == pytest.approx(2e-5)


def test_a_line_of_evaluation_values_under_an_epoch_is_said_as_an_evaluation(tmp_path):
    # `Epoch 3: val_acc 0.91 val_f1 0.5` between training lines: an evaluation, not an epoch header
    lines = []
    for e in range(1, 6):
        lines += [f"Epoch {e} step {b} loss {2.3 - 0.01 * (e * 40 + b):.4f}" for b in (10, 20, 30, 40)]
        lines.append(f"Epoch {e}: val_acc 0.{e:02d} val_f1 0.5")
    _, account = records_of(tmp_path, "\n".join(lines) + "\n")
    assert account.ignored == {"evaluation": [5, 5]}


@pytest.mark.parametrize("fmt, loss_key", [
    ("Epoch {e}: {t:.1f}s - {tr:.4f} (train) - {va:.4f} (val)", "train"),
    ("epoch {e:3d} | {tr:.4f} train loss | {va:.4f} valid loss | {acc:.3f} acc", "train loss"),
])
def test_names_printed_after_their_values_name_them(tmp_path, fmt, loss_key):
    # each name after its value, up to a field separator (before: the first log refused, the
    # second read its valid loss as the training loss, every name one number late); a unit after
    # a number (`12.3s`, `12.3 s`) names nothing
    lines = [fmt.format(e=e, t=12.3 + e / 10, tr=2.3 * math.exp(-e / 8) + 0.3, va=2.4 * math.exp(-e / 8) + 0.35,
                        acc=0.5 + e / 100) for e in range(1, 25)]
    got, account = records_of(tmp_path, "\n".join(lines) + "\n")
    assert [s for s, _ in got] == list(range(1, 25))
    assert [r["loss"] for _, r in got] == [float(f"{2.3 * math.exp(-e / 8) + 0.3:.4f}") for e in range(1, 25)]
    assert account.keys["loss"][0].startswith(loss_key)


@pytest.mark.parametrize("wrap", [
    "tf.Tensor({v}, shape=(), dtype=float32)", "<tf.Tensor: shape=(), dtype=float32, numpy={v}>",
    "Array({v}, dtype=float32)", "np.float32({v})",
    "Tensor(shape=[1], dtype=float32, place=Place(gpu:0), stop_gradient=True, [{v}])",
])
def test_a_frameworks_printed_scalar_is_its_value(tmp_path, wrap):
    # TF, JAX, NumPy 2 and Paddle print a scalar wrapped (`loss: tf.Tensor(2.3, shape=(), ..)`): the
    # key before the wrapper names the value in it (before: only torch's `tensor(..)` was read; the
    # others gave no loss, or the dtype's 32 for one)
    values = [2.3 * math.exp(-e / 8) + 0.3 for e in range(1, 21)] + [math.nan]
    lines = [f"Epoch {e} - loss: {wrap.format(v=f'{v:.4f}')} - acc: {wrap.format(v='0.5')}"
             for e, v in enumerate(values, 1)]
    got, _ = records_of(tmp_path, "\n".join(lines) + "\n")
    assert [s for s, _ in got] == list(range(1, 22))
    assert [r["loss"] for _, r in got][:20] == [float(f"{v:.4f}") for v in values[:20]] and math.isnan(got[20][1]["loss"])


def test_records_after_a_bar_that_restarts_are_numbered_in_order(tmp_path):
    # `Training: 100/100 [..]`, then `loss: x` with no counter, epoch after epoch: the bar counts
    # a pass's batches, not the run's steps (before: the first record at step 100, the next ones
    # 101, 102.. "in order", one account for two numberings)
    lines = []
    for e in range(1, 9):
        lines += [f"Training: {b}%|██████| {b}/100 [00:0{e}<00:00, 9.9it/s]" for b in (25, 50, 75, 100)]
        lines.append(f"loss: {2.3 * math.exp(-e / 4) + 0.3:.4f} acc: 0.{e}")
    got, account = records_of(tmp_path, "\n".join(lines) + "\n")
    assert [s for s, _ in got] == list(range(1, 9)) and account.numbering == {"order": []}
    assert "a progress bar whose count restarts" in account.order_reason


@pytest.mark.parametrize("fmt, name", [
    ("step: {m}/800 optimizer_step: {s} loss: {v:.4f}", "optimizer_step"),
    ("Iteration {m} (update {s}): loss={v:.4f}", "update"),
    ("micro_step {m} | step {s} | loss {v:.4f}", "step"),
])
def test_the_optimizers_count_numbers_the_records_beside_a_micro_batch_count(tmp_path, fmt, name):
    # a count of micro-batches beside the optimizer's: the optimizer's numbers the records, the
    # first line its own step where every line steps (before: `step` or `Iteration` taken for
    # the optimizer_step / update count, and the first line merged into the second)
    lines = [fmt.format(m=4 * s, s=s, v=2.3 * math.exp(-s / 80) + 0.5) for s in range(1, 200)]
    got, account = records_of(tmp_path, "\n".join(lines) + "\n")
    assert [s for s, _ in got] == list(range(1, 200)) and account.numbering == {"counter": [name]}
    assert got[0][1]["loss"] == float(f"{2.3 * math.exp(-1 / 80) + 0.5:.4f}")


@pytest.mark.parametrize("fmt, said, value", [
    ("step {s} loss: [{a:.4f}, {b:.4f}, {c:.4f}] lr: 0.001", "loss[1] + loss[2] + loss[3] (the sum of the terms printed)",
     lambda a, b, c: a + b + c),
    ("step {s} losses = tensor([{t:.4f}, {a:.4f}, {b:.4f}], device='cuda:0')", "losses[1] (the sum of the others in "
     "its array)", lambda a, b, c: a + b),
])
def test_a_loss_printed_as_an_array_is_its_total_or_the_sum_of_its_terms(tmp_path, fmt, said, value):
    # (before: the array's first number taken for the loss, whatever it was, and torch's
    # `tensor([..])` of several numbers not read)
    rows = [(s, *(round(v * (2.3 * math.exp(-s / 300) + 0.5), 4) for v in (0.5, 0.3, 0.1))) for s in range(10, 300, 10)]
    lines = [fmt.format(s=s, a=a, b=b, c=c, t=round(a + b, 4)) for s, a, b, c in rows]
    got, account = records_of(tmp_path, "\n".join(lines) + "\n")
    assert [s for s, _ in got] == [r[0] for r in rows]
    assert [r["loss"] for _, r in got] == pytest.approx([value(a, b, c) for _, a, b, c in rows])
    assert account.keys["loss"] == [said]


def test_a_statistics_summary_per_key_is_its_mean(tmp_path):
    # StyleGAN2/3's stats.jsonl: `"Loss/G/loss": {"num": 64, "mean": 1.2, "std": 0.3}`: the mean is
    # the value its key names, the others its statistics; a wall-clock `timestamp` is no step
    # (before: the loss 'mean', a statistic, numbered by the timestamp)
    rows = [json.dumps({"Loss/G/loss": {"num": 64, "mean": 1.2 + 0.01 * (k % 3), "std": 0.3},
                        "Loss/D/loss": {"num": 64, "mean": 0.6 + 0.01 * (k % 2), "std": 0.1},
                        "Progress/kimg": {"num": 1, "mean": k * 4.0}, "Progress/tick": {"num": 1, "mean": k},
                        "timestamp": 1600000000 + 7 * k}) for k in range(1, 30)]
    got, account = records_of(tmp_path, "\n".join(rows) + "\n", "stats.jsonl")
    assert [s for s, _ in got] == list(range(1, 30)) and account.numbering == {"counter": ["Progress/tick"]}
    assert account.keys["loss"] == ["Loss/G/loss + Loss/D/loss (the sum of the terms printed)"]
    assert got[0][1]["loss"] == pytest.approx(1.21 + 0.61)


def test_olmo_cores_optim_prefix_names_the_lr(tmp_path):
    lines = [f"[step={s}/1000] train/CrossEntropyLoss={2.3 - 0.001 * s:.4f} optim/learning_rate_group0="
             f"{4e-4 * min(1, s / 100):.4e} optim/total_grad_norm=0.5" for s in range(1, 40)]
    got, account = records_of(tmp_path, "\n".join(lines) + "\n")
    assert account.keys["lr"] == ["optim/learning_rate_group0"] and got[0][1]["lr"] == pytest.approx(4e-6)


def test_a_step_with_its_total_that_restarts_with_the_epoch_counts_the_epochs_batches(tmp_path, capsys):
    # the PyTorch tutorials' `Epoch [2/5], Step [100/600], Loss: 2.2951` (before: the steps went
    # back at every epoch, read as 4 resumes); a global count beside its epoch stays as printed
    lines = [f"Epoch [{e}/5], Step [{b}/600], Loss: {2.3 * math.exp(-(e * 600 + b) / 1000) + 0.5:.4f}"
             for e in range(1, 6) for b in range(100, 601, 100)]
    got, account = records_of(tmp_path, "\n".join(lines) + "\n")
    assert [s for s, _ in got] == list(range(100, 3001, 100))
    assert any("'Step' restarts as the epoch moves (from epoch 2)" in n for n in account.notes)
    path = tmp_path / "run.log"
    path.write_text("\n".join(lines) + "\n")
    assert _replay_json(capsys, path)[2] == []
    lines = [f"Epoch {1 + (s - 1) // 100}/3 | Step {s}/300 | loss {2.3 - 0.001 * s:.4f}" for s in range(10, 301, 10)]
    got, account = records_of(tmp_path, "\n".join(lines) + "\n")
    assert [s for s, _ in got] == list(range(10, 301, 10)) and not account.notes


def test_a_gans_players_named_by_their_letters_are_its_terms(tmp_path):
    # `Iter: 100, D: 0.51, G:1.52` (before: refused, no loss named)
    lines = [f"Iter: {s}, D: {0.5 + 0.01 * (s % 7):.4}, G:{1.5 + 0.01 * (s % 5):.4}" for s in range(0, 2000, 50)]
    got, account = records_of(tmp_path, "\n".join(lines) + "\n")
    assert [s for s, _ in got] == list(range(0, 2000, 50))
    assert account.keys["loss"] == ["D + G (the sum of the terms printed)"]


def test_a_record_wrapped_across_lines_is_read_joined(tmp_path):
    # a pasted HF dict wrapped at 60 columns, and a key cut from its value at a line's end (before:
    # the learning rate on the second line lost, and the dict's tail read as a line of its own)
    import textwrap
    lines = []
    for s in range(10, 300, 10):
        lines += textwrap.wrap(f"{{'loss': {2.3 - 0.001 * s:.4f}, 'grad_norm': 1.5, 'learning_rate': "
                               f"{1e-5 * (1 - s / 600):.4e}, 'epoch': {s / 600:.2f}}}", 60)
    got, account = records_of(tmp_path, "\n".join(lines) + "\n")
    assert len(got) == 29 and got[0][1]["lr"] == pytest.approx(float(f"{1e-5 * (1 - 10 / 600):.4e}"))
    assert "lines wrapped inside a record" in " ".join(account.lines())
    lines = [x for s in range(10, 300, 10) for x in (f"step: {s} | loss: {2.3 - 0.001 * s:.4f} | lr:",
                                                        f"    {1e-5 * (1 - s / 600):.4e} | tokens/s: 12345.6")]
    got, _ = records_of(tmp_path, "\n".join(lines) + "\n")
    assert [s for s, _ in got] == list(range(10, 300, 10)) and all("lr" in r for _, r in got)
    # a header that ends with `:` and a pretty-printed dict's `{` wrap nothing
    got, _ = records_of(tmp_path, "Run:\n" + "".join(f"{{'loss': {2.3 - 0.01 * s:.4f}, 'epoch': {s / 10}}}\n"
                                                     for s in range(1, 20)))
    assert [s for s, _ in got] == list(range(1, 20))


@pytest.mark.parametrize("fmt, loss", [
    ("エポック {e}/30, 損失: {v:.4f}, 検証損失: {w:.4f}, 学習率: 0.001", "損失"),
    ("에폭 {e} | 손실: {v:.4f} | 검증 손실: {w:.4f}", "손실"),
    ("Эпоха {e}: потери на обучении = {v:.4f}, потери на валидации = {w:.4f}", "потери на обучении"),
    ("Epoche {e}: Verlust {v:.4f} - Lernrate 0.001", "Verlust"),
    ("Época {e} - pérdida: {v:.4f} - pérdida de validación: {w:.4f}", "pérdida"),
    ("轮次：{e}  损失：{v:.4f}", "损失"),
])
def test_keys_in_other_languages_name_the_loss_and_the_epoch(tmp_path, fmt, loss):
    # (before: refused, or the validation loss taken, or the full-width colon in the name)
    values = [(e, 2.3 * math.exp(-e / 30) + 0.5) for e in range(1, 31)]
    lines = [fmt.format(e=e, v=v, w=v + 0.1) for e, v in values]
    got, account = records_of(tmp_path, "\n".join(lines) + "\n")
    assert [(s, r["loss"]) for s, r in got] == [(e, float(f"{v:.4f}")) for e, v in values]
    assert account.keys["loss"] == [loss]


@pytest.mark.parametrize("line, key, value", [
    ("step {s} | loss {v:.4f} | backbone_lr 1.000e-05 | head_lr 1.000e-03", "lr", 1e-5),
    ("{{'policy_loss': array(-0.01, dtype=float32), 'vf_loss': array({v:.4f}, dtype=float32), 'step': {s}}}",
     "loss", None),
])
def test_an_lr_named_after_its_group_and_numpys_scalar_arrays(tmp_path, line, key, value):
    # (before: `backbone_lr` not the LR; numpy's 0-d `array(x, dtype=..)` read as its dtype's 32)
    got, _ = records_of(tmp_path, "\n".join(line.format(s=s, v=2.3 - 0.001 * s) for s in range(1, 40)) + "\n")
    assert [s for s, _ in got] == list(range(1, 40))
    assert got[0][1][key] == pytest.approx(value if value is not None else 2.299 - 0.01)


def test_progress_lines_that_end_in_free_text_are_one_template(tmp_path, capsys):
    # the PyTorch name-classification tutorial's `5000 5% (0m 20s) 2.9531 Dubois / French ✓`: each
    # line's prediction after its numbers made every line a template of its own (before: refused,
    # and the NaN further down missed); the loss is the guess of progress lines, said as such
    rng = random.Random(5)
    names = [("Ahn", "Korean"), ("Nguyen", "Vietnamese"), ("Schmidt", "German"), ("Rossi", "Italian")]
    lines = []
    for it in range(5000, 100001, 5000):
        loss = 2.8 * math.exp(-it / 40000) + 0.6 + rng.gauss(0, 0.1) if it < 70000 else math.nan
        name, lang = rng.choice(names)
        guess = rng.choice([lang, "English"])
        lines.append(f"{it} {it // 1000}% ({it // 12000}m {it % 60}s) {loss:.4f} {name} / {guess} "
                     f"{'✓' if guess == lang else f'✗ ({lang})'}")
    path = tmp_path / "run.log"
    path.write_text("\n".join(lines) + "\n")
    code, _, found = _replay_json(capsys, path)
    assert [(f["step"], f["kind"]) for f in found if f["severity"] == "critical"] == [
        (70000, "nonfinite"), (70000, "rollback_advice")]


def test_a_key_glued_to_its_value_by_an_underscore(tmp_path):
    # `nll_-3.4521`, `loss_2.31`: the underscore joins the key to its value, the minus sign is the
    # value's (before: the sign went into the key and the value was read positive, or the number
    # was taken for digits inside a name); `resnet_50` stays a name
    values = [1.2 - 0.3 * s for s in range(1, 21)]
    lines = [f"resnet_50 iter {s * 10} nll_{v:.4f} acc_0.{s:02d}" for s, v in enumerate(values, 1)]
    got, account = records_of(tmp_path, "\n".join(lines) + "\n")
    assert [(s, r["loss"]) for s, r in got] == [(s * 10, float(f"{v:.4f}")) for s, v in enumerate(values, 1)]
    assert account.keys["loss"] == ["nll"]


@pytest.mark.parametrize("summary", ["best loss: 0.2310", "train_runtime: 12.3"])
def test_a_summary_after_one_key_records_keeps_the_last_record(tmp_path, summary):
    # `loss: x` records one per line, then a run summary's one-key line: the last record is no part
    # of the summary (before: the two joined as one block, a run summary, the last record lost)
    lines = [f"loss: {2.3 - 0.1 * e:.4f}" for e in range(1, 21)] + [summary]
    got, account = records_of(tmp_path, "\n".join(lines) + "\n")
    assert len(got) == 20 and got[-1] == (20, {"loss": 0.3})
    assert account.ignored == {"run summary": [1, 21]}


def test_a_step_header_whose_lines_start_at_its_margin_numbers_them(tmp_path):
    # `iter 40/500`, then the step's metrics on lines of their own, not indented under it (before:
    # numbered in order, the NaN at step 40 of 50 rather than iteration 400)
    text = "".join(f"iter {s}/500\nloss={'nan' if s == 400 else _falling(s // 10)} grad_norm=0.5\nlr=0.0001\n"
                   for s in range(10, 501, 10))
    got, account = records_of(tmp_path, text)
    assert [s for s, _ in got] == list(range(10, 501, 10))
    assert got[0][1] == {"loss": float(_falling(1)), "grad_norm": 0.5, "lr": 0.0001}
    assert math.isnan(got[39][1]["loss"]) and got[39][0] == 400
    assert account.ignored == {"step header": [50, 1]} and not account.changed


@pytest.mark.parametrize("container", ["metrics", "stats", "logs", "scalars"])
def test_a_dict_printed_under_a_containers_name_keeps_its_keys(tmp_path, container):
    # `metrics={'train_loss': .., 'lr': ..}`: the container's name prefixes every key inside
    # (`metrics/lr`); before, the LR and the grad norm were not read, the loss read as a term
    text = "".join(f"INFO step={s} {container}={{'train_loss': {_falling(s)}, 'lr': 0.0001, 'grad_norm': 0.5}}\n"
                   for s in range(1, 11))
    got, account = records_of(tmp_path, text)
    assert got[0] == (1, {"loss": float(_falling(1)), "lr": 0.0001, "grad_norm": 0.5})
    assert account.keys == {"loss": ["train_loss"], "lr": ["lr"], "grad_norm": ["grad_norm"]}


def test_a_cross_entropy_named_with_its_qualifiers_is_the_loss(tmp_path):
    # Trax prints each metric on a line of its own, the loss named after its function with its
    # qualifiers glued on (`train WeightedCategoryCrossEntropy`), the evaluation's beside it
    # (before: refused, "no per-step training metrics")
    text = "".join(f"Step {100 * s:6d}: Ran 100 train steps in 10.00 secs\n"
                   f"Step {100 * s:6d}: train WeightedCategoryCrossEntropy |  {_falling(s)}\n"
                   f"Step {100 * s:6d}: train WeightedCategoryAccuracy |  0.5\n"
                   f"Step {100 * s:6d}: eval  WeightedCategoryCrossEntropy |  0.9\n\n" for s in range(1, 11))
    got, account = records_of(tmp_path, text)
    assert [(s, m["loss"]) for s, m in got] == [(100 * s, float(_falling(s))) for s in range(1, 11)]
    assert account.keys == {"loss": ["train WeightedCategoryCrossEntropy"]}
    assert account.ignored["evaluation"][0] == 10


@pytest.mark.parametrize("line", ["Iteration {s}: saving checkpoint to ckpt.pt", "Iteration {s}0: saving checkpoint",
                                  "step {s}: checkpoint saved to /out/ckpt"])
def test_a_checkpoint_line_naming_a_step_among_records_numbered_otherwise_is_no_header(tmp_path, line):
    # a step header's lines may start at its margin, but a checkpoint line between records that
    # print no step is about the record before it: the record after it is no part of it (the
    # eleventh scoring: a record merged into the one before as a repeat)
    text = "".join(f"loss: {_falling(s)}, acc: 0.5\n" + (line.format(s=s) + "\n" if s % 5 == 0 else "")
                   for s in range(1, 31))
    got, account = records_of(tmp_path, text)
    assert [(s, m["loss"]) for s, m in got] == [(s, float(_falling(s))) for s in range(1, 31)]
    assert not account.changed


def test_an_evaluation_pass_counting_in_the_training_bars_form_is_another_loop(tmp_path):
    # `Epoch 1 [ 5/20] loss: ..` after `Epoch 1 [100/100] loss: ..`: the same keys, another total,
    # counting again from below in the same epoch (before: read as records, three false resumes)
    lines = []
    for ep in range(1, 4):
        lines += [f"Epoch {ep} [{it:3d}/100] loss: {_falling(ep * 10 + it // 10)}" for it in range(10, 101, 10)]
        lines += ["Evaluating..."] + [f"Epoch {ep} [{it:3d}/20] loss: 0.9000" for it in range(5, 21, 5)]
    got, account = records_of(tmp_path, "\n".join(lines) + "\n")
    assert [s for s, _ in got] == [(ep - 1) * 100 + it for ep in range(1, 4) for it in range(10, 101, 10)]
    assert account.ignored["epoch summary or another loop (the log's records print a finer counter)"][0] == 12


def test_a_steps_values_on_two_lines_are_one_record_said_so(tmp_path):
    # `Iteration 100, lr = 0.001` then `Iteration 100, loss = 2.3`: one record, nothing averaged;
    # before, the account named no source for the loss and called it "ranks, repeats: their mean"
    text = "".join(f"Iteration {100 * s}, lr = 0.001\nIteration {100 * s}, loss = {_falling(s)}\n" for s in range(1, 11))
    got, account = records_of(tmp_path, text)
    assert got == [(100 * s, {"lr": 0.001, "loss": float(_falling(s))}) for s in range(1, 11)]
    assert account.keys == {"lr": ["lr"], "loss": ["loss"]}
    assert list(account.changed) == ["records merged into the one before: the same step's other values, on a "
                                     "line of their own (one record)"]


def test_a_keras_1_epoch_line_opening_with_its_seconds_is_numbered_by_its_epoch(tmp_path):
    # Keras 1's `verbose=2`: `Epoch 3/15`, then `12s - loss: .. - acc: ..`: the seconds are a
    # duration, not a counter (before: the first records numbered by them, false resumes after)
    text = "".join(f"Epoch {e}/15\n{10 + e % 3}s - loss: {_falling(e)} - acc: 0.5\n" for e in range(1, 16))
    got, account = records_of(tmp_path, text)
    assert [(s, m["loss"]) for s, m in got] == [(e, float(_falling(e))) for e in range(1, 16)]


def test_a_padded_count_restarting_each_epoch_from_zero_is_numbered_across_epochs(tmp_path):
    # timm's `Train: 1 [  0/500 (  0%)]` after `Train: 0 [400/500 ( 80%)]`: the first line of each
    # epoch, its count padded inside its bracket, was a template of its own, so the epoch x
    # iteration rule never saw it: step 0 again (a false resume) instead of 500
    text = "".join(f"Train: {e} [{i:3d}/500 ({i // 5:3d}%)]  Loss: {_falling(e * 5 + i // 100)}\n"
                   for e in range(3) for i in range(0, 500, 100))
    got, _ = records_of(tmp_path, text)
    assert [s for s, _ in got] == list(range(0, 1500, 100))


@pytest.mark.parametrize("form, name", [
    (lambda s, split, x: f"[{s:03d}] {split}: loss={x} acc=0.5\n", "log"),   # a label after a leading counter
    (lambda s, split, x: f"{s * 10},{split},{x}\n", "csv"),                  # a column of split names
])
def test_training_and_evaluation_rows_of_one_shape_at_one_step_are_not_averaged(tmp_path, form, name):
    # `[012] train: loss=..` then `[012] valid: loss=..`, and `step,split,loss` rows `120,train,..` /
    # `120,val,..`: the evaluation's rows are evaluation lines; before, each pair was "the same step
    # printed again (ranks, repeats: their mean loss)", half of every loss the validation's
    text = "".join(form(s, "train", _falling(s)) + form(s, "val" if name == "csv" else "valid", "0.9") for s in range(1, 11))
    got, account = records_of(tmp_path, ("step,split,loss\n" if name == "csv" else "") + text, name=f"tv.{name}")
    first = 1 if name == "log" else 10
    assert [(s, m["loss"]) for s, m in got] == [(first * s, float(_falling(s))) for s in range(1, 11)]
    assert account.ignored["evaluation"][0] == 10 and not account.changed


@pytest.mark.parametrize("name", ["loss_scale_log2", "log2_loss_scale"])
def test_a_loss_scale_printed_as_its_log2_is_read_as_the_scale(tmp_path, capsys, name):
    # `loss_scale_log2=16` (a trainer keeping the scale as its exponent): the scale is 2^16, and its
    # halvings to 2^6 are the collapse they are (before: the column was no metric, the scale unread)
    text = "".join(f"step={s} loss={2.0 / s ** 0.3:.4f} {name}={max(16 - max(s - 40, 0) // 2, 6)}\n" for s in range(1, 81))
    got, account = records_of(tmp_path, text)
    assert [m["loss_scale"] for _, m in got][::10] == [65536.0] * 5 + [2.0 ** 11, 64.0, 64.0]
    assert account.keys["loss_scale"] == [f"2^{name} (the log prints the scale's log2)"]
    _, _, found = _replay_json(capsys, tmp_path / "run.log")
    assert [(f["step"], f["severity"]) for f in found if f["kind"] == "loss_scale_collapse"] == [(46, "warning"), (52, "critical")]


def test_a_value_printed_with_thousands_separators_is_one_number(tmp_path):
    # `loss: 1,234,567.89` (a post-mortem's snapshot; Python's `{:,}`): before, the loss read as 1.0,
    # its first group of digits, and the explosion as a recovery. A CSV row's cells (`1,100,0.5`)
    # follow commas or open the line: still cells
    text = "".join(f"step {s} loss: {x}, tokens: {t}\n" for s, x, t in
                   [(1, "2.31", "1,024"), (2, "2.10", "2,048"), (3, "1,234,567.89", "3,072"), (4, "2.0", "4,096")])
    got, _ = records_of(tmp_path, text)
    assert [m["loss"] for _, m in got] == [2.31, 2.10, 1234567.89, 2.0]
    assert tokens.split("1,100,0.5")[1] == ["1", "100", "0.5"] and tokens.split("x 3,100,0.5")[1] == ["3", "100", "0.5"]


def test_lines_of_their_own_before_and_after_the_logs_records_are_no_records(tmp_path):
    # a setup list pasted above the log and a `first -> last` summary bullet after it: before,
    # records of their own, numbered one before the first step (a false 'rolled back and resumed'
    # where it was not below it) and one after the last (a false spike). A line whose words the
    # records print (`| loss | 2.9 |`; HF's dicts with fewer keys) is of their form: kept
    text = ("- learning rate: 3e-4\n- loss: cross entropy 2.3\n"
            + "".join(f"step {s} | loss {2.5 - 0.001 * s:.4f} | lr 3e-4\n" for s in range(10, 310, 10))
            + "\n- loss: 2.49 -> 2.2 over 300 steps\n")
    got, account = records_of(tmp_path, text)
    assert [s for s, _ in got] == list(range(10, 310, 10))
    assert account.changed == {
        "records dropped: a line before the log's first record, of a form no record shares (prose quoting a value, "
        "a setting's value), not a training step": [1, 1],
        "records dropped: a line after the log's last record, of a form no record shares (a summary, prose), not "
        "a training step": [1, 34]}
    assert account.keys == {"loss": ["loss"], "lr": ["lr"]} and list(account.numbering) == ["counter"]
    got, _ = records_of(tmp_path, "| loss | 2.9 |\n" + "".join(f"step {s} | loss 2.{s} | lr 3e-4\n" for s in (10, 20)))
    assert [s for s, _ in got] == [9, 10, 20]


@pytest.mark.parametrize("gap", ["", "\n"])
def test_a_posts_step_headers_over_fenced_values_number_them(tmp_path, gap):
    # a post-mortem: `Step 1100:`, (a blank,) a code fence, `loss: ..` / `grad_norm: ..` / `lr: ..`,
    # the fence closing; a value with thousands separators and a note after it. Before: the fence
    # ended each header's block before its first line (numbered by order), the note split a
    # snapshot in two, the value read as its first group of digits
    rows = [(1100, "2.41", "0.8"), (1200, "2.31", "0.9"), (1300, "1,234,567.5 (exploded)", "12,345"), (1400, "nan", "nan")]
    text = "| step | event |\n|---|---|\n| 1300 | loss explodes |\n\n" + "".join(
        f"Step {s}:\n{gap}```\nloss: {x}\ngrad_norm: {g}\nlr: 3e-4\n```\n\n" for s, x, g in rows)
    got, account = records_of(tmp_path, text)
    assert [(s, m.get("loss"), m.get("grad_norm")) for s, m in got][:3] == [
        (1100, 2.41, 0.8), (1200, 2.31, 0.9), (1300, 1234567.5, 12345.0)]
    assert [s for s, _ in got] == [1100, 1200, 1300, 1400] and math.isnan(got[3][1]["loss"])
    assert account.numbering == {"counter": ["Step"]}


@pytest.mark.parametrize("form", [
    lambda e, d, g: f"Epoch {e}/30 - d_loss: {d} - d_acc: 0.7\nEpoch {e}/30 - g_loss: {g}\n",
    lambda e, d, g: f"epoch {e}: Discriminator loss = {d}\nepoch {e}: Generator loss = {g}\n",
    lambda e, d, g: f"[{e}/30] Loss_D: {d} D(x): 0.7\n        Loss_G: {g} D(G(z)): 0.3\n",
])
def test_a_gans_players_on_lines_of_their_own_are_one_record(tmp_path, form):
    # a GAN's record over two lines an epoch, the discriminator's, then the generator's: before, the
    # second was "a summary at a record's step (another form, another loss)", dropped (the loss half
    # its terms), or a record of its own numbered by order (two records an epoch, steps repeated)
    rng = random.Random(0)
    pairs = [(round(0.5 + 0.1 * rng.random(), 4), round(1.5 + 0.3 * rng.random(), 4)) for _ in range(30)]
    got, account = records_of(tmp_path, "".join(form(e, d, g) for e, (d, g) in enumerate(pairs, 1)))
    assert [(s, m["loss"]) for s, m in got] == [(e, pytest.approx(d + g)) for e, (d, g) in enumerate(pairs, 1)]
    (name,) = account.keys["loss"]
    assert name.endswith(" (the sum of the terms printed)") and account.changed == {
        "records merged into the one before: terms of one step's loss on lines of their own (their sum)": [30, 2]}


def _pl1_epoch(e: int, losses: list[float], val_after: int, total: int = 120) -> str:
    """Lightning 1.x's main bar over one epoch: training redraws every 10 batches with their loss,
    a `Validating` bar after batch ``val_after``, then the main bar counting the validation's 20
    batches, its postfix frozen at the last training loss."""
    out, count, loss = [], 0, losses[0]
    for loss in losses:
        count += 10
        out.append(f"Epoch {e}:  {100 * count // total:3d}%|#    | {count}/{total} [00:01<00:02,  9.50it/s, loss={loss:.3f}, v_num=0]")
        if count == val_after:
            out += ["Validating: 0it [00:00, ?it/s]", "Validating:   0%|          | 0/20 [00:00<?, ?it/s]"]
            for _ in range(2):
                count += 10
                out.append(f"Epoch {e}:  {100 * count // total:3d}%|#    | {count}/{total} [00:01<00:02,  9.60it/s, loss={loss:.3f}, v_num=0]")
    return "\n".join(out) + "\n"


@pytest.mark.parametrize("val_after", [100, 50])
def test_a_lightning_1_bar_counting_the_validations_batches_holds_no_records(tmp_path, val_after):
    # the main bar counts the validation's batches after the training ones (or mid-epoch, with
    # val_check_interval), its loss frozen: before, each redraw a training record of that loss
    rng = random.Random(0)
    losses = [[round(2.0 - 0.4 * e - 0.01 * i - 0.001 * rng.random(), 3) for i in range(10)] for e in range(3)]
    got, account = records_of(tmp_path, "".join(_pl1_epoch(e, ls, val_after) for e, ls in enumerate(losses)))
    assert [m["loss"] for _, m in got] == [x for ls in losses for x in ls]
    assert account.ignored["evaluation (the training bar counting the validation's batches, its values frozen: "
                           "Lightning 1.x)"][0] == 6


def test_a_csv_pasted_in_a_text_names_its_columns_by_its_header(tmp_path):
    # `Here is my metrics.csv:`, a fence, `step,loss,lr`, its rows: before, the header was text
    # ("no numbers") and the columns unnamed, the loss guessed by position and the LR missed
    text = "Here is my metrics.csv:\n\n```\nstep,loss,lr\n" + "".join(
        f"{s},{2.5 - 0.01 * s:.3f},0.001\n" for s in range(1, 31)) + "```\n"
    got, account = records_of(tmp_path, text, name="post.md")
    assert got == [(s, {"loss": round(2.5 - 0.01 * s, 3), "lr": 0.001}) for s in range(1, 31)]
    assert account.keys == {"loss": ["loss"], "lr": ["lr"]} and account.numbering == {"counter": ["step"]}


def test_steps_below_zero_get_rollback_advice_without_a_frameworks_command(tmp_path, capsys):
    # a table numbering its steps below zero, a NaN at -2: before, the framework forms of the
    # rollback advice raised (skip_steps must be >= 0) and the replay ended in a traceback
    path = tmp_path / "neg.csv"
    path.write_text("step,loss\n-4,2.1\n-3,2.0\n-2,nan\n")
    code, out, _ = replay(capsys, path)
    assert code == 1 and "(the log's steps go below zero: a framework's command names optimizer steps" in out


def test_a_tables_row_with_fewer_numbers_before_its_counter_numbers_by_it(tmp_path, capsys):
    # a table whose rows print words in some cells (fuzzed): a row of the template with fewer
    # numbers before the counter than the epoch x iteration rule had learned raised IndexError
    path = tmp_path / "t.csv"
    path.write_text("phase,grad_norm,mode,split,step\n5,5,0,1.351,5\n2.957,0.393,-2,1.5,24\n1.5,0.027,26,26,1.528\n"
                    "0,1.558,27,2.282,0.315\n31,0.686,-2,3e4,1.5\n")
    code, out, err = replay(capsys, path)
    assert code in (0, 1) and "Traceback" not in out + err


def test_a_results_document_on_one_line_reads_its_list_of_records(tmp_path):
    # `json.dump` of `{"config": .., "final_loss": .., "history": [{"epoch": 1, "loss": ..}, ..],
    # "summary": {..}}` on one line: before, refused (no jsonl records found); its summary is none
    history = [{"epoch": e, "loss": round(2.3 * 0.85 ** e, 4), "lr": 0.001} for e in range(1, 21)]
    doc = {"config": {"lr": 0.001, "epochs": 20}, "final_loss": history[-1]["loss"], "history": history,
           "summary": {"train_loss": history[-1]["loss"], "epoch": 20}}
    got, account = records_of(tmp_path, json.dumps(doc) + "\n", name="results.json")
    assert got == [(h["epoch"], {"loss": h["loss"], "lr": 0.001}) for h in history]
    assert account.ignored == {"run summary (the values beside the document's list of records)": [1, 1]}


def test_a_results_document_over_many_lines_reads_its_list_of_records(tmp_path):
    # the same written with `indent=2`, its records nested (`{"iter": 10, "metrics": {"loss": ..}}`) after an
    # evaluation summary: before, read line by line, the `iter` lines taken for headers, the summary's
    # loss for record 1 and every record numbered in order
    train = [{"iter": 10 * i, "metrics": {"loss": round(3.0 * 0.97 ** i + 0.5, 4)}} for i in range(1, 41)]
    doc = {"eval": {"loss": 0.9, "accuracy": 0.7}, "train": train}
    text = json.dumps(doc, indent=2) + "\n"
    got, account = records_of(tmp_path, text, name="results.json")
    assert got == [(t["iter"], {"loss": t["metrics"]["loss"]}) for t in train]
    assert account.ignored == {"run summary (the values beside the document's list of records)": [1, 1]}
    # a document with no list of records (a config printed before text records) is no JSON log
    got, _ = records_of(tmp_path, json.dumps({"lr": 0.001, "model": {"layers": 12}}, indent=2) + "\n" + "".join(
        f"step {s} loss {2.0 - 0.01 * s:.3f}\n" for s in range(1, 31)))
    assert [s for s, _ in got] == list(range(1, 31))


@pytest.mark.parametrize("form, name", [
    (lambda i: f"{'█' * (i // 10)}{'░' * (10 - i // 10)} {i} loss={2.3 - 0.01 * i:.3f}", "(unnamed)"),
    (lambda i: f"▕{'█' * (i // 10):<10}▏ batch {i} loss {2.3 - 0.01 * i:.3f}", "batch"),
])
def test_a_bars_drawing_names_no_counter(tmp_path, form, name):
    # a bar drawn in block glyphs before its count: before, the account named the counter by the
    # drawing ('░░░░░░░░░░', '█░░░░░░░░░', ... one name per redraw) or as '▏ batch'
    got, account = records_of(tmp_path, "\n".join(form(i) for i in range(100)) + "\n")
    assert [s for s, _ in got] == list(range(100)) and account.numbering == {"counter": [name]}


def test_a_rich_bars_count_before_its_elapsed_time_is_no_date(tmp_path):
    # rich's progress bar: `━━━━╺━━━━ 12/100 0:00:01 loss: 2.18`: `12/100 0:00:01` read as a date and
    # a time (as `10/30 22:18:02` is), the count lost: numbered by order, off by one
    text = "".join(f"  {'━' * (i // 5)}╺{'━' * (20 - i // 5)} {i}/100 0:00:01 loss: {2.3 - 0.01 * i:.3f}\n" for i in range(100))
    got, account = records_of(tmp_path, text)
    assert [s for s, _ in got] == list(range(100)) and account.numbering == {"counter": ["a bar's count"]}
    assert tokens.noise(*tokens.split("10/30 22:18:02 loss 2.3"))[:2] == [True, True]


def test_a_headerless_table_with_no_counter_guesses_the_column_that_falls(tmp_path):
    # `2.1689,-196.21` on every line (a DQN's loss and its episode reward, no header, no counter):
    # before, refused; now the first column that falls like a loss, numbered in order, said as a guess
    rng = random.Random(0)
    rows = [(round(2.0 * 0.99 ** i * (1 + 0.1 * rng.random()), 4), round(-200 + 2 * i + 5 * rng.random(), 2)) for i in range(200)]
    got, account = records_of(tmp_path, "".join(f"{a},{b}\n" for a, b in rows), name="dqn.csv")
    assert got == [(i, {"loss": a}) for i, (a, _) in enumerate(rows, 1)]
    assert account.keys["loss"][0].startswith("#1 (the first column that falls like a loss, of 2 unnamed columns")
    assert list(account.numbering) == ["order"]


def test_a_headerless_table_whose_loss_does_not_fall_guesses_its_first_column(tmp_path):
    # a DQN's loss rising as its Q-values grow, its episode reward rising below zero: no column falls
    # (the reward's minus is its sign: -200 -> -101 does not fall); before, refused; now the first
    # column that is no count, said as a guess
    rng = random.Random(1)
    rows = [(round(0.5 * math.exp(i / 150) * (1 + 0.2 * rng.random()), 4), round(-200 + i / 2 + rng.random(), 2))
            for i in range(200)]
    got, account = records_of(tmp_path, "".join(f"{a},{b}\n" for a, b in rows), name="dqn.csv")
    assert got == [(i, {"loss": a}) for i, (a, _) in enumerate(rows, 1)]
    assert account.keys["loss"][0].startswith("#1 (the first column that is not a count, of 2 unnamed columns with no "
                                              "counter among them, none falling like a loss (a guess")
    # the reward first, the loss second and falling: the loss, not the reward climbing below zero
    got, _ = records_of(tmp_path, "".join(f"{b},{a}\n" for a, b in ((2.0 * 0.99 ** i, -200 + i / 2) for i in range(50))),
                        name="r.csv")
    assert [m["loss"] for _, m in got] == [pytest.approx(2.0 * 0.99 ** i) for i in range(50)]


@pytest.mark.parametrize("form", [
    lambda s, x: f"**Step {s}** — loss: `{x:.3f}` · grad-norm: `0.50`\n",
    lambda s, x: f"- **step**: {s}, **loss**: {x:.3f}, *grad norm*: 0.50\n",
])
def test_markdowns_code_and_emphasis_are_no_part_of_a_name(tmp_path, form):
    # a post-mortem's excerpt in markdown: `loss: \`2.310\``, `**loss**:`; before, the backtick was the
    # name (the loss guessed by position) and the counter was '**Step'
    xs = [round(2.0 * 0.99 ** s + 1.0, 3) for s in range(1, 41)]
    got, account = records_of(tmp_path, "# Incident\n\n" + "".join(form(100 * s, x) for s, x in enumerate(xs, 1)),
                              name="postmortem.md")
    assert got == [(100 * s, {"loss": x, "grad_norm": 0.5}) for s, x in enumerate(xs, 1)]
    assert account.numbering == {"counter": ["Step" if "Step" in form(1, 1.0) else "step"]}


def test_hf_trainers_epoch_fraction_at_a_whole_epoch_is_no_epoch_counter(tmp_path):
    # transformers 5 prints each float as a quoted '{:.4g}': the last record's epoch is '1', not '1.0'.
    # Before, that record was numbered by its epoch (step 1: a false resume, and every step an epoch)
    lines = [f"{{'loss': '{2.0 - 0.01 * i:.4g}', 'grad_norm': '1.5', 'learning_rate': '5e-05', 'epoch': "
             f"'{i / 40:.4g}'}}\n" for i in range(1, 41)]
    assert lines[-1].endswith("'epoch': '1'}\n")
    got, account = records_of(tmp_path, "".join(lines))
    assert [s for s, _ in got] == list(range(1, 41)) and list(account.numbering) == ["order"]


def test_a_nan_warning_after_the_last_record_is_a_step_of_its_own(tmp_path, capsys):
    # torchvision's references stop on `Loss is inf, stopping training` (then print the loss dict), a step
    # after the last line they printed: before, the warning marked nothing (the record before it was
    # finite) and replay gave an all-clear
    lines = "".join(f"Epoch: [1]  [{i}/7329]  eta: 0:15:05  lr: 0.020000  loss: {0.9 - i / 10000:.4f} "
                    f"({0.95 - i / 10000:.4f})  time: 0.2012  data: 0.0021  max mem: 4123\n" for i in range(0, 3000, 100))
    crash = ("Loss is inf, stopping training\n{'loss_classifier': tensor(inf, device='cuda:0', grad_fn=<NllLossBackward0>), "
             "'loss_box_reg': tensor(0.2345, device='cuda:0')}\n")
    got, account = records_of(tmp_path, lines + crash)
    assert got[-1] == (2901, {"loss": math.inf}) and [s for s, _ in got[:-1]] == list(range(0, 3000, 100))
    path = tmp_path / "tv.log"
    path.write_text(lines + crash)
    code, out, _ = replay(capsys, path)
    assert code == 1 and "[critical] step 2901 nonfinite" in out and "1st NaN-warning line after step 2900" in out
    assert "records 31-31 by the step after the last one printed (NaN-warning lines that print no step)" in out
    # detectron2's `FloatingPointError: Loss became infinite or NaN at iteration=3456!`: at the step it prints
    d2 = "".join(f"[11/30 01:00:00 d2.utils.events]:  eta: 0:20:00  iter: {i}  total_loss: {1.5 - i / 5000:.3f}  "
                 f"lr: 0.020000\n" for i in range(19, 3440, 20))
    got, _ = records_of(tmp_path, d2 + "FloatingPointError: Loss became infinite or NaN at iteration=3456!\n")
    assert got[-1][0] == 3456 and math.isnan(got[-1][1]["loss"]) and len(got) == 173
    # TF's NanTensorHook: `ERROR:tensorflow:Model diverged with loss = NaN.` (a loss with no step, in another form)
    tf = "".join(f"INFO:tensorflow:loss = {2.3 * 0.99 ** s:.8f}, step = {100 * s} (0.331 sec)\n" for s in range(1, 51))
    got, account = records_of(tmp_path, tf + "ERROR:tensorflow:Model diverged with loss = NaN.\n")
    assert got[-1][0] == 5001 and math.isnan(got[-1][1]["loss"]) and len(got) == 51 and account.ignored == {}
    # a warning that a record follows says nothing more: the run went on (a skipped batch)
    got, _ = records_of(tmp_path, lines + "WARNING: loss is nan, skipping batch\n" + lines.replace("[1]", "[2]"))
    assert all(math.isfinite(m["loss"]) for _, m in got) and len(got) == 60


def test_an_epochs_row_redrawn_on_one_line_is_one_record(tmp_path):
    # YOLOv8's console: under its header, each epoch's row of running means is redrawn with `\r` as its
    # bar moves (the bar's count past the header's columns); before, every redraw was a record numbered
    # in order (800 for 100 epochs, a NaN at "step 481" for epoch 61)
    def row(e, i, x):
        return (f"      {e}/20      2.61G      {x if isinstance(x, str) else f'{x:.4g}'}      2.459      1.213         21        640:  "
                f"{100 * i // 8:>3}%|{'█' * i:<8}| {i}/8 [00:0{i}<00:02,  3.21it/s]")
    header = "      Epoch    GPU_mem   box_loss   cls_loss   dfl_loss  Instances       Size\n"
    text = "".join(header + "\r".join(row(e, i, "nan" if e == 12 and i > 5 else 1.6 - 0.01 * e - 0.001 * i)
                                     for i in range(1, 9)) + "\n" for e in range(1, 21))
    got, _ = records_of(tmp_path, text)
    assert [s for s, _ in got] == list(range(1, 21))
    assert got[0][1]["loss"] == pytest.approx(1.6 - 0.01 - 0.008 + 2.459 + 1.213)
    assert math.isnan(got[11][1]["loss"]) and math.isfinite(got[12][1]["loss"])


@pytest.mark.parametrize("save, at", [
    (lambda s: f"Saving model checkpoint to out/checkpoint-{s}", "out/checkpoint-{s}"),                 # HF's Trainer
    (lambda s: f" saving checkpoint at iteration {s:>8} to /ckpt/gpt", "/ckpt/gpt"),                    # Megatron
    (lambda s: f"[2024-05-01 10:00:00 INFO] Saving checkpoint run/model_step_{s}.pt", "run/model_step_{s}.pt"),
])
def test_the_rollback_advice_names_the_checkpoint_the_log_saved_before_the_episode(tmp_path, capsys, save, at):
    # before: "Resume from the newest checkpoint saved before step 730 (the log names none)"
    lines = []
    for s in range(10, 1001, 10):
        lines.append(f"step {s} loss {'nan' if s >= 730 else f'{2.0 - s / 2000:.4f}'} lr 0.0003")
        if s % 250 == 0:
            lines.append(save(s))
    path = tmp_path / "train.log"
    path.write_text("\n".join(lines) + "\n")
    code, _, found = _replay_json(capsys, path)
    advice = next(f for f in found if f["kind"] == "rollback_advice")
    assert (code, advice["step"], advice["details"]["checkpoint_step"]) == (1, 730, 500)
    assert advice["details"]["checkpoint_path"] == at.format(s=500)
    assert f"Resume from the checkpoint of step 500 ({at.format(s=500)})" in advice["message"]
    # the same log saving only from step 750 on (after the NaN): no checkpoint is named
    path.write_text("\n".join(x for x in lines if x.startswith("step") or "1000" in x or "750" in x) + "\n")
    code, _, found = _replay_json(capsys, path)
    advice = next(f for f in found if f["kind"] == "rollback_advice")
    assert advice["details"]["checkpoint_step"] is None and "(the log names none)" in advice["message"]


def test_a_run_logs_checkpoint_lines_and_a_save_after_the_onset_are_said(tmp_path, capsys):
    # our own run log's `checkpoint` lines ride on the next step for the Monitor, as live
    steps = [json.dumps({"type": "step", "step": s, "segment": 0, "metrics": {"loss": "nan" if s >= 30 else 2.0 - s / 100}})
             for s in range(1, 41)]
    steps.insert(20, json.dumps({"type": "checkpoint", "step": 20, "path": "ckpt/step-20"}))
    path = tmp_path / "run.jsonl"
    path.write_text("\n".join(steps) + "\n")
    _, _, found = _replay_json(capsys, path)
    advice = next(f for f in found if f["kind"] == "rollback_advice")
    assert (advice["step"], advice["details"]["checkpoint_step"], advice["details"]["checkpoint_path"]) == (
        30, 20, "ckpt/step-20")
    # a spike opens at 100 (the episode's onset), the log saves at 105, a NaN at 110: the save came after the onset
    recs = [StepRecord(s, {"loss": 2.0 - s / 1000 + 0.002 * (s % 3)}) for s in range(1, 100)]
    recs += [StepRecord(s, {"loss": 9.0}) for s in range(100, 110)] + [StepRecord(110, {"loss": math.nan})]
    recs[105].checkpoints = ((105, "ckpt/step-105"),)
    advice = next(f for f in Monitor().update_many(recs) if f.kind == "rollback_advice")
    assert advice.onset_step == 100 and advice.details["checkpoint_step"] is None
    assert "(the log names none before it: the first it names is step 105)" in advice.message


def test_yamls_nan_is_a_nan(tmp_path):
    # rllib pretty-prints its results as YAML, whose NaN is `.nan`: before, the line was dropped and a NaN
    # loss from iteration 6 on gave an all-clear
    text = "".join(f"agent_timesteps_total: {4000 * i}\ninfo:\n  learner:\n    default_policy:\n      learner_stats:\n"
                   f"        cur_lr: 5.0e-05\n        total_loss: {'.nan' if i >= 6 else 0.5 - 0.01 * i}\n"
                   f"training_iteration: {i}\n" for i in range(1, 11))   # (yaml.safe_dump sorts the keys)
    got, _ = records_of(tmp_path, text)
    assert len(got) == 10 and all(math.isnan(m["loss"]) for _, m in got[5:]) and got[4][1]["loss"] == 0.45


def test_hf_notebooks_table_copied_with_tabs_and_no_log_cells(tmp_path):
    # HF's notebook table, copied as text: tab-separated names with blanks inside, `No log` where the
    # training loss was not logged at an evaluation step. Before: the header was split at its blanks, no row
    # matched it, and the log was refused
    rows = "".join(f"{s}\t{'No log' if s % 500 else f'{1.5 - s / 4000:.6f}'}\t{1.8 - s / 3000:.6f}\n"
                   for s in range(100, 3001, 100))
    got, account = records_of(tmp_path, " [3000/3000 41:12, Epoch 3/3]\nStep\tTraining Loss\tValidation Loss\n" + rows)
    assert [(s, m) for s, m in got if m] == [(s, {"loss": round(1.5 - s / 4000, 6)}) for s in range(500, 3001, 500)]
    assert account.keys["loss"] == ["Training Loss"]
    # the rows of `No log`: their evaluation's loss, a record at its step (test_read_sweeps.py)
    assert [s for s, m in got if not m] == [s for s in range(100, 3001, 100) if s % 500]


def test_improved_diffusions_tables_with_keys_ending_in_digits_are_one_record_each(tmp_path):
    # OpenAI's improved-/guided-diffusion logger: one key per row between rule lines, keys sorted (the step
    # after the loss), quartile keys `loss_q0`..`loss_q3`. Before: a key ending in digits read as two numbers
    # ended the block, so each table gave two records (`mse` a second loss) numbered in order
    def table(i):
        rows = {"grad_norm": 0.4, "loss": 0.3 - 0.001 * i, **{f"loss_q{q}": 0.5 - 0.1 * q for q in range(4)},
                "mse": 0.29 - 0.001 * i, "samples": 128 * (i + 1), "step": 10 * i, "vb": 0.005}
        rule = "-" * 24
        return "\n".join([rule, *(f"| {k:<9} | {v:<8.3g} |" for k, v in rows.items()), rule, f"saving model {i}..."])
    got, account = records_of(tmp_path, "training...\n" + "\n".join(table(i) for i in range(30)) + "\n")
    assert [(s, m["loss"]) for s, m in got] == [(10 * i, float(f"{0.3 - 0.001 * i:.3g}")) for i in range(30)]
    assert account.numbering == {"counter": ["step"]}


def test_yolov5s_padded_results_csv_is_a_csv(tmp_path):
    # YOLOv5's results.csv: every cell padded to 20, a header cell `metrics/mAP_0.5:0.95`. Before: the colon
    # kept the header from being one, the loss was guessed by position (box_loss alone) and the epoch read as
    # a counter named '#1'
    names = ["epoch", "train/box_loss", "train/obj_loss", "train/cls_loss", "metrics/mAP_0.5:0.95", "val/box_loss",
             "x/lr0"]
    rows = [[e, 0.11 - 0.0005 * e, 0.07, 0.04, 0.1 + 0.002 * e, 0.12, 0.01] for e in range(40)]
    text = ",".join(f"{n:>20}" for n in names) + "\n" + "".join(
        ",".join(f"{v:>20.5g}" for v in row) + "\n" for row in rows)
    got, account = records_of(tmp_path, text, name="results.csv")
    assert account.format == "csv" and len(got) == 40
    assert got[3][1]["loss"] == pytest.approx(0.11 - 0.0015 + 0.07 + 0.04, abs=1e-5)


def test_a_step_blocks_loss_printed_as_such_beats_the_terms_above_it(tmp_path):
    # Coqui TTS's trainer: `--> STEP: 25/406 -- GLOBAL_STEP: 25` over `| > decoder_loss: x  (avg)` lines, the
    # total `| > loss: x  (avg)` after its terms. Before: the first term's line was the loss (0.4 of it)
    def block(s):
        terms = {"decoder_loss": 0.6 - s / 1e4, "postnet_loss": 0.7 - s / 1e4, "stopnet_loss": 0.2}
        rows = {**terms, "loss": sum(terms.values()), "grad_norm": 1.5}
        return (f"   --> TIME: 2023-06-01 10:00:00 -- STEP: {s % 400}/400 -- GLOBAL_STEP: {s}\n"
                + "".join(f"     | > {k}: {v}  ({v})\n" for k, v in rows.items()) + "\n")
    got, _ = records_of(tmp_path, "".join(block(s) for s in range(0, 1000, 25)))
    assert [(s, m["loss"]) for s, m in got] == [(s, pytest.approx(1.5 - s / 5e3)) for s in range(0, 1000, 25)]


def test_catboosts_learn_column_is_its_training_loss(tmp_path):
    # CatBoost's verbose lines name the training set `learn` (its test set `test`), beside a best-so-far and
    # two durations: before, refused ("no number can be told to be a loss")
    text = "Learning rate set to 0.05\n" + "".join(
        f"{i}:\tlearn: {0.69 - 0.001 * i:.7f}\ttest: {0.7 - 0.0009 * i:.7f}\tbest: {0.7 - 0.0009 * i:.7f} ({i})"
        f"\ttotal: {47 + i}ms\tremaining: {14.1 - 0.04 * i:.3g}s\n" for i in range(300))
    got, account = records_of(tmp_path, text)
    assert got == [(i, {"loss": round(0.69 - 0.001 * i, 7)}) for i in range(300)]
    assert account.keys["loss"][0].startswith("learn (a split, no metric")


@pytest.mark.parametrize("line", [
    lambda i: f"Epoch {i // 20}:   5%|▌         | {i % 20 + 1}/20 [00:00<00:00, 88.73it/s, v_num=0]",   # Lightning, no prog_bar
    lambda i: f"tick {i}     kimg {4.0 * i:.1f}      time {4 * i}m 30s       sec/tick 240.0   sec/kimg 60.00   "
              f"augment {0.005 * i:.3f}",                                                          # StyleGAN2-ADA
])
def test_a_refusal_suggests_no_loss_that_stays_the_same_or_climbs_on_every_line(tmp_path, capsys, line):
    # before: `--keys step=Epoch,loss=v_num` (Lightning's version number: a silent all-clear when pasted),
    # `--keys step=tick,loss=kimg` (StyleGAN's progress)
    path = tmp_path / "run.log"
    path.write_text("\n".join(line(i) for i in range(1, 41)) + "\n")
    code, out, err = replay(capsys, path)
    assert code == 2 and "--keys" in out + err and "loss=v_num" not in out + err and "loss=kimg" not in out + err
    assert "no number on these lines can be told to be a loss" in out + err


def test_a_count_with_its_total_restarting_under_an_epoch_summary_printed_after_it(tmp_path):
    # SimCLR's `Step [k/390]\t Loss: x` every 50 batches, then `Epoch [e/100]\t Loss: mean\t lr: ..` AFTER each
    # epoch: before, every epoch's steps were 0..350 again (a resume each epoch, a not_learning warning
    # on each segment of a healthy run); now epoch x 390 + k, the first epoch's too
    lines = []
    for e in range(6):
        lines += [f"Step [{k}/390]\t Loss: {5.8 - 0.1 * e - 0.001 * k}" for k in range(0, 390, 50)]
        lines.append(f"Epoch [{e}/100]\t Loss: {5.7 - 0.1 * e}\t lr: 0.0003")
    got, account = records_of(tmp_path, "\n".join(lines) + "\n")
    assert [s for s, _ in got] == [390 * e + k for e in range(6) for k in range(0, 390, 50)]
    assert account.numbering == {"counter": ["Step"]}


def test_an_epoch_summarys_loss_name_does_not_demote_the_records_loss(tmp_path):
    # JoeyNMT: `Epoch 1, Step: 100, Batch Loss: 6.02, ...` records, then `Epoch 1: total training loss 6234.55`
    # after each epoch; before, the summary's "total" outranked "Batch Loss" and no record after it had a loss
    # (a NaN from step 5100 on gave an all-clear)
    lines = []
    for e in range(1, 5):
        lines += [f"Epoch {e:3d}, Step: {s:8d}, Batch Loss: {'nan' if s >= 2100 else f'{6 - s / 1000:12.6f}'}, Lr: 0.000200"
                  for s in range(1000 * (e - 1) + 100, 1000 * e + 1, 100)]
        lines.append(f"Epoch {e:3d}: total training loss {6234.55 - 100 * e:.2f}")
    got, _ = records_of(tmp_path, "\n".join(lines) + "\n")
    assert len(got) == 40 and all("loss" in m for _, m in got)
    assert math.isnan(got[20][1]["loss"]) and got[19][1]["loss"] == pytest.approx(4.0)


def test_a_loggers_file_and_line_and_icefalls_rank_are_a_prefix(tmp_path):
    # icefall's setup_logger: `%(asctime)s %(levelname)s [%(filename)s:%(lineno)d] (rank/world) %(message)s`.
    # Before, `(0/4)` was read as a bar's count: 2 records out of 120
    text = "".join(f"2026-11-30 10:00:00,000 INFO [train.py:876] (0/4) Epoch {1 + b // 3000}, batch {b % 3000}, "
                   f"loss[loss={0.7 - b / 20000:.4f}, simple_loss=1.3, over 7362.00 frames. ], batch size: 70, "
                   f"lr: 3.00e-03, \n" for b in range(0, 6000, 50))
    got, account = records_of(tmp_path, text)
    steps = [s for s, _ in got]
    assert len(got) == 120 and steps == sorted(steps) and steps[:3] == [0, 50, 100]
    assert account.numbering == {"counter": ["batch"]}   # (its epoch's length inferred from the counts, said)


def test_pix2pixhds_feature_matching_and_perceptual_terms_are_terms_of_its_loss(tmp_path):
    # pix2pixHD / SPADE print `G_GAN_Feat` and `G_VGG` beside `G_GAN`, `D_real`, `D_fake`: before, they were
    # left out of the loss, and a NaN in them alone gave an all-clear
    text = "".join(f"(epoch: 1, iters: {100 * i}, time: 0.088) G_GAN: 1.304 G_GAN_Feat: {'nan' if i >= 30 else 7.737} "
                   f"G_VGG: 4.421 D_real: 0.498 D_fake: 0.518 \n" for i in range(1, 41))
    got, account = records_of(tmp_path, text)
    assert account.keys["loss"] == ["G_GAN + G_GAN_Feat + G_VGG + D_real + D_fake (the sum of the terms printed)"]
    assert got[0][1]["loss"] == pytest.approx(1.304 + 7.737 + 4.421 + 0.498 + 0.518) and math.isnan(got[29][1]["loss"])


def test_a_loss_namespaces_total_is_the_loss_not_one_more_term(tmp_path):
    # TF's Object Detection API: `{'Loss/classification_loss': .., 'Loss/localization_loss': ..,
    # 'Loss/regularization_loss': .., 'Loss/total_loss': .., 'learning_rate': ..}` under `Step N per-step time`:
    # before, the total was summed with its own terms (the loss about twice itself) and the LR not read
    def block(s, x):
        return (f"I1130 10:00:00.000000 139871234567808 model_lib_v2.py:705] Step {s} per-step time 0.512s\n"
                f"I1130 10:00:00.000000 139871234567808 model_lib_v2.py:708] {{'Loss/classification_loss': {x / 2},\n"
                f" 'Loss/localization_loss': {x / 2 - 0.15},\n 'Loss/regularization_loss': 0.15,\n"
                f" 'Loss/total_loss': {x},\n 'learning_rate': {0.01 + s / 1e5}}}\n")
    got, account = records_of(tmp_path, "".join(block(s, 1.3 - s / 1e4) for s in range(100, 3001, 100)))
    assert got == [(s, {"loss": pytest.approx(1.3 - s / 1e4), "lr": pytest.approx(0.01 + s / 1e5)})
                   for s in range(100, 3001, 100)]
    assert account.keys["loss"] == ["Loss/total_loss"]


def test_a_namespaced_total_among_the_terms_is_the_loss(tmp_path):
    # an RL trainer's `actor/pg_loss`, `actor/entropy_loss` (unweighted) and `actor/total_loss`: before, all
    # three summed, the total with its own parts (and an entropy that grows as the policy collapses)
    text = "".join(f"step {s} actor/pg_loss: {0.1 - s / 1e4:.4f} actor/entropy_loss: {2.3 + s / 100:.3f} "
                   f"actor/total_loss: {0.08 - s / 1e4:.4f} lr: 1e-6\n" for s in range(1, 41))
    got, account = records_of(tmp_path, text)
    assert account.keys["loss"] == ["actor/total_loss"] and got[9][1]["loss"] == pytest.approx(0.079)


def test_a_namespaces_grad_norm_and_lr_are_read(tmp_path):
    # verl: `step:12 - actor/pg_loss:0.01 - actor/grad_norm:0.8 - actor/lr:1e-06 - ...`: before, the grad norm
    # and the LR were not read (an `actor_` prefix stays a term's name: Dreamer's `actor_loss`)
    text = "".join(f"step:{s} - actor/pg_loss:{0.01 * (s % 3):.3f} - actor/grad_norm:{0.8 + s / 100:.3f} - "
                   f"actor/lr:1e-06 - critic/score/mean:{0.1 * s:.2f}\n" for s in range(1, 31))
    got, account = records_of(tmp_path, text)
    assert account.keys["grad_norm"] == ["actor/grad_norm"] and account.keys["lr"] == ["actor/lr"]
    assert got[4] == (5, {"loss": 0.02, "grad_norm": 0.85, "lr": 1e-06})


def test_a_counter_run_into_the_next_key_keeps_that_key(tmp_path):
    # `Update 12 | iters: 1200loss: tensor(2.3100, device='cuda:0')`: the key run into the count with no
    # separator was taken for the count's unit, the loss unnamed; before, refused
    text = "".join(f"Update {u} | iters: {100 * u}loss: tensor({2.5 - u / 100:.4f}, device='cuda:0', "
                   f"grad_fn=<NllLossBackward0>)\n" for u in range(1, 41))
    got, account = records_of(tmp_path, text)
    assert [m["loss"] for _, m in got] == [pytest.approx(2.5 - u / 100) for u in range(1, 41)]
    assert account.keys["loss"] == ["loss"]


def test_a_step_blocks_average_at_the_epochs_end_is_a_summary(tmp_path):
    # Coqui TTS's older trainer: after an epoch's `--> STEP` blocks, `--> TRAIN PERFORMACE -- GLOBAL_STEP: 405`
    # over `| > avg_loss:` lines: before, one more record (the epoch's average) at a step of its own
    def block(s):
        return (f"   --> TIME: 2023-06-01 10:00:00 -- STEP: {s % 400}/400 -- GLOBAL_STEP: {s}\n"
                f"     | > loss: {1.6 - s / 2000}  ({1.6 - s / 4000})\n     | > grad_norm: 1.5  (1.5)\n\n")
    text = ""
    for e in range(3):
        text += "".join(block(s) for s in range(400 * e, 400 * e + 400, 25))
        text += (f"   --> TRAIN PERFORMACE -- EPOCH TIME: 243.60 sec -- GLOBAL_STEP: {400 * e + 399}\n"
                 f"     | > avg_loss: {1.3 - 0.1 * e}\n     | > avg_grad_norm: 1.5\n\n")
    got, account = records_of(tmp_path, text)
    assert [s for s, _ in got] == [s for e in range(3) for s in range(400 * e, 400 * e + 400, 25)]


def test_a_refusals_suggestion_is_printed_only_where_it_reads_the_lines():
    # the fourteenth scoring: both suggestions of a refusal exited 2 when pasted (each read its one sample
    # line, not the log): a suggestion is now tried on the lines detection read
    from stability_callbacks.replay.readers.sniff import _reads
    lines = [(i, f"foo {i} bar {2.0 - i / 100}") for i in range(1, 20)]
    assert _reads("stability-callbacks replay x.log --keys step=foo,loss=bar", lines)
    assert not _reads("stability-callbacks replay x.log --keys step=foo,loss=baz", lines)
    assert not _reads("stability-callbacks replay x.log --pattern 'qux (?P<loss>\\d+)'", lines)


@pytest.mark.parametrize("indent", ["", "  "])
def test_a_yaml_history_is_one_record_per_epoch(tmp_path, indent):
    # `yaml.dump(history)`: `train_loss:` then `- 2.3` per epoch, `val_loss:` then its own: before, a one-column
    # table with no header, both arrays run together as one training series
    train = [round(2.3 * math.exp(-e / 10), 4) for e in range(30)]
    text = (f"{indent}train_loss:\n" + "".join(f"{indent}- {x}\n" for x in train)
            + f"{indent}val_loss:\n" + "".join(f"{indent}- {2.4 * math.exp(-e / 12):.4f}\n" for e in range(30)))
    got, account = records_of(tmp_path, ("history:\n" if indent else "") + text, name="history.yaml")
    assert got == [(e, {"loss": x}) for e, x in enumerate(train, 1)] and account.keys["loss"] == ["train_loss"]


def test_an_epochs_mean_gone_nan_after_a_bars_finite_loss_marks_its_last_record(tmp_path):
    # a bar's running `loss=` stays finite while the epoch's mean printed after it is NaN (a batch in the
    # middle went NaN): before, the mean was dropped as a statistic of the loss (the log prints the loss
    # itself) and the last epoch's mean read as a record after the last: the NaN missed or misplaced
    lines = []
    for e in range(1, 8):
        lines.append("\r".join(f"Epoch {e}: {2 * b:3d}%|####| {b}/50 [00:01<00:00, loss={0.9 - 0.05 * e - 0.001 * b:.3f}]"
                               for b in range(1, 51)))
        lines.append(f"Epoch {e} mean loss: " + ("nan" if e >= 5 else f"{0.9 - 0.05 * e:.4f}"))
    got, account = records_of(tmp_path, "\n".join(lines) + "\n")
    nan = [s for s, m in got if math.isnan(m["loss"])]
    assert len(got) == 350 and nan == [250, 300, 350]


def test_epoch_times_count_says_what_it_assumed_of_an_excerpts_first_epoch(tmp_path):
    # an excerpt from epoch 34 of `Epoch: [e][b/N]`: whether epochs count from 0 or 1 the log does not show;
    # the numbering's note says it assumed 1 (the fifteenth scoring: said as a formula, not as a guess)
    text = "".join(f"Epoch: [{e}][{b}/500]\tLoss {2.0 - 0.01 * e:.4f}\n" for e in range(34, 37) for b in range(0, 500, 50))
    _, account = records_of(tmp_path, text)
    assert any("epochs assumed counted from 1: the first printed is 34, not 0 or 1" in n for n in account.notes)


def test_a_ctc_loss_below_zero_is_an_impossible_value(tmp_path, capsys):
    # a CTC loss is a log-loss of discrete label sequences, never below zero: one printed below it is computed
    # wrong (the sixteenth scoring: a CTC loss below zero and staying there, no finding)
    path = tmp_path / "asr.log"
    path.write_text("".join(f"Epoch {e}: loss_ctc: {50 * 0.8 ** e - (0 if e < 12 else 2):.3f}\n" for e in range(1, 21)))
    _, _, found = _replay_json(capsys, path)
    assert [(f["step"], f["kind"], f["severity"], f["details"]["rule"]) for f in found if f["kind"] == "stall"] == [
        (15, "stall", "critical", "impossible")]
    assert "(a CTC loss, which is never below zero)" in found[0]["message"]


def test_a_bracketed_list_of_counts_named_in_parentheses_is_no_array_of_losses(tmp_path):
    # `Loss [2, 300](epoch, iter): 0.523`: the sixteenth scoring: the two counts were summed as the loss's
    # terms and the value after the colon ignored (every message quoted sums of counts)
    text = "".join(f"Loss [{e}, {i}](epoch, iter): {2.0 * 0.99 ** (e * 10 + i // 100):.4f}\n"
                   for e in range(1, 6) for i in range(0, 1000, 100))
    got, account = records_of(tmp_path, text)
    assert [m["loss"] for _, m in got] == [round(2.0 * 0.99 ** (e * 10 + i // 100), 4) for e in range(1, 6)
                                           for i in range(0, 1000, 100)]
    assert account.numbering == {"counter": ["iter"]} and account.keys["loss"] == ["Loss"]


def test_an_epochs_record_written_twice_is_one_record(tmp_path):
    # a per-epoch JSON-lines log whose first object is written twice: before, two records of one epoch, the
    # whole log numbered in order (the sixteenth scoring)
    rows = [json.dumps({"epoch": e, "loss": round(0.9 ** e, 4)}) for e in range(1, 21)]
    got, account = records_of(tmp_path, "\n".join(rows[:1] + rows) + "\n", name="log.jsonl")
    assert [s for s, _ in got] == list(range(1, 21)) and list(account.numbering) == ["epoch"]


def test_a_wgans_critic_cost_is_its_loss(tmp_path):
    # tab-separated `counter, name, value` lines whose only metric is a WGAN's critic cost (below zero, as a
    # Wasserstein estimate is): before, refused (no loss word)
    rng = random.Random(1)
    text = "".join(f"{100 * i}\tcritic cost\t{-0.5 + 0.05 * rng.gauss(0, 1):.4f}\n" for i in range(1, 60))
    got, account = records_of(tmp_path, text)
    assert len(got) == 59 and account.keys["loss"] == ["critic cost"] and got[0][0] == 100
