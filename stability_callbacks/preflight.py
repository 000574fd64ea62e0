"""Preflight audit: known causes of instability that are visible before step one.

Pure rules on plain values (no torch): an integration measures the model once at train begin
(``stability_callbacks.integrations.torch.preflight.collect_facts``) and hands the
:class:`PreflightFacts` to :func:`audit`; the CLI builds the same facts from a transformers
``config.json`` (no weights, no transformers import). The thresholds are :class:`Preflight`'s
keywords, set under the ``preflight`` config section for both. Every rule cites where it comes
from:

* init std too large for the width: Megatron's 0.02 default kept BigScience's 104B from training
  past a few thousand steps; BLOOM used sqrt(1/(3*hidden)) (MT-NLG 530B), 0.0048 at 14336.
* fp16 where bf16 is available (BLOOM-176B switched to bf16 after the 104B failures).
* Adam beta2 = 0.999 on large models (GPT-3 and the 104B fix used 0.95).
* a missing or very short LR warmup.
* weight decay on Lion-style optimizers (a 3B decoupled-LionW run diverged at ~60k steps).
* the attention norm factor applied after Q·K (cuBLAS ``alpha``) in fp16.

Cost: O(number of layer groups) once per run; no state.

>>> facts = PreflightFacts(hidden_size=4096, layer_init_std={"layers.0": 0.02})
>>> [f.signal for f in audit(facts)]
['init_std']
>>> audit(PreflightFacts(hidden_size=4096, layer_init_std={"layers.0": 0.009}))
[]
"""
from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from stability_callbacks.params import at_least, flag, in_interval, int_at_least, positive, positive_int
from stability_callbacks.record import Finding

__all__ = ["PreflightFacts", "Preflight", "audit", "facts_from_config", "load_config_facts",
           "init_std_formulas", "normalize_precision", "weight_decay_is_decoupled", "format_finding",
           "PRECISIONS"]

# Sources, cited in every finding's details["source"].
SRC_BEKMAN_INIT = ("Bekman, ML Engineering, 'Avoiding, Recovering From and Understanding "
                   "Instabilities: STD Init' (github.com/stas00/ml-engineering, training/instabilities)")
SRC_TWT = "Transformers without Tears, arXiv:1910.05895: sqrt(2/(5*hidden))"
SRC_MTNLG = "MT-NLG 530B, arXiv:2201.11990: sqrt(1/(3*hidden))"
SRC_104B = ("BigScience tr8-104B chronicles (github.com/bigscience-workshop/bigscience, "
            "train/tr8-104B-wide/chronicles.md)")
SRC_GPT3 = "GPT-3, arXiv:2005.14165 (Adam beta2 = 0.95)"
SRC_BLOOM = "BLOOM, arXiv:2211.05100 (bf16, embedding LayerNorm)"
SRC_LOSS_PATTERNS = ("Bekman, ML Engineering, 'Understanding Training Loss Patterns' "
                     "(104B: fp16 was a main obstacle; BLOOM-176B switched to bf16 and added an "
                     "embedding LayerNorm)")
SRC_RADAM = "Liu et al., On the Variance of the Adaptive Learning Rate and Beyond, arXiv:1908.03265"
SRC_LION = "Chen et al., Symbolic Discovery of Optimization Algorithms (Lion), arXiv:2302.06675"
SRC_CHINCHILLA_NOTES = ("field notes 'Longer than Chinchilla' (3B, decoupled LionW, weight decay "
                        "10% of max LR, diverged at ~60k steps)")
SRC_ATTN = ("Megatron-DeepSpeed PR #118 (github.com/bigscience-workshop/Megatron-DeepSpeed/pull/118): "
            "scale Q and K by 1/sqrt(sqrt(d)) before the matmul")

PRECISIONS = ("fp16", "bf16", "fp32")

