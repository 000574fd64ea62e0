"""Which data a spike came from (the ``forensics`` section; docs/design.md, Forensics).

Every optimizer step's dataset indices go into a bounded ring on the host (:class:`StepIndices`),
filled by the sampler the integration already controls (the automatic rollback's
``DataSkipSampler``: HF and Lightning map-style loaders, DeepSpeed's ``hook.batches``). A
``loss_spike`` or ``nonfinite`` finding then names the samples of its step and of its
neighbours (``details.samples``), and the ``rollback_advice`` names those of the episode's onset
in its sentence. With ``dump_batches`` the last steps' input batches are also held, by
reference; a spike at ``warning`` or worse runs one no-grad forward of the model on its first
abnormal step's batch (the torch side, :class:`ForensicsPeer`), ranks that batch's samples by
their own loss and writes ``run_dir/forensics/step-N.jsonl`` (rank 0).

Cost: on an ordinary step, the sampler hands each step's index list to the ring (one
``list`` built from an ``islice``, one dict insert) and the session appends a reference per
micro-batch: no device work, no sync. State: ``steps_kept`` index lists, ``batches_kept``
steps' batch references. Everything else happens at a finding.

Several ranks (every rank makes the same findings at the same step): a sampler shared by the
ranks (HF with accelerate: each rank takes every W-th batch) already names every rank's samples
on every rank; a rank-local one (``DistributedSampler``) names this rank's only, so at a finding
that names samples every rank takes part in one gather over the data-parallel group (the torch
side's collective, never on an ordinary step) and the finding names every rank's samples,
rank-major. A dump is collective alike: every rank ranks its own micro-batches, rank 0 writes.
Torch-free: the torch side connects through :meth:`Forensics.connect`.

>>> fz = Forensics(neighbour_steps=1)
>>> for step in (1, 2, 3):
...     fz.indices.put(step, [8 * (step - 1) + i for i in range(8)])
...     fz.step_closed(step)
>>> fz.connect(LocalPeer())
>>> f = Finding(2, "loss_spike", "info", "The loss jumped.")
>>> fz.annotate([f])
>>> f.details["samples"]["indices"], sorted(f.details["samples"]["neighbours"])
([8, 9, 10, 11, 12, 13, 14, 15], ['1', '3'])
>>> compact(f.details["samples"]["indices"])
'8-15'
"""
from __future__ import annotations

import json
import logging
import math
import numbers
import os
from collections import deque
from pathlib import Path
from typing import Any, Iterable, Protocol, Sequence

from .params import flag, int_at_least
from .record import Finding, severity_rank

__all__ = ["Forensics", "StepIndices", "ForensicsPeer", "LocalPeer", "SAMPLE_KINDS", "EPISODE_KINDS", "FORENSICS_DIR",
           "compact", "dump_path", "read_dumps", "listing", "NOT_RECORDED"]

log = logging.getLogger("stability_callbacks")

#: The finding kinds that name the samples of their step and its neighbours.
SAMPLE_KINDS = frozenset({"loss_spike", "nonfinite"})
#: The finding kinds that close a spike: they name the samples of the episode's first steps.
EPISODE_KINDS = frozenset({"spike_recovered", "spike_unrecovered"})
#: The folder under ``run_dir`` where the ranked batches go.
FORENSICS_DIR = "forensics"
#: How many of the highest-loss samples a finding's ``details.samples.ranked.top`` lists.
TOP_SAMPLES = 3
#: Why no index is known before any sampler was iterated.
NOT_RECORDED = ("no train sampler the integration controls was iterated (HF and Lightning: a "
                "DataLoader over a map-style dataset; DeepSpeed: a loop over hook.batches(loader))")


class StepIndices:
    """The dataset indices each recent optimizer step read, on this rank: a bounded ring filled
    by the sampler (:meth:`put`, once per step), read at a finding (:meth:`get`).

    ``steps_kept``: how many steps it holds, counting the steps the loader has drawn ahead of
    training (its prefetch). ``problem``: why it holds nothing (None once a sampler records).
    ``shared_by_ranks``: how many ranks read from the one sampler that filled it (HF under
    accelerate: every rank's samples are here; 1: this rank's only).

    >>> ring = StepIndices(2)
    >>> for s in (1, 2, 3):
    ...     ring.put(s, [s])
    >>> ring.get(1), ring.get(3), ring.newest
    (None, [3], 3)
    """

    def __init__(self, steps_kept: int):
        self.steps_kept = steps_kept
        self.problem: str | None = NOT_RECORDED
        #: Why the steps' indices cannot be trusted any more (sticky), or None.
        self.mismatch: str | None = None
        self.shared_by_ranks = 1
        self.samples_per_step = 0
        self.newest: int | None = None
        self._steps: dict[int, list] = {}

    def put(self, step: int, indices: list) -> None:
        steps = self._steps
        steps.pop(step, None)   # a rollback re-reads a step: the newest reading wins
        steps[step] = indices
        self.newest = step
        if len(steps) > self.steps_kept:
            del steps[next(iter(steps))]

    def get(self, step: int) -> list | None:
        return self._steps.get(step)


