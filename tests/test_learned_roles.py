"""Roles from what the numbers do (issue 32): the step is the integer that increases across a
template's lines, the loss a named slot (the total, a lone statistic, the sum of its terms),
records printed one key per line are one record; text, CSV and JSON alike. Then what the
account says, the user's names over every rule, and refusals whose suggestions read the log
when pasted (each one is run here)."""
from __future__ import annotations

import json
import math
import shlex

import pytest

from stability_callbacks.cli import main
from stability_callbacks.replay.readers import LogFormatError, ReadAccount, parse_keys, read_records

NAN = float("nan")


def _loss(s: int) -> float:
    return round(2.0 + 8.0 / math.sqrt(s + 1), 4)


def records_of(tmp_path, text: str, name: str = "run.log", **kw):
    path = tmp_path / name
    path.write_text(text)
    account = ReadAccount(path)
    got = [(r.step, {k: v for k, v in r.metrics.items() if k not in ("loss_resolution", "loss_window")})
           for r in read_records(path, account=account, **kw)]
    return got, account


def _sb3(i: int) -> str:
    return ("-----------------------------------------\n"
            "| rollout/                |             |\n"
            f"|    ep_len_mean          | {200 + i:<11d} |\n"
            f"|    ep_rew_mean          | {-1200 + i * 10:<11d} |\n"
            "| time/                   |             |\n"
            "|    fps                  | 1200        |\n"
            f"|    iterations           | {i:<11d} |\n"
            f"|    time_elapsed         | {3 * i:<11d} |\n"
            f"|    total_timesteps      | {2048 * i:<11d} |\n"
            "| train/                  |             |\n"
            f"|    entropy_loss         | -1.42       |\n"
            "|    learning_rate        | 0.0003      |\n"
            f"|    loss                 | {_loss(i):<11} |\n"
            f"|    n_updates            | {10 * i:<11d} |\n"
            "|    policy_gradient_loss | -0.012      |\n"
            "-----------------------------------------\n")


