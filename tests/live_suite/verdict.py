"""What a run log says about a scenario: its warning-or-worse findings, whether and when a
planted fault was caught, and evidence that the run is what the table claims (a healthy run
learns and stays finite; a planted fault really hit the loss, the LR, the data or the scaler).

Everything is read back from the run log (``runlog.jsonl``, docs/design.md, Run log), so a verdict can be
recomputed from a kept log without training again.
"""
from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from .fields import NUM_CLASSES
from .scenarios import NEVER_LEARNS, Scenario

SERIOUS = ("warning", "critical")
#: Findings that report a rise above a threshold: their value must be above the threshold they print.
RISES = ("loss_spike", "divergence", "level_shift", "grad_norm_spike", "warmup_instability")


def read_runlog(path: Path) -> tuple[dict[int, dict], list[dict]]:
    """``(metrics by step, findings)``; a step re-run after a rollback keeps its last record."""
    steps: dict[int, dict] = {}
    findings: list[dict] = []
    with open(path) as fh:
        for line in fh:
            obj = json.loads(line)
            if obj["type"] == "step":
                steps[obj["step"]] = {k: float(v) for k, v in obj["metrics"].items()}
            elif obj["type"] == "finding":
                findings.append(obj)
    return steps, findings


def _short(f: dict) -> list:
    return [f["step"], f["kind"], f["severity"], f.get("message", "")]


def _at(f: dict) -> int:
    """The step a finding speaks of: a ``crash`` carries the last finished step, the crash
    itself happened in the next one."""
    return f["step"] + 1 if f["kind"] == "crash" else f["step"]


def dishonest(sc: Scenario, findings: list[dict]) -> list[str]:
    """Findings that contradict their own numbers or the run: a rise printed below its own
    threshold, "no LR warmup" on a run that warms up, a re-warmup the schedule never made."""
    out = []
    for f in findings:
        v, thr = f.get("value"), f.get("threshold")
        if f["kind"] in RISES and v is not None and thr is not None and v < thr:
            out.append(f"{f['kind']}@{f['step']}: value {v:.4g} below its threshold {thr:.4g}")
        if f["kind"] == "preflight" and sc.warmup > 0 and f.get("message", "").startswith("No LR warmup"):
            out.append(f"preflight: 'No LR warmup' on a run with a {sc.warmup}-step warmup")
        if f["kind"] == "warmup_end" and (f.get("details") or {}).get("rewarm") and not (
                sc.fresh_optimizer and sc.framework == "hf"):   # the Trainer restarts the schedule then
            out.append(f"warmup_end@{f['step']}: a re-warmup this schedule ({sc.schedule}) never made")
    return out


