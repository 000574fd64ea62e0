"""Data forensics (docs/design.md, Forensics): each step's dataset indices recorded by the one
sampler wrapper, named by the findings of a spike (its step and neighbours, the episode, the
rollback advice), gathered across ranks only at a finding; with ``dump_batches`` the spiking
step's samples ranked by their own loss into ``forensics/step-N.jsonl``; the ``forensics``
command that lists them.

Real runs: HF Trainer and Lightning on the tiny GPT-2 with 3 garbage samples planted among the
8 of step 25 (``pocket_samples``); ~3 s each on one thread. DeepSpeed on 2 ranks (a gather) is
``forensics-z2`` in ``tests/dist/ds_scenarios.py`` (``test_deepspeed.py``).
"""
from __future__ import annotations

import json
import logging
import math

import pytest

from stability_callbacks.cli import main as cli
from stability_callbacks.config import ConfigError, load_config
from stability_callbacks.control import DataSkips
from stability_callbacks.forensics import Forensics, LocalPeer, compact
from stability_callbacks.live import LiveRun
from stability_callbacks.record import Finding, StepRecord

torch = pytest.importorskip("torch")

from stability_callbacks.demo.scenarios import build_scenario  # noqa: E402
from stability_callbacks.integrations.torch.forensics import per_sample_loss, row_indices  # noqa: E402
from stability_callbacks.integrations.torch.auto_rollback import DataSkipSampler, install_sampler  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")

GARBAGE_AT = (1, 4, 6)          # positions of the garbage samples among step 25's 8


def _pocket():
    """Step 25 of the data-pocket scenario with 3 garbage samples among its 8 (4 x GA 2)."""
    return build_scenario("data-pocket", pocket_steps=1, max_steps=26, batch_size=4, grad_accum=2,
                          pocket_samples=GARBAGE_AT)


