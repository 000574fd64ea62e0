"""Your own LightningModule, watched by the stability monitor.

A small character-level next-token model (plain torch, no pretrained weights) learns to continue
counting sequences; a pocket of garbage batches arrives at optimizer steps 31-33. The callback
reuses the grad norm it monitors for Lightning's norm clipping.

    python examples/lightning_fit.py
"""
import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from stability_callbacks.integrations.lightning import StabilityCallback

BATCH, SEQ, VOCAB, STEPS, WARMUP = 8, 32, 128, 45, 5


def counting(n: int, garbage: range) -> TensorDataset:
    g = torch.Generator().manual_seed(0)
    ids = (torch.randint(0, VOCAB, (n,), generator=g)[:, None] + torch.arange(SEQ)) % VOCAB
    ids[list(garbage)] = torch.randint(0, VOCAB, (len(garbage), SEQ), generator=g)
    return TensorDataset(ids)


class NextToken(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, 64)
        self.rnn = nn.GRU(64, 128, batch_first=True)
        self.head = nn.Linear(128, VOCAB)

    def training_step(self, batch, batch_idx):
        (ids,) = batch
        hidden, _ = self.rnn(self.embed(ids[:, :-1]))
        return nn.functional.cross_entropy(self.head(hidden).flatten(0, 1), ids[:, 1:].flatten())

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=3e-3)
        warmup = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / WARMUP))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": warmup, "interval": "step"}}


monitor = StabilityCallback(config="default")
trainer = pl.Trainer(max_steps=STEPS, callbacks=[monitor], gradient_clip_val=1.0, logger=False,
                     default_root_dir="out/examples/lightning", enable_progress_bar=False)
data = counting(STEPS * BATCH, garbage=range(30 * BATCH, 33 * BATCH))   # the batches of steps 31-33
trainer.fit(NextToken(), DataLoader(data, batch_size=BATCH))

for f in monitor.findings:
    print(f"{f.step:>4} {f.severity:<8} {f.kind}: {f.message}")
assert any(f.kind == "loss_spike" and 31 <= f.step <= 33 for f in monitor.findings), "the pocket was missed"
