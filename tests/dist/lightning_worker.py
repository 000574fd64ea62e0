"""One rank of 2-process Lightning runs of a planted-fault scenario: DDP, then DeepSpeed ZeRO-2.

Launched by tests/test_lightning.py with ``python -m torch.distributed.run --nproc_per_node=2``
(gloo, CPU; ``DS_ACCELERATOR=cpu``). Both strategies run in the same processes, one after the
other, so the suite pays the interpreter and import start-up once. For each strategy it writes
``<out>/<strategy>_rank<R>.json`` with this rank's findings, the records the Monitor saw, its
last global step and the callback's own checkpoint saves, so the test can check that both ranks
decided the same, at the same steps.
"""
import argparse
import json
import os
import sys

import torch

import cpu_deepspeed  # noqa: F401  (before DeepSpeed initialises)
from teardown import leave

torch.set_num_threads(1)


def _cpu_deepspeed_strategy(**kwargs):
    """Lightning's DeepSpeedStrategy minus its CUDA-only checks (lightning 2.6.6
    DeepSpeedStrategy.setup_environment and _setup_model): DeepSpeed itself runs on CPU with
    DS_ACCELERATOR=cpu and gloo. Test scaffolding only; the callback needs none of it."""
    import argparse as _ap

    from lightning.fabric.utilities.seed import reset_seed
    from lightning.pytorch.strategies import DDPStrategy, DeepSpeedStrategy

    class CPUDeepSpeedStrategy(DeepSpeedStrategy):
        def setup_environment(self):
            DDPStrategy.setup_environment(self)

        def setup_distributed(self):
            reset_seed()
            self.set_world_ranks()
            self._init_deepspeed_distributed()

        def _setup_model_and_optimizer(self, model, optimizer, lr_scheduler=None):
            import deepspeed

            # device_rank=root_device.index is None on CPU; DeepSpeed wants an int.
            engine, opt, _, _ = deepspeed.initialize(
                args=_ap.Namespace(device_rank=self.local_rank), config=self.config, model=model,
                model_parameters=[p for p in model.parameters() if p.requires_grad],
                optimizer=optimizer, lr_scheduler=lr_scheduler, dist_init_required=False)
            return engine, opt

    return CPUDeepSpeedStrategy(**kwargs)


def run(strategy_name: str, a, world: int, rank: int) -> None:
    import lightning.pytorch as pl
    from lightning.pytorch.strategies import DDPStrategy

    from stability_callbacks.demo.scenarios import build_scenario
    from stability_callbacks.integrations.lightning import StabilityCallback

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from test_lightning import ScenarioModule   # the same LightningModule as the 1-process tests

    sc = build_scenario(a.scenario, max_steps=a.max_steps, fault_step=a.fault_step,
                        batch_size=a.batch_size, pocket_steps=a.pocket_steps, data_steps=a.data_steps)
    if strategy_name == "ddp":
        strategy = DDPStrategy(process_group_backend="gloo")
    else:
        strategy = _cpu_deepspeed_strategy(stage=2, process_group_backend="gloo")
    out = os.path.join(a.out, strategy_name)
    cb = StabilityCallback(config=json.loads(a.config), run_dir=os.path.join(out, "stability"),
                           checkpoint_dir=os.path.join(out, "ckpt"))
    # Lightning's own distributed sampler SHUFFLES training data (use_distributed_sampler adds
    # shuffle=True for the train loader even when the loader was sequential), which would move the
    # planted fault to other steps. The scenarios need DistributedSampler(shuffle=False).
    dataset = sc.train_dataset(world)
    sampler = torch.utils.data.DistributedSampler(dataset, num_replicas=world, rank=rank,
                                                  shuffle=False)
    loader = torch.utils.data.DataLoader(dataset, batch_size=sc.batch_size, sampler=sampler)
    trainer = pl.Trainer(accelerator="cpu", devices=world, strategy=strategy,
                         max_steps=sc.max_steps, gradient_clip_val=1.0, logger=False,
                         enable_progress_bar=False, enable_model_summary=False,
                         enable_checkpointing=False, default_root_dir=out, callbacks=[cb],
                         use_distributed_sampler=False)
    trainer.fit(ScenarioModule(sc), loader)
    with open(os.path.join(a.out, f"{strategy_name}_rank{rank}.json"), "w") as fh:
        json.dump({"rank": rank, "world": world, "global_step": trainer.global_step,
                   "findings": [f.to_json() for f in cb.findings],
                   "saved": [step for step, _ in cb.saved],
                   "should_stop": bool(trainer.should_stop)}, fh)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--strategies", default="ddp,deepspeed")
    ap.add_argument("--scenario", required=True)
    ap.add_argument("--max-steps", type=int, default=None)
    ap.add_argument("--fault-step", type=int, default=None)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--pocket-steps", type=int, default=3)
    ap.add_argument("--data-steps", type=int, default=None)
    ap.add_argument("--config", default="{}")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    world = int(os.environ["WORLD_SIZE"])
    rank = int(os.environ["RANK"])
    for name in a.strategies.split(","):
        run(name, a, world, rank)
    return 0


if __name__ == "__main__":
    leave(main())
