"""One rank of a 2-process HF Trainer run of a planted-fault scenario (DDP, DeepSpeed ZeRO-2/3).

Launched by tests/test_hf.py with ``python -m torch.distributed.run --nproc_per_node=2``; writes
``<out>/rank<R>.json`` with this rank's findings, its last global step and its checkpoints, so the
test can check that both ranks decided the same.
"""
import argparse
import json
import os
import sys

import torch

import cpu_deepspeed  # noqa: F401  (before DeepSpeed initialises)
from teardown import leave

torch.set_num_threads(1)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", choices=("ddp", "zero2", "zero3"), required=True)
    ap.add_argument("--scenario", required=True)
    ap.add_argument("--max-steps", type=int, default=None)
    ap.add_argument("--halt-on", default="never")
    ap.add_argument("--config", default=None, help="a JSON monitoring config (instead of --halt-on)")
    ap.add_argument("--pocket-steps", type=int, default=3)
    ap.add_argument("--data-steps", type=int, default=None)
    ap.add_argument("--full-checkpoints", action="store_true", help="optimizer and scheduler too")
    ap.add_argument("--out", required=True)
    ap.add_argument("--raise-on-rank", type=int, default=None, help="this rank raises RuntimeError ...")
    ap.add_argument("--raise-at", type=int, default=6, help="... in the forward of this step")
    a = ap.parse_args()

    from transformers import Trainer, TrainingArguments

    from stability_callbacks.demo.scenarios import build_scenario
    from stability_callbacks.integrations.hf import StabilityCallback

    world = int(os.environ["WORLD_SIZE"])
    rank = int(os.environ["RANK"])
    sc = build_scenario(a.scenario, max_steps=a.max_steps, batch_size=4, pocket_steps=a.pocket_steps,
                        data_steps=a.data_steps)
    ds_config = None
    if a.backend.startswith("zero"):
        ds_config = {"zero_optimization": {"stage": int(a.backend[-1])}, "bf16": {"enabled": False},
                     "train_micro_batch_size_per_gpu": "auto",
                     "gradient_accumulation_steps": "auto", "gradient_clipping": "auto"}
    args = TrainingArguments(
        output_dir=os.path.join(a.out, "ckpt"), max_steps=sc.max_steps,
        per_device_train_batch_size=sc.batch_size, gradient_accumulation_steps=sc.grad_accum,
        learning_rate=sc.lr, warmup_steps=sc.warmup_steps, weight_decay=0.0, logging_steps=10,
        save_strategy="steps", save_steps=1000, report_to="none",
        train_sampling_strategy="sequential", disable_tqdm=True, logging_nan_inf_filter=False,
        ddp_backend="gloo", ddp_find_unused_parameters=False, deepspeed=ds_config, use_cpu=True,
        save_only_model=not a.full_checkpoints)
    model = sc.make_model()
    if a.raise_on_rank == rank:
        calls = []

        def boom(module, inputs):
            calls.append(1)
            if len(calls) == (a.raise_at - 1) * sc.grad_accum + 1:   # step raise_at's first micro-batch
                raise RuntimeError(f"boom on rank {rank}: an illegal memory access")

        model.register_forward_pre_hook(boom)
    trainer = Trainer(model=model, args=args, train_dataset=sc.train_dataset(world))
    # halting on any instability right after warmup: the halt's mechanics on every rank
    config = json.loads(a.config) if a.config else {"policy": {"halt_on": a.halt_on, "warmup_escalation": "any"}}
    cb = StabilityCallback.attach(trainer, config=config, run_dir=os.path.join(a.out, "stability"))
    trainer.train()
    ckpts = sorted(d for d in os.listdir(args.output_dir) if d.startswith("checkpoint-")) \
        if os.path.isdir(args.output_dir) else []
    with open(os.path.join(a.out, f"rank{rank}.json"), "w") as fh:
        json.dump({"rank": rank, "world": world, "global_step": trainer.state.global_step,
                   "findings": [f.to_json() for f in cb.findings], "checkpoints": ckpts,
                   "distributed_type": trainer.accelerator.distributed_type.value,
                   "is_deepspeed": bool(trainer.is_deepspeed_enabled),
                   "zero_stage": (trainer.model_wrapped.zero_optimization_stage()
                                  if trainer.is_deepspeed_enabled else None),
                   "outcome": None if cb.outcome is None else {
                       "halted": cb.outcome.halted, "halted_at": cb.outcome.halted_at, "reason": cb.outcome.reason,
                       "exit_code": cb.outcome.exit_code, "report": cb.outcome.report_path is not None},
                   "num_params": sum(p.numel() for p in trainer.model.parameters()),
                   "weights_sum": float(sum(p.detach().double().sum() for p in trainer.model.parameters()))}, fh)
    return 0


if __name__ == "__main__":
    leave(main())
