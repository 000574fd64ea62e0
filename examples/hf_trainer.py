"""Your own model and data under the HF Trainer, watched by the stability monitor.

A tiny GPT-2 built from a config (nothing downloaded) learns to continue counting sequences; a
pocket of garbage samples arrives at optimizer steps 31-33. The callback is added the usual way,
and the run log lands under the Trainer's output_dir.

    python examples/hf_trainer.py
"""
import torch
from torch.utils.data import Dataset
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

from stability_callbacks.integrations.hf import StabilityCallback

BATCH, SEQ, VOCAB = 8, 32, 128


class Counting(Dataset):
    """Sequences that count up from a random start; samples in ``garbage`` are random tokens."""

    def __init__(self, n: int, garbage: range):
        g = torch.Generator().manual_seed(0)
        starts = torch.randint(0, VOCAB, (n,), generator=g)
        self.ids = (starts[:, None] + torch.arange(SEQ)) % VOCAB
        self.ids[list(garbage)] = torch.randint(0, VOCAB, (len(garbage), SEQ), generator=g)

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


model = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_embd=64, n_layer=2, n_head=2))
data = Counting(45 * BATCH, garbage=range(30 * BATCH, 33 * BATCH))   # the samples of steps 31-33
args = TrainingArguments("out/examples/hf", max_steps=45, per_device_train_batch_size=BATCH, learning_rate=3e-3,
                         warmup_steps=5, logging_steps=10, report_to="none", use_cpu=True,
                         train_sampling_strategy="sequential")
monitor = StabilityCallback(config="default")
Trainer(model=model, args=args, train_dataset=data, callbacks=[monitor]).train()

for f in monitor.findings:
    print(f"{f.step:>4} {f.severity:<8} {f.kind}: {f.message}")
assert any(f.kind == "loss_spike" and 31 <= f.step <= 33 for f in monitor.findings), "the pocket was missed"
