"""Planted-fault scenarios: a tiny GPT, a learnable pattern, and a fault at a known step.

Every scenario trains a 2-layer GPT-2 (built from a config, nothing downloaded) on sequences
that count up by one modulo ``PATTERN_TOKENS`` from a random start, with one random token per
sequence as a noise floor. ``make_model`` returns a model that already learned the pattern
(``pretrain_steps`` plain steps, ~1 s, cached per process), so the monitored run's loss is flat
(~0.55 nats) from step one and a fault is unmistakable:

- ``healthy``: nothing planted.
- ``data-pocket``: ``pocket_steps`` consecutive optimizer steps whose batches are uniform random
  tokens (a bad data shard), starting at ``fault_step`` once the loss has dropped; with
  ``pocket_samples``, only the samples at those positions of each such step are (the data
  forensics must tell them from their clean neighbours: :meth:`Scenario.pocket_indices`).
- ``nan``: the batch of ``fault_step`` contains ``POISON_TOKEN``, whose embedding row is planted
  at +inf (a corrupted weight that no batch touched before). The forward pass turns it into NaN,
  so the loss is non-finite at exactly ``fault_step`` and, as the NaN update poisons the weights,
  at every step after it.
- ``warmup-spike``: a data pocket two steps after the LR warmup ends (warmup_steps=18: step 19,
  the first at the peak LR), inside the warmup-end risk window (where the field notes say
  instabilities start).

The data order is fixed (no shuffling): with ``G = batch_size * grad_accum * world_size`` samples
per optimizer step, samples ``[(s-1)*G, s*G)`` form step ``s`` (1-based, = HF ``global_step``
after the step). That holds for a sequential sampler on one process and for
``DistributedSampler(shuffle=False)`` on ``world_size`` processes (rank ``r`` takes samples
``r, r+W, ...``). Use ``train_sampling_strategy="sequential"`` with the HF Trainer.

>>> sc = build_scenario("data-pocket", max_steps=60)
>>> sc.fault_steps, sc.expected["loss_spike"]
((25, 26, 27), (25, 25))
>>> ds = sc.train_dataset()
>>> len(ds) == sc.max_steps * sc.samples_per_step()
True
>>> sc.step_of_sample(sc.samples_per_step() * 39)
40
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from . import SCENARIOS as NAMES

VOCAB_SIZE = 64
POISON_TOKEN = VOCAB_SIZE - 1       # never in the pattern; its embedding row is the planted NaN
PATTERN_TOKENS = VOCAB_SIZE - 1     # the pattern counts modulo this


@dataclass(frozen=True)
class Scenario:
    """One planted-fault training run: model factory, data, schedule and the expected findings.

    ``expected`` maps a finding kind to ``(first_step, last_step)``: the steps between which the
    first finding of that kind must appear. Steps are 1-based optimizer steps.
    """

    name: str
    seed: int
    max_steps: int
    batch_size: int                 # per device, per micro-batch
    grad_accum: int
    lr: float
    warmup_steps: int
    seq_len: int
    fault_steps: tuple[int, ...]    # the optimizer steps whose batches carry the fault
    expected: dict[str, tuple[int, int]] = field(default_factory=dict)
    pretrain_steps: int = 40
    data_steps: int | None = None   # optimizer steps' worth of data (default max_steps; more when
                                    # an automatic rollback skips some)
    pocket_samples: tuple[int, ...] | None = None   # positions within a pocket step that are
                                                    # garbage (None: all of them)
    n_layer: int = 2
    n_embd: int = 64
    n_head: int = 2

    # ----------------------------------------------------------------- model and optimizer
    def make_model(self):
        """A fresh GPT2LMHeadModel, identical for a given seed (on every rank)."""
        from transformers import GPT2Config, GPT2LMHeadModel

        config = GPT2Config(vocab_size=VOCAB_SIZE, n_positions=self.seq_len, n_embd=self.n_embd,
                            n_layer=self.n_layer, n_head=self.n_head, resid_pdrop=0.0,
                            embd_pdrop=0.0, attn_pdrop=0.0, tie_word_embeddings=False,
                            bos_token_id=0, eos_token_id=0, pad_token_id=0)
        torch.manual_seed(self.seed)
        model = GPT2LMHeadModel(config)
        if self.pretrain_steps:
            model.load_state_dict(_pretrained_state(self, config))
        if self.name == "nan":
            # Untied embeddings: the LM head must not read the poisoned row on every step.
            with torch.no_grad():
                model.transformer.wte.weight[POISON_TOKEN] = float("inf")
        return model

    def lr_at(self, step: int) -> float:
        """The LR used by optimizer step ``step`` (1-based): HF's ``linear`` schedule
        (linear warmup over ``warmup_steps``, then linear decay to 0 at ``max_steps``)."""
        return self.lr * _linear_schedule(step - 1, self.warmup_steps, self.max_steps)

    def make_optimizer(self, model):
        """``(AdamW, LambdaLR)`` matching the HF Trainer's defaults for this scenario, for
        frameworks that build their own (Lightning, raw DeepSpeed)."""
        opt = torch.optim.AdamW(model.parameters(), lr=self.lr, weight_decay=0.0)
        sched = torch.optim.lr_scheduler.LambdaLR(
            opt, lambda i: _linear_schedule(i, self.warmup_steps, self.max_steps))
        return opt, sched

    # ----------------------------------------------------------------------------- data
    def deepspeed_config(self, *, stage: int = 1, precision: str = "fp32") -> dict:
        """A DeepSpeed config running this scenario: its batch, its LR with the same linear
        warmup and decay (DeepSpeed's WarmupDecayLR), ``precision`` fp32 | bf16 | fp16."""
        cfg = {
            "train_micro_batch_size_per_gpu": self.batch_size,
            "gradient_accumulation_steps": self.grad_accum,
            "zero_optimization": {"stage": stage},
            # torch_adam: the stock torch AdamW, no JIT-built fused/CPU Adam op.
            "optimizer": {"type": "AdamW", "params": {"lr": self.lr, "weight_decay": 0.0, "torch_adam": True}},
            "scheduler": {"type": "WarmupDecayLR", "params": {
                "total_num_steps": self.max_steps, "warmup_min_lr": 0.0, "warmup_max_lr": self.lr,
                "warmup_num_steps": self.warmup_steps, "warmup_type": "linear"}},
            "gradient_clipping": 1.0,
            "steps_per_print": 10 ** 9,
        }
        if precision == "fp16":
            cfg["fp16"] = {"enabled": True, "initial_scale_power": 8, "loss_scale_window": 1000,
                           "hysteresis": 2, "min_loss_scale": 1}
        elif precision == "bf16":
            cfg["bf16"] = {"enabled": True}
        return cfg

    def samples_per_step(self, world_size: int = 1) -> int:
        return self.batch_size * self.grad_accum * world_size

    def step_of_sample(self, index: int, world_size: int = 1) -> int:
        return index // self.samples_per_step(world_size) + 1

    def train_dataset(self, world_size: int = 1, num_steps: int | None = None) -> "ScenarioDataset":
        """``num_steps`` (default ``data_steps``, else ``max_steps``) optimizer steps' worth of samples."""
        n_steps = num_steps or self.data_steps or self.max_steps
        g = self.samples_per_step(world_size)
        gen = torch.Generator().manual_seed(self.seed + 1)
        n = n_steps * g
        starts = torch.randint(0, PATTERN_TOKENS, (n, 1), generator=gen)
        ids = (starts + torch.arange(self.seq_len)) % PATTERN_TOKENS
        # Random tokens drawn for every sample whether used or not: the pattern samples stay
        # the same across scenarios with the same seed.
        noise = torch.randint(0, PATTERN_TOKENS, (n, self.seq_len), generator=gen)
        # A noise floor: every sequence carries exactly one random token at a random position,
        # so the learned loss plateaus at a steady ~0.3 nats instead of creeping to 0 (a detector
        # working in relative terms would see the 0.01 → 0.03 wobble of a perfect fit as spikes).
        pos = torch.randint(1, self.seq_len, (n, 1), generator=gen)
        ids.scatter_(1, pos, noise.gather(1, pos))
        for s in self.fault_steps:
            if s > n_steps:
                continue
            rows = slice((s - 1) * g, s * g)
            if self.name == "nan":
                ids[rows, self.seq_len // 2] = POISON_TOKEN
            else:
                bad = self.pocket_indices(world_size, steps=(s,))
                ids[bad] = noise[bad]
        return ScenarioDataset(ids)

    def pocket_indices(self, world_size: int = 1, steps: tuple[int, ...] | None = None) -> list[int]:
        """The dataset indices of the garbage samples of the pocket (of ``steps``: default all).

        >>> build_scenario("data-pocket", pocket_steps=1, pocket_samples=(1, 6)).pocket_indices()
        [193, 198]
        """
        g = self.samples_per_step(world_size)
        at = range(g) if self.pocket_samples is None else self.pocket_samples
        return [(s - 1) * g + p for s in (self.fault_steps if steps is None else steps) for p in at]


class ScenarioDataset(torch.utils.data.Dataset):
    """``{"input_ids", "labels"}`` rows (GPT-2 shifts the labels itself)."""

    def __init__(self, input_ids: torch.Tensor):
        self.input_ids = input_ids

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        row = self.input_ids[i]
        return {"input_ids": row, "labels": row}


_PRETRAINED: dict = {}


def _pretrained_state(sc: Scenario, config) -> dict:
    """Weights after ``pretrain_steps`` plain AdamW steps on clean pattern data (cached per
    process; identical on every rank). Starting the monitored run from a model that already
    knows the pattern gives a flat, noisy loss from step one, as in a long run's middle: the
    detectors' baselines settle in ~20 steps instead of chasing the initial fall."""
    key = (sc.seed, sc.seq_len, sc.n_layer, sc.n_embd, sc.n_head, sc.pretrain_steps)
    if key not in _PRETRAINED:
        from transformers import GPT2LMHeadModel

        torch.manual_seed(sc.seed)
        model = GPT2LMHeadModel(config)
        clean = Scenario(name="healthy", seed=sc.seed + 7, max_steps=sc.pretrain_steps,
                         batch_size=8, grad_accum=1, lr=1e-2, warmup_steps=5, seq_len=sc.seq_len,
                         fault_steps=(), pretrain_steps=0, n_layer=sc.n_layer, n_embd=sc.n_embd,
                         n_head=sc.n_head)
        train_plain(clean, model)
        _PRETRAINED[key] = {k: v.detach().clone() for k, v in model.state_dict().items()}
    return _PRETRAINED[key]


def _linear_schedule(i: int, warmup_steps: int, max_steps: int) -> float:
    # transformers.get_linear_schedule_with_warmup, verbatim (so step 1 runs at LR 0).
    if i < warmup_steps:
        return i / max(1, warmup_steps)
    return max(0.0, (max_steps - i) / max(1, max_steps - warmup_steps))


def build_scenario(name: str, *, seed: int = 0, max_steps: int | None = None,
                   batch_size: int = 8, grad_accum: int = 1, lr: float = 3e-3,
                   warmup_steps: int | None = None, fault_step: int | None = None,
                   pocket_steps: int = 3, seq_len: int = 32, data_steps: int | None = None,
                   pocket_samples: tuple[int, ...] | None = None) -> Scenario:
    """The scenario ``name`` (one of :data:`NAMES`) with its planted fault.

    Defaults keep one run to a few seconds on 2 CPU cores.
    """
    if name not in NAMES:
        raise ValueError(f"scenario name: {name!r} is not one of {NAMES}")
    # (max_steps, warmup_steps, fault_step). Faults come after step 20: the policy treats the
    # first 20 steps as start-up (findings there are info), and the baselines need ~20 points.
    defaults = {"healthy": (40, 5, None), "data-pocket": (45, 5, 25), "nan": (30, 5, 22),
                "warmup-spike": (45, 18, None)}
    d_steps, d_warmup, d_fault = defaults[name]
    max_steps = d_steps if max_steps is None else max_steps
    warmup_steps = d_warmup if warmup_steps is None else warmup_steps
    if name == "warmup-spike" and fault_step is None:
        fault_step = warmup_steps + 3          # three optimizer steps after the last warmup step
    fault_step = d_fault if fault_step is None else fault_step
    for key, value in (("max_steps", max_steps), ("batch_size", batch_size),
                       ("grad_accum", grad_accum), ("seq_len", seq_len), ("pocket_steps", pocket_steps)):
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{key}: {value!r} must be a positive integer")
    if pocket_samples is not None and not all(isinstance(p, int) and p >= 0 for p in pocket_samples):
        raise ValueError(f"pocket_samples: {pocket_samples!r} must be positions (integers >= 0) within a step")
    if fault_step is not None and not 1 <= fault_step <= max_steps:
        raise ValueError(f"fault_step: {fault_step!r} must lie in [1, max_steps={max_steps}]")

    fault_steps: tuple[int, ...] = ()
    expected: dict[str, tuple[int, int]] = {}
    if name in ("data-pocket", "warmup-spike"):
        fault_steps = tuple(range(fault_step, min(max_steps, fault_step + pocket_steps - 1) + 1))
        expected["loss_spike"] = (fault_step, fault_step)
        expected["spike_recovered"] = (fault_steps[-1] + 1, min(max_steps, fault_steps[-1] + 15))
        if name == "warmup-spike":
            expected["warmup_instability"] = (fault_step, fault_steps[-1])
    elif name == "nan":
        fault_steps = (fault_step,)
        expected["nonfinite"] = (fault_step, fault_step)
    return Scenario(name=name, seed=seed, max_steps=max_steps, batch_size=batch_size,
                    grad_accum=grad_accum, lr=lr, warmup_steps=warmup_steps, seq_len=seq_len,
                    fault_steps=fault_steps, expected=expected, data_steps=data_steps,
                    pocket_samples=None if pocket_samples is None else tuple(pocket_samples))


def train_plain(scenario: Scenario, model=None, world_size: int = 1) -> list[float]:
    """Reference loop (no framework) on ``model`` (default: the scenario's): the per-step loss.
    It pretrains the scenarios' model, and checks the scenarios (``python -m`` this module)."""
    model = model if model is not None else scenario.make_model()
    opt, sched = scenario.make_optimizer(model)
    ds = scenario.train_dataset(world_size)
    bs = scenario.batch_size
    losses = []
    for s in range(scenario.max_steps):
        total = 0.0
        for m in range(scenario.grad_accum):
            lo = (s * scenario.grad_accum + m) * bs
            ids = ds.input_ids[lo:lo + bs]
            loss = model(input_ids=ids, labels=ids).loss / scenario.grad_accum
            loss.backward()
            total += loss.item()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad()
        losses.append(total)
    return losses


if __name__ == "__main__":          # python -m stability_callbacks.demo.scenarios
    import sys
    import time

    for nm in sys.argv[1:] or NAMES:
        t0 = time.perf_counter()
        ls = train_plain(build_scenario(nm))
        print(nm, f"{time.perf_counter() - t0:.1f}s",
              " ".join(f"{i + 1}:{v:.3g}" for i, v in enumerate(ls)))
