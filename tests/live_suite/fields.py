"""Workloads of other fields (issue 33 item 7): tiny models of five kinds, their synthetic data
and the data faults planted in it. Nothing downloaded; a step costs a few ms on one CPU thread.

- ``cnn``: a two-conv CNN with BatchNorm classifying 12×12 images into 10 classes, each image
  its class's fixed random pattern plus noise (the loss legitimately goes to ~1e-3; chance
  level ln 10 = 2.30);
- ``ddpm``: a DDPM denoiser (an MLP with a sinusoidal timestep embedding) predicting the noise
  of 8-d points from a mixture of four Gaussians, noised at a random timestep of 1000 (linear
  betas 1e-4..0.02): the epsilon MSE of a batch depends on the timesteps drawn, so the loss is
  legitimately very noisy from step to step;
- ``nll``: a Gaussian-NLL regressor of a positive quantity (a price, a count) predicting a mean
  (through a ReLU) and a log-variance, ``0.5 * (log_var + (y - mean)² / exp(log_var))`` as the
  uncertainty papers write it (no variance floor, unlike ``torch.nn.GaussianNLLLoss``'s
  ``eps``): the noise is heteroscedastic, 0.05-0.35, so the loss crosses zero on its way down;
- ``vae``: a VAE on 16-d data from a 2-d latent (decoder variance 0.01): the loss is the negative
  ELBO, reconstruction + KL, the KL term rising while the reconstruction falls;
- ``bandit``: a REINFORCE policy on a contextual bandit of 4 arms (mean rewards ``tanh(W x)``,
  noise 0.5), the loss ``-(r - mean r) · log π(a|x)``: about zero, of either sign at every step
  (its progress is the policy's expected reward, :func:`outcome`).

Every forward takes the row columns as keyword arguments and returns ``{"loss", ...}``, as HF
models do, and casts float inputs to its weights' dtype (a DeepSpeed fp16 engine holds fp16
weights). The randomness of a step (noise, timesteps, reparameterisation, action draws) is in the
rows, drawn from seeded generators: a run is the same on every framework.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from .scenarios import Scenario

FIELD_MODELS = ("cnn", "ddpm", "nll", "vae", "bandit")
NUM_CLASSES = 10
IMAGE_SIZE = 12
DIFFUSION_STEPS = 1000
NUM_ARMS = 4


def _dtype(module: nn.Module) -> torch.dtype:
    return next(module.parameters()).dtype


# ------------------------------------------------------------------------------------ models
class CNNClassifier(nn.Module):
    """conv 1→8 → BN → ReLU → pool, conv 8→16 → BN → ReLU → pool, linear 144→32 → BatchNorm1d →
    ReLU → linear 32→10 (BatchNorm1d refuses a batch of one in training: the ``bn-batch1`` fault)."""

    def __init__(self):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2))
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(16 * 9, 32), nn.BatchNorm1d(32), nn.ReLU(),
                                  nn.Linear(32, NUM_CLASSES))

    def forward(self, x, labels=None):
        logits = self.head(self.features(x.to(_dtype(self))))
        out = {"logits": logits}
        if labels is not None:
            out["loss"] = nn.functional.cross_entropy(logits.float(), labels)
        return out


def _betas() -> torch.Tensor:
    return torch.linspace(1e-4, 0.02, DIFFUSION_STEPS)


class Denoiser(nn.Module):
    """DDPM's epsilon prediction on 8-d points: ``x_t = √ᾱ_t x0 + √(1-ᾱ_t) ε``, the MLP sees
    ``x_t`` and a 16-d sinusoidal embedding of ``t``; the loss is ``mean((ε̂ - ε)²)``."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8 + 16, 128), nn.SiLU(), nn.Linear(128, 128), nn.SiLU(),
                                 nn.Linear(128, 8))
        self.register_buffer("alpha_bar", torch.cumprod(1.0 - _betas(), 0), persistent=False)
        self.register_buffer("freqs", torch.exp(-math.log(1000.0) * torch.arange(8) / 8), persistent=False)

    def forward(self, x0, t, noise):
        dt = _dtype(self)
        ab = self.alpha_bar[t].unsqueeze(-1)
        x_t = ab.sqrt() * x0.float() + (1 - ab).sqrt() * noise.float()
        angles = t.unsqueeze(-1).float() * self.freqs
        h = torch.cat([x_t, angles.sin(), angles.cos()], dim=-1).to(dt)
        return {"loss": (self.net(h).float() - noise.float()).pow(2).mean()}


