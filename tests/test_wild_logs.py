"""The wild corpus (tests/data/wild_logs, labels.*.json): real logs from public issue threads and
repositories that nobody on this project wrote, and logs of 2025-26 tools (half F). The corpus is
split (split.json, a seeded draw over source threads and repositories) into a rules part, which
parses with ``--format auto`` to exactly its hand-written CSV (README there: what a log parses to)
and meets its labels, and a held-out part, never used to write rules, asserted as first scored.
Known misses are asserted exactly as they fail, each with its reason."""
import json
import math
import random
import re
from pathlib import Path

import pytest
from test_readers import assert_same
from test_real_logs import violations

from stability_callbacks.replay.command import judge_log
from stability_callbacks.replay.readers import LogFormatError, read_records

WILD = Path(__file__).parent / "data" / "wild_logs"
ALL_LABELS = [entry for f in sorted(WILD.glob("labels.*.json")) for entry in json.loads(f.read_text())]
SPLIT = json.loads((WILD / "split.json").read_text())
HELD_OUT = {name for batch in SPLIT["batches"] for name in batch["held_out"]}
#: The rules part: the logs reader rules may be written and tuned against (split.json).
LABELS = [lab for lab in ALL_LABELS if lab["name"] not in HELD_OUT]


def source_group(source: str) -> str:
    """The group a log is drawn with: its thread (``owner/repo#N``), the repository its file is
    from (``owner/repo``), the search-index file it was found as (``index:ID``), or, for a log
    generated from a tool's print format, that tool (``owner/repo (generated)``)."""
    m = re.match(r"([\w.-]+/[\w.-]+)#(\d+)", source)
    if m:
        return f"{m.group(1)}#{m.group(2)}"
    m = re.match(r"generated from the print format of ([\w.-]+/[\w.-]+)", source)
    if m:
        return f"{m.group(1)} (generated)"
    m = re.search(r"index file id (\d+)", source)
    if m:
        return f"index:{m.group(1)}"
    m = re.match(r"(?:produced here by running the )?([\w.-]+/[\w.-]+)[ @]", source)
    return m.group(1)


def draw_held_out(labels: list[dict], seed: int, share: float) -> list[str]:
    """split.json's method: whole source groups in a seeded shuffle until ``share`` is reached."""
    groups: dict[str, list[str]] = {}
    for lab in labels:
        groups.setdefault(source_group(lab["source"]), []).append(lab["name"])
    order = sorted(groups)
    random.Random(seed).shuffle(order)
    held: list[str] = []
    for g in order:
        if len(held) >= math.ceil(share * len(labels)):
            break
        held += groups[g]
    return sorted(held)


def _expected(kind, lo, hi):
    return f"expected {{'kind': '{kind}', 'step_min': {lo}, 'step_max': {hi}}}"


#: name -> (the violations it has today, why no principled rule delivers them from these points).
#: A known miss that starts passing fails too: remove it from the list.
KNOWN_MISSES = {
    "a_hf_dict_smart_quotes_rising_loss": (
        [_expected("divergence", 6, 12)],
        "12 points, 2% noise: the 7-point running median (blind to blips) has risen 5% by the "
        "last point, half of min_rise; fewer points than the rule's window + persistence allow "
        "a call on without calling noisy 12-point windows (label confidence: guess)"),
    "a_speechbrain_bestrq_resume_sudden_drop": (
        [_expected("sudden_drop", 74613, 74613)],
        "the resume is in the poster's prose, not in the log, and the drop is its last point: one "
        "point cannot show a fall that stays (a resumed run's drop is a warning: test_rules)"),
    "c_bracket_iter_resume_restarts_lr_and_counter": (
        [_expected("lr_anomaly", 1, 1), _expected("resume|resume_spike", 1, 1)],
        "the step counter goes back to 1: a rollback to step 0, whose resume finding is dated at "
        "the step it resumes from (0, docs/design.md, Run log); after a rollback the detectors forget the "
        "abandoned branch (invariant 5), so LR 0.001 at step 1 is the schedule's start"),
    "c_modded_nanogpt_optimizers_run2_bump196_recovers": (
        [_expected("loss_spike", 196, 203), _expected("spike_recovered", 205, 220)],
        "+7-12% for 11 steps, each point within 3.3 sigma of a 2.5%-noise loss and below min_rise "
        "(15%); the 5.74 at 202 meets a noise band its neighbours widened. The sibling runs' "
        "benign 2-step blips look the same (label confidence: guess)"),
    "c_fairseq_legacy_fconv_summ_gnorm_creeps_before_explosion": (
        [_expected("grad_norm_growth|grad_norm_spike", 1701, 1711)],
        "fairseq-legacy prints gnorm as the epoch's running average: 2.58 -> 3.43 there means the "
        "per-update norm grew ~30x, but read as a grad norm it is x1.3 over 6 points"),
    "c_caffe_sphereface_softmax_loss_drifts_up_23400": (
        [_expected("divergence", 23500, 23700)],
        "4 points: a drift needs a window of points to be told from noise (label confidence: guess)"),
}


