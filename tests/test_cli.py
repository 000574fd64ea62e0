"""The CLI as users run it: a subprocess, exit codes, JSON lines, the summary."""
import json
import subprocess
import sys

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
    assert "rollback_advice" in r.stderr and "--skip-train-iteration-range 8740-9027" in r.stderr


def test_replay_exit_0_on_healthy_and_summary_table():
    r = cli("replay", LOGS / "bs_tr11_176B_throughput_drop_wrapped.csv")
    assert r.returncode == 0, r.stderr
    assert "5 steps" in r.stdout and "critical: 0" in r.stdout


def test_replay_exit_2_on_unreadable_input_and_bad_config(tmp_path):
    r = cli("replay", tmp_path / "nope.log")
    assert r.returncode == 2 and "nope.log" in r.stderr and "Traceback" not in r.stderr
    cfg = tmp_path / "c.yaml"
    cfg.write_text("policy: {halt_on: sometimes}\n")
    r = cli("replay", LOGS / "bs_tr1_13B_spike29k.csv", "--config", cfg)
    assert r.returncode == 2 and "policy.halt_on" in r.stderr and "Traceback" not in r.stderr


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
