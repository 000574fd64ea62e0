"""The launchers jobs are started with, 2 CPU processes each (gloo), a NaN planted at step 22 and
``policy.halt_on: critical``: both ranks find it at that step and halt there, rank 0 alone writes
the run log, and the job exits 0. Every launch runs in its own process group under a timeout:
a hang fails the test and leaves no process behind.

- ``torchrun --nproc_per_node 2``: HF Trainer, DDP (tests/dist/hf_worker.py).
- ``accelerate launch --multi_gpu --num_processes 2``: the same worker; the Trainer asks for the
  CPU (``use_cpu=True``), so accelerate runs it as ``MULTI_CPU`` over gloo. ``accelerate launch
  --cpu --num_processes 2`` is not a 2-process launch: without ``--mpirun_hostfile`` accelerate
  1.15 starts the script once (``simple_launcher``; its multi-CPU launch is mpirun's).
- ``deepspeed --num_accelerators 2`` (alias ``--num_gpus``) with ``DS_ACCELERATOR=cpu``: a raw
  DeepSpeed engine, ZeRO-2, ``attach(engine)`` (tests/dist/ds_scenarios.py, case ``halt-z2``).
  The launcher starts that many local processes whatever the CPU accelerator counts (one NUMA
  node here), and hands each ``--local_rank=N``. ``--bind_cores_to_rank`` needs numactl.

Each launch is ~20-30 s on 2 idle cores, nearly all of it two processes importing torch,
transformers and DeepSpeed.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow   # torchrun, accelerate and deepspeed launchers

pytest.importorskip("torch")
pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parent.parent
DIST = ROOT / "tests" / "dist"
BIN = Path(sys.executable).parent          # the environment's console scripts
TIMEOUT_S = 300
NAN_STEP = 22                              # build_scenario("nan")'s planted NaN
HALT = f"nonfinite (critical) at step {NAN_STEP}; policy.halt_on = critical"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _script(name: str) -> str:
    path = BIN / name
    assert path.is_file(), f"{name} is not installed next to {sys.executable}"
    return str(path)


def _launch(cmd: list[str], out: Path, **env) -> str:
    """Run ``cmd`` in a new session; past the timeout, kill its whole process group (the
    launcher and every rank it started) and fail. Returns the output."""
    env = dict(os.environ, OMP_NUM_THREADS="1", DS_ACCELERATOR="cpu",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]), **env)
    proc = subprocess.Popen(cmd, cwd=out, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
        pytest.fail(f"{Path(cmd[0]).name} still running after {TIMEOUT_S}s (a hang):\n{output[-4000:]}")
    assert proc.returncode == 0, f"{Path(cmd[0]).name} exited {proc.returncode}:\n{output[-4000:]}"
    return output


def _runlog(run_dir: Path) -> list[dict]:
    with open(run_dir / "runlog.jsonl") as fh:
        return [json.loads(line) for line in fh]


def _written_once(run_dir: Path, findings: list[tuple]) -> None:
    """One writer: every step 1..NAN_STEP once, every finding once, one stop, at the NaN."""
    lines = _runlog(run_dir)
    assert [x["step"] for x in lines if x["type"] == "step"] == list(range(1, NAN_STEP + 1))
    assert [(x["step"], x["kind"], x["severity"]) for x in lines if x["type"] == "finding"] == findings
    assert [(x["step"], x["reason"]) for x in lines if x["type"] == "action" and x["action"] == "stop"] == [
        (NAN_STEP, HALT)]


# HF: the warmup ends at step 6, the first at the peak LR (docs/findings.md); its risk window
# (steps 7-24) holds the NaN at 22: a warmup instability too, as under DeepSpeed.
HF_FINDINGS = [(6, "warmup_end", "info"), (NAN_STEP, "nonfinite", "critical"),
               (NAN_STEP, "warmup_instability", "critical"), (NAN_STEP, "rollback_advice", "critical")]


def _hf_launch(tmp_path, launcher: list[str], **env) -> list[dict]:
    output = _launch([*launcher, str(DIST / "hf_worker.py"), "--backend", "ddp", "--scenario", "nan",
                      "--halt-on", "critical", "--out", str(tmp_path)], tmp_path, **env)
    # The alert sinks are rank 0's: the log sink prints the critical once for the whole job, and
    # rank 0 the summary at the end.
    assert output.count(f"CRITICAL: nonfinite at step {NAN_STEP}") == 1, output[-4000:]
    assert output.count(f"stability: the run halted at step {NAN_STEP}: {HALT}") == 1, output[-4000:]
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]


def _assert_hf_halted_together(ranks: list[dict], tmp_path: Path) -> None:
    for r, rank in enumerate(ranks):
        assert (rank["rank"], rank["world"], rank["distributed_type"]) == (r, 2, "MULTI_CPU")
        assert [(f["step"], f["kind"], f["severity"]) for f in rank["findings"]] == HF_FINDINGS
        assert rank["global_step"] == NAN_STEP            # halted at the NaN step itself
        assert rank["checkpoints"] == []                  # NaN weights: no save before the halt
        # Halted, and why, on every rank; the report next to the run log is rank 0's.
        assert rank["outcome"] == {"halted": True, "halted_at": NAN_STEP, "reason": HALT, "exit_code": 3,
                                   "report": r == 0}
    assert ranks[0]["findings"] == ranks[1]["findings"]   # the same decisions, word for word
    _written_once(tmp_path / "stability", HF_FINDINGS)
    assert "rollback_advice" in (tmp_path / "stability" / "report.html").read_text()


def test_torchrun(tmp_path):
    ranks = _hf_launch(tmp_path, [_script("torchrun"), "--nproc_per_node", "2",
                                  "--master_port", str(_free_port())])
    _assert_hf_halted_together(ranks, tmp_path)


def test_accelerate_launch(tmp_path):
    pytest.importorskip("accelerate")
    # HF_HOME: no accelerate config file of this machine's user is read.
    ranks = _hf_launch(tmp_path, [_script("accelerate"), "launch", "--multi_gpu", "--num_processes", "2",
                                  "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
                                  "--main_process_port", str(_free_port())], HF_HOME=str(tmp_path / "hf"))
    _assert_hf_halted_together(ranks, tmp_path)


def test_deepspeed_launcher(tmp_path):
    pytest.importorskip("deepspeed")
    output = _launch([_script("deepspeed"), "--num_accelerators", "2", "--master_port", str(_free_port()),
                      str(DIST / "ds_scenarios.py"), str(tmp_path), "halt-z2"], tmp_path)
    ranks = [json.loads((tmp_path / f"halt-z2.rank{r}.json").read_text()) for r in (0, 1)]
    # DeepSpeed's linear WarmupLR over 5 steps reaches its peak at step 7 (W + 2: the first step
    # at the peak LR), so the NaN at 22 is inside the risk window: also a warmup instability.
    findings = [(7, "warmup_end", "info"), (NAN_STEP, "nonfinite", "critical"),
                (NAN_STEP, "warmup_instability", "critical"), (NAN_STEP, "rollback_advice", "critical")]
    for rank in ranks:
        assert rank["world"] == 2
        assert [tuple(f) for f in rank["findings"]] == findings
        assert rank["stopped_at"] == rank["train"]["left_at"] == NAN_STEP
        assert rank["saved_steps"] == []
        assert {k: rank["outcome"][k] for k in ("halted", "halted_at", "reason", "exit_code")} == {
            "halted": True, "halted_at": NAN_STEP, "reason": HALT, "exit_code": 3}
        assert rank["outcome"]["advice"].startswith("no checkpoint was saved before step ")   # DeepSpeed's form
    assert ranks[0]["findings"] == ranks[1]["findings"]
    _written_once(tmp_path / "halt-z2", findings)
    assert output.count(f"stability: the run halted at step {NAN_STEP}: {HALT}") == 1, output[-4000:]
    assert (tmp_path / "halt-z2" / "report.html").is_file()
