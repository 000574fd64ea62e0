"""Torch side of the preflight audit: measure a model / optimizer / scheduler once at train begin.

``collect_facts`` turns live objects into :class:`~stability_callbacks.preflight.PreflightFacts`;
the rules live in the torch-free :mod:`stability_callbacks.preflight`::

    facts = collect_facts(model, optimizer, scheduler, precision="bf16", total_steps=max_steps)
    findings = config.preflight.build().audit(facts)   # list[Finding], kind "preflight", step 0

Cost: one read of every matrix weight, sampled to at most ``max_sample_elements`` (a fixed
strided subset) per tensor; one host transfer per device at the end (``# host-sync:``, once per
run). A part that cannot be read (an exotic optimizer wrapper, a meta tensor) is left ``None``
and logged once: the audit must never stop training.
"""
from __future__ import annotations

import copy
import functools
import logging
import math
import re
import warnings
from collections import Counter, defaultdict
from typing import Any

import torch

from stability_callbacks.params import positive_int
from stability_callbacks.preflight import (PreflightFacts, facts_from_config, normalize_precision,
                                        weight_decay_is_decoupled)

log = logging.getLogger(__name__)

_LAYER_GROUP = re.compile(r"^(.*?\.\d+)(?:\.|$)")
_OPTIMIZER_WRAPPER_ATTRS = ("optimizer", "_optimizer", "basic_optimizer")
_SCHEDULER_WRAPPER_ATTRS = ("scheduler", "lr_scheduler", "_scheduler")
_PRECISION_OF_DTYPE = {torch.float16: "fp16", torch.bfloat16: "bf16"}


def collect_facts(model: torch.nn.Module, optimizer: Any = None, scheduler: Any = None, *,
                  precision: str | None = None, warmup_steps: int | None = None,
                  total_steps: int | None = None, bf16_available: bool | None = None,
                  attention_scale_after_qk: bool | None = None,
                  weights_pretrained: bool | None = None,
                  max_sample_elements: int = 1 << 20) -> PreflightFacts:
    """Facts about ``model`` (and optionally its optimizer and LR scheduler) for the audit.

    Explicit keyword values win over what is detected, except ``warmup_steps``: the warmup of the
    scheduler in use, read by evaluating its LR over the first steps, wins over a framework's
    warmup argument (which says nothing of a scheduler passed in by hand); the argument counts
    where the scheduler cannot be read. ``precision`` is "fp16"/"bf16"/"fp32" or a
    framework's spelling ("16-mixed", ``torch.bfloat16``; detected only from half-precision parameters: under AMP the weights are fp32, so pass it).
    ``weights_pretrained=True`` (a fine-tune, or a resume) turns the init-std rules off; when
    ``None`` it is True for a transformers model loaded with ``from_pretrained``.

    >>> lin = torch.nn.Linear(64, 64)
    >>> f = collect_facts(lin, torch.optim.AdamW(lin.parameters(), betas=(0.9, 0.95)))
    >>> f.hidden_size, f.optimizer, f.betas, sorted(f.layer_init_std)
    (64, 'AdamW', (0.9, 0.95), ['<root>'])
    """
    positive_int("max_sample_elements", max_sample_elements)
    facts = PreflightFacts(source=type(model).__name__)
    owner = _hf_config_owner(model)
    if owner is not None:
        facts = _guard("reading the model config", lambda: _from_hf_config(owner, model), facts)
    _guard("measuring init std", lambda: _measure_weights(model, facts, max_sample_elements), None)
    if optimizer is not None:
        _guard("reading the optimizer", lambda: _read_optimizer(optimizer, facts), None)
    if scheduler is not None:
        _guard("reading the LR scheduler", lambda: _read_scheduler(scheduler, facts, total_steps), None)
    if precision is not None:
        facts.precision = normalize_precision(precision)
    facts.bf16_available = bf16_available if bf16_available is not None else _bf16_available()
    if attention_scale_after_qk is not None:
        facts.attention_scale_after_qk = attention_scale_after_qk
    if weights_pretrained is not None:
        facts.weights_pretrained = weights_pretrained
    if warmup_steps is not None and facts.warmup_steps is None:
        facts.warmup_steps = int(warmup_steps)
    if total_steps is not None:
        facts.total_steps = int(total_steps)
    return facts