class ForensicsPeer(Protocol):
    """The torch side of :class:`Forensics` (``integrations/torch/forensics.py``): who this rank
    is, the one gather at a finding, and the ranking forward."""

    rank: int
    world_size: int

    def gather(self, obj: Any) -> list:
        """``obj`` of every rank of the data-parallel group, in rank order (a collective)."""

    def rank_rows(self, batches: list, indices: list | None, shared_by_ranks: int,
                  tokens_kept: int) -> tuple[list[dict], float, str]:
        """This rank's rows of a held step (``{"index", "loss", "tokens"}``), the forward's cost
        in ms, and the loss rule used. Raises on a model or batch it cannot rank."""


class LocalPeer:
    """One process, nothing to rank with: indices only (tests, and a session without a model)."""

    rank, world_size = 0, 1

    def gather(self, obj: Any) -> list:
        return [obj]

    def rank_rows(self, batches, indices, shared_by_ranks, tokens_kept):
        raise RuntimeError("no model to rank the batch with")


class Forensics:
    """The ``forensics`` section, and what it keeps (module docstring; docs/design.md, Forensics).

    - ``record_samples``: record each step's dataset indices and name them in findings.
    - ``steps_kept``: how many steps' indices the ring holds (counting the loader's prefetch).
    - ``neighbour_steps``: the steps on each side of the spiking step named with it (those after
      it only when already trained at the finding).
    - ``dump_batches``: hold the last ``batches_kept`` steps' input batches by reference and, on a
      ``loss_spike`` at ``warning`` or worse, rank the first abnormal step's samples by their own
      loss (one no-grad forward) into ``run_dir/forensics/step-N.jsonl``.
    - ``tokens_kept``: how many leading token ids of each sample that file shows.
    """

    def __init__(self, *, record_samples: bool = True, steps_kept: int = 64, neighbour_steps: int = 2,
                 dump_batches: bool = False, batches_kept: int = 8, tokens_kept: int = 32):
        self.record_samples = flag("record_samples", record_samples)
        self.steps_kept = int_at_least("steps_kept", steps_kept, 1)
        self.neighbour_steps = int_at_least("neighbour_steps", neighbour_steps, 0)
        self.dump_batches = flag("dump_batches", dump_batches)
        self.batches_kept = int_at_least("batches_kept", batches_kept, 1)
        self.tokens_kept = int_at_least("tokens_kept", tokens_kept, 0)
        #: The ring the sampler fills (None with ``record_samples: false``).
        self.indices = StepIndices(steps_kept) if record_samples else None
        #: The last optimizer step the run closed.
        self.trained_through = 0
        #: Why the dump is off for this run (said once), or None.
        self.dump_problem: str | None = None
        self._peer: ForensicsPeer | None = None
        self._held: deque[tuple[int, list]] = deque(maxlen=batches_kept)
        self._named: dict[int, tuple[list, int]] = {}   # step -> (its indices, how many ranks' they are)
        self._first_abnormal: dict[int, int] = {}   # spike onset -> the step its first finding came at
        self._dumped: set[int] = set()

    # ---------------------------------------------------------------- the ordinary step (cheap)
    @property
    def wants_batches(self) -> bool:
        """Whether the session should hand each step's micro-batches over (:meth:`step_closed`)."""
        return self.dump_batches and self.dump_problem is None and self._peer is not None

    def step_closed(self, step: int, batches: list | None = None, rows: int = 0) -> None:
        """The run closed optimizer step ``step``; ``batches``: its micro-batches, held by
        reference (with ``dump_batches``); ``rows``: how many samples they held (0: unknown).
        A full step of the ring that is not what the loop read (times the ranks that share the
        sampler) means the steps cannot be told apart (a sampler whose steps are not batch size
        x accumulation samples): from then on the samples are unknown, and say why."""
        self.trained_through = step
        if batches:
            self._held.append((step, batches))
        ring = self.indices
        if rows and ring is not None and ring.mismatch is None:
            drawn = ring.get(step)
            if drawn is not None and len(drawn) == ring.samples_per_step and len(drawn) != rows * ring.shared_by_ranks:
                ring.mismatch = (f"the loop read {rows} samples at step {step} where the sampler dealt "
                                 f"{len(drawn) // ring.shared_by_ranks}: this loader's steps cannot be told "
                                 f"apart by position")

    def forget(self, step: int) -> None:
        """A checkpoint was loaded at ``step``: what was held and named belongs to the abandoned
        steps (the steps after it read other data now)."""
        self._held.clear()
        self._named.clear()
        self.trained_through = step

    def unknown_because(self, reason: str) -> None:
        """Why no sampler records this run's indices (the integration knows it best)."""
        if self.indices is not None and self.indices.newest is None:
            self.indices.problem = reason

    def connect(self, peer: ForensicsPeer) -> None:
        """The torch side is there: findings name samples from now on (without it, a replay,
        nothing is known of the data)."""
        self._peer = peer

    # ------------------------------------------------------------------------- at a finding
    def annotate(self, found: Sequence[Finding], *, run_dir: str | os.PathLike | None = None,
                 is_rank0: bool = True) -> None:
        """Attach the samples to the findings that name them (``details.samples``) and, with
        ``dump_batches``, rank a spike's batch. Every rank calls it with the same findings; the
        one gather (several ranks) is reached by all of them alike."""
        peer = self._peer
        if peer is None:
            return
        plans = [(f, self._plan(f)) for f in found
                 if f.kind in SAMPLE_KINDS or f.kind in EPISODE_KINDS or f.kind == "rollback_advice"]
        if not plans:
            return
        ring = self.indices
        steps = sorted({s for _, (_, around, _) in plans for s in around} - set(self._named)) if ring else []
        dump = next((d for _, (_, _, d) in plans if d is not None), None)
        local: dict[str, Any] = {"steps": {s: _plain(ring.get(s)) for s in steps} if ring else {}}
        if dump is not None:
            local["dump"] = self._rank_locally(peer, dump)
        shared = ring.shared_by_ranks if ring else 1
        gather = peer.world_size > 1 and (dump is not None or (bool(steps) and shared == 1))
        # host-sync: only at a finding that names samples; every rank reaches it (same findings).
        everyone = peer.gather(local) if gather else [local]
        for s in steps:
            lists = [p["steps"].get(s) for p in everyone]
            have = [x for x in lists if x is not None]
            if have:   # a shared sampler: every rank holds all of them; else rank-major
                self._named[s] = ((have[0], peer.world_size) if shared > 1 else
                                  ([i for x in have for i in x], len(have)))
        while len(self._named) > self.steps_kept:
            del self._named[next(iter(self._named))]
        ranked = None if dump is None else self._ranked(dump, [p.get("dump") for p in everyone], run_dir, is_rank0)
        for f, (centre, around, d) in plans:
            if ring is None and d is None:
                continue
            samples: dict[str, Any] = self._samples(centre, around) if ring else {"step": centre}
            if d is not None:
                samples["ranked"] = ranked
            f.details["samples"] = samples
            f.message += _sentence(f, samples)

    def _plan(self, f: Finding) -> tuple[int, list[int], int | None]:
        """(the step whose samples the finding names, the steps named with it, the step whose
        batch to rank or None)."""
        k, done = self.neighbour_steps, self.trained_through
        onset = int(f.onset_step if f.onset_step is not None else f.step)
        if f.kind == "rollback_advice":   # the episode's onset, within the steps it skips
            first, last = f.details.get("skip_steps") or (onset, onset)
            return onset, [s for s in range(onset - k, onset + k + 1) if first <= s <= min(last, done)], None
        if f.kind in EPISODE_KINDS:   # the episode's first steps: what the loss came back from
            return onset, list(range(onset, min(f.step - 1, onset + 2 * k, done) + 1)) or [onset], None
        centre = f.step
        around = [s for s in range(centre - k, centre + k + 1) if 1 <= s <= max(centre, done)]
        dump = None
        if f.kind == "loss_spike":
            if not f.details.get("escalated"):
                self._first_abnormal[onset] = f.step
                while len(self._first_abnormal) > 64:
                    del self._first_abnormal[next(iter(self._first_abnormal))]
            step = self._first_abnormal.get(onset, f.step)
            if (self.dump_batches and self.dump_problem is None and severity_rank(f.severity) >= 1
                    and step not in self._dumped):
                self._dumped.add(step)
                dump = step
        return centre, around, dump

    def _samples(self, centre: int, around: Iterable[int]) -> dict[str, Any]:
        """``details.samples``: the step's indices (every rank's, rank-major), its neighbours',
        how many ranks' samples they are, or why they are unknown."""
        ring = self.indices
        indices, ranks = (None, 0) if ring is None or ring.mismatch else self._named.get(centre, (None, 0))
        out: dict[str, Any] = {"step": centre, "indices": indices}
        neighbours = {str(s): self._named[s][0] for s in around if s != centre and s in self._named
                      and indices is not None}
        if neighbours:
            out["neighbours"] = neighbours
        if indices is None:
            out["unknown"] = self._why_unknown(centre)
        else:
            out["ranks"] = ranks
        return out

    def _why_unknown(self, step: int) -> str:
        ring = self.indices
        if ring is None:
            return "forensics.record_samples is false"
        if ring.mismatch is not None:
            return ring.mismatch
        if ring.problem is not None:
            return ring.problem
        if ring.newest is not None and step > ring.newest:
            return f"the sampler had not reached step {step}"
        return (f"step {step} is no longer held (forensics.steps_kept = {self.steps_kept} steps, "
                f"counting the loader's prefetch)")

    def _rank_locally(self, peer: ForensicsPeer, step: int) -> dict[str, Any]:
        """This rank's rows of ``step``'s batch, or why not (every rank answers; no raise)."""
        held = next((b for s, b in self._held if s == step), None)
        if held is None:
            return {"unknown": f"the batch of step {step} is no longer held (forensics.batches_kept = "
                               f"{self.batches_kept} steps)"}
        ring = self.indices
        try:
            rows, ms, rule = peer.rank_rows(held, ring.get(step) if ring and not ring.mismatch else None,
                                            ring.shared_by_ranks if ring else 1, self.tokens_kept)
        except Exception as e:   # monitoring never takes training down: the dump goes off
            log.debug("stability: ranking the batch of step %d failed", step, exc_info=True)
            return {"error": f"{type(e).__name__}: {e}"}
        for r in rows:
            r["rank"] = peer.rank
        return {"rows": rows, "forward_ms": ms, "loss": rule}

    def _ranked(self, step: int, answers: list, run_dir, is_rank0: bool) -> dict[str, Any]:
        """Every rank's rows merged and ranked (highest loss first, a non-finite loss first of
        all), written by rank 0; the summary a finding carries."""
        errors = [a["error"] for a in answers if a and "error" in a]
        if errors:
            self.dump_problem = errors[0]
            log.warning("stability: ranking the batch of step %d failed (%s); forensics.dump_batches "
                        "is off for this run, the samples are still named", step, errors[0])
            return {"step": step, "unknown": f"the ranking forward failed: {errors[0]}"}
        missing = next((a["unknown"] for a in answers if not a or "unknown" in a), None)
        if missing is not None:
            return {"step": step, "unknown": missing}
        rows = sorted((r for a in answers for r in a["rows"]), key=_rank_key)
        out: dict[str, Any] = {"step": step, "path": None, "samples": len(rows),
                               "forward_ms": round(max(a["forward_ms"] for a in answers), 2),
                               "loss": answers[0]["loss"],
                               "top": [{"index": r["index"], "loss": _json_loss(r["loss"])} for r in rows[:TOP_SAMPLES]]}
        if run_dir is None:
            out["unknown"] = "no run directory to write the ranked samples to"
            return out
        rel = f"{FORENSICS_DIR}/step-{step}.jsonl"
        if is_rank0:
            try:
                path = dump_path(run_dir, step)
                path.parent.mkdir(parents=True, exist_ok=True)
                tmp = path.with_suffix(".tmp")
                with open(tmp, "w", encoding="utf-8") as fh:
                    for r in rows:
                        fh.write(json.dumps({"index": r["index"], "loss": _json_loss(r["loss"]),
                                             "tokens": r["tokens"], "rank": r["rank"]}) + "\n")
                os.replace(tmp, path)
            except OSError as e:
                log.warning("stability: cannot write %s: %s", Path(run_dir) / rel, e)
                out["unknown"] = f"cannot write {rel}: {e}"
                return out
        out["path"] = rel
        return out