class GaussianRegressor(nn.Module):
    """A 4 → 64 → 64 → 2 MLP: a mean (non-negative: a ReLU) and a log-variance per input."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 2))

    def forward(self, x, y):
        mean, log_var = self.net(x.to(_dtype(self))).float().unbind(-1)
        mean = torch.relu(mean)
        loss = 0.5 * (log_var + (y.float() - mean).pow(2) * torch.exp(-log_var)).mean()
        return {"loss": loss, "mean": mean, "log_var": log_var}


class VAE(nn.Module):
    """16 → 64 → (mean, log-variance) of a 4-d latent → 64 → 16; the loss is the negative ELBO per
    example: ``Σ (x - x̂)² / (2·0.01)`` + ``KL(q(z|x) ‖ N(0, I))``."""

    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 8))
        self.decoder = nn.Sequential(nn.Linear(4, 64), nn.GELU(), nn.Linear(64, 16))

    def forward(self, x, eps):
        dt = _dtype(self)
        mean, log_var = self.encoder(x.to(dt)).float().chunk(2, dim=-1)
        z = mean + torch.exp(0.5 * log_var) * eps.float()
        recon = (self.decoder(z.to(dt)).float() - x.float()).pow(2).sum(-1).mean() / (2 * 0.01)
        kl = 0.5 * (mean.pow(2) + log_var.exp() - 1.0 - log_var).sum(-1).mean()
        return {"loss": recon + kl, "recon": recon.detach(), "kl": kl.detach()}


class BanditPolicy(nn.Module):
    """An 8 → 32 → 4 softmax policy trained by REINFORCE with the batch's mean reward as the
    baseline. The rows carry every arm's reward for the context (the learner sees only the one
    it pulls) and a uniform draw ``u`` that picks the arm by the inverse CDF."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, NUM_ARMS))

    def forward(self, context, rewards, u):
        logp = torch.log_softmax(self.net(context.to(_dtype(self))).float(), dim=-1)
        cdf = logp.detach().exp().cumsum(-1)
        arm = (cdf < u.float().unsqueeze(-1)).sum(-1).clamp(max=NUM_ARMS - 1)
        reward = rewards.float().gather(-1, arm.unsqueeze(-1)).squeeze(-1)
        advantage = reward - reward.mean()
        loss = -(advantage * logp.gather(-1, arm.unsqueeze(-1)).squeeze(-1)).mean()
        return {"loss": loss, "reward": reward.mean().detach()}


_MODELS = {"cnn": CNNClassifier, "ddpm": Denoiser, "nll": GaussianRegressor, "vae": VAE, "bandit": BanditPolicy}


class _FrozenLoss:
    """A forward hook that makes the loss require grad, as the forum answer to "element 0 of
    tensors does not require grad" does (``loss.requires_grad = True``) once every parameter was
    frozen: training runs, nothing moves."""

    def __call__(self, module, args, kwargs, output):
        if not output["loss"].requires_grad:
            output["loss"] = output["loss"].detach().requires_grad_(True)
        return output


def make_field_model(sc: Scenario) -> nn.Module:
    torch.manual_seed(sc.seed)
    model = _MODELS[sc.model]()
    if sc.fault is not None and sc.fault.kind == "frozen":
        for p in model.parameters():
            p.requires_grad_(False)
        model.register_forward_hook(_FrozenLoss(), with_kwargs=True)
    return model


# -------------------------------------------------------------------------------------- data
def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


_BLOCK_ROWS = 1024