# ------------------------------------------------------------------------------- the ring
def test_the_shared_sampler_records_what_each_optimizer_step_reads():
    fz = Forensics(steps_kept=4)
    ring = fz.indices
    s = DataSkipSampler(range(24), samples_per_step=4, skips=lambda: DataSkips([[3, 3]]), record=lambda: ring)
    assert list(s) == [0, 1, 2, 3, 4, 5, 6, 7, *range(12, 24)]   # data step 3 is skipped
    # optimizer step 3 read data step 4; the ring keeps the last 4 steps
    assert [ring.get(k) for k in (1, 2, 3, 5)] == [None, [4, 5, 6, 7], [12, 13, 14, 15], [20, 21, 22, 23]]
    s.start_step = lambda: 3                     # a resume after step 3 (DeepSpeed, Lightning rollback)
    assert list(s) == list(range(16, 24)) and ring.get(4) == [16, 17, 18, 19]
    s.start_step = None
    s.set_epoch(1)                               # epoch 1 (HF): after the 5 optimizer steps of epoch 0
    assert len(list(s)) == 24 and ring.get(8) == [8, 9, 10, 11] and ring.get(11) == [20, 21, 22, 23]
    # Lightning without a rollback: the loop re-reads its epoch from the start at the step it is at
    loader = torch.utils.data.DataLoader(list(range(10)), batch_size=2)
    install_sampler(loader, samples_per_step=4, skips=lambda: None, record=lambda: ring, steps_before=lambda: 7)
    assert [b.tolist() for b in loader] == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
    assert [ring.get(k) for k in (8, 9, 10)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert ring.problem is None and ring.shared_by_ranks == 1


def _run(tmp_path, peer=None, **forensics) -> LiveRun:
    run = LiveRun(config={"actions": {}, "phase": {"warmup_steps": 5}, "forensics": forensics}, run_dir=tmp_path)
    run.forensics.connect(peer or LocalPeer())
    run.start(0)
    return run


def _feed(run, steps, loss, per_step=4):
    """What the sampler and the session do each step: the step's indices, then its record."""
    found = []
    for s in steps:
        run.forensics.indices.put(s, list(range((s - 1) * per_step, s * per_step)))
        run.forensics.step_closed(s)
        found += run.observe(StepRecord(s, {"loss": loss(s), "grad_norm": 1.0, "lr": 1e-3}))
        if s == 20:
            run.checkpoint_saved(20, "ckpt/checkpoint-20")
        run.control.step_done()
    return found


def test_a_spike_names_its_step_its_neighbours_its_episode_and_the_advice_its_onset(tmp_path):
    run = _run(tmp_path, neighbour_steps=1)
    found = _feed(run, range(1, 41), lambda s: 9.0 if s == 30 else float("nan") if s == 40 else 2 + s % 3 / 100)
    run.close()
    by = {(f.step, f.kind): f for f in found}
    spike = by[30, "loss_spike"]
    assert spike.severity == "warning"
    assert spike.details["samples"] == {"step": 30, "indices": [116, 117, 118, 119], "ranks": 1,
                                        "neighbours": {"29": [112, 113, 114, 115]}}   # step 31 not trained yet
    assert spike.message.endswith("If it persists, roll back to a checkpoint before step 30. "
                                  "Step 30 read dataset indices 116-119.")
    assert by[31, "spike_recovered"].details["samples"] == {"step": 30, "indices": [116, 117, 118, 119], "ranks": 1}
    assert by[40, "nonfinite"].details["samples"]["indices"] == [156, 157, 158, 159]
    advice = by[40, "rollback_advice"]   # the spike at 30 recovered: the NaN's episode began at the NaN
    assert advice.details["onset_step"] == 40 and advice.details["skip_steps"] == [40, 40]
    assert advice.details["samples"] == {"step": 40, "indices": [156, 157, 158, 159], "ranks": 1}
    assert advice.message.endswith("The batch of step 40 held dataset indices 156-159 (details.samples; "
                                   "stability-callbacks forensics lists them).")
    logged = [json.loads(x) for x in (tmp_path / "runlog.jsonl").read_text().splitlines()]
    assert [x["details"]["samples"]["step"] for x in logged if x["type"] == "finding"
            and "samples" in x["details"]] == [30, 30, 40, 40]
    # A spike still open when the NaN comes is the NaN's episode: the advice names the spike's step.
    run = _run(tmp_path / "open", neighbour_steps=1)
    found = _feed(run, range(1, 41), lambda s: float("nan") if s == 40 else 9.0 if s >= 30 else 2 + s % 3 / 100)
    run.close()
    (advice,) = [f for f in found if f.kind == "rollback_advice"]
    assert advice.details["onset_step"] == 30 and advice.details["skip_steps"] == [30, 40]
    assert advice.details["samples"] == {"step": 30, "indices": [116, 117, 118, 119], "ranks": 1,
                                         "neighbours": {"31": [120, 121, 122, 123]}}
    # Without a connected integration (replay, follow) nothing is known of the data: nothing named.
    replayed = LiveRun(config={"actions": {}}, run_dir=None)
    replayed.start(0)
    assert all("samples" not in f.details for s in range(1, 32)
               for f in replayed.observe(StepRecord(s, {"loss": 9.0 if s == 30 else 2.0 + s % 3 / 100})))


def test_a_step_no_longer_held_or_never_recorded_says_so(tmp_path):
    run = _run(tmp_path, steps_kept=2)
    run.forensics.unknown_because("never used")   # too late: the ring already recorded (below)
    found = _feed(run, range(1, 31), lambda s: 9.0 if s == 30 else 2 + s % 3 / 100)
    assert found[-1].details["samples"]["neighbours"] == {"29": [112, 113, 114, 115]}   # 28 evicted
    fz = Forensics()
    fz.connect(LocalPeer())
    fz.unknown_because("the loop does not iterate hook.batches(loader)")
    f = Finding(7, "loss_spike", "warning", "The loss jumped.")
    fz.annotate([f])
    assert f.details["samples"] == {"step": 7, "indices": None,
                                    "unknown": "the loop does not iterate hook.batches(loader)"}
    assert f.message == "The loss jumped."
    # A loop that reads other than what the sampler dealt per step (GRPO's repeat sampler): unknown.
    fz = Forensics()
    fz.connect(LocalPeer())
    assert list(DataSkipSampler(range(16), samples_per_step=4, skips=lambda: None, record=lambda: fz.indices))
    fz.step_closed(1, rows=4)
    fz.step_closed(2, rows=2)
    f = Finding(2, "loss_spike", "warning", "The loss jumped.")
    fz.annotate([f])
    assert f.details["samples"] == {"step": 2, "indices": None, "unknown": (
        "the loop read 2 samples at step 2 where the sampler dealt 4: this loader's steps cannot be told apart "
        "by position")}


class TwoRanks(LocalPeer):
    """Rank 0 of 2 rank-local samplers: rank 1 read each step's indices + 1000."""

    world_size = 2

    def __init__(self):
        self.gathers = 0

    def gather(self, obj):
        self.gathers += 1
        other = {"steps": {s: [i + 1000 for i in v] for s, v in obj["steps"].items()}}
        return [obj, other]


def test_several_ranks_gather_once_at_a_finding_and_never_on_an_ordinary_step(tmp_path):
    peer = TwoRanks()
    run = _run(tmp_path, peer, neighbour_steps=0)
    found = _feed(run, range(1, 29), lambda s: 2 + s % 3 / 100)
    assert found == [] or all(f.kind == "warmup_end" for f in found)
    assert peer.gathers == 0
    found = _feed(run, range(29, 33), lambda s: 9.0 if s == 30 else 2 + s % 3 / 100)
    assert [(f.step, f.kind) for f in found] == [(30, "loss_spike"), (31, "spike_recovered")]
    assert peer.gathers == 1                    # the recovery names step 30 again, from what was gathered
    assert found[0].details["samples"] == {"step": 30, "indices": [116, 117, 118, 119, 1116, 1117, 1118, 1119],
                                           "ranks": 2}
    assert found[1].details["samples"] == found[0].details["samples"]


# ----------------------------------------------------------------------------- the ranking
def test_each_samples_loss_is_the_models_own_loss_on_that_sample_alone():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=50, n_positions=16, n_embd=32, n_layer=1, n_head=2)).eval()
    ids = torch.randint(0, 50, (3, 16))
    labels = ids.clone()
    labels[1, 10:] = -100                      # padding: left out of the loss
    with torch.no_grad():
        per_row, counted, rule = per_sample_loss(model(input_ids=ids, labels=labels), labels)
        alone = [float(model(input_ids=ids[i:i + 1], labels=labels[i:i + 1]).loss) for i in range(3)]
    assert per_row.tolist() == pytest.approx(alone, rel=1e-5) and counted.tolist() == [True] * 3
    assert rule == "causal LM: mean cross-entropy of the row's label tokens, shifted by one, equal to the model's own loss"
    # A classifier returning bare logits: the row's cross-entropy, unchecked.
    logits, y = torch.tensor([[2.0, 0.0], [0.0, 2.0]]), torch.tensor([0, 0])
    per_row, _, rule = per_sample_loss(logits, y)
    assert per_row.tolist() == pytest.approx([math.log(1 + math.exp(-2)), math.log(1 + math.exp(2))])
    assert rule.endswith("unchecked (the model returned no loss)")
    # A loss that is not the plain token cross-entropy (label smoothing, an auxiliary term): refused.
    out = model(input_ids=ids, labels=labels)
    with pytest.raises(ValueError, match=r"neither the shifted nor the unshifted token cross-entropy"):
        per_sample_loss({"logits": out.logits, "loss": out.loss * 2}, labels)
    with pytest.raises(ValueError, match="the batch has no labels"):
        per_sample_loss(out, None)