def judge(sc: Scenario, run_dir: Path, *, log_warnings=(), error: str | None = None,
          seconds: float = 0.0, notes: dict | None = None) -> dict:
    """The scenario's result (JSON-able). ``ok``: healthy → no warning+ finding, no warning in
    the library's log, learned; fault → caught within its bound, nothing serious before it, and
    the fault is real (and, where the fault says so, nothing critical or forbidden after it);
    both → no finding that contradicts its numbers or the run (:func:`dishonest`)."""
    res = {"name": sc.name, "framework": sc.framework, "healthy": sc.healthy,
           "fault": None if sc.fault is None else sc.fault.kind, "seconds": round(seconds, 1),
           "error": error, "log_warnings": list(log_warnings), "notes": notes or {}}
    path = run_dir / "runlog.jsonl"
    if not path.exists():
        res.update(ok=False, n_steps=0, evidence="no run log", evidence_ok=False, warnings=[])
        return res
    steps, findings = read_runlog(path)
    serious = [f for f in findings if f["severity"] in SERIOUS]
    loss = {s: m["loss"] for s, m in sorted(steps.items()) if "loss" in m}
    finite = [v for v in loss.values() if math.isfinite(v)]
    res["n_steps"] = len(steps)
    res["loss_first"] = statistics.fmean(finite[:10]) if finite else None
    res["loss_last"] = statistics.fmean(finite[-max(10, len(finite) // 10):]) if finite else None
    res["findings"] = [_short(f) for f in findings if f["kind"] not in ("preflight",)]
    res["dishonest"] = dishonest(sc, findings)

    if sc.healthy:
        res["warnings"] = [_short(f) for f in serious]
        res["evidence"], learned = _learned(sc, steps, loss, res, res["notes"])
        res["evidence_ok"] = learned
        res["ok"] = not serious and not log_warnings and error is None and learned and not res["dishonest"]
        return res

    f = sc.fault
    res["warnings"] = [_short(x) for x in serious if _at(x) < f.step]
    after = [x for x in serious if _at(x) >= f.step]
    catch = after[0] if after else None
    res["catch"] = _short(catch) if catch else None
    res["delay"] = _at(catch) - f.step if catch else None
    in_time = [x for x in after if _at(x) <= f.step + f.within]
    res["caught"] = bool(in_time) and (f.expect is None or any(x["kind"] == f.expect for x in in_time))
    # A fault that must warn, not page; kinds that would misread it (a new warmup for an LR jump).
    res["overreach"] = [_short(x) for x in findings if _at(x) >= f.step and (
        (f.critical is False and x["severity"] == "critical") or x["kind"] in f.forbid)]
    res["evidence"], res["evidence_ok"] = fault_evidence(sc, steps, loss, res["notes"])
    res["ok"] = (res["caught"] and not res["warnings"] and res["evidence_ok"] and error is None
                 and not res["overreach"] and not res["dishonest"])
    return res


def _learned(sc: Scenario, steps: dict[int, dict], loss: dict[int, float], res: dict,
             notes: dict) -> tuple[str, bool]:
    """A healthy run learned: every step ran, finite, and the loss fell by 10% (or, for a policy
    gradient, whose loss hovers about zero, the policy won half the way to the best arm)."""
    finite = sum(math.isfinite(v) for v in loss.values())
    text = (f"loss {res['loss_first']:.3g} -> {res['loss_last']:.3g}"
            + ("" if finite == len(loss) else f", {len(loss) - finite} non-finite")
            + ("" if len(steps) == sc.steps else f", {len(steps)}/{sc.steps} steps"))
    complete = finite == len(loss) == sc.steps
    if "reward_end" in notes:
        start, end, best = notes["reward_start"], notes["reward_end"], notes["reward_best"]
        text += f"; expected reward {start:.3g} -> {end:.3g} (best arm {best:.3g})"
        return text, complete and end - start >= 0.5 * (best - start)
    return text, complete and res["loss_last"] < 0.9 * res["loss_first"]


def fault_evidence(sc: Scenario, steps: dict[int, dict], loss: dict[int, float],
                   notes: dict | None = None) -> tuple[str, bool]:
    """A sentence on what the fault did to the run, and whether that makes it a real fault."""
    f = sc.fault
    s = f.step
    before = [loss[i] for i in range(max(1, s - 20), s) if i in loss and math.isfinite(loss[i])]
    pre = statistics.median(before) if before else float("nan")
    if f.kind in NEVER_LEARNS:
        return _never_learned(sc, steps, loss)
    if f.kind == "bn-batch1":
        crash = (notes or {}).get("crash", "")
        return (f"{len(steps)} steps, then in step {s}: {crash[:80] or 'no crash'}",
                "more than 1 value per channel" in crash and max(steps, default=0) == s - 1)
    if f.kind == "targets-zero":   # the variance collapses: the loss runs far below zero
        after = {i: v for i, v in loss.items() if i >= s}
        low_step = min(after, key=lambda i: after[i] if math.isfinite(after[i]) else -math.inf)
        low = after[low_step]
        return (f"loss {pre:.3g} before step {s}, {low:.3g} at step {low_step}",
                not math.isfinite(low) or low < pre - 5.0)
    if f.kind == "reward-scale":
        window = [abs(loss[i]) for i in range(s, s + f.within + 1) if i in loss and math.isfinite(loss[i])]
        ratio = statistics.median(window) / statistics.median(abs(v) for v in before)
        return f"median |loss| x{ratio:.3g} over steps {s}-{s + f.within}", ratio >= 100
    if f.kind == "nan-weight":
        v = loss.get(s)
        return f"loss {v} at step {s}", v is not None and not math.isfinite(v)
    if f.kind == "zero-loss":
        zeros = sum(v == 0.0 for v in loss.values())
        return f"loss exactly 0.0 on {zeros} of {len(loss)} steps", zeros == len(loss) > 0
    if f.kind == "resume-restart":
        fp = steps.get(s, {}).get("batch_fingerprint")
        same = fp is not None and fp == steps.get(1, {}).get("batch_fingerprint")
        return (f"step {s} read step 1's batch (fingerprints equal)" if same
                else f"step {s}'s batch differs from step 1's"), same
    if f.kind == "fp16-overflow":
        skipped = [i for i in range(s, max(steps) + 1) if steps.get(i, {}).get("skipped") == 1.0]
        last = s + f.length - 1 if f.length else max(steps)
        scale = [steps[i].get("loss_scale") for i in (s - 1, last) if i in steps]
        went_through = [i for i in range(1, s) if steps.get(i, {}).get("skipped") == 0.0]
        text = f"{len(skipped)} skipped steps from {s} on, loss scale {scale[0]:g} -> {scale[-1]:g}"
        if f.length:   # right after the start-up search: steps must have gone through before it
            text += f"; {len(went_through)} steps went through before step {s}"
        return text, bool(skipped) and skipped[0] == s and (not f.length or bool(went_through))
    window = range(s, min(max(loss), s + f.within + f.length + 5) + 1)
    peak_step = max(window, key=lambda i: loss.get(i, 0.0) if math.isfinite(loss.get(i, 0.0)) else math.inf)
    peak = loss.get(peak_step, float("nan"))
    text = f"loss {pre:.3g} -> {peak:.3g} (x{peak / pre:.1f}) at step {peak_step}"
    if f.kind in ("lr-jump", "lr-ramp"):
        lr_before, lr_at = steps.get(s - 1, {}).get("lr"), steps.get(s, {}).get("lr")
        if lr_before and lr_at:
            text += f"; LR x{lr_at / lr_before:.3g} at step {s}"
    if f.kind == "lr-ramp":
        # A drift, not a jump: from its lowest point after the ramp began, the 5-step mean of
        # the loss rises 20% before any single point stands 50% above that low.
        smooth = {i: statistics.fmean(loss[j] for j in range(i - 4, i + 1))
                  for i in range(s + 4, max(loss) + 1) if all(j in loss for j in range(i - 4, i + 1))}
        low_step = min(smooth, key=lambda i: smooth[i] if math.isfinite(smooth[i]) else math.inf)
        low = smooth[low_step]
        up = next((i for i, v in smooth.items() if i > low_step and v > 1.2 * low), None)
        if up is None:
            return text + f"; from its low {low:.3g} at step {low_step} the loss never rose 20%", False
        highest = max(loss[i] for i in range(low_step, up + 1))
        return (text + f"; 5-step mean {low:.3g} at step {low_step}, +20% at step {up}, no point "
                f"above x{highest / low:.2f} before"), highest < 1.5 * low
    # garbage batches right after warmup, while the loss is still falling fast, raise it by a
    # third (the case: 3.1 -> 4.2); elsewhere a fault at least halves the way up
    return text, not math.isfinite(peak) or peak >= (1.3 if f.kind == "warmup-spike" else 1.5) * pre


def _never_learned(sc: Scenario, steps: dict[int, dict], loss: dict[int, float]) -> tuple[str, bool]:
    """The run never learned from the fault step on: its last fifth is not 10% below its first
    20 points, and what the fault claims holds (the loss at chance level ln C for random labels,
    an LR of 0 for ``lr-zero``, a grad norm of 0 for ``frozen``, gradients for
    ``optimizer-stale``)."""
    f = sc.fault
    after = [loss[i] for i in sorted(loss) if i >= f.step and math.isfinite(loss[i])]
    if len(after) < 40:
        return f"{len(after)} finite points from step {f.step}", False
    first, last = statistics.fmean(after[:20]), statistics.fmean(after[-len(after) // 5:])
    text = f"loss {first:.3g} -> {last:.3g} from step {f.step}"
    flat = last >= 0.9 * first
    if f.kind == "random-labels":
        chance = math.log(NUM_CLASSES)
        return text + f" (chance level ln {NUM_CLASSES} = {chance:.3g})", flat and abs(last - chance) < 0.05 * chance
    if f.kind == "lr-zero":
        lrs = {steps[i].get("lr") for i in steps if i >= f.step}
        return text + f"; LR {sorted(lrs, key=str)[:3]} from step {f.step}", flat and lrs == {0.0}
    norms = {steps[i]["grad_norm"] for i in steps if "grad_norm" in steps[i]}
    if f.kind == "optimizer-stale":   # the model's gradients flow: HF's grad norm is the model's
        if not norms:                 # (> 0); Lightning's is the optimizer's tensors', which get none (0)
            return text + "; no grad norm logged", flat
        moving = min(norms) > 0 if sc.framework == "hf" else norms <= {0.0}
        return text + f"; grad norm {min(norms):.3g}-{max(norms):.3g}", flat and moving
    # frozen: no gradient reaches a parameter (Lightning then logs no grad norm at all)
    return (text + (f"; grad norm {sorted(norms)[:3]}" if norms else "; no grad norm logged"),
            flat and norms <= {0.0})