def _rows(draw, n: int, seed: int) -> dict[str, torch.Tensor]:
    """``n`` rows drawn block by block (``draw(m, generator)``, each block of 1024 rows from its
    own generator): a shorter run reads the first rows of a longer one, so a fault run and its
    healthy twin see the same data up to the fault."""
    blocks = [draw(_BLOCK_ROWS, _gen(seed * 100_003 + b)) for b in range(-(-n // _BLOCK_ROWS))]
    return {k: torch.cat([b[k] for b in blocks])[:n] for k in blocks[0]}


def _images(m: int, g: torch.Generator) -> dict[str, torch.Tensor]:
    patterns = torch.randn(NUM_CLASSES, 1, IMAGE_SIZE, IMAGE_SIZE, generator=_gen(17))
    labels = torch.randint(0, NUM_CLASSES, (m,), generator=g)
    x = patterns[labels] + torch.randn(m, 1, IMAGE_SIZE, IMAGE_SIZE, generator=g)
    # the labels of a pipeline that shuffled them apart from the images: nothing to learn
    return {"x": x, "labels": labels, "random_labels": torch.randint(0, NUM_CLASSES, (m,), generator=g)}


def _points(m: int, g: torch.Generator) -> dict[str, torch.Tensor]:
    centers = torch.randn(4, 8, generator=_gen(23)).sign() * 0.6
    x0 = centers[torch.randint(0, 4, (m,), generator=g)] + 0.1 * torch.randn(m, 8, generator=g)
    return {"x0": x0, "t": torch.randint(0, DIFFUSION_STEPS, (m,), generator=g),
            "noise": torch.randn(m, 8, generator=g)}


def _regression(m: int, g: torch.Generator) -> dict[str, torch.Tensor]:
    x = torch.rand(m, 4, generator=g) * 4 - 2
    sigma = 0.05 + 0.3 * torch.sigmoid(2 * x[:, 2])
    y = torch.exp(0.5 * torch.sin(1.5 * x[:, 0]) + 0.3 * x[:, 1]) + sigma * torch.randn(m, generator=g)
    return {"x": x, "y": y.clamp(min=0.0)}


def _latent_data(m: int, g: torch.Generator) -> dict[str, torch.Tensor]:
    mix = torch.randn(2, 16, generator=_gen(29))
    x = torch.tanh(torch.randn(m, 2, generator=g) @ mix) + 0.05 * torch.randn(m, 16, generator=g)
    return {"x": x, "eps": torch.randn(m, 4, generator=g)}


def _arm_means(context: torch.Tensor) -> torch.Tensor:
    w = torch.randn(8, NUM_ARMS, generator=_gen(31)) / math.sqrt(8)
    return torch.tanh(2 * context @ w)


def _bandit(m: int, g: torch.Generator) -> dict[str, torch.Tensor]:
    context = torch.randn(m, 8, generator=g)
    rewards = _arm_means(context) + 0.5 * torch.randn(m, NUM_ARMS, generator=g)
    return {"context": context, "rewards": rewards, "u": torch.rand(m, generator=g)}


_DATA = {"cnn": _images, "ddpm": _points, "nll": _regression, "vae": _latent_data, "bandit": _bandit}


def field_columns(sc: Scenario, n: int, *, seed: int, train: bool) -> dict[str, torch.Tensor]:
    """``n`` rows of ``sc.model``'s data; on training rows, the data faults planted at their
    steps (step ``s`` reads rows ``[(s-1)·G, s·G)``, ``G = sc.samples_per_step``)."""
    f = sc.fault if train else None
    cols = _rows(_DATA[sc.model], n, seed)
    if sc.model == "cnn":
        shuffled = cols.pop("random_labels")
        if f is not None and f.kind == "random-labels":
            cols["labels"] = shuffled
        if f is not None and f.kind == "bn-batch1":   # the dataset ends one row into step f.step
            cols = {k: v[:(f.step - 1) * sc.samples_per_step + 1] for k, v in cols.items()}
        return cols
    if f is None or f.kind not in ("data-scale", "targets-zero", "reward-scale"):
        return cols
    g = sc.samples_per_step
    rows = slice((f.step - 1) * g, (f.step - 1 + f.length) * g if f.length else n)
    key = {"data-scale": "x0" if sc.model == "ddpm" else "x", "targets-zero": "y",
           "reward-scale": "rewards"}[f.kind]
    cols[key][rows] = 0.0 if f.kind == "targets-zero" else cols[key][rows] * f.factor
    return cols


# ------------------------------------------------------------------------------------ outcome
def outcome(sc: Scenario, model: nn.Module) -> dict:
    """What the loss cannot say about progress, measured after training (the run's notes): the
    bandit policy's expected reward on 512 held-out contexts, against the untrained policy's and
    the best arm's. Empty for the other models."""
    if sc.model != "bandit":
        return {}
    context = torch.randn(512, 8, generator=_gen(sc.seed + 77))
    means = _arm_means(context)

    def expected(policy: nn.Module) -> float:
        with torch.no_grad():
            p = torch.softmax(policy.net(context.to(_dtype(policy))).float(), dim=-1)
        return float((p * means).sum(-1).mean())

    return {"reward_start": round(expected(make_field_model(sc)), 4),
            "reward_end": round(expected(model), 4),
            "reward_best": round(float(means.max(-1).values.mean()), 4)}
