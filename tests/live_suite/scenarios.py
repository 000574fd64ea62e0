"""The scenario table, and the tiny models, data and LR schedules every runner builds from it.

One :class:`Scenario` is one real training run: framework, model, schedule, optimizer,
precision, gradient accumulation, clipping, length, and either nothing planted (a healthy run:
no warning or critical finding allowed) or a :class:`Fault` at a known optimizer step with the
largest acceptable detection delay.

Workloads (nothing downloaded; a step costs a few ms on one CPU thread):

- ``gpt2`` / ``llama``: a 2-layer, 32-wide GPT-2 or LLaMA built from a config, on sequences
  from a fixed random Markov chain over 64 tokens (each token has 4 successors with
  probabilities .55/.25/.15/.05: the loss falls from ln 64 = 4.16 towards the chain's entropy,
  1.11 nats, over hundreds of steps, like a language model's). The fine-tune task redraws the
  successors of a quarter of the tokens.
- ``mlp``: a classifier on four well separated Gaussian blobs, whose loss legitimately goes
  to ~1e-4;
- ``cnn``, ``ddpm``, ``nll``, ``vae``, ``bandit``: other fields (issue 33), in :mod:`.fields`.

Steps are 1-based optimizer steps; with a sequential sampler step ``s`` reads the samples
``[(s-1)*G, s*G)``, ``G = batch_size * grad_accum``, so a data fault lands on a known step.

>>> sc = SCENARIOS["hf-pocket"]
>>> sc.fault.kind, sc.fault.step, sc.fault.within
('data-pocket', 150, 3)
>>> [round(lr_factor("wsd", i, 10, 100, 20), 3) for i in (0, 5, 10, 79, 80, 90, 99)]
[0.0, 0.5, 1.0, 1.0, 1.0, 0.5, 0.006]
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .fields import FIELD_MODELS, field_columns, make_field_model

FRAMEWORKS = ("hf", "lightning", "deepspeed")
MODELS = ("gpt2", "llama", "mlp", *FIELD_MODELS)
VOCAB_SIZE = 64
SEQ_LEN = 32
SUCCESSOR_PROBS = (0.55, 0.25, 0.15, 0.05)
FAULT_KINDS = ("lr-jump", "data-pocket", "nan-weight", "lr-ramp", "resume-restart",
               "warmup-spike", "weights-scale", "fp16-overflow", "zero-loss", "spike-grows",
               # other fields (issue 33): data faults (fields.field_columns), a crash, and runs
               # that never learn
               "data-scale", "targets-zero", "reward-scale", "bn-batch1",
               "random-labels", "lr-zero", "frozen", "optimizer-stale")
#: Faults after which the run never learns: caught by a ``not_learning`` warning.
NEVER_LEARNS = ("random-labels", "lr-zero", "frozen", "optimizer-stale")
#: Shard difficulties of a non-shuffled run (``Scenario.shards``): successor probabilities whose
#: entropy is 3% below / as / 4% above the base chain's (1.11 nats).
SHARD_PROBS = ((0.58, 0.24, 0.13, 0.05), SUCCESSOR_PROBS, (0.52, 0.26, 0.16, 0.06))


@dataclass(frozen=True)
class Fault:
    """A planted fault: ``kind`` (one of :data:`FAULT_KINDS`) first acts on optimizer step
    ``step``; it is caught when a warning-or-worse finding comes at a step in
    ``[step, step + within]`` (and, with ``expect``, a finding of that kind is among them).
    ``factor``: the LR multiplier (``lr-jump``), the per-step LR growth (``lr-ramp``) or the
    weight scale (``weights-scale``, ``spike-grows``); ``length``: how many steps of garbage
    data (``data-pocket``, ``warmup-spike``) or of overflows (``fp16-overflow``; 0: to the end).
    ``zero-loss``: the model's loss is multiplied by 0 from the first step; ``spike-grows``: one
    step of half-garbage data (a small spike), then the weights scaled by ``factor`` (a huge
    one inside it). Other fields (:mod:`.fields`): ``data-scale`` multiplies the inputs by
    ``factor`` (images not divided by 255), ``targets-zero`` sets the regression targets to 0.0
    (a sensor outage written as zeros), ``reward-scale`` multiplies the rewards by ``factor``,
    each for ``length`` steps (0: to the end); ``bn-batch1``: the dataset ends one row into the
    step (the last batch of an epoch, of one example: BatchNorm raises; a ``crash`` finding
    carries the step before). Never learning (:data:`NEVER_LEARNS`): ``random-labels`` (labels
    drawn apart from the images), ``lr-zero`` (the LR set to 0 from the step on, for good),
    ``frozen`` (every parameter frozen, the loss made to require grad), ``optimizer-stale`` (the
    optimizer holds another model's parameters; HF and Lightning). ``critical=False``: no
    critical finding may follow (a fault that must warn,
    not page); ``forbid``: finding kinds that must not appear from the fault step on."""

    kind: str
    step: int
    within: int
    factor: float = 1.0
    length: int = 0
    expect: str | None = None
    critical: bool | None = None
    forbid: tuple[str, ...] = ()

    def __post_init__(self):
        if self.kind not in FAULT_KINDS:
            raise ValueError(f"fault kind: {self.kind!r} is not one of {FAULT_KINDS}")


@dataclass(frozen=True)
class Scenario:
    name: str
    framework: str
    steps: int                          # optimizer steps of the whole run (all epochs)
    model: str = "gpt2"                 # gpt2 | llama | mlp | cnn | ddpm | nll | vae | bandit (fields.py)
    warmup: int = 10
    lr: float = 1e-3
    schedule: str = "linear"            # linear | cosine | constant | wsd | step (x0.1 at 40% and 70%)
    optimizer: str = "adamw"            # adamw | sgd | adafactor
    beta2: float = 0.999
    precision: str = "fp32"             # fp32 | bf16 (autocast / bf16-mixed / DeepSpeed bf16) | fp16
    grad_accum: int = 1
    clip: float = 1.0                   # 0: no clipping
    batch_size: int = 8                 # per micro-batch
    epochs: int = 1                     # > 1: every epoch re-reads the same data
    eval_every: int = 0                 # evaluation every N optimizer steps (0: none)
    finetune: bool = False              # start from a trained model, fresh optimizer, new task
    resume_at: int | None = None        # stop after this step's checkpoint, resume from it
    zero_stage: int = 0                 # DeepSpeed only
    ds_warmup_type: str = "linear"      # DeepSpeed schedulers: linear | log (DeepSpeed's default)
    objective: str = "ce"               # ce | label-smoothing (0.1) | aux (+ z-loss) | rl-noise (x U(0.5, 1.5) a step)
    shards: bool = False                # non-shuffled data: shards of 20-80 steps, each of its own difficulty
    fresh_optimizer: bool = False       # with resume_at: restart from the checkpoint's weights, new optimizer state
    trainer: str = "hf"                 # HF framework: hf (Trainer) | trl (SFTTrainer)
    fault: Fault | None = None
    quick: bool = False                 # in the quick subset (make test)
    seed: int = 0
    note: str = ""

    def __post_init__(self):
        checks = (("framework", self.framework, FRAMEWORKS),
                  ("model", self.model, MODELS),
                  ("schedule", self.schedule, ("linear", "cosine", "constant", "wsd", "step")),
                  ("objective", self.objective, ("ce", "label-smoothing", "aux", "rl-noise")),
                  ("trainer", self.trainer, ("hf", "trl")),
                  ("optimizer", self.optimizer, ("adamw", "sgd", "adafactor")),
                  ("precision", self.precision, ("fp32", "bf16", "fp16")))
        for key, value, allowed in checks:
            if value not in allowed:
                raise ValueError(f"{self.name}: {key} {value!r} is not one of {allowed}")
        if self.steps % self.epochs:
            raise ValueError(f"{self.name}: steps {self.steps} is not a multiple of epochs {self.epochs}")
        if self.precision == "fp16" and self.framework != "deepspeed":
            raise ValueError(f"{self.name}: fp16 runs only under DeepSpeed on a CPU")
        if self.trainer == "trl" and self.framework != "hf":
            raise ValueError(f"{self.name}: trainer 'trl' is the HF framework's")
        if self.fresh_optimizer and (self.framework == "lightning" or not self.resume_at):
            raise ValueError(f"{self.name}: fresh_optimizer needs resume_at, under HF or DeepSpeed")
        if self.schedule == "step" and self.framework == "hf":
            raise ValueError(f"{self.name}: the HF Trainer has no step schedule by name")
        if self.fault is not None and self.fault.kind == "optimizer-stale" and self.framework == "deepspeed":
            raise ValueError(f"{self.name}: optimizer-stale runs under HF or Lightning")
        if self.fault is not None and not 1 <= self.fault.step <= self.steps:
            raise ValueError(f"{self.name}: fault step {self.fault.step} outside 1..{self.steps}")

    # ------------------------------------------------------------------------------ derived
    @property
    def healthy(self) -> bool:
        return self.fault is None

    @property
    def steps_per_epoch(self) -> int:
        return self.steps // self.epochs

    @property
    def samples_per_step(self) -> int:
        return self.batch_size * self.grad_accum

    @property
    def decay_steps(self) -> int:
        """The WSD decay phase: the last fifth of the run."""
        return max(1, self.steps // 5)

    def describe(self) -> str:
        """One short line for the table: what a user would have typed."""
        parts = [self.model, f"{self.schedule} w{self.warmup}", f"lr {self.lr:g}", self.optimizer]
        if self.optimizer == "adamw":
            parts[-1] += f" b2={self.beta2:g}"
        if self.precision != "fp32":
            parts.append(self.precision)
        if self.grad_accum > 1:
            parts.append(f"GA{self.grad_accum}")
        parts.append(f"clip {self.clip:g}" if self.clip else "no clip")
        if self.framework == "deepspeed":
            parts.append(f"ZeRO-{self.zero_stage}")
        if self.epochs > 1:
            parts.append(f"{self.epochs} epochs")
        if self.eval_every:
            parts.append(f"eval/{self.eval_every}")
        if self.finetune:
            parts.append("fine-tune")
        if self.resume_at:
            parts.append(f"resume@{self.resume_at}" + (" fresh optimizer" if self.fresh_optimizer else ""))
        if self.objective != "ce":
            parts.append(self.objective)
        if self.shards:
            parts.append("unshuffled shards")
        if self.trainer != "hf":
            parts.append(f"{self.trainer.upper()} SFTTrainer")
        if self.batch_size == 1:
            parts.append("batch 1")
        return ", ".join(parts)


def lr_factor(schedule: str, i: int, warmup: int, total: int, decay_steps: int) -> float:
    """The LR multiplier of scheduler step ``i`` (0-based: optimizer step ``i + 1``), the
    formulas of transformers' schedules (``get_linear_schedule_with_warmup``, ``..._cosine_...``,
    ``get_constant_schedule_with_warmup``, ``get_wsd_schedule`` with cosine decay)."""
    if i < warmup:
        return i / max(1, warmup)
    if schedule == "constant":
        return 1.0
    if schedule == "linear":
        return max(0.0, (total - i) / max(1, total - warmup))
    if schedule == "cosine":
        progress = (i - warmup) / max(1, total - warmup)
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))
    if schedule == "wsd":
        if i < total - decay_steps:
            return 1.0
        progress = (i - (total - decay_steps)) / decay_steps
        return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))
    if schedule == "step":   # MultiStepLR(milestones=[40%, 70%], gamma=0.1)
        return 0.1 ** ((i >= 0.4 * total) + (i >= 0.7 * total))
    raise ValueError(f"schedule: {schedule!r}")


# ------------------------------------------------------------------------------------ models
class BlobClassifier(torch.nn.Module):
    """A 16 → 64 → 4 MLP; ``forward(x, labels)`` returns ``{"loss", "logits"}`` as HF models do."""

    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 4))

    def forward(self, x, labels=None):
        logits = self.net(x)
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = torch.nn.functional.cross_entropy(logits, labels)
        return out


def make_model(sc: Scenario) -> torch.nn.Module:
    """A fresh model, identical for a given seed; a fine-tune starts from the trained one."""
    if sc.model in FIELD_MODELS:
        return make_field_model(sc)
    torch.manual_seed(sc.seed)
    if sc.model == "mlp":
        return BlobClassifier()
    if sc.model == "gpt2":
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config(vocab_size=VOCAB_SIZE, n_positions=SEQ_LEN, n_embd=32, n_layer=2, n_head=2,
                            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                            bos_token_id=0, eos_token_id=0, pad_token_id=0)
        model = GPT2LMHeadModel(config)
    else:
        from transformers import LlamaConfig, LlamaForCausalLM

        config = LlamaConfig(vocab_size=VOCAB_SIZE, hidden_size=32, intermediate_size=64,
                             num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                             max_position_embeddings=SEQ_LEN, bos_token_id=0, eos_token_id=0,
                             pad_token_id=0)
        model = LlamaForCausalLM(config)
    if sc.finetune:
        model.load_state_dict(_pretrained(sc.model, model))
    zero = sc.fault is not None and sc.fault.kind == "zero-loss"
    if zero or sc.objective in ("aux", "rl-noise") or (sc.objective == "label-smoothing" and sc.framework != "hf"):
        model.register_forward_hook(_Objective(sc.objective, zero=zero, seed=sc.seed), with_kwargs=True)
    return model


class _Objective:
    """A forward hook that turns the model's LM loss into the scenario's objective, as a user's
    own loss code would: label smoothing 0.1 (HF Trainer: ``label_smoothing_factor`` instead), a
    z-loss added (``aux``: 1e-3 x logsumexp², PaLM's auxiliary loss), the loss weighted by a
    random factor in [0.5, 1.5] per forward (``rl-noise``: a reward-weighted, noisy objective),
    or multiplied by 0 (the ``zero-loss`` fault)."""

    def __init__(self, objective: str, *, zero: bool, seed: int):
        self.objective, self.zero = objective, zero
        self.gen = torch.Generator().manual_seed(seed + 11)

    def __call__(self, module, args, kwargs, output):
        loss, labels = output.get("loss"), kwargs.get("labels")
        if loss is None or labels is None:
            return output
        logits = output["logits"]
        if self.objective == "label-smoothing":
            shifted = logits[:, :-1].float()
            loss = torch.nn.functional.cross_entropy(shifted.reshape(-1, shifted.shape[-1]),
                                                     labels[:, 1:].reshape(-1), label_smoothing=0.1)
        elif self.objective == "aux":
            loss = loss + 1e-3 * torch.logsumexp(logits.float(), dim=-1).pow(2).mean()
        elif self.objective == "rl-noise":
            loss = loss * (0.5 + torch.rand((), generator=self.gen))
        if self.zero:
            loss = loss * 0.0
        output["loss"] = loss
        return output


_PRETRAINED: dict = {}


def _pretrained(kind: str, model: torch.nn.Module) -> dict:
    """Weights after 400 plain AdamW steps on the base task (cached per process)."""
    if kind not in _PRETRAINED:
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
        ids = markov_ids(400 * 8, seed=99, task=0)
        for s in range(400):
            batch = ids[s * 8:(s + 1) * 8]
            for group in opt.param_groups:
                group["lr"] = 3e-3 * min(1.0, (s + 1) / 20)
            model(input_ids=batch, labels=batch).loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad()
        _PRETRAINED[kind] = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return _PRETRAINED[kind]


def make_optimizer(sc: Scenario, params):
    """The torch optimizer users of Lightning (and of a DeepSpeed client optimizer) write."""
    params = list(params)
    if sc.optimizer == "sgd":
        return torch.optim.SGD(params, lr=sc.lr, momentum=0.9)
    if sc.optimizer == "adafactor":
        return torch.optim.Adafactor(params, lr=sc.lr)
    return torch.optim.AdamW(params, lr=sc.lr, betas=(0.9, sc.beta2), weight_decay=0.0)


def make_scheduler(sc: Scenario, optimizer):
    return torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda i: lr_factor(sc.schedule, i, sc.warmup, sc.steps, sc.decay_steps))


# -------------------------------------------------------------------------------------- data
def markov_ids(n: int, *, seed: int, task: int = 0, probs: tuple = SUCCESSOR_PROBS) -> torch.Tensor:
    """``n`` sequences of ``SEQ_LEN`` tokens from the Markov chain of ``task`` (0: base; 1: the
    fine-tune task, a quarter of the tokens with new successors), each token's successors drawn
    with ``probs``."""
    g = torch.Generator().manual_seed(1000)
    succ = torch.stack([torch.randperm(VOCAB_SIZE, generator=g)[:4] for _ in range(VOCAB_SIZE)])
    if task == 1:
        gt = torch.Generator().manual_seed(2000)
        for tok in torch.randperm(VOCAB_SIZE, generator=gt)[:VOCAB_SIZE // 4]:
            succ[tok] = torch.randperm(VOCAB_SIZE, generator=gt)[:4]
    gen = torch.Generator().manual_seed(seed)
    ids = torch.empty(n, SEQ_LEN, dtype=torch.long)
    ids[:, 0] = torch.randint(0, VOCAB_SIZE, (n,), generator=gen)
    choice = torch.multinomial(torch.tensor(probs).expand(n, 4), SEQ_LEN,
                               replacement=True, generator=gen)
    for t in range(1, SEQ_LEN):
        ids[:, t] = succ[ids[:, t - 1], choice[:, t]]
    return ids


class Rows(torch.utils.data.Dataset):
    """Map-style rows: ``{"input_ids", "labels"}`` (LM), ``{"x", "labels"}`` (classifier) or a
    field's columns (:func:`.fields.field_columns`)."""

    def __init__(self, columns: dict[str, torch.Tensor]):
        self.columns = columns

    def __len__(self) -> int:
        return next(iter(self.columns.values())).shape[0]

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {k: v[i] for k, v in self.columns.items()}


def train_rows(sc: Scenario) -> Rows:
    """One epoch of training rows, faults of the data kind planted at their steps."""
    n = sc.steps_per_epoch * sc.samples_per_step
    if sc.model == "mlp":
        return Rows(_blobs(n, seed=sc.seed + 1))
    if sc.model in FIELD_MODELS:
        return Rows(field_columns(sc, n, seed=sc.seed + 1, train=True))
    ids = markov_ids(n, seed=sc.seed + 1, task=1 if sc.finetune else 0)
    g = sc.samples_per_step
    if sc.shards:   # non-shuffled: each shard of 20-80 steps from a chain of its own difficulty
        gen = torch.Generator().manual_seed(sc.seed + 7)
        start = 0
        while start < sc.steps_per_epoch:
            length = int(torch.randint(20, 81, (), generator=gen))
            probs = SHARD_PROBS[int(torch.randint(0, len(SHARD_PROBS), (), generator=gen))]
            rows = slice(start * g, min(start + length, sc.steps_per_epoch) * g)
            ids[rows] = markov_ids(rows.stop - rows.start, seed=sc.seed + 100 + start, probs=probs)
            start += length
    f = sc.fault
    if f is not None and f.kind in ("data-pocket", "warmup-spike", "spike-grows"):
        rows = slice((f.step - 1) * g, (f.step - 1 + max(f.length, 1)) * g)
        gen = torch.Generator().manual_seed(sc.seed + 5)
        garbage = torch.randint(0, VOCAB_SIZE, ids[rows].shape, generator=gen)
        if f.kind == "spike-grows":   # half of each sequence garbage: a small spike
            ids[rows, SEQ_LEN // 2:] = garbage[:, SEQ_LEN // 2:]
        else:
            ids[rows] = garbage
    return Rows({"input_ids": ids, "labels": ids})


def eval_rows(sc: Scenario) -> Rows:
    n = 4 * sc.batch_size
    if sc.model == "mlp":
        return Rows(_blobs(n, seed=sc.seed + 3))
    if sc.model in FIELD_MODELS:
        return Rows(field_columns(sc, n, seed=sc.seed + 3, train=False))
    ids = markov_ids(n, seed=sc.seed + 3, task=1 if sc.finetune else 0)
    return Rows({"input_ids": ids, "labels": ids})


def _blobs(n: int, *, seed: int) -> dict[str, torch.Tensor]:
    centers = torch.randn(4, 16, generator=torch.Generator().manual_seed(7)) * 4.0
    gen = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 4, (n,), generator=gen)
    x = centers[labels] + torch.randn(n, 16, generator=gen)
    return {"x": x, "labels": labels}


# ------------------------------------------------------------------------------- the table
def _s(name, framework, steps, **kw) -> Scenario:
    return Scenario(name=name, framework=framework, steps=steps, **kw)


_ROWS = [
    # ------------------------------------------------------------------ healthy: HF Trainer
    _s("hf-linear-w100", "hf", 3000, warmup=100, lr=1e-3,
       note="the default recipe, past beta2=0.999's horizon"),
    _s("hf-cosine-w10-b095", "hf", 400, warmup=10, lr=3e-3, schedule="cosine", beta2=0.95),
    _s("hf-constant-w0", "hf", 1500, warmup=0, lr=1e-4, schedule="constant", note="no warmup at all"),
    _s("hf-wsd-w500-llama", "hf", 2000, model="llama", warmup=500, lr=3e-4, schedule="wsd"),
    _s("hf-ga4-bf16-noclip", "hf", 400, warmup=100, lr=1e-3, beta2=0.95, grad_accum=4, batch_size=2,
       precision="bf16", clip=0.0),
    _s("hf-sgd", "hf", 400, warmup=10, lr=3e-2, schedule="cosine", optimizer="sgd"),
    _s("hf-adafactor", "hf", 400, warmup=10, lr=1e-3, optimizer="adafactor"),
    _s("hf-finetune", "hf", 600, warmup=10, lr=1e-4, finetune=True,
       note="a trained model, a fresh AdamW, a related task"),
    _s("hf-classifier", "hf", 1000, model="mlp", warmup=10, lr=1e-3, note="loss goes to ~1e-4"),
    _s("hf-epochs3-eval", "hf", 600, warmup=30, lr=3e-4, schedule="cosine", epochs=3, eval_every=50),
    _s("hf-resume", "hf", 600, warmup=100, lr=1e-3, beta2=0.95, resume_at=300, quick=True),
    # ------------------------------------------------------------------- healthy: Lightning
    _s("pl-cosine-w20-3e-3", "lightning", 1500, warmup=20, lr=3e-3, schedule="cosine",
       note="issue 16: second_moment_surge at 22 + warmup_instability"),
    _s("pl-linear-w500-b095", "lightning", 1500, model="llama", warmup=500, lr=1e-3, beta2=0.95),
    _s("pl-constant-bf16", "lightning", 400, warmup=10, lr=3e-4, schedule="constant", beta2=0.95,
       precision="bf16"),
    _s("pl-wsd-ga4-noclip", "lightning", 1200, warmup=100, lr=1e-3, schedule="wsd", grad_accum=4,
       batch_size=2, clip=0.0),
    _s("pl-sgd", "lightning", 400, warmup=10, lr=3e-2, optimizer="sgd"),
    _s("pl-adafactor", "lightning", 400, warmup=10, lr=1e-2, schedule="cosine", optimizer="adafactor",
       note="torch.optim.Adafactor: lr is relative to the parameter RMS (its default, 1e-2)"),
    _s("pl-finetune", "lightning", 600, model="llama", warmup=0, lr=1e-4, schedule="constant",
       finetune=True),
    _s("pl-classifier", "lightning", 1000, model="mlp", warmup=10, lr=1e-3, schedule="cosine"),
    _s("pl-epochs3-eval", "lightning", 600, warmup=30, lr=1e-3, beta2=0.95, epochs=3, eval_every=50,
       quick=True),
    _s("pl-resume", "lightning", 600, warmup=100, lr=1e-3, beta2=0.95, resume_at=300),
    # ------------------------------------------------------------------- healthy: DeepSpeed
    _s("ds-z1-bf16-w100", "deepspeed", 3000, warmup=100, lr=1e-3, zero_stage=1, precision="bf16"),
    _s("ds-z0-cosine-b095", "deepspeed", 400, warmup=10, lr=3e-3, schedule="cosine", beta2=0.95,
       eval_every=50),
    _s("ds-z2-fp16-logwarmup", "deepspeed", 1200, warmup=200, lr=3e-4, schedule="constant",
       zero_stage=2, precision="fp16", ds_warmup_type="log",
       note="forced fp16, DeepSpeed's default loss-scale search and log warmup"),
    _s("ds-z1-ga4-noclip-wsd", "deepspeed", 400, warmup=10, lr=1e-3, schedule="wsd", beta2=0.95,
       zero_stage=1, grad_accum=4, batch_size=2, clip=0.0),
    _s("ds-resume", "deepspeed", 600, warmup=100, lr=1e-3, beta2=0.95, zero_stage=1, resume_at=300,
       quick=True),
    # ------------------------------------------- healthy: what users also run (issue 27)
    _s("hf-label-smoothing", "hf", 600, warmup=30, lr=1e-3, objective="label-smoothing",
       note="label_smoothing_factor=0.1: the loss cannot fall below ~1.4"),
    _s("hf-trl-sft", "hf", 400, warmup=20, lr=1e-3, trainer="trl", note="TRL's SFTTrainer"),
    _s("hf-plateau", "hf", 2500, warmup=20, lr=3e-3, schedule="constant",
       note="at the chain's entropy from ~step 500: a 2000-step plateau"),
    _s("hf-shards", "hf", 2000, warmup=50, lr=1e-3, schedule="cosine", shards=True,
       note="no shuffling: the loss level moves with each shard's difficulty while the trend falls"),
    _s("hf-restart-fresh-optimizer", "hf", 600, warmup=30, lr=1e-3, resume_at=300, fresh_optimizer=True,
       note="resumed from the weights alone: AdamW starts from zero moments"),
    _s("pl-batch1", "lightning", 1200, warmup=20, lr=3e-4, batch_size=1, note="32 tokens a step"),
    _s("pl-aux-loss", "lightning", 600, warmup=20, lr=1e-3, objective="aux", note="LM loss + a z-loss"),
    _s("pl-sgd-1e-2", "lightning", 600, warmup=0, lr=1e-2, schedule="constant", optimizer="sgd"),
    _s("pl-step-lr", "lightning", 1200, warmup=10, lr=3e-3, schedule="step",
       note="the LR stepped down x0.1 at 40% and again at 70%"),
    _s("ds-long-warmup", "deepspeed", 1500, warmup=1000, lr=1e-3, schedule="constant", zero_stage=1),
    _s("ds-rl-noise", "deepspeed", 800, warmup=20, lr=1e-3, objective="rl-noise",
       note="the loss weighted by U(0.5, 1.5) each step: +-50% noise"),
    _s("ds-restart-fresh-optimizer", "deepspeed", 600, warmup=30, lr=1e-3, zero_stage=1, resume_at=300,
       fresh_optimizer=True),
    # --------------------------------------------------------------------------- faults
    _s("hf-lr-x100", "hf", 300, warmup=50, lr=3e-3, schedule="cosine", beta2=0.95,
       fault=Fault("lr-jump", 150, within=10, factor=100, forbid=("warmup_end", "warmup_instability"))),
    _s("pl-lr-x50", "lightning", 300, warmup=50, lr=3e-3, schedule="constant",
       fault=Fault("lr-jump", 200, within=10, factor=50, forbid=("warmup_end", "warmup_instability"))),
    _s("hf-trl-lr-x100", "hf", 300, warmup=50, lr=3e-3, schedule="cosine", beta2=0.95, trainer="trl",
       fault=Fault("lr-jump", 150, within=10, factor=100, forbid=("warmup_end", "warmup_instability"))),
    _s("ds-lr-x100", "deepspeed", 300, warmup=50, lr=3e-3, schedule="cosine", beta2=0.95,
       fault=Fault("lr-jump", 150, within=10, factor=100, forbid=("warmup_end", "warmup_instability"))),
    _s("hf-pocket", "hf", 200, warmup=20, lr=1e-3, beta2=0.95,
       fault=Fault("data-pocket", 150, within=3, length=5)),
    _s("pl-pocket", "lightning", 200, warmup=20, lr=1e-3, schedule="cosine", beta2=0.95,
       fault=Fault("data-pocket", 150, within=3, length=5), quick=True),
    _s("ds-pocket-z2-bf16", "deepspeed", 200, warmup=20, lr=1e-3, beta2=0.95, zero_stage=2,
       precision="bf16", fault=Fault("data-pocket", 150, within=3, length=5)),
    _s("hf-nan-weight", "hf", 160, warmup=20, lr=1e-3, fault=Fault("nan-weight", 140, within=0)),
    _s("pl-nan-weight", "lightning", 160, warmup=20, lr=1e-3, beta2=0.95,
       fault=Fault("nan-weight", 140, within=0), quick=True),
    _s("ds-nan-weight", "deepspeed", 160, warmup=20, lr=1e-3, beta2=0.95,
       fault=Fault("nan-weight", 140, within=0)),
    _s("hf-lr-ramp", "hf", 500, warmup=50, lr=3e-3, schedule="constant", beta2=0.95,
       fault=Fault("lr-ramp", 200, within=300, factor=1.02),
       note="LR x1.02 per step from step 200: the loss drifts up, no jump"),
    _s("pl-lr-ramp", "lightning", 500, warmup=50, lr=3e-3, schedule="constant",
       fault=Fault("lr-ramp", 200, within=300, factor=1.02)),
    _s("hf-resume-restart", "hf", 400, warmup=20, lr=1e-3, beta2=0.95, resume_at=200,
       fault=Fault("resume-restart", 201, within=1), quick=True),
    _s("pl-resume-restart", "lightning", 400, warmup=20, lr=1e-3, beta2=0.95, resume_at=200,
       fault=Fault("resume-restart", 201, within=1)),
    _s("ds-resume-restart", "deepspeed", 400, warmup=20, lr=1e-3, beta2=0.95, zero_stage=1,
       resume_at=200, fault=Fault("resume-restart", 201, within=1)),
    # A spike needs a loss well below ln(64) when warmup ends: these start from a trained model.
    # A spike in the risk window that recovers by itself: escalated to a warning, never paged.
    _s("hf-warmup-spike", "hf", 200, warmup=100, lr=1e-3, finetune=True,
       fault=Fault("warmup-spike", 103, within=3, length=3, expect="warmup_instability", critical=False)),
    _s("pl-warmup-spike", "lightning", 200, warmup=100, lr=1e-3, beta2=0.95, finetune=True,
       fault=Fault("warmup-spike", 103, within=3, length=3, expect="warmup_instability", critical=False)),
    _s("ds-warmup-spike-z3", "deepspeed", 200, warmup=100, lr=1e-3, zero_stage=3, precision="bf16",
       finetune=True,
       fault=Fault("warmup-spike", 104, within=3, length=3, expect="warmup_instability", critical=False),
       note="DeepSpeed's scheduler lags a step: warmup ends at step 101"),
    # The same right after a short warmup, from scratch: the loss still falls fast (issue 27).
    _s("hf-early-spike", "hf", 400, warmup=60, lr=3e-3,
       fault=Fault("warmup-spike", 66, within=3, length=4, expect="loss_spike", critical=False), quick=True),
    _s("pl-early-spike", "lightning", 400, warmup=60, lr=3e-3,
       fault=Fault("warmup-spike", 66, within=3, length=4, expect="loss_spike", critical=False)),
    _s("ds-early-spike", "deepspeed", 400, warmup=60, lr=3e-3,
       fault=Fault("warmup-spike", 66, within=3, length=4, expect="loss_spike", critical=False)),
    # An LR burst: the update norm jumps at its step, the loss one step later (the step's forward
    # ran on the weights before the update): the precursor leads (info at the burst, a warning
    # once the loss or grad norm follows, one step later) and sets the spike's onset; lr_anomaly
    # warns at the burst itself.
    _s("hf-lr-burst", "hf", 110, warmup=20, lr=3e-3, schedule="constant", beta2=0.95,
       fault=Fault("lr-jump", 100, within=1, factor=30, expect="precursor"), quick=True),
    _s("pl-lr-burst", "lightning", 110, warmup=20, lr=3e-3, schedule="constant", beta2=0.95,
       fault=Fault("lr-jump", 100, within=1, factor=30, expect="precursor"), quick=True),
    _s("ds-lr-burst", "deepspeed", 110, warmup=20, lr=3e-3, schedule="constant", beta2=0.95,
       fault=Fault("lr-jump", 100, within=1, factor=30, expect="precursor"), quick=True),
    # A small spike, and one step into it a huge one: its own finding at its own step.
    _s("hf-spike-grows", "hf", 200, warmup=20, lr=1e-3,
       fault=Fault("spike-grows", 150, within=1, factor=10, expect="loss_spike")),
    _s("pl-spike-grows", "lightning", 200, warmup=20, lr=1e-3,
       fault=Fault("spike-grows", 150, within=1, factor=10, expect="loss_spike")),
    _s("ds-spike-grows", "deepspeed", 200, warmup=20, lr=1e-3,
       fault=Fault("spike-grows", 150, within=1, factor=10, expect="loss_spike")),
    # The loss multiplied by 0 from the first step: a stall as soon as the LR leaves 0.
    _s("hf-zero-loss", "hf", 60, warmup=10, lr=1e-3, fault=Fault("zero-loss", 1, within=1, expect="stall"),
       quick=True),
    _s("pl-zero-loss", "lightning", 60, warmup=10, lr=1e-3, fault=Fault("zero-loss", 1, within=1, expect="stall")),
    _s("ds-zero-loss", "deepspeed", 60, warmup=10, lr=1e-3, fault=Fault("zero-loss", 1, within=2, expect="stall"),
       note="DeepSpeed's scheduler lags a step: its LR leaves 0 at step 3"),
    _s("hf-weights-x10", "hf", 200, warmup=20, lr=1e-3, beta2=0.95,
       fault=Fault("weights-scale", 150, within=2, factor=10), quick=True),
    _s("pl-weights-x10", "lightning", 200, warmup=20, lr=1e-3, schedule="cosine",
       fault=Fault("weights-scale", 150, within=2, factor=10)),
    _s("ds-weights-x10", "deepspeed", 200, warmup=20, lr=1e-3, beta2=0.95,
       fault=Fault("weights-scale", 150, within=2, factor=10)),
    _s("ds-fp16-overflow-z1", "deepspeed", 200, warmup=20, lr=1e-3, beta2=0.95, zero_stage=1,
       precision="fp16", fault=Fault("fp16-overflow", 150, within=5), quick=True),
    _s("ds-fp16-overflow-z0", "deepspeed", 200, warmup=20, lr=1e-3, beta2=0.95, zero_stage=0,
       precision="fp16", fault=Fault("fp16-overflow", 150, within=5)),
    _s("ds-fp16-collapse-after-search", "deepspeed", 60, warmup=20, lr=1e-3, zero_stage=1, precision="fp16",
       fault=Fault("fp16-overflow", 8, within=12, length=10, expect="loss_scale_collapse"),
       note="ten overflows in a row right after the start-up search, all in the first 20 steps (apex's case)"),
    # ========================================================= other fields (issue 33 item 7)
    # Tiny models of five other fields (fields.py), batches of 32. Healthy, the awkward ones
    # included: a CNN trained to ~3e-3, SGD at LR 0.1, a diffusion loss that jumps x3 from step
    # to step, an NLL that crosses zero, a policy-gradient loss of either sign.
    _s("hf-cnn", "hf", 600, model="cnn", warmup=10, lr=3e-3, schedule="cosine", batch_size=32,
       note="the loss goes to ~3e-3"),
    _s("pl-cnn", "lightning", 600, model="cnn", warmup=10, lr=3e-3, batch_size=32),
    _s("ds-cnn", "deepspeed", 600, model="cnn", warmup=10, lr=3e-3, schedule="cosine", batch_size=32),
    _s("hf-cnn-sgd-lr0.1", "hf", 600, model="cnn", warmup=0, lr=0.1, schedule="constant", optimizer="sgd",
       batch_size=32, note="SGD momentum 0.9 at LR 0.1 from the first step"),
    _s("pl-cnn-sgd-lr0.1", "lightning", 600, model="cnn", warmup=0, lr=0.1, schedule="constant",
       optimizer="sgd", clip=0.0, batch_size=32),
    _s("hf-ddpm", "hf", 600, model="ddpm", warmup=20, lr=1e-3, schedule="cosine", batch_size=32,
       note="epsilon MSE at random timesteps: x3 from one step to the next"),
    _s("pl-ddpm", "lightning", 600, model="ddpm", warmup=20, lr=1e-3, batch_size=32),
    _s("ds-ddpm-fp16", "deepspeed", 600, model="ddpm", warmup=20, lr=1e-3, schedule="constant",
       precision="fp16", batch_size=32),
    _s("hf-nll", "hf", 500, model="nll", warmup=10, lr=3e-3, schedule="constant", batch_size=32,
       note="Gaussian NLL: 0.4 -> -1.2, below zero from step ~20"),
    _s("pl-nll", "lightning", 500, model="nll", warmup=20, lr=3e-3, schedule="constant", batch_size=32),
    _s("hf-vae", "hf", 500, model="vae", warmup=10, lr=1e-3, batch_size=32, note="negative ELBO 400 -> 20"),
    _s("pl-vae", "lightning", 500, model="vae", warmup=10, lr=1e-3, schedule="constant", batch_size=32),
    _s("hf-bandit", "hf", 500, model="bandit", warmup=10, lr=1e-2, schedule="constant", batch_size=32,
       note="REINFORCE: the loss about zero, of either sign; the expected reward -0.03 -> ~0.8"),
    _s("pl-bandit", "lightning", 500, model="bandit", warmup=10, lr=1e-2, batch_size=32),
    _s("ds-bandit", "deepspeed", 500, model="bandit", warmup=10, lr=1e-2, schedule="constant", batch_size=32,
       quick=True),
    # Faults of these fields, each as their issue threads report it; a fault run is its healthy
    # twin above (same data, schedule and length where the schedule depends on it) plus the fault.
    # A CNN at a too-high LR diverges (keras-team/keras#21: 0.74 -> 13.4 -> 26.6 in two epochs;
    # facebookresearch/maskrcnn-benchmark#295: "the learning rate is too large and training
    # diverges"): SGD's LR x20 mid-run, AdamW's x30.
    _s("hf-cnn-sgd-lr-x20", "hf", 300, model="cnn", warmup=0, lr=0.1, schedule="constant", optimizer="sgd",
       batch_size=32, fault=Fault("lr-jump", 150, within=10, factor=20, forbid=("warmup_end", "warmup_instability"))),
    _s("pl-cnn-sgd-lr-x20", "lightning", 300, model="cnn", warmup=0, lr=0.1, schedule="constant",
       optimizer="sgd", clip=0.0, batch_size=32,
       fault=Fault("lr-jump", 150, within=10, factor=20, forbid=("warmup_end", "warmup_instability"))),
    _s("ds-cnn-lr-x30", "deepspeed", 300, model="cnn", warmup=10, lr=3e-3, schedule="constant", batch_size=32,
       fault=Fault("lr-jump", 150, within=10, factor=30, forbid=("warmup_end", "warmup_instability"))),
    # BatchNorm on a last batch of one example (pytorch/pytorch#4534, fastai/fastai#1352 "after 1
    # epoch end"): "Expected more than 1 value per channel when training"; a crash at step 120.
    _s("hf-cnn-bn-batch1", "hf", 300, model="cnn", warmup=10, lr=3e-3, batch_size=32,
       fault=Fault("bn-batch1", 120, within=0, expect="crash"), quick=True),
    _s("pl-cnn-bn-batch1", "lightning", 300, model="cnn", warmup=10, lr=3e-3, batch_size=32,
       fault=Fault("bn-batch1", 120, within=0, expect="crash")),
    # Images not scaled to [-1, 1] (DeweiHu/OCT_DDPM#3 and #15: a loss in the tens of thousands;
    # lucidrains/denoising-diffusion-pytorch#20): five batches x255 in a noisy diffusion loss.
    _s("hf-ddpm-unnormalized", "hf", 600, model="ddpm", warmup=20, lr=1e-3, schedule="cosine", batch_size=32,
       fault=Fault("data-scale", 400, within=3, factor=255, length=5)),
    _s("pl-ddpm-unnormalized", "lightning", 600, model="ddpm", warmup=20, lr=1e-3, batch_size=32,
       fault=Fault("data-scale", 400, within=3, factor=255, length=5)),
    # fp16 NaN in a diffusion model (openai/guided-diffusion#50: "Found NaN, decreased
    # lg_loss_scale" on every step from step 153k; lucidrains/imagen-pytorch#129): every step
    # from 400 overflows, the scaler halves until DeepSpeed stops at its minimum.
    _s("ds-ddpm-fp16-nan", "deepspeed", 600, model="ddpm", warmup=20, lr=1e-3, schedule="constant",
       precision="fp16", batch_size=32, fault=Fault("fp16-overflow", 400, within=5)),
    # The NLL's variance collapses on targets it can fit exactly (Hui-Li/multi-task-learning-
    # example-PyTorch#2: "log_var values continue decreasing in negative, and the total loss
    # continues decreasing"; QingyuZhao/VAE-for-Regression#3; xmed-lab/UCVME#1): a sensor outage
    # written as 0.0 from step 300, the ReLU mean fits it exactly and the loss runs towards -inf.
    _s("hf-nll-variance-collapse", "hf", 700, model="nll", warmup=10, lr=3e-3, schedule="constant",
       batch_size=32, fault=Fault("targets-zero", 300, within=100, expect="divergence")),
    _s("pl-nll-variance-collapse", "lightning", 700, model="nll", warmup=20, lr=3e-3, schedule="constant",
       batch_size=32, fault=Fault("targets-zero", 300, within=100, expect="divergence")),
    # A VAE's KL explodes (AntixK/PyTorch-VAE#16: "kld_loss growing very fast from ~2000 to 2e35";
    # AppliedDataSciencePartners/WorldModels#9: the KL loss at 2.9e8 in the first epoch;
    # vanderschaarlab/synthcity#331): unscaled inputs from step 300 on, the KL x3e4 for good.
    _s("hf-vae-kl-explodes", "hf", 500, model="vae", warmup=10, lr=1e-3, batch_size=32,
       fault=Fault("data-scale", 300, within=5, factor=255)),
    _s("pl-vae-kl-explodes", "lightning", 500, model="vae", warmup=10, lr=1e-3, schedule="constant", batch_size=32,
       fault=Fault("data-scale", 300, within=5, factor=255)),
    # Rewards x1000 in a policy gradient (yandexdataschool/Practical_RL#216 and #512: "without
    # the reward scaling, the gradient at some step will start to magnify"; MorvanZhou/
    # Reinforcement-learning-with-tensorflow#99): the loss and the grad norm x1000, either sign.
    _s("hf-bandit-reward-x1000", "hf", 500, model="bandit", warmup=10, lr=1e-2, schedule="constant",
       batch_size=32, fault=Fault("reward-scale", 300, within=5, factor=1000)),
    _s("pl-bandit-reward-x1000", "lightning", 500, model="bandit", warmup=10, lr=1e-2, batch_size=32,
       fault=Fault("reward-scale", 300, within=5, factor=1000)),
    _s("ds-bandit-reward-x1000", "deepspeed", 500, model="bandit", warmup=10, lr=1e-2, schedule="constant",
       batch_size=32, fault=Fault("reward-scale", 300, within=5, factor=1000)),
    # Runs that never learn: a not_learning warning anywhere in the run, never a page.
    # Labels disconnected from the images (amoodie/StratGAN#3 "images are not matching labels
    # ... will never learn"; dennybritz/cnn-text-classification-tf#136): the loss stays at ln 10.
    _s("hf-cnn-random-labels", "hf", 400, model="cnn", warmup=10, lr=3e-3, batch_size=32,
       fault=Fault("random-labels", 1, within=399, expect="not_learning", critical=False)),
    _s("pl-cnn-random-labels", "lightning", 400, model="cnn", warmup=10, lr=3e-3, schedule="constant",
       batch_size=32, fault=Fault("random-labels", 1, within=399, expect="not_learning", critical=False)),
    # LR 0 after warmup: a schedule told the wrong length (huggingface/transformers#26827, "the
    # learning rate is 0 after half of max_train_steps"; deepset-ai/FARM#46, "Learning rate
    # multiplier set to 0"): here it ends with the warmup, LR 0 from step 11 on.
    _s("hf-vae-lr-zero", "hf", 400, model="vae", warmup=10, lr=1e-3, schedule="constant", batch_size=32,
       fault=Fault("lr-zero", 11, within=389, expect="not_learning", critical=False)),
    _s("pl-vae-lr-zero", "lightning", 400, model="vae", warmup=10, lr=1e-3, schedule="constant", batch_size=32,
       fault=Fault("lr-zero", 11, within=389, expect="not_learning", critical=False)),
    # Every parameter frozen, and the resulting "element 0 of tensors does not require grad"
    # silenced with loss.requires_grad = True (ronghuaiyang/arcface-pytorch#56: "the loss is not
    # decline, and the acc is always zero"; MCC-WH/Token#12): a noisy diffusion loss that stays.
    _s("hf-ddpm-frozen", "hf", 400, model="ddpm", warmup=20, lr=1e-3, schedule="cosine", batch_size=32,
       fault=Fault("frozen", 1, within=399, expect="not_learning", critical=False)),
    _s("pl-ddpm-frozen", "lightning", 400, model="ddpm", warmup=20, lr=1e-3, batch_size=32,
       fault=Fault("frozen", 1, within=399, expect="not_learning", critical=False), quick=True),
    # The optimizer built over a model that was then re-created (openvinotoolkit/nncf#327;
    # pytorch/pytorch#3358 "optimizer.step() does not update my weights"): gradients flow, the
    # grad norm looks normal, nothing moves.
    _s("hf-nll-optimizer-stale", "hf", 400, model="nll", warmup=10, lr=3e-3, schedule="constant", batch_size=32,
       fault=Fault("optimizer-stale", 1, within=399, expect="not_learning", critical=False)),
    _s("pl-nll-optimizer-stale", "lightning", 400, model="nll", warmup=20, lr=3e-3, schedule="constant",
       batch_size=32, fault=Fault("optimizer-stale", 1, within=399, expect="not_learning", critical=False)),
]

SCENARIOS: dict[str, Scenario] = {}
for _row in _ROWS:
    if _row.name in SCENARIOS:
        raise ValueError(f"scenario name {_row.name!r} appears twice")
    SCENARIOS[_row.name] = _row
QUICK = tuple(name for name, sc in SCENARIOS.items() if sc.quick)
