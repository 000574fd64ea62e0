"""Your own model in a hand-written DeepSpeed loop, watched by the stability monitor.

One CPU process without the ``deepspeed`` launcher (the launcher sets these variables itself):
a small next-token model learns to continue counting sequences, and a pocket of garbage batches
arrives at optimizer steps 31-33. ``hook.should_stop`` is the halt, the same step on every rank.

    python examples/deepspeed_loop.py
"""
import os

os.environ.update(DS_ACCELERATOR="cpu", MASTER_ADDR="127.0.0.1", MASTER_PORT="29511", RANK="0",
                  LOCAL_RANK="0", WORLD_SIZE="1")

import deepspeed  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

from stability_callbacks.integrations.deepspeed import attach  # noqa: E402

BATCH, SEQ, VOCAB, STEPS = 8, 32, 128, 45
deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False   # one process: skip a JIT-built all-reduce


class NextToken(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 64)
        self.rnn = nn.GRU(64, 128, batch_first=True)
        self.head = nn.Linear(128, VOCAB)

    def forward(self, ids):
        hidden, _ = self.rnn(self.embed(ids[:, :-1]))
        return nn.functional.cross_entropy(self.head(hidden).flatten(0, 1), ids[:, 1:].flatten())


g = torch.Generator().manual_seed(0)
ids = (torch.randint(0, VOCAB, (STEPS * BATCH,), generator=g)[:, None] + torch.arange(SEQ)) % VOCAB
ids[30 * BATCH:33 * BATCH] = torch.randint(0, VOCAB, (3 * BATCH, SEQ), generator=g)   # steps 31-33
config = {"train_micro_batch_size_per_gpu": BATCH, "gradient_clipping": 1.0,
          "optimizer": {"type": "AdamW", "params": {"lr": 3e-3, "torch_adam": True}},
          "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 5, "warmup_max_lr": 3e-3}}}
model = NextToken()
engine, _, _, _ = deepspeed.initialize(model=model, config=config, model_parameters=model.parameters())

with attach(engine, config="default") as hook:
    for (batch,) in DataLoader(TensorDataset(ids), batch_size=BATCH):
        engine.backward(engine(batch))
        engine.step()
        if hook.should_stop:
            break

for f in hook.findings:
    print(f"{f.step:>4} {f.severity:<8} {f.kind}: {f.message}")
assert any(f.kind == "loss_spike" and 31 <= f.step <= 33 for f in hook.findings), "the pocket was missed"