# model_type → does the architecture put a LayerNorm right after the word embeddings?
_EMBEDDING_LAYERNORM_TYPES = frozenset({
    "bloom", "bert", "roberta", "xlm-roberta", "electra", "deberta", "deberta-v2", "albert",
    "distilbert", "camembert", "mpnet", "ernie"})
# model_type → attention scale applied after Q·K in the transformers implementation
# (BloomAttention: alibi.baddbmm(..., alpha=inv_norm_factor), the cuBLAS alpha of the 104B notes).
_SCALE_AFTER_QK_TYPES = frozenset({"bloom"})


_PRECISION_NAMES = {
    "fp16": "fp16", "16": "fp16", "16-mixed": "fp16", "16-true": "fp16", "float16": "fp16", "half": "fp16",
    "bf16": "bf16", "bf16-mixed": "bf16", "bf16-true": "bf16", "bfloat16": "bf16",
    "fp32": "fp32", "32": "fp32", "32-true": "fp32", "float32": "fp32", "float": "fp32",
    "64": "fp32", "64-true": "fp32", "float64": "fp32", "transformer-engine": "bf16",
}


def normalize_precision(value) -> str:
    """"fp16" / "bf16" / "fp32" from the ways frameworks spell it (Lightning "16-mixed",
    "bf16-true"; a torch dtype; "float16"). Raises ValueError on anything else.

    >>> normalize_precision("16-mixed"), normalize_precision("bf16-true"), normalize_precision("torch.float32")
    ('fp16', 'bf16', 'fp32')
    """
    key = str(value).lower().removeprefix("torch.")
    if key not in _PRECISION_NAMES:
        raise ValueError(f"preflight.precision must be fp16, bf16 or fp32 (or a framework's name "
                         f"for one), got {value!r}")
    return _PRECISION_NAMES[key]


def weight_decay_is_decoupled(optimizer_name: str) -> bool | None:
    """From the class name alone: AdamW-style and ``Decoupled*`` decay apart from the gradient;
    None when the name does not say.

    >>> weight_decay_is_decoupled("DecoupledLionW"), weight_decay_is_decoupled("Lion")
    (True, None)
    """
    name = optimizer_name.lower()
    return True if "decoupled" in name or name.endswith("adamw") else None


def init_std_formulas(hidden_size: int) -> dict[str, float]:
    """The two published init std formulas for a width.

    >>> {k: round(v, 5) for k, v in init_std_formulas(14336).items()}
    {'transformers_without_tears': 0.00528, 'mt_nlg_530b': 0.00482}
    """
    return {"transformers_without_tears": math.sqrt(2.0 / (5.0 * hidden_size)),
            "mt_nlg_530b": math.sqrt(1.0 / (3.0 * hidden_size))}