@pytest.mark.parametrize("label", LABELS, ids=[lab["name"] for lab in LABELS])
def test_wild_log_parses_to_its_csv(label):
    # Extra keys beyond the CSV's five (eval metrics kept apart, consumed samples) are allowed.
    assert_same(list(read_records(WILD / label["log"])), WILD / label["csv"],
                allowed_extra=("consumed_samples", "param_norm"))


#: What users' tooling adds around a log: Windows line ends, an issue's code fence and quoting,
#: torchrun's rank prefix, a logging handler's timestamp and level.
def _as_pasted(text: str) -> str:
    lines = [f"> [rank0]: 2024-05-01 12:00:00,123 INFO {line}" if line.strip() else "> " + line
             for line in text.split("\n")]
    return "```text\r\n" + "\r\n".join(lines) + "\r\n```\r\n"


TEXT_LOGS = [lab for lab in LABELS if lab["log"].endswith(".log") and not lab["name"].startswith("b_tsv_")]


@pytest.mark.parametrize("label", TEXT_LOGS, ids=[lab["name"] for lab in TEXT_LOGS])
def test_prefixes_quotes_and_line_ends_change_nothing(label, tmp_path):
    pasted = tmp_path / label["log"]
    with open(WILD / label["log"], encoding="utf-8", errors="replace", newline="") as f:   # tqdm's \r kept
        pasted.write_text(_as_pasted(f.read()), newline="")
    assert_same(list(read_records(pasted)), WILD / label["csv"],
                allowed_extra=("consumed_samples", "param_norm"))


@pytest.mark.parametrize("label", LABELS, ids=[lab["name"] for lab in LABELS])
def test_wild_log_meets_its_labels(label):
    findings = judge_log(WILD / label["log"])   # as `replay` judges it
    assert violations(label, findings) == KNOWN_MISSES.get(label["name"], ([], None))[0]


@pytest.mark.parametrize("halves, size, held", [("abcde", 122, 37), ("f", 27, 9)])
def test_the_held_out_part_is_the_seeded_draw(halves, size, held):
    batch = next(b for b in SPLIT["batches"] if b["logs"] == size)
    drawn = [lab for lab in ALL_LABELS if lab["name"][0] in halves]
    assert len(drawn) == size
    assert draw_held_out(drawn, batch["seed"], batch["share"]) == batch["held_out"]
    assert len(batch["held_out"]) == held


HELD_OUT_LABELS = [lab for lab in ALL_LABELS if lab["name"] in HELD_OUT]

#: The held-out part as first (and only) scored, at the end of issue 26 (docs/cli.md, Measured
#: generality): 44 of 46 parse exactly, 43 meet their labels. name -> why it does not parse to
#: its CSV (none now). The two held-out logs did not parse to their CSVs: build-nanogpt's log.txt (`N train
#: X` / `N val X`: the loss under a split word alone) and OLMo-core's console (`optim/LR (group 0)=x`:
#: the tokenizer cut the key at its group's index). Both read since rules written for other shapes
#: (2026-11-29: a value named only by the training split beside evaluation splits, `epoch 3 | train
#: 0.52 | valid 0.61`; a parameter group's index inside its key's parentheses): spent files, they
#: measure nothing. Never fixed by a rule for the file: a later change to the rules needs a new
#: held-out batch (split.json).
HELD_OUT_PARSE_MISSES: dict[str, str] = {}


@pytest.mark.parametrize("label", HELD_OUT_LABELS, ids=[lab["name"] for lab in HELD_OUT_LABELS])
def test_held_out_log_reads_as_first_scored(label):
    try:
        records = list(read_records(WILD / label["log"]))
        assert_same(records, WILD / label["csv"], allowed_extra=("consumed_samples", "param_norm"))
        exact = True
    except (AssertionError, LogFormatError):
        exact = False
    assert exact == (label["name"] not in HELD_OUT_PARSE_MISSES)


@pytest.mark.parametrize("label", HELD_OUT_LABELS, ids=[lab["name"] for lab in HELD_OUT_LABELS])
def test_held_out_log_meets_its_labels_as_first_scored(label):
    findings = judge_log(WILD / label["log"])
    assert violations(label, findings) == KNOWN_MISSES.get(label["name"], ([], None))[0]


def test_the_known_misses_are_few_and_labelled():
    assert set(KNOWN_MISSES) <= {lab["name"] for lab in ALL_LABELS} and len(ALL_LABELS) == 149
    assert len(KNOWN_MISSES) == 6 and HELD_OUT_PARSE_MISSES == {}
    assert len(HELD_OUT_LABELS) == 46
    assert all(reason for _, reason in KNOWN_MISSES.values())


def test_every_wild_log_has_a_label():
    logs = {p.name for p in WILD.glob("*") if (p.suffix in (".log", ".json", ".jsonl", ".txt")
                                               or p.name.endswith(".metrics.csv"))
            and not p.name.startswith(("labels.", "split."))}
    assert logs == {lab["log"] for lab in ALL_LABELS}
