"""The CLI as users run it: a subprocess, exit codes, JSON lines, the summary."""
import json
import re
import subprocess
import sys

import pytest

from conftest import DATA

LOGS = DATA / "real_logs"


def cli(*args):
    return subprocess.run([sys.executable, "-m", "stability_callbacks", *map(str, args)],
                          capture_output=True, text=True, timeout=120)


def test_replay_exit_1_on_critical_with_json_lines():
    r = cli("replay", LOGS / "bs_tr8_104B_exp12_spike8740_diverge9027.csv", "--json", "-")
    assert r.returncode == 1, r.stderr
    read, *lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert read["type"] == "read" and read["format"] == "csv" and read["steps"] == read["steps_with_loss"]
    assert [(f["step"], f["kind"]) for f in lines] == [
        (8740, "grad_norm_spike"), (8741, "loss_spike"), (8743, "loss_spike"), (9027, "nonfinite"),
        (9027, "rollback_advice")]
    # A CSV is no framework's: the advice is generic, naming no framework's flag (--advice says how).
    said = " ".join(r.stderr.split())   # the table's console wraps lines
    assert "rollback_advice" in said and "skip the batches of steps 8740-9027" in said
    assert "--skip-train-iteration-range" not in said and "(--advice all, or --advice" in said
    r = cli("replay", LOGS / "bs_tr8_104B_exp12_spike8740_diverge9027.csv", "--advice", "megatron")
    assert "megatron: --load with latest_checkpointed_iteration.txt = the newest iteration saved before 8740 " \
           "(the log names no checkpoint; Megatron-LM: --ckpt-step that iteration) " \
           "--skip-train-iteration-range 8740-9027" in " ".join(r.stdout.split())


def test_replay_exit_0_on_healthy_and_summary_table():
    r = cli("replay", LOGS / "bs_tr11_176B_throughput_drop_wrapped.csv")
    assert r.returncode == 0, r.stderr
    assert "5 steps" in r.stdout and "critical: 0" in r.stdout


def test_an_output_that_cannot_be_written_is_exit_2_in_one_line_before_reading(tmp_path):
    """--json or --report where a file stands in for a folder, or on a folder: exit 2, one line,
    no traceback, said before the log is read (here a log that does not exist, which would be
    the error otherwise)."""
    (tmp_path / "a-file").write_text("not a folder")
    for flag, out, why in (("--json", "a-file/x.jsonl", f"{tmp_path / 'a-file'} is not a folder"),
                           ("--report", "a-file/r.html", f"{tmp_path / 'a-file'} is not a folder"),
                           ("--json", ".", "it is a folder")):
        r = cli("replay", tmp_path / "nope.log", flag, str(tmp_path / out) if out != "." else str(tmp_path))
        assert r.returncode == 2 and r.stderr.splitlines() == [
            f"error: {flag} {tmp_path / out if out != '.' else tmp_path}: cannot write it: {why}"], r.stderr
    r = cli("replay", LOGS / "bs_tr11_176B_throughput_drop_wrapped.csv", "--json", tmp_path / "new" / "x.jsonl")
    assert r.returncode == 0 and (tmp_path / "new" / "x.jsonl").is_file()   # missing folders are made


def test_replay_exit_2_on_unreadable_input_and_bad_config(tmp_path):
    r = cli("replay", tmp_path / "nope.log")
    assert r.returncode == 2 and "nope.log" in r.stderr and "Traceback" not in r.stderr
    cfg = tmp_path / "c.yaml"
    cfg.write_text("policy: {halt_on: sometimes}\n")
    r = cli("replay", LOGS / "bs_tr1_13B_spike29k.csv", "--config", cfg)
    assert r.returncode == 2 and "policy.halt_on" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.slow
def test_replay_of_our_own_run_log_reproduces_live_findings(tmp_path):
    from streams import healthy, scale

    from stability_callbacks.live import LiveRun
    run = LiveRun(config={"actions": {}}, run_dir=tmp_path)
    run.start(0)
    live = []
    for r in scale(healthy(400), "loss", lambda s: 2.0 if s == 300 else 1.0):
        live += run.observe(r)
    run.close()
    r = cli("replay", tmp_path / "runlog.jsonl", "--json", tmp_path / "f.jsonl")
    assert r.returncode == 0, r.stderr
    read, *replayed = [json.loads(x) for x in (tmp_path / "f.jsonl").read_text().splitlines()]
    assert read["type"] == "read" and read["steps"] == 400
    assert replayed == [f.to_json() for f in live]
    assert [(f["step"], f["kind"]) for f in replayed] == [(50, "warmup_end"), (300, "loss_spike"),
                                                          (301, "spike_recovered")]


@pytest.mark.slow
def test_replay_of_an_unknown_format_says_how_to_read_it(tmp_path):
    log = tmp_path / "odd.log"
    log.write_text("".join(f"ep {e} mse_err {3 - e / 20} acc 0.{e}\n" for e in range(40)))   # stays > 0
    r = cli("replay", log)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert r.stderr.count("error:") == 1 and "closest lines:\n    line 1: ep 0 mse_err 3.0 acc 0.0" in r.stderr
    assert "--keys step=ep,loss=mse_err" in r.stderr
    r = cli("replay", log, "--keys", "step=ep,loss=mse_err")
    assert r.returncode == 0 and "40 steps" in r.stdout, r.stderr
    r = cli("replay", log, "--keys", "stp=ep")
    assert r.returncode == 2 and "--keys: 'stp' is not step or a metric key" in r.stderr