SHAPES = [
    # A counter with no name of a key, in brackets with its total (the loss a window median).
    ("unnamed bracket counter",
     "".join(f"Training  [{s:7d}/5000000]  eta: 1 day, 2:03:04  total_loss: {_loss(s)} ({_loss(s)})  lr: 0.01\n"
             for s in (40, 60, 80, 100)),
     [(s, {"loss": _loss(s), "lr": 0.01}) for s in (40, 60, 80, 100)]),
    # Punctuation of any kind between the fields.
    ("double dashes", "".join(f"Train step {s} -- Loss: {_loss(s)} -- Acc: 0.4\n" for s in (10, 20, 30)),
     [(s, {"loss": _loss(s)}) for s in (10, 20, 30)]),
    ("double colons and bullets",
     "".join(f"it {s} :: loss {_loss(s)} • lr 1e-4 ~ acc 0.5\n" for s in (10, 20, 30)),
     [(s, {"loss": _loss(s), "lr": 1e-4}) for s in (10, 20, 30)]),
    # An unnamed counter in parentheses, a key with none before it.
    ("(i/N)", "".join(f"({s}/400) loss: {_loss(s)}; acc: 0.5\n" for s in (1, 2, 3)),
     [(s, {"loss": _loss(s)}) for s in (1, 2, 3)]),
    # A counter whose name the vocabulary does not know, a lone statistic of the loss.
    ("lone statistic", "".join(f"Update {s}: avg loss {_loss(s)}, avg reward 0.7\n" for s in (12, 13, 14, 15)),
     [(s, {"loss": _loss(s)}) for s in (12, 13, 14, 15)]),
    # ... where the log prints the loss itself, a statistic of it is no loss (its summary line
    # before the next epoch's lines included).
    ("statistic beside the loss",
     "- Average Loss: 7.1\nEpoch 3 | Iter 10 | Loss 6.5 (7.07)\nEpoch 3 | Iter 20 | Loss 6.4 (7.0)\n",
     [(10, {"loss": 6.5}), (20, {"loss": 6.4})]),
    # Records printed one key per line between rule lines, the step last; stable-baselines3's
    # tables with their section rows (its logger dumps at total_timesteps).
    ("one key per line, step last",
     "".join(f"-----\nloss: {_loss(s)}\naccuracy: 0.5\nstep: {s}\n" for s in (5, 10, 15)) + "-----\n",
     [(s, {"loss": _loss(s)}) for s in (5, 10, 15)]),
    ("stable-baselines3 tables", "".join(_sb3(i) for i in (2, 3, 4)),
     [(2048 * i, {"lr": 0.0003, "loss": _loss(i)}) for i in (2, 3, 4)]),
    # A rich box table.
    ("box table", "┏━━━━━━┳━━━━━━━━┓\n┃ Step ┃ Loss   ┃\n┡━━━━━━╇━━━━━━━━┩\n"
     + "".join(f"│ {s:<4d} │ {_loss(s)} │\n" for s in (1, 2, 3)) + "└──────┴────────┘\n",
     [(s, {"loss": _loss(s)}) for s in (1, 2, 3)]),
    # diffusers' tqdm postfix; verl's `key:value - key:value` (only terms: their sum, signed,
    # to the printed decimals).
    ("diffusers postfix",
     "".join(f"Steps:  {s}%|█         | {s}/1000 [00:{s:02d}<01:30,  9.90it/s, lr=1e-05, step_loss={_loss(s)}]\n"
             for s in (1, 2, 3)),
     [(s, {"lr": 1e-05, "loss": _loss(s)}) for s in (1, 2, 3)]),
    ("verl terms", "".join(f"step:{s} - actor/pg_loss:-0.0{s} - critic/vf_loss:0.5{s} - critic/score/mean:0.5\n"
                           for s in (1, 2, 3)),
     [(s, {"loss": 0.5 + s / 100 - s / 100}) for s in (1, 2, 3)]),
    # Terms whose names have no loss word, the vocabulary's (CycleGAN's): their sum.
    ("CycleGAN terms", "".join(f"Epoch [1/10] Step [{s}/600] D_A: 0.25 G_A: 0.5 cycle_A: 1.2{s // 100}\n"
                               for s in (100, 200, 300)),
     [(s, {"loss": round(1.95 + s / 10000, 4)}) for s in (100, 200, 300)]),
    # Two lines per step, each a term of the objective: one record, their sum.
    ("terms on lines of their own",
     "".join(f"discriminator loss at step {s}: 0.68{s}\nadversarial loss at step {s}: 0.7{s}\n" for s in (0, 100, 200)),
     [(s, {"loss": round(float(f"0.68{s}") + float(f"0.7{s}"), 6)}) for s in (0, 100, 200)]),
    # An inner counter that restarts when the integer before it goes up: epoch x iteration.
    ("epoch x iteration", "".join(f"Train: {e} [{b:4d}/73 ({b * 100 // 73:3d}%)]  Loss: {_loss(b)} ({_loss(b)})\n"
                                  for e in (0, 1) for b in (0, 50)),
     [(e * 73 + b, {"loss": _loss(b)}) for e in (0, 1) for b in (0, 50)]),
    # An excerpt that opens with a complete Keras bar: the epoch before the first header.
    ("Keras excerpt", "1562/1562 [====] - 524s - loss: 1.0897 - val_loss: 0.9240\nEpoch 175/200\n"
     "1562/1562 [====] - 539s - loss: 1.0843 - val_loss: 0.8596\n",
     [(174, {"loss": 1.0897, "eval_loss": 0.924}), (175, {"loss": 1.0843, "eval_loss": 0.8596})]),
    # A split word naming a counter makes the line an evaluation.
    ("evaluation counters", "train epoch: 1, loss: 0.2\ntest epoch: 1, loss: 0.07\ntrain epoch: 2, loss: 0.05\n"
     "Test: [  0/30]  Time: 6.5  Loss:   6.723\n", [(1, {"loss": 0.2}), (2, {"loss": 0.05})]),
    # Two columns without a header: a counter and its value.
    ("two columns, no header", "".join(f"{s}\t{_loss(s)}\n" for s in (1, 2, 3)),
     [(s, {"loss": _loss(s)}) for s in (1, 2, 3)]),
]


