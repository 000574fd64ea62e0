"""The replay report: one figure of the run with every finding marked, as PNG or HTML.

Seven panels, each only when the log has the signal, each drawn by its own function
(``_draw_<panel>``): loss (per-stream losses too), grad norm, Adam's update norm, the per-layer
summary, LR (phases shaded), loss scale (skipped steps ticked), Adam ``exp_avg_sq`` (max and
mean). The LR
warmup end and the warmup-end risk window (from the ``warmup_end`` finding's
``details = {"warmup_steps": n, "risk_window_end_step": m}``) are drawn across all panels.
Findings: warning and critical ones numbered on the panel of their signal and listed with their
message; info ones (a healthy long run has hundreds of one-step blips) drawn as small ticks and
counted by kind. The HTML is self-contained: the figure is embedded as a base64 PNG above a table
of every finding.

Cost: O(records) to gather the series; rendering 20k steps takes ~2 s with Matplotlib (Agg).
Needs ``pip install stability-callbacks[report]``.

>>> from stability_callbacks.record import StepRecord
>>> write_report("run.png", [StepRecord(1, {"loss": 2.0})], [], title="run")   # doctest: +SKIP
"""
from __future__ import annotations

import base64
import html
import io
import math
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterable, Sequence

from .. import keys
from ..record import Finding, StepRecord, severity_rank

if TYPE_CHECKING:
    from ..live import LiveRun
    from ..outcome import Outcome

SEVERITY_STYLE = {  # marker, colour, size
    "info": ("|", "#7a8ca3", 40),
    "warning": ("v", "#f28e2b", 70),
    "critical": ("v", "#d62728", 110),
}
PHASE_COLOURS = {"warmup": "#fdd9a0", "peak": "#f9b4b4", "decay": "#c6dbef",
                 "rewarm": "#d8c3e6"}
MAX_NUMBERED_FINDINGS = 40
_PANELS = ("loss", "grad_norm", "update", "layers", "lr", "loss_scale", "adam")
_PANEL_TITLES = {"loss": "loss", "grad_norm": "grad norm (global, pre-clip)",
                 "update": "Adam update norm", "layers": "layer update ratio",
                 "lr": "learning rate", "loss_scale": "loss scale",
                 "adam": "Adam exp_avg_sq"}
#: The probe's per-layer summary drawn in the layers panel (docs/design.md, Metric keys).
_LAYER_LINES = ((keys.LAYERS_LOWER_UPDATE_RATIO, "#1b9e77", "lower half"),
                (keys.LAYERS_UPPER_UPDATE_RATIO, "#7570b3", "upper half"),
                (keys.layer_top(1, "update_ratio"), "#d95f02", "top tensor"))


class _Series:
    """Steps and values of one metric, non-finite values kept apart (they are drawn as marks)."""

    __slots__ = ("steps", "values", "bad_steps")

    def __init__(self):
        self.steps: list[int] = []
        self.values: list[float] = []
        self.bad_steps: list[int] = []

    def add(self, step: int, value: float) -> None:
        if math.isfinite(value):
            self.steps.append(step)
            self.values.append(value)
        else:
            self.bad_steps.append(step)

    def __bool__(self):
        return bool(self.steps or self.bad_steps)


def _gather(records: Iterable[StepRecord]):
    series: dict[str, _Series] = {}
    steps: list[int] = []
    for rec in records:
        steps.append(rec.step)
        m = rec.metrics
        for key, value in m.items():
            if key == "adam/exp_avg_sq_l1":
                numel = m.get("adam/exp_avg_sq_numel")
                if numel:
                    series.setdefault("adam/exp_avg_sq_mean", _Series()).add(rec.step, value / numel)
                continue
            if key in ("adam/exp_avg_sq_numel", "batch_fingerprint", "consumed_samples"):
                continue
            series.setdefault(key, _Series()).add(rec.step, float(value))
    return steps, series