def test_every_command_says_what_it_does_and_its_exit_codes():
    for command in ("replay", "timeline", "preflight", "demo"):
        r = cli(command, "--help")
        assert r.returncode == 0, r.stderr
        usage, _, rest = r.stdout.partition("\n\n")
        assert rest.split("\n\n")[0].strip() and not rest.startswith("positional"), command   # a description
        assert "exit codes: 0 " in r.stdout and " 2 " in r.stdout.split("exit codes:")[1], command


def test_demo_help_lists_its_choices():
    r = cli("demo", "--help")
    assert "{healthy,data-pocket,nan,warmup-spike}" in r.stdout and "{hf,lightning,deepspeed}" in r.stdout
    r = cli("demo", "--scenario", "oops")
    assert r.returncode == 2 and "invalid choice: 'oops'" in r.stderr


def test_json_means_the_same_in_every_command(tmp_path):
    """``--json OUT`` writes JSON lines to OUT, ``--json`` alone to standard output: replay and
    preflight alike."""
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"model_type": "gpt2", "n_embd": 4096, "n_layer": 2, "initializer_range": 0.02,
                                  "torch_dtype": "float16"}))
    r = cli("preflight", config, "--json", tmp_path / "pre.jsonl")
    to_file = [json.loads(x) for x in (tmp_path / "pre.jsonl").read_text().splitlines()]
    assert r.returncode == 1 and to_file and all(f["kind"] == "preflight" for f in to_file)
    assert "[warning] init_std: Init std 0.0200" in r.stdout   # the human lines still go to the terminal
    r = cli("preflight", config, "--json")
    assert [json.loads(x) for x in r.stdout.splitlines()] == to_file


def test_unknown_preset_lists_the_presets():
    r = cli("replay", LOGS / "bs_tr1_13B_spike29k.csv", "--config", "pretrain_fp16")
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "no preset of that name (presets: default, finetune, pretrain-bf16, pretrain-fp16)" in r.stderr


def test_a_missing_extra_exits_2_and_names_it_before_the_work(monkeypatch, capsys, tmp_path):
    from stability_callbacks import cli as cli_module

    monkeypatch.setitem(sys.modules, "matplotlib", None)   # what an install without [report] has
    for args in (["replay", str(LOGS / "bs_tr1_13B_spike29k.csv"), "--report", str(tmp_path / "r.png")],
                 ["timeline", str(tmp_path / "runlog.jsonl"), "--png", str(tmp_path / "t.png")]):
        assert cli_module.main(args) == 2
        out = capsys.readouterr()
        assert out.err == (f"error: {args[0]} needs matplotlib here: pip install "
                           f"'stability-callbacks[report]'\n")
        assert out.out == ""   # said before any work, not after


def test_rollback_advice_speaks_the_logs_framework_and_advice_all_gives_every_form():
    """A Megatron log: the advice in Megatron's terms only (``--advice auto``, the default);
    ``--advice all`` adds HF, Lightning and DeepSpeed; ``--advice deepspeed`` that one."""
    log = LOGS / "bs_tr8_104B_exp12_spike8740_diverge9027.log"

    def forms(*flags):
        r = cli("replay", log, *flags)
        assert r.returncode == 1, r.stderr
        return [m.group(1) for m in map(re.compile(r"^    (\w+): ").match, r.stdout.splitlines()) if m]

    assert forms() == ["megatron"]
    assert forms("--advice", "all") == ["hf", "lightning", "megatron", "deepspeed"]
    assert forms("--advice", "deepspeed") == ["deepspeed"]


def test_the_end_of_a_short_flat_log_says_it_is_too_early_to_call_unless_its_steps_are_epochs(tmp_path):
    # 10 rows flat at 2.3026 under a step column: fewer than 50 steps, so only an info at the end
    # of the log, in the JSON and the table (exit 0); the same numbers printed with no counter
    # (each step a record's rank) say that an excerpt need not start where the run did
    xs = ["2.3031", "2.3027", "2.3026", "2.3029", "2.3025", "2.3026", "2.3027", "2.3026", "2.3024", "2.3026"]
    (tmp_path / "flat.csv").write_text("step,loss\n" + "".join(f"{i},{x}\n" for i, x in enumerate(xs, 1)))
    r = cli("replay", tmp_path / "flat.csv", "--json", "-")
    assert r.returncode == 0, r.stderr
    _, *lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert [(f["step"], f["kind"], f["severity"]) for f in lines] == [(10, "not_learning", "info")]
    assert "if each is an epoch (or many batches), the run is not learning" in lines[0]["message"]
    (tmp_path / "flat.log").write_text("".join(f"loss: {x}\n" for x in xs))
    r = cli("replay", tmp_path / "flat.log", "--json", "-")
    _, *lines = [json.loads(x) for x in r.stdout.splitlines()]
    assert r.returncode == 0 and [(f["step"], f["kind"], f["severity"]) for f in lines] == [(10, "not_learning", "info")]
    assert "if the log starts where the run did: it prints no step numbers" in lines[0]["message"]