@pytest.mark.parametrize("text, want", [(t, w) for _, t, w in SHAPES], ids=[n for n, _, _ in SHAPES])
def test_shapes_read_without_flags(tmp_path, text, want):
    got, _ = records_of(tmp_path, text)
    assert [s for s, _ in got] == [s for s, _ in want]
    for (_, g), (_, w) in zip(got, want):
        assert g == pytest.approx(w, nan_ok=True)


@pytest.mark.parametrize("name, text, want", [
    # ultralytics' results.csv: padded cells, the loss only as terms, evaluation columns.
    ("results.csv", "   epoch,   train/box_loss,   train/cls_loss,   metrics/mAP50(B),   val/box_loss,   lr/pg0\n"
     + "".join(f"   {e},   1.2{e},   2.0{e},   0.3,   1.3,   0.001\n" for e in (1, 2, 3)),
     [(e, {"loss": round(float(f"1.2{e}") + float(f"2.0{e}"), 2), "lr": 0.001}) for e in (1, 2, 3)]),
    # timm's summary.csv: one row per epoch, the evaluation loss beside the training loss (read beside it).
    ("summary.csv", "epoch,train_loss,eval_loss,eval_top1,lr\n" + "".join(f"{e},{_loss(e)},2.5,50.0,0.001\n" for e in range(3)),
     [(e, {"loss": _loss(e), "lr": 0.001, "eval_loss": 2.5}) for e in range(3)]),
    # A counter column under a name no vocabulary holds.
    ("progress.csv", "it_count,loss,acc\n" + "".join(f"{s},{_loss(s)},0.5\n" for s in (10, 20, 30)),
     [(s, {"loss": _loss(s)}) for s in (10, 20, 30)]),
    # JSON with the step under another name.
    ("log.jsonl", "".join(json.dumps({"update": s, "loss": _loss(s)}) + "\n" for s in (10, 20, 30)),
     [(s, {"loss": _loss(s)}) for s in (10, 20, 30)]),
])
def test_tables_and_json_go_through_the_same_rules(tmp_path, name, text, want):
    got, _ = records_of(tmp_path, text, name)
    assert got == want


def test_the_account_says_no_step_numbers_only_when_no_number_counts_up(tmp_path):
    _, account = records_of(tmp_path, "".join(f"loss: {_loss(s)} tokens: 4096\n" for s in range(4)))
    assert account.lines()[2] == ("  steps numbered by order of appearance (the records print no "
                                  "counter taken for the step: step N is the N-th record)")
    _, account = records_of(tmp_path, "".join(f"[{s}] loss: {_loss(s)}\n" for s in (5, 6, 7, 8)))
    assert account.lines()[2] == "  steps numbered by the log's counter: '(unnamed)'"
    assert not account.order_numbered


def test_the_account_says_how_each_part_of_the_log_was_numbered_where_parts_differ(tmp_path):
    text = "".join(f"[Rank 0] step={s}, skipped=0, lr=[1e-05], mom=[(0.9, 0.999)]\n" for s in (10, 20)) \
        + "[deepspeed] OVERFLOW! Rank 0 Skipping step. Attempted loss scale: 65536, reducing to 32768\n"
    got, account = records_of(tmp_path, text)
    assert [s for s, _ in got] == [10, 20, 21]
    assert account.lines()[2:5] == [
        "  steps numbered differently in 2 parts of the log:",
        "    records 1-2 by the log's counter: 'step'",
        "    records 3-3 by the step after the last one printed (overflow lines that print no step)"]
    assert account.to_json()["numbering_parts"][1] == {
        "by": "the step after the last printed", "names": [], "first_record": 3, "last_record": 3}


def test_the_account_says_what_the_loss_is(tmp_path):
    _, account = records_of(tmp_path, "".join(f"Update {s}: avg loss {_loss(s)}\n" for s in (1, 2, 3)))
    assert account.keys["loss"] == ["avg loss (a statistic of the loss: the log prints no other)"]
    _, account = records_of(tmp_path, "".join(f"[{s}] [D loss: 0.5] [G loss: 0.7]\n" for s in (1, 2, 3)))
    assert account.keys["loss"] == ["D loss + G loss (the sum of the terms printed)"]


