"""Your own model and data under TRL's SFTTrainer, watched by the stability monitor.

TRL's trainers are HF Trainers: the same callback, added the same way. A character-level
tokenizer and a 2-layer Llama are built here (nothing downloaded); the model first learns the
task with a plain loop (~1 s), so fine-tuning starts flat, as it does in real life. A shard of
random letters arrives at optimizer steps 25-27.

    python examples/trl_sft.py
"""
import torch
from datasets import Dataset
from tokenizers import Tokenizer, models
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast
from trl import SFTConfig, SFTTrainer

from stability_callbacks.integrations.hf import StabilityCallback

LETTERS = "abcdefghijklmnopqrstuvwxyz"
PER_STEP, STEPS = 8, 30
g = torch.Generator().manual_seed(0)


def alphabet(n: int) -> list[str]:
    """The task: the alphabet goes on, from a random letter (24 letters per text)."""
    ids = (torch.randint(0, 26, (n, 1), generator=g) + torch.arange(24)) % 26
    return ["".join(LETTERS[i] for i in row) for row in ids.tolist()]


vocab = {t: i for i, t in enumerate(("<pad>", "<eos>", *LETTERS))}
tok = PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.BPE(vocab=vocab, merges=[])),
                              pad_token="<pad>", eos_token="<eos>")
torch.manual_seed(0)
model = LlamaForCausalLM(LlamaConfig(vocab_size=len(vocab), hidden_size=64, intermediate_size=128,
                                     num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                                     max_position_embeddings=64, pad_token_id=0, eos_token_id=1))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
for _ in range(60):                                   # "pretraining": the model knows the task
    batch = tok([t + "<eos>" for t in alphabet(16)], return_tensors="pt")
    model(**batch, labels=batch["input_ids"]).loss.backward()
    opt.step()
    opt.zero_grad()

texts = alphabet(STEPS * PER_STEP)
garbage = torch.randint(0, 26, (3 * PER_STEP, 24), generator=g).tolist()
texts[24 * PER_STEP:27 * PER_STEP] = ["".join(LETTERS[i] for i in row) for row in garbage]  # steps 25-27

args = SFTConfig("out/examples/trl", max_steps=STEPS, per_device_train_batch_size=PER_STEP // 2,
                 gradient_accumulation_steps=2, learning_rate=1e-3, warmup_steps=5, max_length=64,
                 logging_steps=10, save_strategy="no", report_to="none", use_cpu=True,
                 train_sampling_strategy="sequential")
monitor = StabilityCallback(config="finetune")
SFTTrainer(model=model, args=args, processing_class=tok, train_dataset=Dataset.from_dict({"text": texts}),
           callbacks=[monitor]).train()

for f in monitor.findings:
    print(f"{f.step:>4} {f.severity:<8} {f.kind}: {f.message}")
assert any(f.kind == "loss_spike" and 25 <= f.step <= 27 for f in monitor.findings), "the bad shard was missed"