# -- model -------------------------------------------------------------------------------------
def _hf_config_owner(model):
    """``model`` or its first submodule holding a transformers config (a LightningModule
    wrapping an HF model)."""
    for module in model.modules():
        cfg = getattr(module, "config", None)
        if cfg is not None and hasattr(cfg, "to_dict"):
            return module
    return None


def _from_hf_config(owner, model) -> PreflightFacts:
    facts = facts_from_config(owner.config.to_dict(), source=type(model).__name__)
    facts.precision = None      # the saved dtype says little about how this run trains
    facts.num_params = None     # counted exactly from the parameters below
    # Loading a checkpoint (from_pretrained) attaches `_weight_conversions` in transformers 5.x
    # (core_model_loading.py); `config._name_or_path` would not do: from_config(a hub config),
    # the usual way to pretrain from scratch, sets it too. Private, so only a default: pass
    # `weights_pretrained=` to be sure.
    facts.weights_pretrained = "_weight_conversions" in vars(owner)
    return facts


def _measure_weights(model: torch.nn.Module, facts: PreflightFacts, max_sample: int) -> None:
    seen: set[int] = set()
    stats: list[tuple[str, bool, int, torch.Tensor]] = []   # (group, is_embedding, n, [var, mean])
    fan_in: Counter = Counter()
    emb_dims: Counter = Counter()
    groups_numbered: set[str] = set()
    num_params = 0
    dtypes: Counter = Counter()
    has_embedding = has_embedding_norm = False
    scale_after_qk = False
    for mod_name, module in model.named_modules():
        cls = type(module).__name__
        is_norm = "norm" in cls.lower()
        is_embedding = isinstance(module, torch.nn.Embedding) or "embedding" in cls.lower() and not is_norm
        if is_norm and "emb" in mod_name.lower():
            has_embedding_norm = True   # BLOOM word_embeddings_layernorm, BERT embeddings.LayerNorm
        if cls == "BloomAttention":
            scale_after_qk = True       # alibi.baddbmm(..., alpha=inv_norm_factor): scale after Q·K
        for p_name, p in module.named_parameters(recurse=False):
            if id(p) in seen:
                continue                # tied weights (lm_head = wte) count once
            seen.add(id(p))
            local, shape = _local_values(p)
            num_params += int(getattr(p, "ds_numel", 0) or p.numel())
            if p.is_floating_point():
                dtypes[p.dtype] += int(p.numel() or getattr(p, "ds_numel", 0))
            if local is None or len(shape) < 2 or is_norm:
                continue         # biases, norm gains, 1-D params: not initialised with the std
            group = _group_of(mod_name)
            if _LAYER_GROUP.match(mod_name):
                groups_numbered.add(group)
            # raw 2-D parameters named like wpe / pos_embed are embeddings too
            emb_param = is_embedding or "emb" in p_name.lower() or p_name.lower().startswith("pos")
            if emb_param:
                has_embedding = True
                emb_dims[int(shape[-1])] += 1
            else:
                # HF's GPT-2 Conv1D stores (in, out); everything else (out, in, ...).
                fan_in[int(shape[0] if cls == "Conv1D" else shape[1])] += 1
            stats.append((group, emb_param, _sampled_numel(local, max_sample),
                          _var_mean(local, max_sample)))
    layer_std, emb_std = _pool(stats)
    facts.layer_init_std = layer_std
    facts.embedding_init_std = emb_std
    facts.num_params = num_params
    if facts.hidden_size is None:
        # the embedding width, else the most common fan-in of the matrices (ties: the wider)
        counts = emb_dims or fan_in
        if counts:
            facts.hidden_size = max(counts.items(), key=lambda kv: (kv[1], kv[0]))[0]
    if facts.num_layers is None and groups_numbered:
        facts.num_layers = len(groups_numbered)
    # the modules are the truth here (the config's model_type only guessed); no embedding: moot
    facts.has_embedding_layernorm = has_embedding_norm if (has_embedding or has_embedding_norm) else None
    if scale_after_qk:
        facts.attention_scale_after_qk = True
    if dtypes:
        dominant = dtypes.most_common(1)[0][0]
        facts.precision = _PRECISION_OF_DTYPE.get(dominant)


