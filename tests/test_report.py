"""The replay report: panels, findings marked and listed, self-contained HTML, speed."""
from __future__ import annotations

import base64
import re
import struct
import time
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

from stability_callbacks.record import Finding, StepRecord
from stability_callbacks.replay.readers import read_records
from stability_callbacks.replay.report import render_figure, write_report

REAL = Path(__file__).parent / "data" / "real_logs"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == PNG_MAGIC
    return struct.unpack(">II", data[16:24])   # IHDR width, height


def spike_findings():
    return [
        Finding(31218, "grad_norm_spike", "info", "Grad norm x60 its baseline.",
                signal="grad_norm", value=145.1),
        Finding(31219, "loss_spike", "warning", "Loss 5.098 vs baseline 2.2 <watch>",
                signal="loss", value=5.098),
        Finding(31250, "spike_recovered", "info", "Back to baseline in 31 steps.", signal="loss"),
    ]


def synthetic(n=300, warmup=100):
    recs = []
    for s in range(1, n + 1):
        lr = 1e-3 * min(1.0, s / warmup)
        recs.append(StepRecord(s, {
            "loss": 3.0 + 1.0 / s + (4.0 if s == 150 else 0.0), "grad_norm": 1.0 + (s == 149) * 9,
            "lr": lr, "loss_scale": 65536.0 if s < 200 else 32768.0, "skipped": float(s == 200),
            "adam/exp_avg_sq_max": 1e-6 * s, "adam/exp_avg_sq_l1": 1e-3 * s,
            "adam/exp_avg_sq_numel": 1e4, "loss/code": 2.0}))
    recs[-5].metrics["loss"] = float("nan")
    phases = [(r.step, "warmup" if r.step <= warmup else "peak") for r in recs]
    findings = [
        Finding(warmup, "warmup_end", "info", "LR warmup ended at step 100.",
                details={"warmup_steps": warmup, "risk_window_end_step": 160}),
        Finding(150, "loss_spike", "critical", "Loss spike in the risk window.", signal="loss",
                in_warmup_risk_window=True),
        Finding(200, "overflow_burst", "warning", "Skipped step.", signal="skipped"),
        Finding(n - 4, "nonfinite", "critical", "Loss is NaN.", signal="loss"),
    ]
    return recs, findings, phases


def test_png_of_a_real_spike_has_the_panels_of_its_signals(tmp_path):
    recs = list(read_records(REAL / "bs_tr11_176B_spike31216.log"))
    fig = render_figure(recs, spike_findings(), title="BLOOM 176B")
    labels = [ax.get_ylabel() for ax in fig.axes if ax.get_ylabel()]
    assert labels == ["loss", "grad norm (global, pre-clip)", "learning rate"]
    listing = fig.axes[-1].texts[0].get_text()
    assert "1. step 31218    info     grad_norm_spike    Grad norm x60 its baseline." in listing
    assert "2. step 31219    warning  loss_spike         Loss 5.098 vs baseline 2.2 <watch>" in listing
    assert "3. step 31250" in listing
    assert ("not in this log: Adam update norm, layer update ratio, loss scale, Adam exp_avg_sq"
            in fig._suptitle.get_text())
    out = write_report(tmp_path / "spike.png", recs, spike_findings(), title="BLOOM 176B")
    w, h = png_size(out.read_bytes())
    assert w == 1300 and 700 < h < 1300


def test_all_five_panels_warmup_end_and_risk_window(tmp_path):
    recs, findings, phases = synthetic()
    fig = render_figure(recs, findings, title="synthetic", phases=phases)
    panels = [ax for ax in fig.axes if ax.get_ylabel()]
    assert [ax.get_ylabel() for ax in panels] == [
        "loss", "grad norm (global, pre-clip)", "learning rate", "loss scale", "Adam exp_avg_sq"]
    for ax in panels:
        vlines = [tuple(l.get_xdata()) for l in ax.get_lines() if l.get_linestyle() == "--"]
        assert (100, 100) in vlines          # warmup end on every panel
        spans = [p for p in ax.patches if p.get_hatch() == "//"]
        assert len(spans) == 1               # the risk window 100..160
        assert (spans[0].get_x(), spans[0].get_x() + spans[0].get_width()) == (100, 160)
    lr_ax = panels[2]
    assert sorted(t.get_text() for t in lr_ax.get_legend().get_texts()) == ["peak", "warmup"]
    listing = fig.axes[-1].texts[0].get_text()
    assert "1. step 150      critical loss_spike" in listing
    assert "2. step 200      warning  overflow_burst" in listing
    assert "3. step 296      critical nonfinite" in listing
    assert "warmup_end: LR warmup ended at step 100." in listing
    # Findings are marked on the panel of their signal: overflow on the loss-scale panel.
    assert any(t.get_text() == "2" for t in panels[3].texts)
    assert {t.get_text() for t in panels[0].texts} >= {"1", "3"}