def test_rows_map_to_indices_as_the_sampler_dealt_them():
    assert row_indices(list(range(8)), [4, 4], 0, 1) == list(range(8))            # rank-local
    assert row_indices(list(range(16)), [4, 4], 1, 2) == [4, 5, 6, 7, 12, 13, 14, 15]   # accelerate: batch j*W+r
    assert row_indices(list(range(7)), [4, 4], 0, 1) == [None] * 8                # counts disagree: unknown


class Failing(LocalPeer):
    def rank_rows(self, batches, indices, shared_by_ranks, tokens_kept):
        raise ValueError("logits of shape (4,) with labels of shape (4,)")


def test_a_failing_ranking_is_said_once_turns_the_dump_off_and_the_samples_are_still_named(tmp_path, caplog):
    run = _run(tmp_path, Failing(), dump_batches=True)
    fz = run.forensics
    assert fz.wants_batches
    loss = lambda s: 9.0 if s in (30, 60) else 2 + s % 3 / 100  # noqa: E731
    for s in range(1, 62):
        fz.indices.put(s, [s])
        fz.step_closed(s, [{"input_ids": torch.zeros(1, 2, dtype=torch.long)}])
        with caplog.at_level(logging.WARNING, logger="stability_callbacks"):
            found = run.observe(StepRecord(s, {"loss": loss(s), "lr": 1e-3}))
        if s == 30:
            assert found[0].details["samples"]["ranked"] == {
                "step": 30, "unknown": "the ranking forward failed: ValueError: logits of shape (4,) with labels of shape (4,)"}
        if s == 60:
            assert "ranked" not in found[0].details["samples"] and found[0].details["samples"]["indices"] == [60]
    assert not fz.wants_batches and fz.dump_problem.startswith("ValueError")
    assert [r.message for r in caplog.records].count(
        "stability: ranking the batch of step 30 failed (ValueError: logits of shape (4,) with labels of shape "
        "(4,)); forensics.dump_batches is off for this run, the samples are still named") == 1
    assert not (tmp_path / "forensics").exists()


