"""``replay --follow``: the tail (partial lines, rotation, truncation) and the sidecar end to end
on a real training subprocess, with a halt, a stop file, a command and a Slack alert to a real
local HTTP server."""
import json
import math
import os
import random
import re
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from stability_callbacks.replay.follow import StopConditions, TailLines, process_alive
from stability_callbacks.replay.readers import LogFormatError

TESTS = Path(__file__).parent
REPO = TESTS.parent


class Stop:
    """A should_stop the test flips."""

    def __init__(self):
        self.now = False

    def __call__(self):
        return self.now


def tail(path, stop):
    return iter(TailLines(path, poll_s=0.001, should_stop=stop))


def tail_of(tmp_path, data: bytes):
    """A ``train.log`` holding ``data``, a stop switch and the tail of the log."""
    log = tmp_path / "train.log"
    log.write_bytes(data)
    stop = Stop()
    return log, stop, tail(log, stop)


def append(path, data: bytes) -> None:
    with open(path, "ab") as f:
        f.write(data)


def next_line(it):
    """The next real line, passing over idle ticks (each tick is one poll that found nothing)."""
    for item in it:
        if item[1] is not None:
            return item
    raise AssertionError("the tail ended")


def test_partial_last_line_is_held_back_until_complete(tmp_path):
    log, stop, it = tail_of(tmp_path, b"step 1 loss 2.5\nstep 2 lo")
    assert next(it) == (1, "step 1 loss 2.5")
    assert next(it) == (1, None)                 # `step 2 lo` is not out: an idle tick instead
    append(log, b"ss 2.4\nstep 3 loss 2.3\n")
    assert next_line(it) == (2, "step 2 loss 2.4")
    assert next_line(it) == (3, "step 3 loss 2.3")
    append(log, b"step 4 loss")                  # the job died mid-line: given out at the end
    stop.now = True
    assert list(it) == [(4, "step 4 loss")]


def test_tqdm_redraws_of_an_unfinished_line_go_out_at_once(tmp_path):
    log, stop, it = tail_of(tmp_path, b"epoch 1\n 10%| 1/10 [loss=2.5]\r 20%| 2/10 [loss=2.4]\r 30%| 3/1")
    assert next(it) == (1, "epoch 1")
    assert next(it) == (2, " 10%| 1/10 [loss=2.5]\r 20%| 2/10 [loss=2.4]")
    append(log, b"0 [loss=2.3]\n")
    assert next_line(it) == (2, " 30%| 3/10 [loss=2.3]")


def test_rotation_reads_the_old_file_to_its_end_then_the_new_one(tmp_path):
    log, stop, it = tail_of(tmp_path, b"step 1 loss 2.5\n")
    assert next(it) == (1, "step 1 loss 2.5")
    append(log, b"step 2 loss 2.4\n")             # written just before the rename
    os.replace(log, tmp_path / "train.log.1")
    log.write_text("step 3 loss 2.3\n")
    assert next_line(it) == (2, "step 2 loss 2.4")
    assert next_line(it) == (1, "step 3 loss 2.3")    # the new file, numbered from 1
    stop.now = True
    assert [x for x in it if x[1] is not None] == []


def test_truncation_restarts_at_the_top(tmp_path):
    log, stop, it = tail_of(tmp_path, b"step 1 loss 2.5\nstep 2 loss 2.4\nstep 3 loss 2.3\n")
    assert [next_line(it) for _ in range(3)][-1] == (3, "step 3 loss 2.3")
    with open(log, "w") as f:                    # copytruncate, or a restart with `>`
        f.write("step 1 loss 9.9\n")
    assert next_line(it) == (1, "step 1 loss 9.9")


