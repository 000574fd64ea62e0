"""The loss's shape within an epoch against the epoch before (stability_callbacks.cycles): a CTC loss
growing with utterance length as length-sorted batches lengthen is no divergence; a real rise is."""
from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from stability_callbacks import Monitor, StepRecord
from stability_callbacks.cli import main
from stability_callbacks.replay.readers import read_records

EPOCHS, BATCHES, EVERY = 6, 400, 10


def _sorted_ctc_log(tmp_path, seed: int, diverge_from: int | None = None) -> str:
    """A speech recognizer's log, `epoch E iter I/400 loss X`: batches sorted by utterance length
    every epoch, the CTC loss summed over an utterance's frames (so it grows with the length, x9
    across an epoch), its per-frame level falling as the run learns; from ``diverge_from`` on,
    the per-frame level climbs x1.01 a step instead (an LR far too high)."""
    rng = random.Random(seed)
    lines = []
    for e in range(1, EPOCHS + 1):
        for it in range(EVERY, BATCHES + 1, EVERY):
            step = (e - 1) * BATCHES + it
            per_frame = 0.15 + 2.0 * math.exp(-step / 150)
            if diverge_from is not None and step > diverge_from:
                per_frame *= 1.01 ** (step - diverge_from)
            length = 40 + 360 * (it / BATCHES) ** 1.3
            lines.append(f"epoch {e} iter {it}/{BATCHES} loss {per_frame * length * (1 + rng.gauss(0, 0.08)):.3f} lr 0.0005")
        lines.append(f"epoch {e} valid loss 0.500")
    path = tmp_path / f"ctc{seed}.log"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def _as(tmp_path, log: str, form: str) -> str:
    """The same records as a Lightning CSVLogger's metrics.csv (epochs from 0) or a trainer_state.json
    (``epoch`` the fraction of epochs done, rounded to 2 decimals as the Trainer logs it)."""
    rows = [line.split() for line in open(log) if " iter " in line]
    recs = [(int(r[1]), int(r[3].split("/")[0]) + (int(r[1]) - 1) * BATCHES, float(r[5])) for r in rows]
    if form == "csv":
        path = tmp_path / "metrics.csv"
        path.write_text("epoch,step,train_loss_step\n" + "".join(f"{e - 1},{s},{x}\n" for e, s, x in recs))
    else:
        path = tmp_path / "trainer_state.json"
        history = [{"epoch": round(s / BATCHES, 2), "step": s, "loss": x} for e, s, x in recs]
        path.write_text(json.dumps({"log_history": history}))
    return str(path)


def _judge(path: str, many: bool):
    m = Monitor()
    records = list(read_records(path))
    assert records[41].epoch - records[0].epoch == 1 and records[41].step == 420   # `iter` counts within the epoch
    found = m.update_many(records) if many else [f for r in records for f in m.update(r)]
    return found + m.end()


@pytest.mark.parametrize("many", [False, True])
def test_a_length_sorted_ctc_loss_rising_through_each_epoch_is_the_data_order(tmp_path, many):
    # before: a critical divergence (and its rollback advice) at steps 600 and 1410, a warning at
    # 1080: each epoch's climb from short to long utterances, judged against the points before it
    found = _judge(_sorted_ctc_log(tmp_path, 0), many)
    loud = [(f.step, f.kind, f.severity) for f in found if f.severity != "info"]
    assert loud == [(170, "loss_spike", "warning")]   # the first epoch has no epoch before it
    shaped = [(f.step, f.kind, f.details["severity_said"]) for f in found if f.details.get("epoch_shape")]
    assert shaped == [(600, "divergence", "critical"), (1080, "divergence", "warning"), (1410, "divergence", "critical")]
    f = next(f for f in found if f.step == 600)
    assert f.message.startswith("The loss rose (its running median) from the level it had at step 440 (14.38) "
                                "to 31.38 at step 600 (a divergence critical on its own); at the same point of the "
                                "epoch before (step 200) the loss was 115.2 (now 31.38); it fell from 107.1 to "
                                "13.16 when this epoch began")
    assert "No action needed" in f.message and "roll back" not in f.message.lower()
    assert "Training on will not fix it" in f.details["said"]


@pytest.mark.parametrize("form", ["csv", "hf"])
def test_a_table_or_a_trainer_state_says_its_epochs_too(tmp_path, form):
    # the same numbers as a Lightning CSVLogger's table (an epoch column beside the step) and as a
    # trainer_state.json (the fraction of epochs done): the same findings as the text log's
    log = _sorted_ctc_log(tmp_path, 0)
    text = [(f.step, f.kind, f.severity) for f in _judge(log, True)]
    assert [(f.step, f.kind, f.severity) for f in _judge(_as(tmp_path, log, form), True)] == text


def test_a_divergence_past_the_epoch_befores_level_stays_critical(tmp_path):
    # the same run, its per-frame loss climbing x1.01 a step from step 1300 (mid epoch 4): above
    # the epoch before's loss at the same point, which the data order does not explain
    # (the warning at 1080, made info as the epoch's shape, is said again once the loss stands above
    # the epoch before's for 3 points; the divergence's critical is not made info, the loss being above)
    found = _judge(_sorted_ctc_log(tmp_path, 0, diverge_from=1300), many=True)
    assert [(f.step, f.kind, f.severity) for f in found if f.step > 1300] == [
        (1350, "divergence", "warning"), (1410, "divergence", "critical"), (1410, "rollback_advice", "critical")]
    assert found[-3].message.startswith("The loss is above the epoch before's at the same point: 36.47 at step 1350 "
                                        "vs 21.9 at step 950, for 3 points in a row. The rise from step 840 (8.952), "
                                        "said at step 1080 to be the epoch's own shape, is more than that")