@pytest.mark.parametrize("cfg, message", [
    ({"dump_batches": "yes"}, "forensics.dump_batches must be true or false, got 'yes'"),
    ({"steps_kept": 0}, "forensics.steps_kept must be an integer ≥ 1, got 0"),
    ({"dump": True}, "forensics.dump: unknown key (known: batches_kept, dump_batches, neighbour_steps, "
                     "record_samples, steps_kept, tokens_kept)"),
])
def test_bad_forensics_keys_name_key_and_value(cfg, message):
    with pytest.raises(ConfigError) as e:
        load_config({"forensics": cfg})
    assert str(e.value) == message


# ---------------------------------------------------------------------- real training runs
def _hf_run(out, config):
    from transformers import Trainer, TrainingArguments

    from stability_callbacks.integrations.hf import StabilityCallback

    sc = _pocket()
    args = TrainingArguments(output_dir=str(out / "ckpt"), max_steps=sc.max_steps, per_device_train_batch_size=4,
                             gradient_accumulation_steps=2, learning_rate=sc.lr, warmup_steps=sc.warmup_steps,
                             weight_decay=0.0, save_strategy="no", report_to="none",
                             train_sampling_strategy="sequential", use_cpu=True, disable_tqdm=True)
    cb = StabilityCallback(run_dir=out / "stability", config={"actions": {}, **config})
    Trainer(model=sc.make_model(), args=args, train_dataset=sc.train_dataset(), callbacks=[cb]).train()
    steps = [json.loads(x) for x in (out / "stability" / "runlog.jsonl").read_text().splitlines()]
    return cb, {x["step"]: x["metrics"]["loss"] for x in steps if x["type"] == "step"}


