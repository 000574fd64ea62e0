"""One runner per framework: a real training run of a :class:`Scenario`, monitored through the
library's public API only, its run log written to ``run_dir``.

- HF Trainer: ``StabilityCallback(run_dir=...)`` in ``Trainer(callbacks=...)`` (the plain way;
  the callback finds its Trainer), HF's own optimizers and
  schedules (``optim``, ``adam_beta2``, ``lr_scheduler_type``), a sequential sampler;
- Lightning: ``StabilityCallback(run_dir=...)`` in ``Trainer(callbacks=...)``, the torch
  optimizer and ``LambdaLR`` a LightningModule configures;
- DeepSpeed: ``attach(engine, run_dir=...)`` on a hand-written loop, single process on the CPU
  accelerator, optimizer and scheduler from the DeepSpeed config (WSD, step schedules and LR faults: a
  client LambdaLR).

Every runner uses the default monitoring config, as a user who adds one line would (or the JSON
config in the environment variable ``LIVE_MATRIX_CONFIG``: ``live_matrix.py --config``). Faults are
planted right before the first micro-batch of their step (:func:`plant`); data faults live in
the data (``scenarios.train_rows``). A resume is a second process-like start: a fresh model,
framework object and callback/hook on the same ``run_dir``, loading the checkpoint.
"""
from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import torch

from .fields import outcome
from .scenarios import Scenario, eval_rows, make_model, make_optimizer, make_scheduler, train_rows

#: The environment variable holding a JSON monitoring config for every runner (None: defaults).
CONFIG_ENV = "LIVE_MATRIX_CONFIG"


def _config():
    return json.loads(os.environ.get(CONFIG_ENV) or "null")


# -------------------------------------------------------------------------------- faults
def plant(sc: Scenario, step: int, model, optimizer, scheduler=None) -> None:
    """Plant ``sc.fault`` if optimizer step ``step`` (1-based, about to run) is where it acts."""
    f = sc.fault
    if f is None or step < f.step:
        return
    if (f.kind == "lr-jump" and step == f.step) or f.kind == "lr-ramp":
        _scale_lr(optimizer, scheduler, f.factor)
    elif f.kind == "lr-zero" and step == f.step:
        _scale_lr(optimizer, scheduler, 0.0)
    elif f.kind == "nan-weight" and step == f.step:
        weight = [p for p in model.parameters() if p.dim() == 2][-1]
        with torch.no_grad():
            weight.view(-1)[0] = float("nan")
    elif (f.kind == "weights-scale" and step == f.step) or (f.kind == "spike-grows" and step == f.step + 1):
        with torch.no_grad():
            for p in model.parameters():
                if p.dim() >= 2:
                    p.mul_(f.factor)


def _scale_lr(optimizer, scheduler, factor: float) -> None:
    # The LR of this step was already set by the scheduler's last step(); base_lrs carries the
    # change into every later step (LambdaLR: lr = base_lr * factor(step)).
    for group in optimizer.param_groups:
        group["lr"] *= factor
    if scheduler is not None and hasattr(scheduler, "base_lrs"):
        scheduler.base_lrs = [b * factor for b in scheduler.base_lrs]


def _loss(out):
    return out["loss"]


def _stale(sc: Scenario) -> bool:
    """The ``optimizer-stale`` fault: the optimizer holds the parameters of a model built before
    the one that trains (openvinotoolkit/nncf#327: parameters replaced after the optimizer took
    the list "break the gradient updates")."""
    return sc.fault is not None and sc.fault.kind == "optimizer-stale"


# ------------------------------------------------------------------------------ HF Trainer
_HF_SCHEDULES = {"linear": "linear", "cosine": "cosine", "constant": "constant_with_warmup",
                 "wsd": "warmup_stable_decay"}
_HF_OPTIM = {"adamw": "adamw_torch", "sgd": "sgd", "adafactor": "adafactor"}