def test_a_shuffled_runs_rise_is_judged_as_ever(tmp_path):
    # a loss continuous across the epoch's start (shuffled data) gains nothing from its epochs: a x4
    # step up in epoch 3 is the same finding with and without them
    rng = random.Random(5)
    xs = [(1.0 + 2.0 * math.exp(-s / 300)) * (4.0 if 1000 < s <= 1100 else 1.0) * math.exp(rng.gauss(0, 0.05))
          for s in range(1, 2001)]
    plain, epochs = Monitor(), Monitor()
    a = [(f.step, f.kind, f.severity) for s, x in enumerate(xs, 1) for f in plain.update(StepRecord(s, {"loss": x}))]
    b = [(f.step, f.kind, f.severity) for s, x in enumerate(xs, 1)
         for f in epochs.update(StepRecord(s, {"loss": x}, epoch=1 + (s - 1) // 400))]
    assert a == b and any(sev != "info" for _, _, sev in a)


def test_the_profile_survives_a_resume(tmp_path):
    records = list(read_records(_sorted_ctc_log(tmp_path, 0)))
    whole, first = Monitor(), Monitor()
    expect = [(f.step, f.kind, f.severity) for f in whole.update_many(records)]
    got = [(f.step, f.kind, f.severity) for f in first.update_many(records[:100])]
    second = Monitor()
    second.load_state_dict(json.loads(json.dumps(first.state_dict())))
    got += [(f.step, f.kind, f.severity) for f in second.update_many(records[100:])]
    assert got == expect


def test_the_record_carries_its_epoch_in_the_run_log():
    r = StepRecord(420, {"loss": 2.0}, epoch=2)
    assert r.to_json()["epoch"] == 2 and StepRecord.from_json(r.to_json()).epoch == 2
    assert "epoch" not in StepRecord(3, {"loss": 2.0}).to_json()


def _sgdr(tmp_path, blow_up: bool = False) -> str:
    """200 epochs of cosine annealing with warm restarts every 50 (`Epoch e/200 - loss: .. - lr: ..`):
    the loss rises ~25% as the LR goes back to its peak at each cycle's start; ``blow_up``: at the
    third restart the loss climbs x1.1 an epoch instead (the LR's peak too high for the model now)."""
    rng = random.Random(0)
    lines = []
    for e in range(1, 201):
        lr = 0.05 * 0.5 * (1 + math.cos(math.pi * ((e - 1) % 50) / 50)) + 1e-4
        x = (0.3 + 1.5 * math.exp(-e / 40)) * (1 + 0.25 * lr / 0.05) * (1 + 0.02 * rng.gauss(0, 1))
        if blow_up and e > 150:
            x = 0.5 * 1.1 ** (e - 150)
        lines.append(f"Epoch {e}/200 - loss: {x:.4f} - lr: {lr:.6f}")
    path = tmp_path / "sgdr.log"
    path.write_text("\n".join(lines) + "\n")
    return str(path)


def _replayed(capsys, path: str) -> list[dict]:
    """The findings ``replay PATH --json`` writes (the read account, its first line, left out)."""
    out = Path(path).parent / "f.jsonl"
    assert main(["replay", path, "--json", str(out)]) in (0, 1, 3)
    capsys.readouterr()
    return [json.loads(x) for x in out.read_text().splitlines()[1:]]


def test_the_loss_rising_after_a_warm_restart_is_the_restarts(tmp_path, capsys):
    # before: a loss_spike warning at epoch 53 and a critical divergence (with its rollback advice)
    # at 107, each the loss leaving its minimum as the LR went back to its peak (lr_anomaly: info)
    found = _replayed(capsys, _sgdr(tmp_path))
    assert [(f["step"], f["kind"], f["severity"]) for f in found if f["severity"] != "info"] == []
    made = [f for f in found if f["details"].get("warm_restart")]
    assert [(f["step"], f["kind"], f["details"]["severity_said"]) for f in made] == [
        (53, "loss_spike", "warning"), (107, "divergence", "critical")]
    assert ("the LR went back up to its peak at epoch 101 (a warm restart, as lr_anomaly said), and the loss "
            "rises as the optimizer leaves the minimum it had settled in; it stays below 0.9057") in made[1]["message"]


def test_a_loss_past_where_the_last_cycle_began_is_more_than_the_restart(tmp_path, capsys):
    # the third restart's loss climbs x1.1 an epoch, past 0.51 where the cycle before began: as loud
    # as without restarts (the cycle before's rise, made info, is no longer watched)
    found = _replayed(capsys, _sgdr(tmp_path, blow_up=True))
    # (its spike unrecovered 9 epochs on: an epoch log reaches loss_spike's horizon at its points)
    assert [(f["step"], f["kind"], f["severity"]) for f in found if f["severity"] != "info" and f["step"] > 150] == [
        (153, "loss_spike", "warning"), (155, "divergence", "warning"), (160, "spike_unrecovered", "critical"),
        (160, "rollback_advice", "critical"), (168, "loss_spike", "warning"), (170, "divergence", "critical"),
        (182, "loss_spike", "warning"), (196, "loss_spike", "warning")]