def _rank_key(row: dict) -> tuple[int, float]:
    """Highest loss first; a non-finite loss before every finite one; a row without a label
    token (no loss) last."""
    loss = row["loss"]
    if loss is None:
        return (2, 0.0)
    return (1, -loss) if math.isfinite(loss) else (0, 0.0)


def _json_loss(x: float | None):
    return x if x is None or math.isfinite(x) else repr(x)


def _plain(indices: list | None) -> list | None:
    """Indices JSON can carry (a sampler may yield numpy integers)."""
    if indices is None:
        return None
    return [int(i) if isinstance(i, numbers.Integral) else str(i) for i in indices]


def _sentence(f: Finding, samples: dict) -> str:
    """What the message adds: the rollback advice always names the onset's samples; a spike at
    warning or worse names its step's, and the ranking when there is one."""
    if f.kind == "rollback_advice":
        idx = samples.get("indices")
        if idx is None:
            return ""
        return (f" The batch of step {samples['step']} held dataset indices {compact(idx)} "
                f"(details.samples; stability-callbacks forensics lists them).")
    if f.kind != "loss_spike" or severity_rank(f.severity) < 1 or samples.get("indices") is None:
        return ""
    out = f" Step {samples['step']} read dataset indices {compact(samples['indices'])}"
    ranked = samples.get("ranked") or {}
    top = ranked.get("top")
    if top and ranked.get("path"):
        of = "" if ranked["step"] == samples["step"] else f" (step {ranked['step']}'s)"
        loss = top[0]["loss"]
        out += (f"; ranked by their own loss in {ranked['path']}{of}, index {top[0]['index']} first"
                + (f" at {loss:.3g}" if isinstance(loss, float) else f" ({loss})" if loss else ""))
    return out + "."


