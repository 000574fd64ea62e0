"""``scripts/gpu_check.py --device cpu``: the GPU proof's code paths on CPU, CI's smoke test of the
script whoever gets a GPU will run cold (issue 24). Tiny models, 5 ordinary steps per host-sync
check; ~1.5 min on 2 idle cores (three processes: torch, HF + Lightning, DeepSpeed)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow   # the GPU checks' CPU run

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("lightning")
pytest.importorskip("deepspeed")

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "gpu_check.py"


def _run(*args, timeout=900):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--device", "cpu", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout)
    return proc, json.loads(proc.stdout.strip().splitlines()[-1]) if proc.stdout.strip() else None


def test_every_check_runs_on_cpu_and_passes_or_says_it_needs_cuda(tmp_path):
    proc, out = _run("--ordinary-steps", "5", "--budget-s", "840", "--json", str(tmp_path / "out.json"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert json.loads((tmp_path / "out.json").read_text()) == out
    checks = {c["check"]: c for c in out["checks"]}
    assert list(checks) == ["probe_cost_fp32", "probe_cost_bf16", "step_overhead", "fp16_grad_scaler", "skip_step",
                            "hostsync_hf", "hostsync_lightning", "fsdp2_lightning", "fsdp2_hf", "hostsync_deepspeed"]
    assert {n: c["status"] for n, c in checks.items() if c["status"] != "ok"} == {"fsdp2_hf": "skipped"}
    assert checks["fsdp2_hf"]["figure"].startswith("needs CUDA")
    # the table: one row per check, a skip says why
    table = proc.stdout.splitlines()
    assert table[0].startswith("gpu_check on CPU") and any(
        line.split()[:4] == ["fsdp2_hf", "skipped", "needs", "CUDA"] for line in table)
    # what each check found, not only that it passed
    for name in ("probe_cost_fp32", "probe_cost_bf16"):
        assert checks[name]["data"]["pass_exact"]["max_equal"] is True
        assert "tiny GPT-2 on CPU" in checks[name]["figure"]
    assert checks["fp16_grad_scaler"]["data"]["skipped"] == [6]
    assert checks["skip_step"]["data"] == {"flagged": [8], "package": {}}
    for name in ("hostsync_hf", "hostsync_lightning", "hostsync_deepspeed"):
        assert checks[name]["data"]["package"] == {} and "5 ordinary steps" in checks[name]["figure"]
    rec, ref = checks["fsdp2_lightning"]["data"]["record"], checks["fsdp2_lightning"]["data"]["reference"]
    assert rec["adam/exp_avg_sq_max"] == ref["max"]


def test_the_budget_guard_skips_what_would_not_fit_and_says_so():
    proc, out = _run("--budget-s", "1", timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    reasons = {c["check"]: c["figure"] for c in out["checks"]}
    assert reasons.pop("fsdp2_hf").startswith("needs CUDA")
    assert all(r.startswith("budget: ") for r in reasons.values()), reasons


def test_an_unknown_check_is_an_error_naming_it():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--only", "probe_cost,nope"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "unknown check(s) ['probe_cost', 'nope']" in proc.stderr