@pytest.mark.parametrize("text, keys, want", [
    # The user's name wins over the separator, the split word and every other rule.
    ("".join(f"Train step {s} -- Loss: {_loss(s)} -- val_acc: 0.{s}\n" for s in (1, 2, 3)),
     "step=Train step,loss=-- Loss", [(s, {"loss": _loss(s)}) for s in (1, 2, 3)]),
    ("".join(f"Update {s}: avg loss {_loss(s)}, avg reward 0.{s}\n" for s in (1, 2, 3)),
     "loss=avg reward", [(s, {"loss": s / 10}) for s in (1, 2, 3)]),
    # Columns without names, by position (a table without a header).
    ("".join(f"{s},0.3,{_loss(s)},0.0003\n" for s in (1, 2, 3)), "step=1,loss=3",
     [(s, {"loss": _loss(s)}) for s in (1, 2, 3)]),
])
def test_the_user_wins(tmp_path, text, keys, want):
    got, _ = records_of(tmp_path, text, user_keys=parse_keys(keys))
    assert got == want


def test_positions_name_the_columns_of_a_csv_with_a_header(tmp_path):
    text = "epoch,mse,acc\n" + "".join(f"{e},{_loss(e)},0.5\n" for e in (1, 2, 3))
    got, _ = records_of(tmp_path, text, "t.csv", user_keys=parse_keys("step=1,loss=2"))
    assert got == [(e, {"loss": _loss(e)}) for e in (1, 2, 3)]


REFUSED = [
    # No name says loss: the suggestions name the step and the value to read as the loss.
    ("odd.log", "".join(f"ep {e} mse_err {_loss(e)} acc 0.{e}\n" for e in range(6))),
    ("gan.log", "".join(f"Epoch [1/10] Step [{s}/600] err_D: 0.2{s % 9} err_G: 0.3{s % 7} D(x): 0.5\n"
                        for s in range(100, 600, 100))),
    # A table of four columns without a header, none of which falls like a loss (one that does is
    # guessed: test_read_shapes_more): by position.
    ("noheader.csv", "".join(f"{s},{1 + s / 10:.3f},0.300,0.0003\n" for s in range(1, 8))),
    # Names with spaces and punctuation, quoted for the shell.
    ("spaces log.txt", "".join(f"Train step {s} -- Mean Sq Err: {_loss(s)} -- Acc: 0.4\n" for s in range(1, 6))),
]


@pytest.mark.parametrize("name, text", REFUSED, ids=[n for n, _ in REFUSED])
def test_every_suggestion_reads_the_log_when_pasted(tmp_path, capsys, name, text):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(LogFormatError) as e:
        read_records(path)
    pasted = [line.strip() for line in str(e.value).splitlines()
              if line.strip().startswith("stability-callbacks replay ")]
    assert len(pasted) == 2 and all("NAME" not in c and "<" not in c.split("--")[0] for c in pasted)
    for command in pasted:
        argv = shlex.split(command)
        assert argv[:3] == ["stability-callbacks", "replay", str(path)]
        code = main(argv[1:] + ["--json", str(tmp_path / "read.jsonl")])
        capsys.readouterr()
        read = json.loads((tmp_path / "read.jsonl").read_text().splitlines()[0])
        assert code in (0, 1) and read["steps"] == read["steps_with_loss"] == text.count("\n"), command


def test_a_followed_log_waits_for_its_counter_through_idle_ticks():
    # `replay --follow`: an idle tick between every line releases nothing a watched template
    # holds (its counter is learned from three lines), and the end of the log settles the rest.
    lines = [item for s in (12, 13, 14, 15) for item in ((s, f"Round {s}: avg loss {_loss(s)}"), (s, None))]
    got = [(r.step, r.metrics["loss"]) for r in read_records("run.log", "generic", lines=iter(lines))]
    assert got == [(s, _loss(s)) for s in (12, 13, 14, 15)]
    lines = [(1, "Round 12: avg loss 2.5"), (1, None)]
    assert [r.step for r in read_records("run.log", "generic", lines=iter(lines))] == [1]