def test_a_file_that_does_not_exist_yet_is_waited_for(tmp_path):
    log = tmp_path / "later.log"
    stop = Stop()
    t = TailLines(log, poll_s=0.001, should_stop=stop)
    got: list = []

    def read():
        try:
            got.extend(x for x in t if x[1] is not None)
        except LogFormatError as e:            # stopped before it appeared: said so
            got.append(e.msg.split(" (")[0])

    reader = threading.Thread(target=read)
    reader.start()
    log.write_text("step 1 loss 2.5\n")
    stop.now = True      # the tail reads what is there before it honours the stop
    reader.join(10)
    assert got in ([(1, "step 1 loss 2.5")], ["no such file"])   # created before or after the last look
    assert list(TailLines(log, poll_s=0.001, should_stop=lambda: True)) == [(1, "step 1 loss 2.5")]
    with pytest.raises(LogFormatError, match=r"never\.log: no such file \(waited"):
        list(TailLines(tmp_path / "never.log", poll_s=0.001, should_stop=lambda: True))


def test_stop_conditions_process_and_idle(tmp_path):
    proc = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                            stdin=subprocess.PIPE)
    cond = StopConditions(pid=proc.pid)
    assert process_alive(proc.pid) and not cond()
    proc.stdin.close()
    proc.wait(10)
    assert not process_alive(proc.pid) and cond() and cond.reason == f"process {proc.pid} ended"
    zombie = subprocess.Popen([sys.executable, "-c", "pass"])
    os.waitid(os.P_PID, zombie.pid, os.WEXITED | os.WNOWAIT)   # ended, not reaped yet
    assert not process_alive(zombie.pid)
    zombie.wait()
    idle = StopConditions(idle_exit_s=1e-9)
    assert idle() and idle.reason.startswith("no new line for")


# ---------------------------------------------------------------------------------------------
# End to end: a real training subprocess writes its log while `replay --follow` tails it.

class _Inbox(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _Hook)
        self.posts: list[dict] = []


class _Hook(BaseHTTPRequestHandler):
    def do_POST(self):  # noqa: N802 (http.server's naming)
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.server.posts.append({"path": self.path, "json": json.loads(body)})
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"ok")

    def log_message(self, *args):
        pass


@pytest.fixture
def inbox():
    srv = _Inbox()
    thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()


def _env(**extra):
    env = dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", **extra)
    return env


def _job(log, *args):
    return subprocess.Popen([sys.executable, str(TESTS / "follow_job.py"), str(log), *map(str, args)],
                            stdout=subprocess.PIPE, text=True, env=_env())


def _follow_cmd(log, *args):
    return [sys.executable, "-m", "stability_callbacks", "replay", str(log), "--follow",
            "--poll-s", "0.05", *map(str, args)]


def _follow(log, *args, env=None):
    return subprocess.run(_follow_cmd(log, *args), capture_output=True, text=True, timeout=180,
                          env=env or _env())


def _end_block(stdout: str) -> list[str]:
    """The summary block that ends a follower's output (it is the last thing printed)."""
    lines = stdout.splitlines()
    (start,) = [i for i, line in enumerate(lines) if line.startswith("stability: ")]
    return lines[start:]