def _local_values(p: torch.Tensor):
    """(the values this rank holds, the logical shape); values None when not readable."""
    if getattr(p, "ds_tensor", None) is not None and p.numel() == 0:
        # DeepSpeed ZeRO-3: the full parameter is gathered only in forward; this rank's flat
        # partition is a fair sample of its values.
        return p.ds_tensor.detach(), tuple(getattr(p, "ds_shape", ()))
    if hasattr(p, "to_local"):           # DTensor (FSDP2, TP): the local shard
        return p.to_local().detach(), tuple(p.shape)
    if p.device.type == "meta" or p.numel() == 0 or not p.is_floating_point():
        return None, tuple(p.shape)
    return p.detach(), tuple(p.shape)


def _sample(t: torch.Tensor, max_sample: int) -> torch.Tensor:
    flat = t.reshape(-1)
    n = flat.numel()
    if n <= max_sample:
        return flat
    stride = math.ceil(n / max_sample)
    # An odd stride walks across columns of power-of-two-wide matrices instead of re-reading
    # the same few; the values are i.i.d. at init, so any fixed subset estimates the std.
    if stride % 2 == 0:
        stride += 1
    return flat[::stride]


def _sampled_numel(t: torch.Tensor, max_sample: int) -> int:
    n = t.numel()
    if n <= max_sample:
        return n
    stride = math.ceil(n / max_sample)
    stride += stride % 2 == 0
    return math.ceil(n / stride)


def _var_mean(t: torch.Tensor, max_sample: int) -> torch.Tensor:
    var, mean = torch.var_mean(_sample(t, max_sample).float(), correction=0)
    return torch.stack((var, mean))


def _pool(stats) -> tuple[dict[str, float], dict[str, float]]:
    """Pool per-tensor (n, var, mean) into one std per layer group (exact, Chan et al.)."""
    if not stats:
        return {}, {}
    by_device: dict[torch.device, list[int]] = defaultdict(list)
    for i, (_, _, _, vm) in enumerate(stats):
        by_device[vm.device].append(i)
    host: list[list[float]] = [None] * len(stats)  # type: ignore[list-item]
    for idx in by_device.values():
        # host-sync: once per run at train begin, one transfer per device.
        rows = torch.stack([stats[i][3] for i in idx]).tolist()
        for i, row in zip(idx, rows):
            host[i] = row
    parts: dict[tuple[str, bool], list[tuple[int, float, float]]] = defaultdict(list)
    for (group, is_emb, n, _), (var, mean) in zip(stats, host):
        parts[(group, is_emb)].append((n, var, mean))
    layer, emb = {}, {}
    for key, items in parts.items():
        total = sum(n for n, _, _ in items)
        mean = sum(n * m for n, _, m in items) / total
        var = sum(n * (v + (m - mean) ** 2) for n, v, m in items) / total
        (emb if key[1] else layer)[key[0]] = math.sqrt(max(var, 0.0))
    return layer, emb


def _group_of(module_name: str) -> str:
    m = _LAYER_GROUP.match(module_name)
    if m:
        return m.group(1)
    return module_name or "<root>"


# -- optimizer -----------------------------------------------------------------------------------
def _innermost(obj, attrs):
    """Follow wrapper attributes (AcceleratedOptimizer.optimizer, LightningOptimizer._optimizer,
    DeepSpeedZeroOptimizer.optimizer) down to the object that does the work."""
    for _ in range(6):
        inner = next((getattr(obj, a) for a in attrs
                      if getattr(obj, a, None) is not None and getattr(obj, a) is not obj), None)
        if inner is None:
            return obj
        obj = inner
    return obj


def _read_optimizer(optimizer, facts: PreflightFacts) -> None:
    opt = _innermost(optimizer, _OPTIMIZER_WRAPPER_ATTRS)
    name = type(opt).__name__
    facts.optimizer = name
    groups = getattr(opt, "param_groups", None) or getattr(optimizer, "param_groups", None) or []
    betas = next((g["betas"] for g in groups if g.get("betas") is not None), None)
    if betas is not None:
        facts.betas = (float(betas[0]), float(betas[1]))
    wds = [float(g.get("weight_decay") or 0.0) for g in groups]
    facts.weight_decay = max(wds) if wds else None
    flags = [g["decoupled_weight_decay"] for g in groups if "decoupled_weight_decay" in g]
    if flags:
        facts.weight_decay_decoupled = bool(flags[0]) or name == "AdamW"
    elif getattr(opt, "adam_w_mode", None) is not None:       # DeepSpeed FusedAdam / CPUAdam
        facts.weight_decay_decoupled = bool(opt.adam_w_mode)
    else:
        facts.weight_decay_decoupled = weight_decay_is_decoupled(name)


