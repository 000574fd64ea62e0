"""Resume auditor end to end with the HF Trainer: a rollback to an older checkpoint leaves a run
log whose stitched timeline keeps the abandoned branch apart (issue: honest plots after rollbacks)."""
from __future__ import annotations

import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
from test_hf import _args  # noqa: E402
from transformers import Trainer  # noqa: E402

from stability_callbacks.demo.scenarios import build_scenario  # noqa: E402
from stability_callbacks.integrations.hf import StabilityCallback  # noqa: E402
from stability_callbacks.replay.timeline import stitch  # noqa: E402


@pytest.mark.slow
def test_rollback_to_an_older_checkpoint_gives_a_stitched_timeline(tmp_path):
    torch.set_num_threads(1)
    sc = build_scenario("healthy", max_steps=30)
    out, run_dir = tmp_path / "hf", tmp_path / "stability"
    config = {"actions": {}}
    first = Trainer(model=sc.make_model(), args=_args(out, sc, max_steps=30, save_steps=10),
                    train_dataset=sc.train_dataset())
    StabilityCallback.attach(first, config=config, run_dir=run_dir)
    first.train()
    # Roll back: resume the same run from the older checkpoint-10, into the same run log.
    again = Trainer(model=sc.make_model(), args=_args(out, sc, max_steps=30, save_steps=10),
                    train_dataset=sc.train_dataset())
    cb = StabilityCallback.attach(again, config=config, run_dir=run_dir)
    again.train(resume_from_checkpoint=str(out / "checkpoint-10"))
    assert [(f.step, f.kind) for f in cb.findings if f.severity != "info"] == []
    assert cb.findings[0].kind == "resume" and cb.findings[0].step == 10

    tl = stitch(run_dir / "runlog.jsonl")
    assert [(s["segment"], s["start_step"], s["reason"]) for s in tl.segments] == [
        (0, 0, "start"), (1, 10, "resume")]
    assert [r.step for r in tl.live] == list(range(1, 31))
    assert sorted(r.step for r in tl.superseded) == list(range(11, 31))   # the abandoned branch
    assert [r.segment for r in tl.live] == [0] * 10 + [1] * 20

    png = tmp_path / "timeline.png"
    r = subprocess.run([sys.executable, "-m", "stability_callbacks", "timeline", str(run_dir / "runlog.jsonl"),
                        "--png", str(png)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "30 live steps, 20 superseded" in r.stdout
    assert png.stat().st_size > 10_000