def compact(indices: Sequence, max_runs: int = 6) -> str:
    """Indices as runs: ``[3, 4, 5, 9]`` -> ``'3-5, 9'``; past ``max_runs`` runs, ``(+N more)``.

    >>> compact([7, 1, 2, 3, 9, 10], max_runs=2)
    '7, 1-3 (+2 more)'
    """
    runs: list[list] = []
    for i in indices:
        if runs and isinstance(i, int) and isinstance(runs[-1][1], int) and i == runs[-1][1] + 1:
            runs[-1][1] = i
        else:
            runs.append([i, i])
    text = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs[:max_runs])
    rest = sum(b - a + 1 if isinstance(a, int) else 1 for a, b in runs[max_runs:])
    return text + (f" (+{rest} more)" if rest else "")


def dump_path(run_dir: str | os.PathLike, step: int) -> Path:
    return Path(run_dir) / FORENSICS_DIR / f"step-{step}.jsonl"


def read_dumps(run_dir: str | os.PathLike) -> list[tuple[int, Path, list[dict]]]:
    """``(step, path, rows)`` of every ``forensics/step-N.jsonl`` in ``run_dir``, by step; the
    rows as written (highest loss first). Raises ``ValueError`` naming the file and line of a
    line that is not a JSON object."""
    folder = Path(run_dir) / FORENSICS_DIR
    out = []
    for path in folder.glob("step-*.jsonl") if folder.is_dir() else ():
        stem = path.stem[len("step-"):]
        if not stem.isdigit():
            continue
        rows = []
        with open(path, encoding="utf-8") as fh:
            for n, line in enumerate(fh, 1):
                if not line.strip():
                    continue
                try:
                    row = json.loads(line)
                except ValueError:
                    row = None
                if not isinstance(row, dict):
                    raise ValueError(f"{path} line {n}: not a JSON object")
                rows.append(row)
        out.append((int(stem), path, rows))
    return sorted(out, key=lambda t: t[0])


