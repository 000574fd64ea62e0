"""Stitching a run log (docs/design.md, Run log) across resumes and rollbacks into one trajectory.

A run log is appended to by every segment of a run: ``segment`` lines open a segment at
``start_step`` ("start" / "resume" / "rollback"), ``step`` lines follow. ``start_step`` is the step
the segment resumes from (the checkpoint's step, 0 for a fresh start), so its first step line is
``start_step + 1``: every point of earlier segments at a step > ``s`` belongs to an
abandoned branch (or to progress lost in a crash) and becomes *superseded*; the live trajectory is
what the model that exists now went through. A step line whose step does not advance, with no
segment line before it (an integration that did not write one), is taken as an implicit resume
from the step before it.

Cost: O(steps) time and memory (the whole trajectory is kept, for plotting).

>>> t = stitch("out/stability/run.jsonl")                                        # doctest: +SKIP
>>> [r.step for r in t.live][:3], len(t.superseded), t.segments[1]["reason"]     # doctest: +SKIP
([1, 2, 3], 40, 'rollback')
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import NamedTuple

from .. import keys
from ..record import Finding, StepRecord
from .readers.account import ReadAccount
from .readers.source import LogFormatError, numbered_lines


class Timeline(NamedTuple):
    live: list[StepRecord]          # the stitched trajectory, ascending steps
    superseded: list[StepRecord]    # points of abandoned branches, in file order
    segments: list[dict]            # {segment, start_step, reason, end_step, num_steps, num_superseded}
    findings: list[Finding]         # every finding line, with details["superseded"] for abandoned ones
    checkpoints: list[dict]         # {step, path, segment, superseded}


def stitch(runlog_path, *, on_skip=None) -> Timeline:
    """Read a run log and stitch its segments (see the module docstring).

    Raises :class:`~stability_callbacks.replay.readers.LogFormatError` for a missing file or one
    with no step line; unreadable lines go to ``on_skip(line_no, text, reason)``.
    """
    report = ReadAccount(runlog_path, on_skip)
    live: list[StepRecord] = []         # ascending by step
    superseded: list[StepRecord] = []
    segments: list[dict] = []
    findings: list[Finding] = []
    finding_segments: list[int] = []
    checkpoints: list[dict] = []
    current = None

    def open_segment(index: int, start_step: int, reason: str) -> dict:
        seg = {"segment": index, "start_step": start_step, "reason": reason, "end_step": None,
               "num_steps": 0, "num_superseded": 0}
        # Everything at or after the restart point is a branch the run left behind.
        cut = len(live)
        while cut > 0 and live[cut - 1].step > start_step:
            cut -= 1
        dropped = live[cut:]
        del live[cut:]
        superseded.extend(dropped)
        seg["num_superseded"] = len(dropped)
        segments.append(seg)
        return seg

    for line_no, text in numbered_lines(runlog_path):
        if not text.strip():
            continue
        try:
            obj = json.loads(text)
            kind = obj.get("type") if isinstance(obj, dict) else None
            if kind == "segment":
                current = open_segment(int(obj.get("segment", len(segments))),
                                       int(obj["start_step"]), str(obj.get("reason", "resume")))
            elif kind == "step":
                rec = StepRecord.from_json(obj)
                if current is None:
                    current = open_segment(rec.segment, rec.step - 1, "start")
                elif live and rec.step <= live[-1].step:
                    current = open_segment(max(rec.segment, current["segment"] + 1), rec.step - 1,
                                           "resume")
                live.append(rec)
                current["num_steps"] += 1
                current["end_step"] = rec.step
            elif kind == "finding":
                findings.append(Finding.from_json(obj))
                finding_segments.append(current["segment"] if current else 0)
            elif kind == "checkpoint":
                checkpoints.append({"step": int(obj["step"]), "path": obj.get("path"),
                                    "segment": current["segment"] if current else 0})
        except (ValueError, KeyError, TypeError) as e:
            report(line_no, text, f"unreadable run-log line: {e!r}")
    report.finish()
    if not live and not superseded:
        raise LogFormatError(runlog_path, None, "no step lines (not a stability_callbacks run log)")
    _mark_superseded_findings(findings, finding_segments, segments)
    for c in checkpoints:
        c["superseded"] = _restarted_after(segments, c["segment"], c["step"])
    return Timeline(live, superseded, segments, findings, checkpoints)


def _restarted_after(segments, segment: int, step: int) -> bool:
    """Whether a segment after ``segment`` resumed from a step before ``step``."""
    return any(s["segment"] > segment and s["start_step"] < step for s in segments)


def _mark_superseded_findings(findings, finding_segments, segments) -> None:
    for f, seg in zip(findings, finding_segments):
        f.details = dict(f.details or {})
        f.details["superseded"] = _restarted_after(segments, seg, f.step)


#: What the timeline plots, when the log has it, with its axis label: the loss, then what moves
#: before it (the update norm and the tensor departing most from its history lead the loss; the
#: grad norm follows: docs/design.md, Metric keys).
_SIGNALS = {keys.LOSS: "loss", keys.GRAD_NORM: "grad norm", keys.UPDATE_NORM: "update norm",
            keys.layer_top(1, "update_ratio"): "top tensor's update\n(x its history)"}
_COLOURS = {keys.LOSS: "#1f77b4", keys.GRAD_NORM: "#2ca02c", keys.UPDATE_NORM: "#e7298a",
            keys.layer_top(1, "update_ratio"): "#d95f02"}


def write_timeline_png(out_path, timeline, *, title: str | None = None) -> Path:
    """:func:`timeline_figure` as a PNG at ``out_path``."""
    fig = timeline_figure(timeline, title=title)
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png")
    return out


def timeline_figure(timeline, *, title: str | None = None):
    """Plot a stitched run: live loss (and grad norm, update norm, top tensor's update ratio)
    solid, superseded points faded, segment starts as dashed lines labelled with their reason,
    checkpoints as ticks, warning+ findings. ``timeline``: a :class:`Timeline` or a run-log path.
    """
    if not isinstance(timeline, Timeline):
        if title is None:
            title = Path(str(timeline)).name
        timeline = stitch(timeline)
    import matplotlib
    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    signals = [k for k in _SIGNALS if any(k in r.metrics for r in timeline.live + timeline.superseded)]
    if not signals:
        signals = ["loss"]
    fig = Figure(figsize=(13, 2.6 + 2.4 * len(signals)), dpi=100)
    axes = fig.subplots(len(signals), 1, sharex=True, squeeze=False)[:, 0]
    for ax, key in zip(axes, signals):
        pts = [(r.step, r.metrics[key]) for r in timeline.superseded
               if key in r.metrics and math.isfinite(r.metrics[key])]
        if pts:
            ax.scatter(*zip(*pts), s=8, color="#999999", alpha=0.45,
                       label=f"superseded ({len(timeline.superseded)} points)")
        pts = [(r.step, r.metrics[key]) for r in timeline.live
               if key in r.metrics and math.isfinite(r.metrics[key])]
        if pts:
            ax.plot(*zip(*pts), color=_COLOURS[key], linewidth=1.0,
                    marker="o" if len(pts) <= 60 else None, markersize=3, label="live")
        for r in timeline.live:
            v = r.metrics.get(key)
            if v is not None and not math.isfinite(v):
                ax.axvline(r.step, color="#d62728", linestyle=":", alpha=0.6)
        ax.set_ylabel(_SIGNALS[key], fontsize=9)
        ax.grid(True, alpha=0.25, linewidth=0.6)
        ax.tick_params(labelsize=8)
        ax.margins(y=0.12)
        for seg in timeline.segments[1:]:
            colour = "#d62728" if seg["reason"] == "rollback" else "#ff7f0e"
            ax.axvline(seg["start_step"], color=colour, linestyle="--", linewidth=1.1)
            if key == signals[0]:
                ax.annotate(f"{seg['reason']} → {seg['start_step']}", (seg["start_step"], 1.0),
                            xycoords=ax.get_xaxis_transform(), xytext=(3, -12),
                            textcoords="offset points", fontsize=8, color=colour)
        if key == signals[0]:
            for gone in (False, True):
                cks = [c["step"] for c in timeline.checkpoints if c["superseded"] == gone]
                if cks:
                    ax.plot(cks, [0.02] * len(cks), "^", color="#8c564b", markersize=6,
                            markerfacecolor="none" if gone else "#8c564b",
                            transform=ax.get_xaxis_transform(), clip_on=False,
                            label="checkpoint (abandoned branch)" if gone else "checkpoint")
            for f in timeline.findings:
                if not f.at_least("warning"):
                    continue
                faded = f.details.get("superseded", False)
                ax.axvline(f.step, color="#d62728" if f.severity == "critical" else "#f28e2b",
                           alpha=0.15 if faded else 0.5, linewidth=0.8)
            ax.legend(fontsize=7, loc="upper right")
    axes[-1].set_xlabel("optimizer step", fontsize=9)
    from matplotlib.ticker import MaxNLocator, ScalarFormatter
    xfmt = ScalarFormatter(useOffset=False)
    xfmt.set_scientific(False)
    axes[-1].xaxis.set_major_formatter(xfmt)
    axes[-1].xaxis.set_major_locator(MaxNLocator(nbins=12, steps=[1, 2, 2.5, 5, 10], integer=True))
    n_roll = sum(1 for s in timeline.segments if s["reason"] == "rollback")
    n_res = sum(1 for s in timeline.segments[1:] if s["reason"] != "rollback")
    fig.suptitle(f"{title or 'run timeline'}\n{len(timeline.live)} live steps, "
                 f"{len(timeline.superseded)} superseded; {len(timeline.segments)} segments "
                 f"({n_roll} rollback, {n_res} resume)", fontsize=10, x=0.01, ha="left")
    fig.subplots_adjust(left=0.07, right=0.98, top=0.86 if len(signals) == 1 else 0.9,
                        bottom=0.1 if len(signals) == 1 else 0.07, hspace=0.1)
    return fig