# -- scheduler -----------------------------------------------------------------------------------
def _read_scheduler(scheduler, facts: PreflightFacts, total_hint: int | None) -> None:
    sched = _innermost(scheduler, _SCHEDULER_WRAPPER_ATTRS)
    warmup, total = scheduler_warmup(sched, total_hint)
    if warmup is not None:
        facts.warmup_steps = warmup
    if total is not None:
        facts.total_steps = total


def scheduler_warmup(sched, total_hint):
    """(warmup steps, total steps) of an LR scheduler, each None when it cannot be told (the
    scheduler is read or evaluated on a copy, never stepped). The warmup is counted in scheduler
    ``step()`` calls: those after which its first ramp has peaked (a later jump, an LR x100 at
    step 30, is not the warmup's peak)."""
    name = type(sched).__name__
    if hasattr(sched, "warmup_num_steps"):             # DeepSpeed WarmupLR / WarmupDecayLR / ...
        evaluated = _warmup_by_evaluating(sched, total_hint)
        return (evaluated if evaluated is not None else _deepspeed_warmup(sched),
                _as_int(getattr(sched, "total_num_steps", None)))
    if name == "OneCycleLR":
        return int(sched._schedule_phases[0]["end_step"]) + 1, int(sched.total_steps)
    if name == "LinearLR":
        rising = sched.start_factor < sched.end_factor
        return (int(sched.total_iters) if rising else 0), None
    if name == "SequentialLR":
        first = sched._schedulers[0]
        warmup, _ = scheduler_warmup(first, None)
        if warmup:
            return min(warmup, int(sched._milestones[0])), total_hint
        return warmup, total_hint
    lambdas = getattr(sched, "lr_lambdas", None)
    if lambdas:
        fn = lambdas[0]
        kw = fn.keywords if isinstance(fn, functools.partial) else {}
        if "num_warmup_steps" in kw:                   # transformers.get_*_schedule_with_warmup
            return int(kw["num_warmup_steps"]), _as_int(kw.get("num_training_steps"))
        return _warmup_by_probing(fn, total_hint), None
    return _warmup_by_evaluating(sched, total_hint), None


def _deepspeed_warmup(sched) -> int:
    """A DeepSpeed warmup scheduler's ramp in ``step()`` calls, from its settings: it starts at
    iteration -1, so after k calls it is at iteration k - 1; its gamma reaches 1 at iteration
    W - 1 (``log``: log(it + 1) / log(W)) or W (``linear``: it / W), W = ``warmup_num_steps``
    (deepspeed.runtime.lr_schedules.WarmupLR._get_gamma)."""
    w = int(sched.warmup_num_steps)
    return w + 1 if getattr(sched, "warmup_type", "log") == "linear" else w


#: Values without a rise that end a warmup ramp (PhaseTracker's flat_samples): the ramp peaked at
#: its last rise, and a rise after them is a jump.
_RAMP_FLAT_VALUES = 3


def _ramp_end(values) -> int:
    """The index of the peak of the first ramp of an LR course (0: it does not start with one):
    its last rise before the LR falls or stays flat ``_RAMP_FLAT_VALUES`` values. Reads
    ``values`` (any iterable) only that far.

    >>> _ramp_end([0.0, 0.5, 1.0, 1.0, 1.0, 1.0, 100.0]), _ramp_end([1.0, 1.0, 1.0, 1.0, 2.0])
    (2, 0)
    """
    end = flat = 0
    prev = None
    for i, v in enumerate(values):
        if prev is not None:
            if v > prev * (1 + 1e-6) and v > 0:
                end, flat = i, 0
            elif v < prev * (1 - 1e-6):
                break
            else:
                flat += 1
                if flat >= _RAMP_FLAT_VALUES:
                    break
        prev = v
    return end