@dataclass
class PreflightFacts:
    """What the audit looks at; every field may be ``None`` (= unknown, the rule is skipped).

    ``layer_init_std`` maps a layer group (``transformer.h.3``) to the std of its matrix weights
    (biases, norms and 1-D parameters excluded); ``embedding_init_std`` does the same for
    embedding tables. ``weights_pretrained`` = True skips the init rules (a fine-tune's weights
    are trained, not initialised). ``warmup_steps`` = 0 means "no warmup".
    """

    hidden_size: int | None = None
    num_layers: int | None = None
    num_params: int | None = None
    layer_init_std: dict[str, float] = field(default_factory=dict)
    embedding_init_std: dict[str, float] = field(default_factory=dict)
    initializer_range: float | None = None
    weights_pretrained: bool | None = None
    precision: str | None = None
    bf16_available: bool | None = None
    optimizer: str | None = None
    betas: tuple[float, float] | None = None
    weight_decay: float | None = None
    weight_decay_decoupled: bool | None = None
    warmup_steps: int | None = None
    total_steps: int | None = None
    has_embedding_layernorm: bool | None = None
    attention_scale_after_qk: bool | None = None
    model_type: str | None = None
    source: str | None = None          # where the facts came from (a config path, a model class)

    def to_json(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["betas"] = list(self.betas) if self.betas is not None else None
        return d


class Preflight:
    """The preflight rules with their thresholds (keyword-only; defaults from the sources).

    * ``init_std_factor=1.5``: flag a layer whose std exceeds 1.5x sqrt(1/(3*hidden)) (the
      smaller formula, the one BLOOM used). The two formulas differ by only 1.1x, so 1.5x is
      clearly "not following either"; with it Megatron's/HF's 0.02 is flagged from hidden ≈ 1875
      (2.2x at 4096, 4.1x at 14336: the 104B failure) but not on GPT-2 widths up to 1600,
      which train fine with 0.02. PyTorch's default ``nn.Linear`` init (1/sqrt(3*fan_in)) equals
      the MT-NLG formula for square layers and passes.
    * ``min_hidden_size_for_init=1024``: narrower models are not checked (the formulas give
      ≥ 0.018 there; the documented failures are at 10k+ widths).
    * "large" = ``num_params ≥ large_model_min_params`` (1e9) or ``hidden ≥
      large_model_min_hidden_size`` (2048). Beta2 and the embedding-LayerNorm note apply to large
      models only; a missing/short warmup is a warning on large models and info otherwise.
    * ``max_adam_beta2=0.99``: beta2 above it (0.999, PyTorch's default) is flagged; 0.95 is
      recommended (``recommended_adam_beta2``).
    * warmup too short: shorter than both ``min_warmup_steps`` (100; GPT-3's 375M-token warmup
      was ~120 steps, BLOOM's ~100) and ``min_warmup_fraction`` (1%) of ``total_steps``.

    * ``enabled``: the integrations run the audit at train begin only when true
      (``preflight: false`` in a config is the same as ``{enabled: false}``);
      ``stability-callbacks preflight`` always runs it.
    * ``max_sample_elements``: the integrations measure the std of each weight from at most
      this many elements (a fixed strided subset; ~1M keeps the estimate within 0.1%).

    >>> Preflight(init_std_factor=0)
    Traceback (most recent call last):
    ...
    ValueError: init_std_factor must be a positive number, got 0
    """

    def __init__(self, *, enabled: bool = True, init_std_factor: float = 1.5,
                 min_hidden_size_for_init: int = 1024, large_model_min_params: int = 1_000_000_000,
                 large_model_min_hidden_size: int = 2048, max_adam_beta2: float = 0.99,
                 recommended_adam_beta2: float = 0.95, min_warmup_steps: int = 100,
                 min_warmup_fraction: float = 0.01, max_sample_elements: int = 1 << 20):
        self.enabled = flag("enabled", enabled)
        self.init_std_factor = positive("init_std_factor", init_std_factor)
        self.min_hidden_size_for_init = int_at_least("min_hidden_size_for_init", min_hidden_size_for_init, 0)
        self.large_model_min_params = at_least("large_model_min_params", large_model_min_params, 0)
        self.large_model_min_hidden_size = int_at_least("large_model_min_hidden_size",
                                                        large_model_min_hidden_size, 0)
        self.max_adam_beta2 = in_interval("max_adam_beta2", max_adam_beta2, 0, 1)
        self.recommended_adam_beta2 = in_interval("recommended_adam_beta2", recommended_adam_beta2, 0, 1)
        self.min_warmup_steps = int_at_least("min_warmup_steps", min_warmup_steps, 0)
        self.min_warmup_fraction = in_interval("min_warmup_fraction", min_warmup_fraction, 0, 1,
                                               low_open=False)
        self.max_sample_elements = positive_int("max_sample_elements", max_sample_elements)

    # -- the audit ---------------------------------------------------------------------------
    def audit(self, facts: PreflightFacts) -> list[Finding]:
        """All findings for ``facts``, in a fixed order (init, precision, optimizer, warmup)."""
        out: list[Finding] = []
        out += self._init_std(facts)
        out += self._embedding(facts)
        out += self._precision(facts)
        out += self._attention_scale(facts)
        out += self._adam_beta2(facts)
        out += self._lion_weight_decay(facts)
        out += self._warmup(facts)
        return out

    def is_large(self, facts: PreflightFacts) -> bool:
        return ((facts.num_params is not None and facts.num_params >= self.large_model_min_params)
                or (facts.hidden_size is not None and facts.hidden_size >= self.large_model_min_hidden_size))

    def _init_threshold(self, hidden: int) -> tuple[float, float, dict[str, float]]:
        formulas = init_std_formulas(hidden)
        recommended = formulas["mt_nlg_530b"]
        return recommended, self.init_std_factor * recommended, formulas

    def _init_std(self, facts: PreflightFacts) -> list[Finding]:
        h = facts.hidden_size
        if h is None or h < self.min_hidden_size_for_init or facts.weights_pretrained:
            return []
        recommended, threshold, formulas = self._init_threshold(h)
        measured = {k: v for k, v in facts.layer_init_std.items() if _finite(v)}
        if measured:
            flagged = {k: v for k, v in measured.items() if v > threshold}
            if not flagged:
                return []
            value, what = max(flagged.values()), "measured"
            layers = sorted(flagged, key=_natural_key)
            where = (f"{len(flagged)} of {len(measured)} layer groups" if len(measured) > 1
                     else f"layer group {layers[0]!r}")
        elif (init := facts.initializer_range) is not None and _finite(init) and init > threshold:
            value, what, layers = float(init), "initializer_range", []
            where = "the config's initializer_range"
        else:
            return []
        ratio = value / recommended
        msg = (f"Init std {value:.4f} ({where}) on {h}-wide layers is {ratio:.1f}x the "
               f"{recommended:.4f} that sqrt(1/(3*hidden)) recommends (MT-NLG 530B, arXiv:2201.11990; "
               f"sqrt(2/(5*hidden)) = {formulas['transformers_without_tears']:.4f}, arXiv:1910.05895). "
               f"BigScience's 104B could not train past a few thousand steps with Megatron's 0.02. "
               f"Re-initialise with std≈{recommended:.4f} before a long run.")
        details = {"recommended": recommended, "formulas": formulas, "factor": self.init_std_factor,
                   "measured_from": what, "layers": layers,
                   "initializer_range": facts.initializer_range,
                   "source": f"{SRC_BEKMAN_INIT}; {SRC_MTNLG}; {SRC_TWT}; {SRC_104B}"}
        return [_finding("init_std", "warning", msg, value, recommended, threshold, details)]

    def _embedding(self, facts: PreflightFacts) -> list[Finding]:
        """Info notes: a large model without an embedding LayerNorm; embeddings initialised wide."""
        if facts.weights_pretrained or not self.is_large(facts):
            return []
        out = []
        if facts.has_embedding_layernorm is False:
            msg = ("No LayerNorm after the word embeddings. BLOOM-176B added one (with bf16 and cleaner "
                   "data) after the 104B attempts kept diverging; it costs little and steadies early "
                   "training of large models.")
            out.append(_finding("embedding_layernorm", "info", msg, 0.0, 1.0, None,
                                {"recommended": "a LayerNorm right after the word embeddings",
                                 "source": f"{SRC_LOSS_PATTERNS}; {SRC_BLOOM}"}))
        h = facts.hidden_size
        emb = {k: v for k, v in facts.embedding_init_std.items() if _finite(v)}
        if h and h >= self.min_hidden_size_for_init and emb:
            recommended, threshold, formulas = self._init_threshold(h)
            flagged = {k: v for k, v in emb.items() if v > threshold}
            if flagged:
                value = max(flagged.values())
                ln = {True: "there is an embedding LayerNorm after it",
                      False: "there is no embedding LayerNorm after it",
                      None: "no embedding LayerNorm was detected"}[facts.has_embedding_layernorm]
                msg = (f"Embedding init std {value:.4f} is {value / recommended:.1f}x the {recommended:.4f} "
                       f"of sqrt(1/(3*hidden)) at hidden {h}; {ln}. Megatron and BLOOM initialise "
                       f"embeddings with the same small std as the other weights.")
                out.append(_finding("embedding_init_std", "info", msg, value, recommended, threshold,
                                    {"recommended": recommended, "formulas": formulas,
                                     "layers": sorted(flagged, key=_natural_key),
                                     "has_embedding_layernorm": facts.has_embedding_layernorm,
                                     "source": f"{SRC_BEKMAN_INIT}; {SRC_MTNLG}"}))
        return out

    def _precision(self, facts: PreflightFacts) -> list[Finding]:
        if facts.precision != "fp16" or facts.bf16_available is False:
            return []
        details = {"recommended": "bf16", "bf16_available": facts.bf16_available,
                   "source": f"{SRC_LOSS_PATTERNS}; {SRC_104B}; {SRC_BLOOM}"}
        if facts.bf16_available:
            msg = ("Training in fp16 on hardware that supports bf16. fp16 was one of the two main "
                   "reasons BigScience's 104B kept diverging (loss-scale overflows, attention "
                   "blow-ups); BLOOM-176B trained smoothly in bf16. Switch to bf16.")
            return [_finding("precision", "warning", msg, None, None, None, details)]
        msg = ("fp16 precision. If the GPUs support bf16 (A100/H100 and newer), use it: fp16 was one "
               "of the main reasons BigScience's 104B kept diverging; BLOOM-176B trained in bf16.")
        return [_finding("precision", "info", msg, None, None, None, details)]

    def _attention_scale(self, facts: PreflightFacts) -> list[Finding]:
        if facts.precision != "fp16" or not facts.attention_scale_after_qk:
            return []
        msg = ("fp16 with the attention norm factor applied after Q·K (a matmul alpha): with wide heads "
               "Q·K can overflow fp16 before the 1/sqrt(d) can save it. Scale Q and K by d^-1/4 each "
               "before the matmul (or use SDPA / bf16).")
        return [_finding("attention_scale", "warning", msg, None, None, None,
                         {"recommended": "scale Q and K before the matmul", "source": SRC_ATTN})]

    def _adam_beta2(self, facts: PreflightFacts) -> list[Finding]:
        if facts.betas is None or not self.is_large(facts):
            return []
        name = (facts.optimizer or "").lower()
        if name and "adam" not in name:
            return []   # Lion/Sophia/... have their own beta2 meaning and defaults
        beta2 = float(facts.betas[1])
        if not beta2 > self.max_adam_beta2:
            return []
        rec = self.recommended_adam_beta2
        size = _size_words(facts)
        msg = (f"Adam beta2 = {beta2:g} on a large model ({size}). The second-moment average then "
               f"remembers ~{1 / (1 - beta2):.0f} steps and reacts slowly to gradient shifts, which "
               f"makes loss spikes likelier; GPT-3 used {rec:g} and BigScience's 104B was steadied "
               f"by switching to {rec:g}. Use beta2 = {rec:g}.")
        return [_finding("adam_beta2", "warning", msg, beta2, rec, self.max_adam_beta2,
                         {"recommended": rec, "optimizer": facts.optimizer,
                          "source": f"{SRC_104B}; {SRC_GPT3}"})]

    def _lion_weight_decay(self, facts: PreflightFacts) -> list[Finding]:
        name = facts.optimizer or ""
        if "lion" not in name.lower() or not facts.weight_decay:
            return []
        wd = float(facts.weight_decay)
        details = {"recommended": "weight decay tied to the LR schedule (lr*wd), 3-10x AdamW's wd "
                                  "with a 3-10x smaller LR; watch param_norm",
                   "optimizer": name, "decoupled": facts.weight_decay_decoupled,
                   "source": f"{SRC_CHINCHILLA_NOTES}; {SRC_LION}"}
        if facts.weight_decay_decoupled:
            msg = (f"{name} with decoupled weight decay {wd:g}: the decay does not follow the LR, so "
                   f"it grows relative to the update as the LR decays. A 3B run with decoupled LionW "
                   f"(wd = 10% of the max LR) diverged at ~60k steps with a rising parameter norm. "
                   f"Tie the decay to the LR schedule and watch param_norm.")
            return [_finding("weight_decay", "warning", msg, wd, None, None, details)]
        msg = (f"{name} with weight decay {wd:g}: Lion's sign update makes lr*wd the effective decay "
               f"(the Lion paper uses a 3-10x smaller LR and 3-10x larger wd than AdamW). Watch "
               f"param_norm on long runs.")
        return [_finding("weight_decay", "info", msg, wd, None, None, details)]

    def _warmup(self, facts: PreflightFacts) -> list[Finding]:
        w, total = facts.warmup_steps, facts.total_steps
        name = (facts.optimizer or "").lower()
        if w is None or (name and not any(a in name for a in _ADAPTIVE)):
            return []   # the reason given is Adam's second moment: plain SGD has none
        large = self.is_large(facts)
        severity = "warning" if large else "info"
        need = self.min_warmup_steps
        if total:
            need = min(need, math.ceil(self.min_warmup_fraction * total))
        details = {"recommended": max(need, 1), "total_steps": total,
                   "min_warmup_steps": self.min_warmup_steps,
                   "min_warmup_fraction": self.min_warmup_fraction,
                   "source": f"{SRC_RADAM}; {SRC_GPT3} (375M-token warmup)"}
        run = f" in a {total}-step run" if total else ""
        if w <= 0:
            msg = (f"No LR warmup{run}. Adam-style optimizers start from a second-moment estimate "
                   f"built from a handful of gradients, so full-LR updates at step one are erratic; "
                   f"large runs warm up over ≥ {self.min_warmup_steps} steps (GPT-3: 375M tokens). "
                   f"Add a warmup of ≥ {max(need, 1)} steps.")
            return [_finding("warmup_steps", severity, msg, float(w), float(max(need, 1)), float(need), details)]
        if w < need:
            below = (f"below both {self.min_warmup_steps} steps and {self.min_warmup_fraction:.0%} "
                     f"of the run" if total else f"below {self.min_warmup_steps} steps")
            msg = (f"LR warmup of {w} steps{run} is short: {below}. Adam's second-moment estimate is "
                   f"still noisy that early. Warm up over ≥ {need} steps.")
            return [_finding("warmup_steps", severity, msg, float(w), float(need), float(need), details)]
        return []


#: Optimizers that scale steps by a running second moment (or sign: Lion), whose first steps a
#: warmup steadies; the warmup note is theirs.
_ADAPTIVE = ("adam", "lamb", "adafactor", "rmsprop", "adagrad", "adadelta", "lion", "sophia", "nadam", "radam")


def audit(facts: PreflightFacts, **thresholds: Any) -> list[Finding]:
    """``Preflight(**thresholds).audit(facts)``."""
    return Preflight(**thresholds).audit(facts)


# -- offline: a transformers config.json (plain JSON, transformers not needed) ----------------
_HIDDEN_KEYS = ("hidden_size", "n_embd", "d_model", "dim", "n_embed", "model_dim")
_LAYER_KEYS = ("num_hidden_layers", "n_layer", "num_layers", "n_layers", "num_decoder_layers")
_INIT_KEYS = ("initializer_range", "init_std")
_DTYPES = {"float16": "fp16", "fp16": "fp16", "half": "fp16", "bfloat16": "bf16", "bf16": "bf16",
           "float32": "fp32", "fp32": "fp32", "float": "fp32"}


def facts_from_config(config: Mapping[str, Any], *, source: str | None = None) -> PreflightFacts:
    """Facts from a transformers config dict (multimodal configs: their ``text_config``).

    ``torch_dtype``/``dtype`` is the dtype the weights were saved in: the best hint of the training
    precision a config holds. The parameter count is estimated as 12*L*h² + vocab*h.

    >>> f = facts_from_config({"model_type": "bloom", "hidden_size": 14336, "n_layer": 70,
    ...                        "initializer_range": 0.02, "torch_dtype": "float16"})
    >>> f.hidden_size, f.num_layers, f.precision, f.has_embedding_layernorm
    (14336, 70, 'fp16', True)
    """
    cfg = dict(config)
    if _first(cfg, _HIDDEN_KEYS) is None and isinstance(cfg.get("text_config"), Mapping):
        text = dict(cfg["text_config"])
        text.setdefault("torch_dtype", cfg.get("torch_dtype", cfg.get("dtype")))
        cfg = text
    hidden = _as_int(_first(cfg, _HIDDEN_KEYS))
    layers = _as_int(_first(cfg, _LAYER_KEYS))
    vocab = _as_int(cfg.get("vocab_size"))
    params = None
    if hidden and layers:
        params = 12 * layers * hidden * hidden + (vocab or 0) * hidden
    init = _first(cfg, _INIT_KEYS)
    dtype = cfg.get("torch_dtype", cfg.get("dtype"))
    model_type = cfg.get("model_type")
    emb_ln = None
    if isinstance(model_type, str):
        emb_ln = model_type in _EMBEDDING_LAYERNORM_TYPES
    scale_after = None
    if isinstance(model_type, str) and model_type in _SCALE_AFTER_QK_TYPES:
        scale_after = True
    return PreflightFacts(
        hidden_size=hidden, num_layers=layers, num_params=params,
        initializer_range=float(init) if isinstance(init, (int, float)) else None,
        precision=_DTYPES.get(str(dtype).lower().replace("torch.", "")) if dtype else None,
        has_embedding_layernorm=emb_ln, attention_scale_after_qk=scale_after,
        model_type=model_type if isinstance(model_type, str) else None, source=source)


def load_config_facts(path: str) -> PreflightFacts:
    """Facts from a ``config.json`` path or a directory holding one. Raises ``OSError`` /
    ``ValueError`` naming the file when it cannot be read."""
    cfg_path = os.path.join(path, "config.json") if os.path.isdir(path) else path
    try:
        with open(cfg_path, encoding="utf-8") as fh:
            cfg = json.load(fh)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{cfg_path}: not valid JSON ({exc})") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"{cfg_path}: expected a JSON object (a transformers config), got {type(cfg).__name__}")
    facts = facts_from_config(cfg, source=cfg_path)
    if facts.hidden_size is None:
        raise ValueError(f"{cfg_path}: no hidden size found (looked for {', '.join(_HIDDEN_KEYS)})")
    return facts


def format_finding(f: Finding) -> str:
    return f"[{f.severity}] {f.signal}: {f.message}"


# -- small pieces ---------------------------------------------------------------------------
def _finding(signal, severity, message, value, baseline, threshold, details) -> Finding:
    return Finding(step=0, kind="preflight", severity=severity, message=message, signal=signal,
                   value=value, baseline=baseline, threshold=threshold, details=details)


def _finite(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _first(cfg, keys):
    for k in keys:
        if cfg.get(k) is not None:
            return cfg[k]
    return None


def _as_int(v):
    return int(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def _natural_key(name: str):
    # "h.10" after "h.9": layer groups listed in model order.
    return [(0, int(t), "") if t.isdigit() else (1, 0, t) for t in name.split(".")]


def _size_words(facts: PreflightFacts) -> str:
    parts = []
    if facts.num_params is not None:
        parts.append(f"{facts.num_params / 1e9:.2g}B params" if facts.num_params >= 1e8
                     else f"{facts.num_params / 1e6:.3g}M params")
    if facts.hidden_size is not None:
        parts.append(f"hidden {facts.hidden_size}")
    return ", ".join(parts) or "size unknown"