@pytest.mark.slow
def test_follow_halts_a_live_job_alerts_and_writes_the_run_log(tmp_path, inbox):
    log, stop_file, ran = tmp_path / "train.log", tmp_path / "STOP", tmp_path / "on_halt.txt"
    config = tmp_path / "halt.yaml"
    config.write_text("policy: {halt_on: critical}\n"
                      "actions:\n  slack: {webhook_url: '${SLACK_WEBHOOK_URL}', min_severity: critical}\n")
    # The job trains until it finds the stop file (or 2000 steps); the NaN comes at step 30.
    job = _job(log, "--nan-at", 30, "--steps", 2000, "--stop-file", stop_file)
    r = _follow(log, "--pid", job.pid, "--config", config, "--run-dir", tmp_path / "run",
                "--stop-file", stop_file, "--on-halt", f"echo $STABILITY_KIND $STABILITY_STEP > {ran}",
                "--report", tmp_path / "report.html",
                env=_env(SLACK_WEBHOOK_URL=f"http://127.0.0.1:{inbox.server_address[1]}/hook"))
    job_out, _ = job.communicate(timeout=120)
    assert r.returncode == 3, r.stdout + r.stderr
    assert "[critical] step 30 nonfinite" in r.stdout
    # It ends as a live run does: the summary block, its last lines the run log and the report
    # (--report: there, rather than next to the run log).
    end = _end_block(r.stdout)
    assert end[:3] == ["stability: following halted at step 30: nonfinite (critical) at step 30; policy.halt_on = critical",
                       f"  the job: stop file written: {stop_file}; ran 'echo $STABILITY_KIND $STABILITY_STEP > {ran}' (exit 0)",
                       "  steps watched: 30 (1-30)"]
    assert end[3].startswith("  findings: critical: nonfinite x1 (step 30), rollback_advice x1 (step 30)")
    assert end[4].startswith("  roll back: Roll back: nonfinite at step 30")
    assert end[5:] == [f"  run log: {tmp_path / 'run' / 'runlog.jsonl'}", f"  report: {tmp_path / 'report.html'}"]
    # The job saw the stop file and stopped by itself, a few steps later at most.
    stopped_after = int(job_out.split("stopped by the stop file after step ")[1])
    assert 30 <= stopped_after < 2000
    assert json.loads(stop_file.read_text())["kind"] == "nonfinite"
    assert ran.read_text().split() == ["nonfinite", "30"]
    assert "nonfinite" in (tmp_path / "report.html").read_text() and not (tmp_path / "run" / "report.html").exists()
    # The alert reached the (local) Slack webhook before we exited.
    texts = [p["json"]["text"] for p in inbox.posts]
    assert inbox.posts[0]["path"] == "/hook" and any("nonfinite" in t and "30" in t for t in texts)
    # The run log has the steps up to the halt and the findings, as an integration writes it.
    lines = [json.loads(x) for x in (tmp_path / "run" / "runlog.jsonl").read_text().splitlines()]
    assert lines[0] == {"type": "segment", "segment": 0, "start_step": 0, "reason": "start"}
    assert [x["step"] for x in lines if x["type"] == "step"] == list(range(1, 31))
    assert [(x["step"], x["kind"]) for x in lines if x["type"] == "finding"
            and x["severity"] == "critical"] == [(30, "nonfinite"), (30, "rollback_advice")]