def _panel_of(signal: str | None) -> str:
    if not signal:
        return "loss"
    if signal in (keys.UPDATE_NORM, keys.ADAM_M_NORM):
        return "update"
    if signal.startswith("layers/"):
        return "layers"
    if signal.startswith("adam/"):
        return "adam"
    if signal in ("grad_norm", "lr", "loss_scale"):
        return signal
    if signal == "skipped":
        return "loss_scale"
    return "loss"


def _warmup_marks(findings: Sequence[Finding]):
    for f in findings:
        if f.kind == "warmup_end":
            d = f.details or {}
            end = d.get("warmup_steps", f.step)
            return end, d.get("risk_window_end_step")
    return None, None


def _phase_spans(phases):
    """Contiguous (start_step, end_step, phase) runs of an aligned (step, phase) list."""
    spans = []
    for step, name in phases or ():
        if spans and spans[-1][2] == name:
            spans[-1][1] = step
        else:
            if spans:
                spans[-1][1] = step   # close the previous span where this one starts
            spans.append([step, step, name])
    return [(a, b, n) for a, b, n in spans if n]


def _spread(values) -> float:
    lo = min(v for v in values if v > 0) if any(v > 0 for v in values) else 0.0
    hi = max(values) if values else 0.0
    return hi / lo if lo > 0 else 0.0


