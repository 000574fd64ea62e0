"""StepProbe across 2 ranks (gloo, CPU): reduced Adam stats equal a full-gather reference, the
per-tensor summary (update norm, layers/...) included.

One torchrun launch of tests/dist/probe_worker.py covers DDP, FSDP2 (uneven and empty shards),
DeepSpeed ZeRO 0/1/2/3 and BF16_Optimizer, in fp32 and bf16 (~60 s on 2 busy cores).
"""
import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
import torch.distributed as dist  # noqa: E402

from stability_callbacks import keys  # noqa: E402
from stability_callbacks.integrations.torch.layers import ALPHA, WARM_SAMPLES  # noqa: E402

pytestmark = pytest.mark.slow   # several ranks

if not dist.is_available():  # pragma: no cover
    pytest.skip("torch.distributed unavailable", allow_module_level=True)

HAVE_DEEPSPEED = importlib.util.find_spec("deepspeed") is not None
WORKER = Path(__file__).parent / "dist" / "probe_worker.py"
CASES = ["ddp_fp32", "ddp_bf16", "fsdp2_fp32", "fsdp2_bf16"]
DS_CASES = [f"zero{s}_{d}" for d in ("fp32", "bf16") for s in range(4)] + ["zero1_bf16_fp32acc"]
NUMEL = 16 * 33 + 16 + 7 * 16 + 7 + 7 + 1   # 671: odd, so ZeRO pads rank 1's partition
STEPS = 6   # tests/dist/probe_worker.py


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
    assert last["step"] == STEPS
    m, ref = last["metrics"], c0["ref"]
    assert m["adam/exp_avg_sq_max"] == ref["max"]                 # MAX is exact
    assert m["adam/exp_avg_sq_l1"] == pytest.approx(ref["l1"], rel=1e-6)   # SUM order only
    assert m["adam/exp_avg_sq_numel"] == ref["numel"] == NUMEL     # no padding, no double count
    assert m["param_norm"] == pytest.approx(ref["param_norm"], rel=1e-6)
    # per-rank losses differ: the record holds their mean; fingerprints add up exactly
    assert m["loss"] == pytest.approx(ref["loss"], rel=1e-6)
    assert m["batch_fingerprint"] == ref["fingerprint"]
    assert m["lr"] == 0.01
    assert m["loss/rank0_only"] == 0.25 * STEPS       # only rank 0 set it
    assert "loss/undeclared" not in m and "loss/never_set" not in m
    # Adam's beta2 and update count, from the param groups and the state's step (no collective)
    t = ref["adam_step"]
    assert [(r["metrics"]["adam/beta2"], r["metrics"]["adam/step"]) for r in c0["records"]] == [
        (0.98, t - STEPS + k) for k in range(1, STEPS + 1)]
    assert t == STEPS + (name == "zero0_bf16")   # FP16_UnfusedOptimizer's own first step
    # the first moment and the per-tensor summary, against the same reference
    assert m["adam/beta1"] == 0.9
    assert m["adam/exp_avg_norm"] == pytest.approx(ref["exp_avg_norm"], rel=1e-6)
    want = reference_layers(c0["ref"]["history"])
    for rec, step_ref in zip(c0["records"], want):
        assert rec["metrics"]["update_norm"] == pytest.approx(step_ref["update_norm"], rel=1e-6)
        assert ("layers/top1/update_ratio" in rec["metrics"]) == ("layers/top1/update_ratio" in step_ref)
    # the device pass (its pointer table, CPU tensors taking it) on each rank's local state
    for c in (c0, c1):
        d = c["ref"]["device_path"]
        assert d["max_equal"] and d["numel"][0] == d["numel"][1], d
        assert max(d["l1_rel"], d["m_rel"], d["per_tensor_rel"]) < 1e-6, d
    got = {k: v for k, v in m.items() if k.startswith("layers/")}
    assert set(got) == set(want[-1]) - {"update_norm"}
    for k, v in want[-1].items():
        assert m[k] == (v if k.endswith("/tensor") else pytest.approx(v, rel=1e-6)), k


def reference_layers(history, lr=0.01, beta1=0.9, beta2=0.98, eps=1e-8):
    """The per-tensor summary recomputed in float64 from the full (unsharded) per-tensor sums of
    every step (tests/dist/probe_worker.py): the definitions of integrations/torch/layers.py."""
    out, base = [], None
    for j, h in enumerate(history):
        t = h["t"]
        c1, c2 = 1 - beta1 ** t, 1 - beta2 ** t
        logx = []
        update_sq = 0.0
        parts = []
        for s_v, q_m, n in h["tensors"]:
            m = math.sqrt(q_m) / c1
            v = s_v / (n * c2)
            d = m / (math.sqrt(v) + eps)
            update_sq += (lr * d) ** 2
            parts.append((lr * d) ** 2)
            logx.append([math.log(max(x, 1e-30)) for x in (d, m, v)])
        base = base or logx
        ratio = [[math.exp(a - b) for a, b in zip(row, brow)] for row, brow in zip(logx, base)]
        alpha = max(ALPHA, 1.0 / (j + 1))
        base = [[b + alpha * (a - b) for a, b in zip(row, brow)] for row, brow in zip(logx, base)]
        rec = {"update_norm": math.sqrt(update_sq)}
        if j >= WARM_SAMPLES:
            half = (len(ratio) + 1) // 2

            def gmean(rows, i):
                return math.exp(sum(math.log(r[i]) for r in rows) / len(rows))
            rec.update({keys.LAYERS_LOWER_UPDATE_RATIO: gmean(ratio[:half], 0),
                        keys.LAYERS_UPPER_UPDATE_RATIO: gmean(ratio[half:], 0),
                        keys.LAYERS_LOWER_EXP_AVG_RATIO: gmean(ratio[:half], 1),
                        keys.LAYERS_UPPER_EXP_AVG_RATIO: gmean(ratio[half:], 1)})
            top = sorted(range(len(ratio)), key=lambda i: -ratio[i][0])[:keys.LAYERS_TOP]
            for k, i in enumerate(top, 1):
                rec.update({keys.layer_top(k, "tensor"): float(i),
                            keys.layer_top(k, "update_ratio"): ratio[i][0],
                            keys.layer_top(k, "exp_avg_ratio"): ratio[i][1],
                            keys.layer_top(k, "exp_avg_sq_ratio"): ratio[i][2],
                            keys.layer_top(k, "update_share"): parts[i] / update_sq})
        out.append(rec)
    return out


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