@pytest.mark.slow
def test_follow_ends_with_the_job_and_follows_its_rotated_log(tmp_path):
    log, go, runlog = tmp_path / "train.log", tmp_path / "go", tmp_path / "run" / "runlog.jsonl"
    job = _job(log, "--steps", 80, "--rotate-at", 41, "--go-file", go)
    follower = subprocess.Popen(_follow_cmd(log, "--pid", job.pid, "--run-dir", tmp_path / "run"),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    # The run log's segment line is written with the first record: the follower has the first
    # file open. Only then does the job rotate it (renamed to train.log.1, a new train.log).
    deadline = time.monotonic() + 120
    while not (runlog.exists() and runlog.read_text()):
        assert follower.poll() is None and time.monotonic() < deadline, follower.communicate()
        time.sleep(0.02)
    go.touch()
    out, err = follower.communicate(timeout=180)
    assert job.wait(120) == 0
    assert follower.returncode == 0, out + err
    assert _end_block(out)[:3] == [f"stability: following ended at step 80 (process {job.pid} ended), not halted",
                                   "  steps watched: 80 (1-80)", "  findings: none"]
    steps = [json.loads(x)["step"] for x in runlog.read_text().splitlines() if '"type":"step"' in x]
    assert steps == list(range(1, 81))
    assert (tmp_path / "train.log.1").read_text().count("step:") == 40


def test_follow_reports_unreadable_input_and_bad_flags(tmp_path):
    log = tmp_path / "notes.log"
    log.write_text("hello\nno metrics here\n")
    r = _follow(log, "--idle-exit-s", 0.3, "--run-dir", tmp_path / "run")
    assert r.returncode == 2 and "unknown log format" in r.stderr and "Traceback" not in r.stderr
    r = _follow(log, "--poll-s", 0, "--run-dir", tmp_path / "run")
    assert r.returncode == 2 and "--poll-s" in r.stderr
    r = _follow(tmp_path / "x.csv", "--format", "tensorboard", "--idle-exit-s", 0.3)
    assert r.returncode == 2 and "cannot be followed" in r.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("policy: {halt_on: warnings}\n")
    r = _follow(log, "--config", bad, "--idle-exit-s", 0.3, "--run-dir", tmp_path / "run")
    assert r.returncode == 2 and "policy.halt_on" in r.stderr and "Traceback" not in r.stderr


# ---------------------------------------------------------------------------------------------
# Where the follower writes: the job's W&B run, its run folder; what it prints.

@pytest.fixture(scope="module")
def finished_log(tmp_path_factory):
    """A finished job's log: 40 torchtitan-style steps, NaN from step 30 on."""
    log = tmp_path_factory.mktemp("job") / "train.log"
    job = _job(log, "--nan-at", 30, "--steps", 40)
    assert job.wait(120) == 0
    return log


@pytest.mark.slow
def test_follow_writes_into_the_jobs_wandb_run_and_prints_each_finding_once(tmp_path, finished_log):
    """``--wandb-run-id`` (offline W&B): the follower joins that run and writes the
    ``stability/<key>`` scalars of every step and the alerts there; each finding is printed once
    (no second copy from the log sink on stderr)."""
    pytest.importorskip("wandb")
    from test_alerts import _wandb_records_when_complete

    config = tmp_path / "c.yaml"
    config.write_text("actions:\n  log: {}\n  wandb: {min_severity: critical}\n")
    wandb_dir = tmp_path / "wandb"
    wandb_dir.mkdir()
    r = _follow(finished_log, "--idle-exit-s", 0.5, "--config", config, "--run-dir", tmp_path / "run",
                "--wandb-project", "stab", "--wandb-run-id", "job42",
                env=_env(WANDB_MODE="offline", WANDB_DIR=str(wandb_dir), WANDB_SILENT="true"))
    assert r.returncode == 1, r.stderr
    assert r.stdout.count("step 30 nonfinite") == 1 and "nonfinite" not in r.stderr
    (run_file,) = wandb_dir.rglob("run-job42.wandb")
    records = _wandb_records_when_complete(run_file)
    rows = [{i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in x.history.item}
            for x in records if x.WhichOneof("record_type") == "history"]
    assert [row["stability/step"] for row in rows if "stability/loss" in row] == list(range(1, 41))
    alerts = [(x.alert.title, x.alert.level) for x in records if x.WhichOneof("record_type") == "alert"]
    assert ("stability: nonfinite (critical)", "ERROR") in alerts


def test_follow_without_a_wandb_run_says_why_and_keeps_its_run_next_to_the_log(tmp_path, finished_log):
    config = tmp_path / "c.yaml"
    config.write_text("actions:\n  wandb: {}\n")
    log = tmp_path / "train.log"
    log.write_bytes(finished_log.read_bytes())
    env = _env()
    env.pop("WANDB_RUN_ID", None)
    r = _follow(log, "--idle-exit-s", 0.5, "--config", config, "--advice", "all", env=env)
    assert r.returncode == 1, r.stderr
    assert r.stderr.count("actions.wandb is off: no W&B run to write to") == 1 and "failed" not in r.stderr
    # --advice all: the advice in each framework's terms (auto: none for a torchtitan log).
    forms = [line.split(":")[0].strip() for line in r.stdout.splitlines() if re.match(r"    \S", line)]
    assert forms == ["hf", "lightning", "megatron", "deepspeed"]
    steps = [json.loads(x)["step"] for x in (tmp_path / "stability" / "runlog.jsonl").read_text().splitlines()
             if '"type":"step"' in x]
    assert steps == list(range(1, 41))


def test_follow_with_an_unwritable_run_dir_warns_once_and_keeps_alerting(tmp_path, finished_log, inbox):
    (tmp_path / "a-file").write_text("not a folder")
    config = tmp_path / "c.yaml"
    config.write_text("actions:\n  slack: {webhook_url: '${SLACK_WEBHOOK_URL}', min_severity: critical}\n")
    r = _follow(finished_log, "--idle-exit-s", 0.5, "--config", config, "--run-dir", tmp_path / "a-file" / "run",
                env=_env(SLACK_WEBHOOK_URL=f"http://127.0.0.1:{inbox.server_address[1]}/hook"))
    assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
    assert r.stderr.count("cannot write the run log") == 1
    assert any("nonfinite" in p["json"]["text"] for p in inbox.posts)


@pytest.mark.slow
def test_follow_of_a_log_without_step_numbers_says_so_in_every_finding_once(tmp_path):
    """HF Trainer dict lines print no step: the follower counts records, as the offline replay
    does, and each finding says so where the engineer reads it (the console, the run log, the
    alerts), once; rollback advice names no checkpoint step or batches."""
    log = tmp_path / "train.log"
    losses = [2.0 - 0.01 * i + 0.01 * (i % 3) for i in range(60)]
    for i in range(40, 43):
        losses[i] = 9.0                    # records 41-43
    log.write_text("".join(f"{{'loss': {x:.4f}, 'grad_norm': 1.0, 'learning_rate': 0.0003, "
                           f"'epoch': {i / 60:.2f}}}\n" for i, x in enumerate(losses)))
    r = _follow(log, "--idle-exit-s", 0.5, "--json", tmp_path / "f.jsonl")
    assert r.returncode in (0, 1), r.stderr
    printed = [line for line in r.stdout.splitlines() if line.startswith("[warning] step 41 loss_spike")]
    assert len(printed) == 1 and printed[0].count("is record number 41 of the log") == 1
    logged = [json.loads(x) for x in (tmp_path / "stability" / "runlog.jsonl").read_text().splitlines()]
    spikes = [x for x in logged if x["type"] == "finding" and x["kind"] == "loss_spike"]
    assert [x["step"] for x in spikes] == [41] and spikes[0]["details"]["step_is_record_number"] is True
    assert spikes[0]["message"].count("of the log, which prints no step numbers") == 1
    found = [json.loads(x) for x in (tmp_path / "f.jsonl").read_text().splitlines()][1:]
    assert all(f["details"]["step_is_record_number"] and f["message"].count("of the log, which prints no step numbers") == 1
               for f in found)


def test_follow_of_a_reinforcement_learners_log_judges_its_loss_as_an_objective(tmp_path):
    """A log whose first lines name a critic's term (`value_loss`): an A2C's summed loss grows
    x30 with the returns; the follower is told before the first record, as replay is: no
    divergence, and the account's note says why. Without the name it is a divergence."""
    rng = random.Random(7)
    rows = [(s, 0.5 * (20.0 * (1 + 9 * s / 1200)) ** 2 / 10 * math.exp(rng.gauss(0, 0.6))) for s in range(1, 1201)]
    log = tmp_path / "train.log"
    log.write_text("".join(f"step {s} | loss {x / 2:.4f} | value_loss {x:.4f}\n" for s, x in rows))
    r = _follow(log, "--idle-exit-s", 0.5, "--json", tmp_path / "f.jsonl")
    assert r.returncode == 0, r.stderr
    account, *found = [json.loads(x) for x in (tmp_path / "f.jsonl").read_text().splitlines()]
    assert [f["kind"] for f in found if f["severity"] != "info"] == []
    assert any("reinforcement learner's name ('value_loss')" in n for n in account["notes"])
    log.write_text("".join(f"step {s} | loss {x / 2:.4f}\n" for s, x in rows))
    r = _follow(log, "--idle-exit-s", 0.5, "--json", tmp_path / "g.jsonl")
    found = [json.loads(x) for x in (tmp_path / "g.jsonl").read_text().splitlines()][1:]
    assert [(f["step"], f["kind"]) for f in found if f["severity"] == "critical"][:1] == [(299, "divergence")]


# ---------------------------------------------------------------------------------------------
# How following ends: as a live run does (docs/integrations.md, The end of a run), every way.

def _nan_log(path, *, steps: int = 40, nan_at: int | None = 30) -> Path:
    path.write_text("".join(f"step {s} | loss {'nan' if s == nan_at else f'{2.0 + 1.0 / s:.4f}'}\n"
                            for s in range(1, steps + 1)))
    return path


@pytest.mark.end_report
@pytest.mark.parametrize("halt", [False, True], ids=["idle", "halt"])
def test_follow_ends_with_the_summary_block_and_the_report_next_to_its_run_log(tmp_path, capsys, halt):
    """The log stops growing (``--idle-exit-s``) or a halt (exit 3): the summary block, the same
    as a live run's, from the same code (``Outcome``); the report next to the run log."""
    from stability_callbacks.cli import main

    log = _nan_log(tmp_path / "train.log")
    config = tmp_path / "c.yaml"
    config.write_text(f"policy: {{halt_on: {'critical' if halt else 'never'}}}\n")
    code = main(["replay", str(log), "--follow", "--idle-exit-s", "0.3", "--poll-s", "0.02", "--config", str(config)])
    out = capsys.readouterr().out
    run = tmp_path / "stability"
    advice = "  roll back: Roll back: nonfinite at step 30; the episode began at step 30. Resume from the newest " \
             "checkpoint saved before step 30 (the log names none) and skip the batches of steps 30-30 (1 step)."
    assert _end_block(out) == [
        ("stability: following halted at step 30: nonfinite (critical) at step 30; policy.halt_on = critical"
         if halt else "stability: following ended at step 40 (no new line for 0.3 s), not halted"),
        *(["  the job: no --stop-file or --on-halt given: stop the job yourself"] if halt else []),
        f"  steps watched: {30 if halt else 40} (1-{30 if halt else 40})",
        # not halted, the loss back at its level for 10 steps after the NaN: saves resume, and
        # there is no rollback left to advise
        *(["  findings: critical: nonfinite x1 (step 30), rollback_advice x1 (step 30)",
           advice + " If it happens again at the same place, change the seed or the data order (PaLM, BigScience)."]
          if halt else ["  findings: critical: nonfinite x1 (step 30), rollback_advice x1 (step 30); "
                        "info: saves_resumed x1 (step 40)"]),
        f"  run log: {run / 'runlog.jsonl'}", f"  report: {run / 'report.html'}"]
    assert code == (3 if halt else 1)
    html = (run / "report.html").read_text()
    assert "rollback_advice" in html and ("following halted at step 30" if halt else "following ended") in html


def test_follow_with_the_report_off_says_so_at_its_end(tmp_path, capsys):
    from stability_callbacks.cli import main

    log = _nan_log(tmp_path / "train.log", nan_at=None)
    config = tmp_path / "c.yaml"
    config.write_text("report: {enabled: false}\n")
    assert main(["replay", str(log), "--follow", "--idle-exit-s", "0.3", "--poll-s", "0.02", "--config", str(config)]) == 0
    assert _end_block(capsys.readouterr().out)[-2:] == [f"  run log: {tmp_path / 'stability' / 'runlog.jsonl'}",
                                                        "  report: none (report.enabled is false)"]
    assert not (tmp_path / "stability" / "report.html").exists()


@pytest.mark.slow
@pytest.mark.parametrize("sig, said", [("SIGTERM", "SIGTERM"), ("SIGINT", "Ctrl-C")])
def test_a_follower_stopped_by_a_signal_ends_with_its_summary_and_report(tmp_path, sig, said):
    """A scheduler ends the job and its sidecar with SIGTERM; a user presses Ctrl-C: the follower
    reads what the log holds, then ends as for any other reason (summary, report, exit code)."""
    import signal

    log = _nan_log(tmp_path / "train.log")
    runlog = tmp_path / "stability" / "runlog.jsonl"
    follower = subprocess.Popen(_follow_cmd(log), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=_env())
    deadline = time.monotonic() + 60
    # The advice at step 30 is flushed to the run log once read; the 10 lines after it came in
    # the same read, before the follower next looks for news (and for the signal).
    while not (runlog.exists() and '"rollback_advice"' in runlog.read_text()):
        assert follower.poll() is None and time.monotonic() < deadline, follower.communicate()
        time.sleep(0.02)
    follower.send_signal(getattr(signal, sig))
    out, err = follower.communicate(timeout=60)
    assert follower.returncode == 1, out + err
    end = _end_block(out)
    assert end[:2] == [f"stability: following ended at step 40 ({said}), not halted", "  steps watched: 40 (1-40)"]
    assert end[-2:] == [f"  run log: {runlog}", f"  report: {runlog.with_name('report.html')}"]
    assert "Traceback" not in err and "nonfinite" in runlog.with_name("report.html").read_text()