def _with_gaps(steps, values):
    """Break the line where the log skips far ahead (``[...]`` in a snippet, a lost range)."""
    if len(steps) < 3:
        return steps, values
    gaps = sorted(b - a for a, b in zip(steps, steps[1:]))
    limit = 5 * max(1, gaps[len(gaps) // 2])
    xs, ys = [steps[0]], [values[0]]
    for i in range(1, len(steps)):
        if steps[i] - steps[i - 1] > limit:
            xs.append(steps[i - 1])
            ys.append(float("nan"))
        xs.append(steps[i])
        ys.append(values[i])
    return xs, ys


def _moving_average(values, window: int):
    import numpy as np
    v = np.asarray(values, dtype=float)
    c = np.cumsum(np.insert(v, 0, 0.0))
    out = np.empty_like(v)
    half = window // 2
    n = len(v)
    lo = np.clip(np.arange(n) - half, 0, n)
    hi = np.clip(np.arange(n) + half + 1, 0, n)
    out[:] = (c[hi] - c[lo]) / (hi - lo)
    return out


def _clip_startup(ax, values) -> None:
    """Keep the first steps' huge losses from flattening the rest of a long run."""
    head = max(5, len(values) // 50)
    rest = values[head:]
    if not rest:
        return
    top, low = max(rest), min(values)
    if max(values[:head]) > 1.5 * top:
        ax.set_ylim(low - 0.05 * (top - low), top + 0.08 * (top - low))
        ax.text(0.01, 0.03, f"start-up losses up to {max(values[:head]):.4g} clipped",
                transform=ax.transAxes, fontsize=7, color="#555555", va="bottom")


def _log_axis(ax, base=10) -> None:
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter
    ax.set_yscale("log", base=base)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _pos: f"{v:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    if base == 10:
        ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))


def _value_at(series: _Series | None, step: int) -> float | None:
    if not series or not series.steps:
        return None
    import bisect
    i = bisect.bisect_left(series.steps, step)
    if i < len(series.steps) and series.steps[i] == step:
        return series.values[i]
    return None


def render_figure(records: Sequence[StepRecord], findings: Sequence[Finding], *, title: str,
                  phases=None):
    """The Matplotlib figure of the report (Agg; the caller saves or closes it): one panel per
    signal the records carry (:data:`_PANELS`, each drawn by its function in :data:`_DRAW`),
    the warmup marks across them, the findings on them, the title and the numbered listing."""
    import matplotlib
    matplotlib.use("Agg", force=False)

    steps, series = _gather(records)
    findings = sorted(findings, key=lambda f: (f.step, -severity_rank(f.severity)))
    panels = _panels_drawn(series)
    shown = [f for f in findings if f.kind != "warmup_end"]
    if len(shown) > MAX_NUMBERED_FINDINGS:
        # A long healthy run has hundreds of info blips: number what needs a human.
        shown = [f for f in shown if f.at_least("warning")][:MAX_NUMBERED_FINDINGS]
    numbered = shown
    listing = _finding_lines(findings, numbered)
    fig, grid, axes = _layout(panels, len(listing))
    few = len(steps) <= 60     # short snippets: show the points themselves
    style: dict[str, Any] = dict(linewidth=0.9, marker="o" if few else None, markersize=3)
    for p, ax in axes.items():
        _DRAW[p](ax, series, style, phases)
    _mark_warmup(axes, panels, findings)
    _mark_findings(axes, series, findings, numbered)
    if steps:
        lo, hi = min(steps), max(steps)
        pad = max(1, (hi - lo) * 0.01)
        axes[panels[0]].set_xlim(lo - pad, hi + pad)
    _title_and_listing(fig, grid, len(panels), title=title, steps=steps, findings=findings, listing=listing,
                       missing=[_PANEL_TITLES[p] for p in _PANELS if p not in panels])
    return fig


def _panels_drawn(series: dict) -> list[str]:
    """The panels the series fill, in :data:`_PANELS`' order (the loss panel when none is)."""
    loss_streams = any(k.startswith("loss/") for k in series)
    panels = [p for p in _PANELS if (
        (p == "loss" and (series.get("loss") or loss_streams)) or
        (p == "adam" and (series.get("adam/exp_avg_sq_max") or series.get("adam/exp_avg_sq_mean")))
        or (p == "update" and series.get(keys.UPDATE_NORM))
        or (p == "layers" and any(series.get(k) for k, _, _ in _LAYER_LINES))
        or (p not in ("loss", "adam", "update", "layers") and series.get(p)))]
    return panels or ["loss"]


def _layout(panels: list[str], listing_lines: int):
    """``(figure, grid, axes)``: the panels stacked on one shared step axis, a spacer row for the
    x label, and a text row for the listing of ``listing_lines`` lines."""
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator, ScalarFormatter

    heights = {"loss": 3.2, "grad_norm": 2.0, "update": 1.7, "layers": 1.7, "lr": 1.6, "loss_scale": 1.5,
               "adam": 1.7}
    text_h = 0.3 + 0.16 * listing_lines
    fig = Figure(figsize=(13, sum(heights[p] for p in panels) + text_h + 1.3), dpi=100)
    ratios = [heights[p] for p in panels] + [0.35, text_h]   # spacer row for the x label
    grid = fig.add_gridspec(len(panels) + 2, 1, height_ratios=ratios, hspace=0.12)
    axes = {}
    first = None
    for i, p in enumerate(panels):
        ax = fig.add_subplot(grid[i], sharex=first)
        first = first or ax
        axes[p] = ax
        ax.grid(True, alpha=0.25, linewidth=0.6)
        ax.set_ylabel(_PANEL_TITLES[p], fontsize=9)
        ax.tick_params(labelsize=8)
        ax.margins(y=0.12)      # room for the finding numbers above the highest points
        if i < len(panels) - 1:
            ax.tick_params(labelbottom=False)
    axes[panels[-1]].set_xlabel("optimizer step", fontsize=9)
    xfmt = ScalarFormatter(useOffset=False)   # "31215", not "+3.12e4" offsets
    xfmt.set_scientific(False)
    axes[panels[-1]].xaxis.set_major_formatter(xfmt)
    axes[panels[-1]].xaxis.set_major_locator(MaxNLocator(nbins=12, steps=[1, 2, 2.5, 5, 10], integer=True))
    return fig, grid, axes


def _draw_loss(ax, series: dict, style: dict, phases) -> None:
    """The loss: faint per-step points under a moving average for a long run, a log axis for a
    loss that spans decades; the per-dataset streams; NaN/Inf steps as red dotted lines."""
    s = series.get("loss")
    loss_streams = sorted(k for k in series if k.startswith("loss/"))
    if s:
        xs, ys = _with_gaps(s.steps, s.values)
        if len(s.values) > 500:
            # Per-step losses of a long run are a band of noise: draw it faint, and a
            # moving average on top so that the trend and the real departures read at once.
            ax.plot(xs, ys, color="#9ecae1", linewidth=0.5, label="loss (per step)")
            ax.plot(s.steps, _moving_average(s.values, max(5, len(s.values) // 250)),
                    color="#08519c", linewidth=1.1, label="moving average")
            _clip_startup(ax, s.values)
            ax.legend(fontsize=7, loc="best")
        else:
            ax.plot(xs, ys, color="#1f77b4", label="loss", **style)
            if _spread(s.values) > 4:
                _log_axis(ax)
    for k in loss_streams:
        ax.plot(series[k].steps, series[k].values, linewidth=0.7, alpha=0.8, label=k)
    if loss_streams:
        ax.legend(fontsize=7, loc="best")
    bad = sorted(set(series["loss"].bad_steps)) if s else []
    for b in bad:
        ax.axvline(b, color="#d62728", alpha=0.5, linewidth=1.0, linestyle=":")
    if bad:
        ax.plot([], [], color="#d62728", linestyle=":", label="NaN/Inf loss")
        ax.legend(fontsize=7, loc="best")


def _draw_grad_norm(ax, series: dict, style: dict, phases) -> None:
    """The global grad norm (log axis over two decades; a note where a build prints 0)."""
    s = series["grad_norm"]
    xs, ys = _with_gaps(s.steps, s.values)
    ax.plot(xs, ys, color="#2ca02c", linewidth=0.6 if len(xs) > 500 else 0.9,
            marker=style["marker"], markersize=3)
    if s.values and min(s.values) > 0 and _spread(s.values) > 100:
        _log_axis(ax)
    elif s.values and max(s.values) == 0:
        ax.text(0.01, 0.8, "grad norm printed as 0 throughout (a print artefact of that build)",
                transform=ax.transAxes, fontsize=8, color="#555555")
    for b in s.bad_steps:
        ax.axvline(b, color="#d62728", alpha=0.5, linewidth=1.0, linestyle=":")


def _draw_update(ax, series: dict, style: dict, phases) -> None:
    """Adam's update norm (log axis over a decade)."""
    s = series[keys.UPDATE_NORM]
    ax.plot(*_with_gaps(s.steps, s.values), color="#e7298a", **style)
    if s.values and min(s.values) > 0 and _spread(s.values) > 10:
        _log_axis(ax)


def _draw_layers(ax, series: dict, style: dict, phases) -> None:
    """The per-layer summary lines (:data:`_LAYER_LINES`) around the ratio 1."""
    for key, colour, label in _LAYER_LINES:
        s = series.get(key)
        if s:
            ax.plot(*_with_gaps(s.steps, s.values), color=colour, label=label, **style)
    ax.axhline(1.0, color="#999999", linewidth=0.6)
    ax.legend(fontsize=7, loc="best")


def _draw_lr(ax, series: dict, style: dict, phases) -> None:
    """The LR, with the LR phases (``phases``) as coloured spans."""
    s = series["lr"]
    ax.plot(*_with_gaps(s.steps, s.values), color="#9467bd", **style)
    ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
    ax.yaxis.get_offset_text().set_fontsize(7)
    seen = set()
    for a, b, name in _phase_spans(phases):
        ax.axvspan(a, b, color=PHASE_COLOURS.get(name, "#e0e0e0"), alpha=0.6, linewidth=0,
                   label=None if name in seen else name)
        seen.add(name)
    if seen:
        ax.legend(fontsize=7, loc="best", title="phase", title_fontsize=7)


def _draw_loss_scale(ax, series: dict, style: dict, phases) -> None:
    """The fp16 loss scale as steps on a log2 axis, the skipped steps as ticks at the bottom."""
    s = series["loss_scale"]
    ax.step(s.steps, s.values, where="post", color="#8c564b", linewidth=1.0,
            marker=style["marker"], markersize=3)
    if s.values and min(s.values) > 0:
        ax.set_yscale("log", base=2)
    sk = series.get("skipped")
    if sk:
        skipped = [st for st, v in zip(sk.steps, sk.values) if v > 0]
        if skipped:
            ax.plot(skipped, [0.04] * len(skipped), "|", color="#d62728", markersize=9,
                    transform=ax.get_xaxis_transform(), label="skipped step(s)")
            ax.legend(fontsize=7, loc="best")


def _draw_adam(ax, series: dict, style: dict, phases) -> None:
    """Adam's second moment, max and mean, on a log axis."""
    for key, colour, label in (("adam/exp_avg_sq_max", "#e377c2", "max"),
                               ("adam/exp_avg_sq_mean", "#17becf", "mean")):
        s = series.get(key)
        if s:
            ax.plot(s.steps, s.values, color=colour, label=label, **style)
    ax.set_yscale("log")
    ax.legend(fontsize=7, loc="best")


#: Each panel's drawing function, ``(ax, series, style, phases)``.
_DRAW = {"loss": _draw_loss, "grad_norm": _draw_grad_norm, "update": _draw_update, "layers": _draw_layers,
         "lr": _draw_lr, "loss_scale": _draw_loss_scale, "adam": _draw_adam}


def _mark_warmup(axes: dict, panels: list[str], findings: Sequence[Finding]) -> None:
    """The warmup end (dashed) and its risk window (hatched) across every panel."""
    warmup_end, risk_end = _warmup_marks(findings)
    for p, ax in axes.items():
        if warmup_end is not None:
            ax.axvline(warmup_end, color="#ff7f0e", linewidth=1.2, linestyle="--",
                       label="warmup end" if p == panels[0] else None)
        if warmup_end is not None and risk_end is not None:
            ax.axvspan(warmup_end, risk_end, color="#ff7f0e", alpha=0.08, hatch="//", linewidth=0,
                       label="warmup-end risk window" if p == panels[0] else None)
    if warmup_end is not None:
        axes[panels[0]].legend(fontsize=7, loc="best")


def _title_and_listing(fig, grid, num_panels: int, *, title: str, steps, findings, listing, missing) -> None:
    """The title (steps, counts by severity, the panels this log has no data for) and the
    numbered listing of the findings below the panels."""
    counts = Counter(f.severity for f in findings)
    summary = (f"{len(steps)} steps ({min(steps)}–{max(steps)})" if steps else "no steps")
    summary += "   findings: " + ", ".join(f"{counts.get(s, 0)} {s}" for s in
                                           ("critical", "warning", "info"))
    if missing:
        summary += "   not in this log: " + ", ".join(missing)
    fig.suptitle(f"{title}\n{summary}", fontsize=11, x=0.01, ha="left", y=0.995)
    text_ax = fig.add_subplot(grid[num_panels + 1])
    text_ax.axis("off")
    text_ax.text(0, 1, "\n".join(listing), va="top", ha="left", family="monospace", fontsize=8,
                 transform=text_ax.transAxes)
    fig.subplots_adjust(left=0.07, right=0.98, top=1 - 0.75 / fig.get_figheight(),
                        bottom=0.02)


def _mark_findings(axes, series, findings, numbered):
    number = {id(f): i + 1 for i, f in enumerate(numbered)}
    for f in findings:
        if f.kind == "warmup_end":
            continue
        panel = _panel_of(f.signal)
        if panel not in axes:
            panel = "loss" if "loss" in axes else next(iter(axes))
        ax = axes[panel]
        # Sit on the curve the panel draws (a `skipped` finding sits on the loss scale).
        own = {"loss": "loss", "grad_norm": "grad_norm", "lr": "lr", "loss_scale": "loss_scale",
               "update": keys.UPDATE_NORM, "layers": keys.layer_top(1, "update_ratio")}
        key = f.signal if (f.signal in series and _panel_of(f.signal) == panel
                           and f.signal != "skipped") else own.get(panel)
        y = _value_at(series.get(key), f.step) if key else None
        marker, colour, size = SEVERITY_STYLE.get(f.severity, SEVERITY_STYLE["info"])
        if y is None:
            # No value to sit on (NaN loss, a signal this panel does not draw): top edge.
            ax.scatter([f.step], [0.97], marker=marker, color=colour, s=size, zorder=5,
                       transform=ax.get_xaxis_transform(), clip_on=False)
        elif f.severity == "info":
            ax.scatter([f.step], [y], marker="o", facecolors="none", edgecolors=colour, s=36,
                       linewidths=1.0, zorder=5)
        else:
            ax.scatter([f.step], [y], marker=marker, color=colour, s=size, zorder=6,
                       edgecolors="black", linewidths=0.4)
        if f.severity == "critical":
            ax.axvline(f.step, color=colour, alpha=0.35, linewidth=0.8)
        n = number.get(id(f))
        if n is not None:
            ax.annotate(str(n), (f.step, 0.97 if y is None else y),
                        xycoords=ax.get_xaxis_transform() if y is None else "data",
                        xytext=(0, 7), textcoords="offset points", ha="center", fontsize=7,
                        color=colour, fontweight="bold")


def _finding_lines(findings: Sequence[Finding], numbered: Sequence[Finding]) -> list[str]:
    lines = ["Findings (numbered as on the plots):" if numbered
             else "No warning or critical finding."]
    import textwrap
    for i, f in enumerate(numbered, 1):
        head = f"{i:>3}. step {f.step:<8} {f.severity:<8} {f.kind:<18} "
        msg = textwrap.wrap(" ".join(f.message.split()), 150 - len(head), max_lines=2,
                            placeholder=" ...")
        lines.append(head + (msg[0] if msg else ""))
        lines.extend(" " * len(head) + m for m in msg[1:])
    numbered_ids = {id(f) for f in numbered}
    rest = [f for f in findings if f.at_least("warning") and id(f) not in numbered_ids]
    if rest:
        lines.append(f"     ... and {len(rest)} more warning/critical findings (see the HTML "
                     "report or --json)")
    infos = Counter(f.kind for f in findings
                    if not f.at_least("warning") and id(f) not in numbered_ids)
    if infos:
        first_warmup = next((f for f in findings if f.kind == "warmup_end"), None)
        kinds = ", ".join(f"{n} {k}" for k, n in infos.most_common())
        lines.append(f"info, not numbered (small circles): {kinds}")
        if first_warmup is not None:
            lines.append(f"     warmup_end: {' '.join(first_warmup.message.split())[:140]}")
    return lines


def _png_bytes(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def check_report_path(out_path) -> Path:
    """``out_path`` as a report path: ``ValueError`` unless it ends in ``.png`` or ``.html``."""
    out = Path(out_path)
    if out.suffix.lower() not in (".png", ".html", ".htm"):
        raise ValueError(f"report: {str(out)!r} must end in .png or .html")
    return out


def write_report(out_path, records: Sequence[StepRecord], findings: Sequence[Finding], *,
                 title: str, phases=None, advice_forms: tuple[str, ...] | None = ()) -> Path:
    """Write ``out_path`` (``.png`` or ``.html``, by suffix) and return it.

    ``phases``: ``(step, phase_name)`` pairs aligned with ``records`` (or ``None``).
    ``advice_forms``: the frameworks whose command the HTML table adds under rollback advice
    (:func:`~stability_callbacks.advice.native_forms`; None: all; ``()``: none).
    ``ValueError`` for another suffix.
    """
    out = check_report_path(out_path)
    suffix = out.suffix.lower()
    records = list(records)
    findings = list(findings)
    fig = render_figure(records, findings, title=title, phases=phases)
    png = _png_bytes(fig)
    out.parent.mkdir(parents=True, exist_ok=True)
    if suffix == ".png":
        out.write_bytes(png)
    else:
        out.write_text(_html(title, records, findings, png, advice_forms), encoding="utf-8")
    return out


def report_run_end(run: "LiveRun", outcome: "Outcome", *, out_path=None) -> None:
    """The report at the end of a live run or of ``replay --follow`` (docs/integrations.md, The
    end of a run), one way for both: from the run log, stitched across resumes and rollbacks (the
    trajectory the model went through, :func:`~.timeline.stitch`), to ``out_path`` (default:
    ``report.html`` next to the run log) when the ``report`` section has it on (a path asked for
    by name is written whatever it says). Sets ``outcome.report_path``, or
    ``outcome.report_problem``: why there is none (turned off, no run log, no matplotlib, a run
    log without a step, an ``OSError``). Raises none of those: the summary says it."""
    from ..outcome import REPORT_NAME
    from .readers.source import LogFormatError
    from .timeline import stitch

    if out_path is None and not run.config.report.enabled:
        outcome.report_problem = "report.enabled is false"
        return
    if outcome.runlog_path is None:
        outcome.report_problem = "no run log"
        return
    title = f"{run.run_name}: {outcome.summary_lines()[0].removeprefix('stability: ')}"
    try:
        t = stitch(outcome.runlog_path)
        outcome.report_path = write_report(out_path or outcome.runlog_path.with_name(REPORT_NAME), t.live,
                                           t.findings, title=title, advice_forms=run.advice_forms)
    except ImportError as e:
        outcome.report_problem = f"{e.name or 'matplotlib'} is not installed: pip install 'stability-callbacks[report]'"
    except (LogFormatError, OSError) as e:
        outcome.report_problem = str(e)


def _advice_html(f: Finding, advice_forms: tuple[str, ...] | None) -> str:
    """The native commands of a rollback advice, as lines under its message."""
    if f.kind != "rollback_advice" or advice_forms == () or f.details.get("step_is_record_number"):
        return ""
    from ..advice import FORM_LABELS, native_forms
    try:
        forms = native_forms(f.details, advice_forms)
    except (KeyError, TypeError, ValueError):
        return ""
    return "".join(f"<br><b>{html.escape(FORM_LABELS[k])}:</b> <code>{html.escape(v)}</code>"
                   for k, v in forms.items())


def _html(title: str, records, findings, png: bytes, advice_forms: tuple[str, ...] | None = ()) -> str:
    esc = html.escape
    counts = Counter(f.severity for f in findings)
    steps = [r.step for r in records]
    rows = []
    for f in sorted(findings, key=lambda f: (-severity_rank(f.severity), f.step)):
        rows.append(
            f'<tr class="{esc(f.severity)}"><td>{f.step}</td><td>{esc(f.severity)}</td>'
            f"<td>{esc(f.kind)}</td><td>{esc(f.signal or '')}</td><td>{esc(f.phase or '')}</td>"
            f"<td>{'yes' if f.in_warmup_risk_window else ''}</td><td>{esc(f.message)}"
            f"{_advice_html(f, advice_forms)}</td></tr>")
    span = f"{len(steps)} steps, {min(steps)}–{max(steps)}" if steps else "no steps"
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>
<style>
body {{ font-family: system-ui, sans-serif; margin: 1.5em; color: #222; }}
img {{ max-width: 100%; border: 1px solid #ddd; }}
table {{ border-collapse: collapse; font-size: 0.9em; margin-top: 1em; }}
td, th {{ border: 1px solid #ddd; padding: 3px 8px; text-align: left; vertical-align: top; }}
tr.critical td {{ background: #fde0e0; }} tr.warning td {{ background: #fff1dc; }}
tr.info td {{ color: #555; }}
</style></head><body>
<h1>{esc(title)}</h1>
<p>{esc(span)} &middot; findings: {counts.get('critical', 0)} critical,
{counts.get('warning', 0)} warning, {counts.get('info', 0)} info</p>
<img alt="loss, grad norm, learning rate, loss scale and Adam panels with findings marked"
 src="data:image/png;base64,{base64.b64encode(png).decode('ascii')}">
<h2>Findings</h2>
<table><tr><th>step</th><th>severity</th><th>kind</th><th>signal</th><th>phase</th>
<th>risk window</th><th>message</th></tr>
{''.join(rows) if rows else '<tr><td colspan="7">none</td></tr>'}
</table></body></html>
"""
