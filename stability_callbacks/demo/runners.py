"""The demo's thin runners, one per framework: build the scenario's tiny model and data, attach
the integration with the terminal as its listener, train. Nothing here watches the run."""
from __future__ import annotations

import logging
import os
from contextlib import contextmanager
from pathlib import Path

from .terminal import LiveDisplay


def train_hf(sc, config: dict, ckpt_dir: Path, run_dir: Path, display: LiveDisplay) -> None:
    from transformers import Trainer, TrainingArguments
    from transformers.trainer_callback import PrinterCallback, ProgressCallback

    from ..integrations.hf import StabilityCallback

    args = TrainingArguments(
        output_dir=str(ckpt_dir), max_steps=sc.max_steps, per_device_train_batch_size=sc.batch_size,
        gradient_accumulation_steps=sc.grad_accum, learning_rate=sc.lr,
        warmup_steps=sc.warmup_steps, weight_decay=0.0, logging_steps=10,
        save_strategy="steps", save_steps=display.user_save_steps, report_to="none",
        train_sampling_strategy="sequential", use_cpu=True, disable_tqdm=True,
        logging_nan_inf_filter=False, seed=sc.seed)
    with _quiet():
        trainer = Trainer(model=sc.make_model(), args=args, train_dataset=sc.train_dataset())
        for cb in (PrinterCallback, ProgressCallback):   # the demo's own bar and lines instead
            trainer.remove_callback(cb)
        stability = StabilityCallback.attach(trainer, config=config, run_dir=run_dir,
                                             run_name=f"demo-{sc.name}", listeners=[display])
        try:
            trainer.train()
        finally:
            stability.close()


def train_lightning(sc, config: dict, ckpt_dir: Path, run_dir: Path, display: LiveDisplay) -> None:
    import lightning.pytorch as pl
    import torch

    from ..integrations.lightning import StabilityCallback

    class TinyGPT(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = sc.make_model()

        def training_step(self, batch, batch_idx):
            return self.model(input_ids=batch["input_ids"], labels=batch["labels"]).loss

        def configure_optimizers(self):
            opt, sched = sc.make_optimizer(self.model)   # the HF Trainer's AdamW + linear warmup
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    stability = StabilityCallback(config=config, run_dir=run_dir, run_name=f"demo-{sc.name}",
                                  checkpoint_dir=ckpt_dir, listeners=[display])
    loader = torch.utils.data.DataLoader(sc.train_dataset(), batch_size=sc.batch_size, shuffle=False)
    with _quiet():
        trainer = pl.Trainer(max_steps=sc.max_steps, accelerator="cpu", devices=1,
                             accumulate_grad_batches=sc.grad_accum, gradient_clip_val=1.0,
                             callbacks=[stability], enable_checkpointing=False, logger=False,
                             enable_progress_bar=False, enable_model_summary=False,
                             default_root_dir=str(ckpt_dir))
        trainer.fit(TinyGPT(), loader)


def train_deepspeed(sc, config: dict, ckpt_dir: Path, run_dir: Path, display: LiveDisplay) -> None:
    """A hand-written loop (forward, ``engine.backward``, ``engine.step``) on a one-process
    DeepSpeed engine on the CPU, with ``attach(engine)``: the Megatron-DeepSpeed shape."""
    import sys

    if "deepspeed" not in sys.modules:
        os.environ.setdefault("DS_ACCELERATOR", "cpu")   # the demo's model is CPU-sized
    import deepspeed
    import deepspeed.ops
    import torch
    import torch.distributed as dist

    from ..integrations.deepspeed import attach

    # The CPU accelerator JIT-compiles a shared-memory all-reduce at the first init (minutes on
    # a laptop); one process needs no all-reduce at all.
    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    created = not dist.is_initialized()
    if created:
        for key, value in (("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", str(_free_port())),
                           ("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1")):
            os.environ.setdefault(key, value)
    with _quiet():
        if created:
            deepspeed.init_distributed(dist_backend="gloo", verbose=False)
        try:
            model = sc.make_model()
            engine, _, _, _ = deepspeed.initialize(model=model, config=sc.deepspeed_config(stage=1),
                                                   model_parameters=model.parameters())
            loader = torch.utils.data.DataLoader(sc.train_dataset(), batch_size=sc.batch_size,
                                                 shuffle=False)
            with attach(engine, config=config, run_dir=run_dir, run_name=f"demo-{sc.name}",
                        save_dir=ckpt_dir, listeners=[display]) as hook:
                last = 0
                for batch in hook.batches(loader):   # rewinds after an automatic rollback
                    engine.backward(engine(input_ids=batch["input_ids"], labels=batch["labels"]).loss)
                    engine.step()
                    step = int(engine.global_steps)
                    if step == last:
                        continue          # an accumulation micro-batch
                    last = step
                    if hook.should_stop or step >= sc.max_steps:
                        break
                    if step % display.user_save_steps == 0:   # the loop's own regular save
                        engine.save_checkpoint(str(ckpt_dir), tag=f"global_step{step}")
        finally:
            if created:
                dist.destroy_process_group()


@contextmanager
def _quiet():
    """Tiny-model warnings (no attention mask, loss_type), DeepSpeed's "Setting accelerator to
    CPU", checkpoint progress bars, Lightning's start-up notes (GPU available, a logger tip) and
    deprecation warnings of pinned dependencies would drown the story; all restored afterwards.
    DeepSpeed's logger gets a filter, not a level: DeepSpeed sets its level when first imported."""
    import warnings

    import transformers

    verbosity = transformers.logging.get_verbosity()
    transformers.logging.set_verbosity_error()
    transformers.utils.logging.disable_progress_bar()
    ds_logger, below_error = logging.getLogger("DeepSpeed"), lambda record: record.levelno >= logging.ERROR
    ds_logger.addFilter(below_error)
    lightning = [logging.getLogger(f"lightning.{n}") for n in ("pytorch", "fabric", "pytorch.utilities.rank_zero",
                                                                "fabric.utilities.rank_zero")]
    levels = [lg.level for lg in lightning]
    for lg in lightning:
        lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(lightning, levels):
            lg.setLevel(level)
        ds_logger.removeFilter(below_error)
        transformers.logging.set_verbosity(verbosity)
        transformers.utils.logging.enable_progress_bar()


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


RUNNERS = {"hf": train_hf, "lightning": train_lightning, "deepspeed": train_deepspeed}