@pytest.mark.slow
def test_hf_names_the_pocket_and_ranks_its_garbage_first_without_touching_training(tmp_path):
    sc = _pocket()
    garbage = sc.pocket_indices()
    assert garbage == [193, 196, 198]
    cb, losses = _hf_run(tmp_path / "dump", {"forensics": {"dump_batches": True}})
    spike = next(f for f in cb.findings if f.kind == "loss_spike")
    assert (spike.step, spike.severity) == (25, "warning")
    samples = spike.details["samples"]
    assert samples["indices"] == list(range(192, 200)) and samples["ranks"] == 1
    assert samples["neighbours"] == {"23": list(range(176, 184)), "24": list(range(184, 192))}
    ranked = samples["ranked"]
    assert {r["index"] for r in ranked["top"]} == set(garbage) and ranked["samples"] == 8
    assert ranked["path"] == "forensics/step-25.jsonl" and ranked["forward_ms"] > 0
    assert ranked["loss"].endswith("equal to the model's own loss")
    rows = [json.loads(x) for x in (tmp_path / "dump" / "stability" / "forensics" / "step-25.jsonl").read_text().splitlines()]
    assert [r["index"] for r in rows[:3]] == [r["index"] for r in ranked["top"]]
    assert sorted(r["index"] for r in rows) == list(range(192, 200))
    assert min(r["loss"] for r in rows[:3]) > 3 * max(r["loss"] for r in rows[3:])
    assert all(len(r["tokens"]) == 32 and r["rank"] == 0 for r in rows)
    assert f"Step 25 read dataset indices 192-199; ranked by their own loss in forensics/step-25.jsonl, index " \
           f"{ranked['top'][0]['index']} first at " in spike.message
    # The same run without the sampler wrapper or the forward trains exactly alike.
    _, plain = _hf_run(tmp_path / "plain", {"forensics": {"record_samples": False}})
    assert losses == plain and len(losses) == 26

    # The command lists what the run named and ranked.
    run_dir = tmp_path / "dump" / "stability"
    assert cli(["forensics", str(run_dir), "--top", "3", "--json", str(tmp_path / "f.jsonl")]) == 0
    entries = [json.loads(x) for x in (tmp_path / "f.jsonl").read_text().splitlines()]
    assert [(e["type"], e["step"]) for e in entries] == [("samples", 25), ("samples", 25), ("ranked", 25)]
    assert entries[1]["kind"] == "spike_recovered" and entries[2]["rows"] == rows


def test_hf_random_order_is_the_order_of_a_run_without_the_wrapper(tmp_path):
    """HF's random sampler behind the wrapper is seeded as accelerate would seed it unwrapped
    (torch's initial seed, here changed after the Trainer set its own)."""
    from transformers import Trainer, TrainingArguments

    from stability_callbacks.integrations.hf import StabilityCallback

    sc = build_scenario("healthy", max_steps=6, batch_size=4)
    prints = []
    for record in (True, False):
        args = TrainingArguments(output_dir=str(tmp_path / f"r{record}"), max_steps=6, per_device_train_batch_size=4,
                                 save_strategy="no", report_to="none", use_cpu=True, disable_tqdm=True, seed=3)
        trainer = Trainer(model=sc.make_model(), args=args, train_dataset=sc.train_dataset())
        cb = StabilityCallback.attach(trainer, config={"actions": {}, "forensics": {"record_samples": record}},
                                      run_dir=tmp_path / f"s{record}")
        torch.manual_seed(11)
        trainer.train()
        lines = [json.loads(x) for x in (tmp_path / f"s{record}" / "runlog.jsonl").read_text().splitlines()]
        prints.append([x["metrics"]["batch_fingerprint"] for x in lines if x["type"] == "step"])
        if record:
            ring = cb.run.forensics.indices
            order = torch.randperm(len(sc.train_dataset()), generator=torch.Generator().manual_seed(11)).tolist()
            assert [ring.get(s) for s in (1, 6)] == [order[:4], order[20:24]]
    assert prints[0] == prints[1] and len(prints[0]) == 6


def test_the_forensics_command_lists_says_nothing_or_fails_loudly(tmp_path, capsys):
    run_dir = tmp_path / "run"
    run = _run(run_dir, neighbour_steps=1)
    _feed(run, range(1, 32), lambda s: 9.0 if s == 30 else 2 + s % 3 / 100)
    run.close()
    (run_dir / "forensics").mkdir()
    (run_dir / "forensics" / "step-30.jsonl").write_text(
        '{"index": 118, "loss": 7.5, "tokens": [1, 2, 3], "rank": 0}\n{"index": 116, "loss": null, "tokens": [], "rank": 0}\n')
    assert cli(["forensics", str(run_dir)]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "step 30: dataset indices 116-119  [loss_spike (warning) at step 30]",
        "  step 29: 112-115",
        "step 30: dataset indices 116-119  [spike_recovered (info) at step 31]",
        "step 30: 2 samples ranked by their own loss (forensics/step-30.jsonl)",
        "    1. index      118  loss       7.5  rank 0  tokens 1 2 3",
        "    2. index      116  loss      None  rank 0  tokens "]
    assert cli(["forensics", str(tmp_path)]) == 1
    assert capsys.readouterr().out == f"{tmp_path}: no finding named samples and no batch was ranked\n"
    assert cli(["forensics", str(tmp_path / "nope")]) == 2
    assert capsys.readouterr().err == f"error: {tmp_path / 'nope'}: no such run directory\n"
    (run_dir / "forensics" / "step-31.jsonl").write_text("[1]\n")
    assert cli(["forensics", str(run_dir)]) == 2
    assert capsys.readouterr().err == f"error: {run_dir / 'forensics' / 'step-31.jsonl'} line 1: not a JSON object\n"
    with pytest.raises(SystemExit):
        cli(["forensics", "--help"])
    text = capsys.readouterr().out
    assert "List the data behind a live run's spikes" in text and "exit codes: 0 listed, 1 nothing to list" in text
    assert compact([]) == ""


