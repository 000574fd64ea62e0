"""StepProbe across 2 ranks (gloo, CPU): reduced Adam stats equal a full-gather reference.

One torchrun launch of tests/dist/probe_worker.py covers DDP, FSDP2 (uneven and empty shards),
DeepSpeed ZeRO 0/1/2/3 and BF16_Optimizer, in fp32 and bf16 (~30 s on 2 busy cores).
"""
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

if not dist.is_available():  # pragma: no cover
    pytest.skip("torch.distributed unavailable", allow_module_level=True)

HAVE_DEEPSPEED = importlib.util.find_spec("deepspeed") is not None
WORKER = Path(__file__).parent / "dist" / "probe_worker.py"
CASES = ["ddp_fp32", "ddp_bf16", "fsdp2_fp32", "fsdp2_bf16"]
DS_CASES = [f"zero{s}_{d}" for d in ("fp32", "bf16") for s in range(4)] + ["zero1_bf16_fp32acc"]
NUMEL = 16 * 33 + 16 + 7 * 16 + 7 + 7 + 1   # 671: odd, so ZeRO pads rank 1's partition


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("probe_dist")
    env = dict(os.environ, DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1",
               PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           str(WORKER), str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]


def _case(results, name):
    for r in results:
        c = r["cases"][name]
        assert "error" not in c, c.get("trace")
    return [r["cases"][name] for r in results]


@pytest.mark.parametrize("name", CASES + (DS_CASES if HAVE_DEEPSPEED else []))
def test_reduced_adam_stats_equal_the_full_gather_reference(results, name):
    c0, c1 = _case(results, name)
    # every rank gets the same records, bit for bit (they decide the same)
    assert c0["records"] == c1["records"]
    last = c0["records"][-1]
    assert last["step"] == 2
    m, ref = last["metrics"], c0["ref"]
    assert m["adam/exp_avg_sq_max"] == ref["max"]                 # MAX is exact
    assert m["adam/exp_avg_sq_l1"] == pytest.approx(ref["l1"], rel=1e-6)   # SUM order only
    assert m["adam/exp_avg_sq_numel"] == ref["numel"] == NUMEL     # no padding, no double count
    assert m["param_norm"] == pytest.approx(ref["param_norm"], rel=1e-6)
    # per-rank losses differ: the record holds their mean; fingerprints add up exactly
    assert m["loss"] == pytest.approx(ref["loss"], rel=1e-6)
    assert m["batch_fingerprint"] == ref["fingerprint"]
    assert m["lr"] == 0.01
    assert m["loss/rank0_only"] == 0.5                 # only rank 0 set it (0.25 * step 2)
    assert "loss/undeclared" not in m and "loss/never_set" not in m
    # Adam's beta2 and update count, from the param groups and the state's step (no collective)
    t = ref["adam_step"]
    assert [(r["metrics"]["adam/beta2"], r["metrics"]["adam/step"]) for r in c0["records"]] == [(0.98, t - 1), (0.98, t)]
    assert t == (3.0 if name == "zero0_bf16" else 2.0)   # FP16_UnfusedOptimizer's own first step


def test_fsdp2_case_really_has_uneven_and_empty_shards(results):
    c0, c1 = _case(results, "fsdp2_fp32")
    assert c0["ref"]["local_numels"] == [264, 8, 64, 4, 7, 1]
    assert c1["ref"]["local_numels"] == [264, 8, 48, 3, 0, 0]


@pytest.mark.skipif(not HAVE_DEEPSPEED, reason="deepspeed not installed")
def test_deepspeed_cases_use_the_intended_optimizers_and_reuse_their_grad_norm(results):
    kinds = {n: _case(results, n)[0]["ref"]["optimizer"] for n in DS_CASES}
    assert kinds["zero0_fp32"] == "AdamW"
    assert kinds["zero0_bf16"] == "FP16_UnfusedOptimizer"
    assert kinds["zero1_bf16"] == kinds["zero2_fp32"] == "DeepSpeedZeroOptimizer"
    assert kinds["zero3_bf16"] == "DeepSpeedZeroOptimizer_Stage3"
    assert kinds["zero1_bf16_fp32acc"] == "BF16_Optimizer"
    for n in DS_CASES:
        m = _case(results, n)[0]["records"][-1]["metrics"]
        # ZeRO-0 fp32 hands out no norm (None); every other configuration does
        assert ("grad_norm" in m) == (n != "zero0_fp32"), n
        readings = _case(results, n)[0]["ref"]["readings"]
        assert readings["loss_scale"] is None and readings["skipped_steps"] == 0   # no fp16
    grad_norm_types = {n: _case(results, n)[0]["ref"]["readings"]["grad_norm_type"]
                       for n in ("zero0_fp32", "zero0_bf16", "zero1_fp32", "zero3_fp32")}
    assert grad_norm_types == {"zero0_fp32": "NoneType", "zero0_bf16": "float",
                               "zero1_fp32": "Tensor", "zero3_fp32": "Tensor"}