def test_html_is_self_contained_and_lists_every_finding(tmp_path):
    recs = list(read_records(REAL / "bs_tr11_176B_spike31216.log"))
    out = write_report(tmp_path / "r" / "spike.html", recs, spike_findings(), title="a <b> run")
    text = out.read_text()
    assert "<title>a &lt;b&gt; run</title>" in text
    assert not re.search(r"""(src|href)=["'](https?:|//|/)""", text)     # nothing external
    m = re.search(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', text)
    png_size(base64.b64decode(m.group(1)))
    rows = re.findall(r'<tr class="(\w+)"><td>(\d+)</td>', text)
    assert rows == [("warning", "31219"), ("info", "31218"), ("info", "31250")]
    assert "Loss 5.098 vs baseline 2.2 &lt;watch&gt;" in text


def test_long_run_numbers_only_warnings_and_counts_info():
    recs, _, _ = synthetic(n=600)
    findings = [Finding(s, "loss_spike", "info", "blip", signal="loss") for s in range(10, 600, 10)]
    findings.append(Finding(450, "divergence", "critical", "Loss drifting up.", signal="loss"))
    listing = render_figure(recs, findings, title="long").axes[-1].texts[0].get_text()
    assert "  1. step 450      critical divergence" in listing
    assert "  2." not in listing
    assert "info, not numbered (small circles): 59 loss_spike" in listing


def test_report_suffix_must_be_png_or_html(tmp_path):
    with pytest.raises(ValueError, match=r"report: .*run\.pdf.* must end in \.png or \.html"):
        write_report(tmp_path / "run.pdf", [StepRecord(1, {"loss": 1.0})], [], title="x")


def test_report_of_a_log_without_loss_still_renders(tmp_path):
    recs = list(read_records(REAL / "bs_exp_gpt2meg_perf_n16_startup_scale_search_all_skipped.log"))
    out = write_report(tmp_path / "skipped.png", recs, [], title="all skipped")
    png_size(out.read_bytes())


def test_20k_step_read_and_report_under_10s(tmp_path):
    t0 = time.perf_counter()
    recs = list(read_records(REAL / "mn_gpt2_1p5B_scaleup_20k.log"))
    write_report(tmp_path / "20k.png", recs, [], title="20k")
    elapsed = time.perf_counter() - t0
    assert elapsed < 10.0, f"{elapsed:.1f}s"    # ~3 s measured here (2 shared cores)


def test_report_draws_the_update_norm_and_the_layers_with_the_precursor_on_them():
    recs = [StepRecord(s, {"loss": 3.0 - s / 100, "grad_norm": 1.0, "lr": 1e-3,
                           "update_norm": 0.04 * (2.5 if s == 30 else 1.0),
                           "layers/lower/update_ratio": 2.4 if s == 30 else 1.0, "layers/upper/update_ratio": 1.0,
                           "layers/top1/tensor": 3.0, "layers/top1/update_ratio": 1.2}) for s in range(1, 61)]
    pre = Finding(30, "precursor", "info", "The optimizer moved before the loss.", signal="layers/lower/update_ratio",
                  value=2.4)
    fig = render_figure(recs, [pre], title="precursor")
    labels = [ax.get_ylabel() for ax in fig.axes if ax.get_ylabel()]
    assert labels == ["loss", "grad norm (global, pre-clip)", "Adam update norm", "layer update ratio",
                      "learning rate"]
    layers = fig.axes[3]
    assert [line.get_label() for line in layers.get_lines()][:3] == ["lower half", "upper half", "top tensor"]
    assert [tuple(c.get_offsets()[0]) for c in layers.collections] == [(30.0, 2.4)]   # the finding sits on its curve