def _warmup_by_probing(fn, total_hint):
    """Where an LR multiplier's first ramp peaks: LambdaLR lambdas are pure functions of the
    step, so calling one does not touch the scheduler. None when the lambda raises."""
    horizon = min(int(total_hint or 20_000), 100_000)
    try:
        return _ramp_end(float(fn(s)) for s in range(horizon + 1))
    except Exception:      # a stateful or exotic lambda: leave the warmup unknown
        return None


class _StandIn:
    """An optimizer with the real one's param groups, minus the parameters: what a scheduler copy
    steps (``step`` marked as LRScheduler wraps it, so the copy does not warn)."""

    def __init__(self, param_groups):
        self.param_groups = [{k: copy.deepcopy(v) for k, v in g.items() if k != "params"} for g in param_groups]
        self.defaults: dict = {}

    def step(self):
        pass

    step._wrapped_by_lr_sched = True   # type: ignore[attr-defined]


def _warmup_by_evaluating(sched, total_hint):
    """Where the LR of any step-based scheduler's first ramp peaks, from a copy of it stepped on
    a stand-in optimizer (every reference to the real optimizer inside it, nested schedulers
    included, is replaced): the real scheduler and optimizer are not touched. Only a scheduler
    that has not stepped yet (torch's at ``last_epoch`` 0, DeepSpeed's at ``last_batch_iteration``
    -1; a resumed one would show the rest of its course); None when it cannot be told."""
    optimizer = getattr(sched, "optimizer", None)
    groups = getattr(optimizer, "param_groups", None)
    fresh = getattr(sched, "last_epoch", None) == 0 or getattr(sched, "last_batch_iteration", None) == -1
    if not groups or not callable(getattr(sched, "step", None)) or not fresh:
        return None
    horizon = min(int(total_hint or 20_000), 20_000)
    try:
        stand_in = _StandIn(groups)
        clone = copy.copy(sched)
        clone.__dict__.update(copy.deepcopy(vars(sched), memo={id(optimizer): stand_in}))

        def course():
            yield float(stand_in.param_groups[0]["lr"])
            for _ in range(horizon):
                clone.step()
                yield float(stand_in.param_groups[0]["lr"])

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return _ramp_end(course())
    except Exception:      # an exotic scheduler (it needs a metric, holds unpicklable state): unknown
        return None


def _as_int(v):
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


# -- hardware --------------------------------------------------------------------------------
def _bf16_available() -> bool | None:
    """Native bf16 on the current GPU; None when there is no GPU to ask (CPU runs, tests)."""
    try:
        if not torch.cuda.is_available():
            return None
        try:
            # emulated bf16 is slow: only native support counts as "available"
            return bool(torch.cuda.is_bf16_supported(including_emulation=False))
        except TypeError:
            return torch.cuda.get_device_capability() >= (8, 0)
    except Exception:
        return None


_logged: set[str] = set()


def _guard(what: str, fn, fallback):
    """Run one part of the collection; on failure log once and keep the rest."""
    try:
        out = fn()
        return fallback if out is None and fallback is not None else out
    except Exception as exc:   # monitoring never takes training down (docs/design.md, Invariants)
        if what not in _logged:
            _logged.add(what)
            log.warning("stability_callbacks preflight: %s failed (%s: %s); that part of the audit "
                        "is skipped", what, type(exc).__name__, exc)
        return fallback


def run_preflight(run, model, optimizer=None, scheduler=None, **facts_kwargs) -> list:
    """What every integration does at train begin: measure, audit with the thresholds of the
    run's ``preflight`` config section, and emit ``preflight`` findings through the LiveRun
    (run log + alerts). Nothing when ``preflight.enabled`` is false. Never raises into training."""
    try:
        rules = run.config.preflight.build()
        if not rules.enabled:
            return []
        facts_kwargs.setdefault("max_sample_elements", rules.max_sample_elements)
        findings = rules.audit(collect_facts(model, optimizer, scheduler, **facts_kwargs))
    except Exception:   # the audit is advice; a failure must not stop training
        log.exception("stability_callbacks: preflight audit failed; skipped")
        return []
    run.emit(findings)
    return findings