def _local_tokenizer():
    """A word-level tokenizer over the 64 tokens, built here (TRL wants one; nothing downloaded)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from .scenarios import VOCAB_SIZE

    tok = Tokenizer(models.WordLevel({f"t{i}": i for i in range(VOCAB_SIZE)}, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="t0", eos_token="t0", unk_token="t0")


def _trl_trainer(sc: Scenario, kw: dict, callbacks: list):
    """TRL's SFTTrainer on the same rows (already token ids: TRL only builds the labels), through
    the same callbacks: what a user fine-tuning with TRL writes."""
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    cfg = SFTConfig(**kw, max_length=None, packing=False, dataset_num_proc=None)
    rows = Dataset.from_dict({"input_ids": train_rows(sc).columns["input_ids"].tolist()})
    return SFTTrainer(model=make_model(sc), args=cfg, train_dataset=rows, processing_class=_local_tokenizer(),
                      callbacks=callbacks)


def run_hf(sc: Scenario, run_dir: Path) -> dict:
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from stability_callbacks.integrations.hf import StabilityCallback

    class Plant(TrainerCallback):
        def on_step_begin(self, args, state, control, model=None, optimizer=None, lr_scheduler=None, **kw):
            plant(sc, state.global_step + 1, model, optimizer, lr_scheduler)

    class StopAt(TrainerCallback):
        """A preempted job: checkpoint at ``resume_at``, then gone."""

        def on_step_end(self, args, state, control, **kw):
            if state.global_step == sc.resume_at:
                control.should_save = control.should_training_stop = True

    ckpt = run_dir / "ckpt"
    kw = dict(output_dir=str(ckpt), per_device_train_batch_size=sc.batch_size,
              per_device_eval_batch_size=sc.batch_size, gradient_accumulation_steps=sc.grad_accum,
              learning_rate=sc.lr, warmup_steps=sc.warmup, lr_scheduler_type=_HF_SCHEDULES[sc.schedule],
              optim=_HF_OPTIM[sc.optimizer], adam_beta2=sc.beta2, max_grad_norm=sc.clip,
              bf16=sc.precision == "bf16", logging_steps=50, save_strategy="no", report_to="none",
              train_sampling_strategy="sequential", use_cpu=True, disable_tqdm=True, seed=sc.seed,
              eval_strategy="steps" if sc.eval_every else "no", eval_steps=sc.eval_every or None)
    if sc.epochs > 1:
        kw.update(num_train_epochs=sc.epochs, max_steps=-1)
    else:
        kw.update(max_steps=sc.steps)
    if sc.schedule == "wsd":
        kw["lr_scheduler_kwargs"] = {"num_decay_steps": sc.decay_steps}
    if sc.optimizer == "sgd":
        kw["optim_args"] = "momentum=0.9"
    if sc.objective == "label-smoothing":
        kw["label_smoothing_factor"] = 0.1   # the Trainer's own LabelSmoother

    def trainer(**extra):
        callbacks = [Plant(), StabilityCallback(run_dir=run_dir, config=_config())]
        if sc.trainer == "trl":
            return _trl_trainer(sc, {**kw, **extra}, callbacks)
        stale = (make_optimizer(sc, make_model(sc).parameters()), None) if _stale(sc) else (None, None)
        return Trainer(model=make_model(sc), args=TrainingArguments(**{**kw, **extra}),
                       train_dataset=train_rows(sc), eval_dataset=eval_rows(sc) if sc.eval_every else None,
                       callbacks=callbacks, optimizers=stale)

    if sc.resume_at is None:
        t = trainer()
        t.train()
        return outcome(sc, t.model)
    first = trainer()
    first.add_callback(StopAt())
    first.train()
    restart = sc.fault is not None and sc.fault.kind == "resume-restart"
    folder = ckpt / f"checkpoint-{sc.resume_at}"
    if sc.fresh_optimizer:   # a restart that keeps the weights only: the Trainer then builds a new AdamW
        (folder / "optimizer.pt").unlink()
    # ignore_data_skip: the resumed run reads the data from its first batch again.
    trainer(ignore_data_skip=restart).train(resume_from_checkpoint=str(folder))
    return {}


# ------------------------------------------------------------------------------- Lightning
def run_lightning(sc: Scenario, run_dir: Path) -> dict:
    import lightning.pytorch as pl

    from stability_callbacks.integrations.lightning import StabilityCallback

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = make_model(sc)

        def training_step(self, batch, batch_idx):
            return _loss(self.model(**batch))

        def validation_step(self, batch, batch_idx):
            self.log("val_loss", _loss(self.model(**batch)))

        def configure_optimizers(self):
            opt = make_optimizer(sc, (make_model(sc) if _stale(sc) else self.model).parameters())
            return {"optimizer": opt, "lr_scheduler": {"scheduler": make_scheduler(sc, opt), "interval": "step"}}

    class Plant(pl.Callback):
        def __init__(self):
            self.last = None

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            step = trainer.global_step + 1
            if step != self.last:        # the first micro-batch of the step
                self.last = step
                sched = trainer.lr_scheduler_configs[0].scheduler
                plant(sc, step, pl_module.model, trainer.optimizers[0], sched)

    rows = train_rows(sc)
    loader = lambda ds: torch.utils.data.DataLoader(ds, batch_size=sc.batch_size, shuffle=False)  # noqa: E731
    val = loader(eval_rows(sc)) if sc.eval_every else None

    def fit(max_steps, data, ckpt_path=None, callbacks=()):
        kw = dict(accelerator="cpu", devices=1, accumulate_grad_batches=sc.grad_accum,
                  gradient_clip_val=sc.clip or None, logger=False, enable_progress_bar=False,
                  enable_model_summary=False, enable_checkpointing=bool(callbacks),
                  default_root_dir=str(run_dir), num_sanity_val_steps=0,
                  precision="bf16-mixed" if sc.precision == "bf16" else "32-true")
        if sc.epochs > 1:
            kw.update(max_epochs=sc.epochs, max_steps=-1)
        else:
            kw.update(max_steps=max_steps)
        if sc.eval_every:
            kw.update(val_check_interval=sc.eval_every * sc.grad_accum, check_val_every_n_epoch=None)
        cb = StabilityCallback(run_dir=run_dir, checkpoint_dir=run_dir / "ckpt", config=_config())
        trainer = pl.Trainer(callbacks=[Plant(), cb, *callbacks], **kw)
        trainer.fit(Module(), loader(data), val, ckpt_path=ckpt_path)
        return trainer

    if sc.resume_at is None:
        return outcome(sc, fit(sc.steps, rows).lightning_module.model)
    r = sc.resume_at
    mc = pl.callbacks.ModelCheckpoint(dirpath=run_dir / "ckpt", every_n_train_steps=r, save_top_k=-1)
    fit(r, rows, callbacks=[mc])
    (path,) = (run_dir / "ckpt").glob(f"epoch=*-step={r}.ckpt")
    restart = sc.fault is not None and sc.fault.kind == "resume-restart"
    # Lightning restores the loops, not a map-style loader's position: a correct resume hands
    # over the rows not yet seen; a careless one the whole dataset again.
    rest = rows if restart else torch.utils.data.Subset(rows, range(r * sc.samples_per_step, len(rows)))
    fit(sc.steps, rest, ckpt_path=str(path))
    return {}


# ------------------------------------------------------------------------------- DeepSpeed
def _init_single_process_dist() -> None:
    import deepspeed
    import torch.distributed as dist

    if dist.is_initialized():
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", LOCAL_RANK="0",
                      WORLD_SIZE="1")
    deepspeed.init_distributed(dist_backend="gloo")


def _client_schedule(sc: Scenario) -> bool:
    """Whether a DeepSpeed run takes its schedule as a client LambdaLR: no DeepSpeed scheduler
    makes WSD or a step schedule, and an LR fault must be able to scale its base LRs."""
    return sc.schedule in ("wsd", "step") or (sc.fault is not None and sc.fault.kind in ("lr-jump", "lr-ramp"))


def ds_config(sc: Scenario) -> dict:
    """What a DeepSpeed user writes: batch, ZeRO stage, AdamW (the stock torch one: no JIT-built
    op), a DeepSpeed scheduler, clipping, precision (fp16 with DeepSpeed's default scale search)."""
    cfg = {
        "train_micro_batch_size_per_gpu": sc.batch_size,
        "gradient_accumulation_steps": sc.grad_accum,
        "zero_optimization": {"stage": sc.zero_stage},
        "optimizer": {"type": "AdamW", "params": {"lr": sc.lr, "betas": [0.9, sc.beta2],
                                                  "weight_decay": 0.0, "torch_adam": True}},
        "gradient_clipping": sc.clip,
        "steps_per_print": 10 ** 9,
    }
    warm = {"warmup_num_steps": sc.warmup, "warmup_type": sc.ds_warmup_type}
    if _client_schedule(sc):
        pass
    elif sc.schedule == "linear":
        cfg["scheduler"] = {"type": "WarmupDecayLR", "params": {
            "total_num_steps": sc.steps, "warmup_min_lr": 0.0, "warmup_max_lr": sc.lr, **warm}}
    elif sc.schedule == "cosine":
        cfg["scheduler"] = {"type": "WarmupCosineLR", "params": {
            "total_num_steps": sc.steps, "warmup_min_ratio": 0.0, **warm}}
    elif sc.schedule == "constant":
        cfg["scheduler"] = {"type": "WarmupLR", "params": {
            "warmup_min_lr": 0.0, "warmup_max_lr": sc.lr, **warm}}
    if sc.precision == "fp16":
        cfg["fp16"] = {"enabled": True}
    elif sc.precision == "bf16":
        cfg["bf16"] = {"enabled": True}
    return cfg


def run_deepspeed(sc: Scenario, run_dir: Path) -> dict:
    import deepspeed
    from cpu_deepspeed import GradBlowUp, allow_fp16   # tests/dist: no shared-memory op build here

    from stability_callbacks.integrations.deepspeed import attach

    if sc.precision == "fp16":
        allow_fp16()
    _init_single_process_dist()
    cols = train_rows(sc).columns     # token ids and labels, or a field's columns (fields.py)
    val = eval_rows(sc).columns if sc.eval_every else None
    g, ckpt = sc.samples_per_step, run_dir / "ckpt"
    num_rows = len(next(iter(cols.values())))

    def rows(columns: dict, start: int) -> dict:
        return {k: v[start:start + sc.batch_size] for k, v in columns.items()}

    def engine_and_hook():
        model = make_model(sc)
        client_sched = None
        if _client_schedule(sc):
            client_sched = lambda opt: make_scheduler(sc, opt)  # noqa: E731
        engine, _, _, _ = deepspeed.initialize(model=model, config=ds_config(sc), lr_scheduler=client_sched,
                                               model_parameters=model.parameters())
        return engine, attach(engine, run_dir=run_dir, config=_config())

    def train(engine, hook, last_step, data_offset=0):
        while engine.global_steps < last_step:
            step = engine.global_steps + 1
            plant(sc, step, engine.module, engine.optimizer, engine.lr_scheduler)
            d = (step - 1 - data_offset) % (num_rows // g)
            for m in range(sc.grad_accum):
                loss = engine(**rows(cols, d * g + m * sc.batch_size))["loss"]
                f = sc.fault
                if f is not None and f.kind == "fp16-overflow" and f.step <= step < f.step + (f.length or 10 ** 9):
                    loss = GradBlowUp.apply(loss)
                engine.backward(loss)
                engine.step()
            if sc.eval_every and step % sc.eval_every == 0:
                engine.eval()
                with torch.no_grad():
                    for k in range(0, len(next(iter(val.values()))), sc.batch_size):
                        engine(**rows(val, k))
                engine.train()

    notes: dict = {}
    engine, hook = engine_and_hook()
    try:
        if sc.resume_at is None:
            train(engine, hook, sc.steps)
            notes.update(outcome(sc, engine.module))
        else:
            train(engine, hook, sc.resume_at)
            engine.save_checkpoint(str(ckpt), tag=f"global_step{sc.resume_at}")
            hook.close()
            engine, hook = engine_and_hook()
            # a restart from the weights alone (fresh_optimizer): DeepSpeed's own switch
            engine.load_checkpoint(str(ckpt), load_optimizer_states=not sc.fresh_optimizer)
            restart = sc.fault is not None and sc.fault.kind == "resume-restart"
            train(engine, hook, sc.steps, data_offset=sc.resume_at if restart else 0)
    except Exception as e:   # DeepSpeed's own end of an fp16 run: the minimum loss scale
        if "minimum" not in str(e):
            raise
        notes["deepspeed_exit"] = {"step": int(engine.global_steps) + 1, "message": str(e)[:200]}
    finally:
        hook.close()
    return notes


RUNNERS = {"hf": run_hf, "lightning": run_lightning, "deepspeed": run_deepspeed}