def listing(run_dir: str | os.PathLike) -> tuple[list[dict], list[int]]:
    """What ``stability-callbacks forensics RUN_DIR`` lists: every finding of ``run_dir``'s run
    log that names samples (``{"type": "samples", ...}``, in run-log order) and every ranked
    batch in ``run_dir/forensics/`` (``{"type": "ranked", "step", "path", "rows"}``, by step);
    and the numbers of the run-log lines that could not be read (a killed job's last line).
    Raises ``OSError`` / ``ValueError`` naming what cannot be read."""
    folder = Path(run_dir)
    if folder.is_file():
        folder = folder.parent
    if not folder.is_dir():
        raise OSError(f"{run_dir}: no such run directory")
    out: list[dict] = []
    bad: list[int] = []
    runlog = folder / "runlog.jsonl"
    if runlog.is_file():
        with open(runlog, encoding="utf-8", errors="replace") as fh:
            for n, line in enumerate(fh, 1):
                if '"samples"' not in line:
                    continue
                try:
                    obj = json.loads(line)
                except ValueError:
                    bad.append(n)
                    continue
                samples = (obj.get("details") or {}).get("samples") if obj.get("type") == "finding" else None
                if isinstance(samples, dict):
                    out.append({"type": "samples", "finding_step": obj.get("step"), "kind": obj.get("kind"),
                                "severity": obj.get("severity"), **samples})
    for step, path, rows in read_dumps(folder):
        out.append({"type": "ranked", "step": step, "path": str(path.relative_to(folder)), "rows": rows})
    return out, bad