def test_lightning_names_the_pocket_and_ranks_its_garbage_first(tmp_path):
    pl = pytest.importorskip("lightning.pytorch")

    from stability_callbacks.integrations.lightning import StabilityCallback

    sc = _pocket()

    class TinyGPT(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = sc.make_model()

        def forward(self, **batch):   # what the ranking forward calls: module(**batch)
            return self.model(**batch)

        def training_step(self, batch, batch_idx):
            return self.model(input_ids=batch["input_ids"], labels=batch["labels"]).loss

        def configure_optimizers(self):
            opt, sched = sc.make_optimizer(self.model)
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    cb = StabilityCallback(run_dir=tmp_path / "stability", config={
        "actions": {}, "phase": {"warmup_steps": sc.warmup_steps}, "forensics": {"dump_batches": True}})
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=sc.max_steps, accumulate_grad_batches=2,
                         gradient_clip_val=1.0, logger=False, enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=False, default_root_dir=tmp_path, callbacks=[cb])
    trainer.fit(TinyGPT(), torch.utils.data.DataLoader(sc.train_dataset(), batch_size=4, shuffle=False))
    spike = next(f for f in cb.findings if f.kind == "loss_spike")
    assert (spike.step, spike.severity) == (25, "warning")
    samples = spike.details["samples"]
    assert samples["indices"] == list(range(192, 200))
    assert samples["neighbours"] == {"23": list(range(176, 184)), "24": list(range(184, 192))}
    assert {r["index"] for r in samples["ranked"]["top"]} == set(sc.pocket_indices())
    assert (tmp_path / "stability" / "forensics" / "step-25.jsonl").is_file()


@pytest.mark.parametrize("loader, problem", [
    (RuntimeError("the loader failed to build"), "wrapping the train loader's sampler failed (the log has why)"),
    ([], "the train loaders are a list, not one DataLoader")])
def test_lightning_a_loader_it_cannot_wrap_is_left_alone_and_said(tmp_path, caplog, loader, problem):
    """The loader's own sampler stays; the spike says why it names no samples, and a rollback
    would halt with that reason (an unexpected failure is logged once, training goes on)."""
    pytest.importorskip("lightning.pytorch")
    from stability_callbacks.integrations.lightning import StabilityCallback
    from stability_callbacks.integrations.torch.auto_rollback import RollBack

    class Trainer:
        global_step = 0

        @property
        def train_dataloader(self):
            if isinstance(loader, Exception):
                raise loader
            return loader

    cb = StabilityCallback(run_dir=tmp_path, config={"actions": {}})
    cb._open(is_rank0=True, run_dir=str(tmp_path))
    cb._rollback = rb = RollBack(lambda: cb.session)
    with caplog.at_level(logging.ERROR, logger="stability_callbacks"):
        cb._wrap_sampler(Trainer())
    assert (rb.sampler, rb.sampler_problem) == (None, problem)
    assert ("the loader failed to build" in caplog.text) == isinstance(loader, Exception)
    fz = cb.session.run.forensics
    fz.connect(LocalPeer())
    f = Finding(3, "loss_spike", "warning", "The loss jumped.")
    fz.annotate([f])
    assert f.details["samples"] == {"step": 3, "indices": None, "unknown": problem}
    cb.session.close()
