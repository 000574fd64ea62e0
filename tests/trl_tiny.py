"""A tiny language model for the TRL tests, built here: nothing is downloaded.

- :func:`tokenizer`: a character-level ``PreTrainedTokenizerFast`` over ``a-z`` (a BPE model with
  no merges, so every character is one token) with ``<pad>`` and ``<eos>``.
- :func:`model`: a 2-layer Llama (hidden 64) that already knows the task, "the alphabet goes on":
  every text counts up through ``a-z`` (wrapping) from a random letter, with one random letter
  per text as a noise floor. It is pretrained with a plain loop (~1 s, cached per process), so
  a fine-tuning run starts where fine-tuning starts in real life, from a model that already
  knows the language, and its loss is flat from step one (a fault is then unmistakable).
- :func:`texts` / :func:`garbage`: pattern texts and uniform random letters (a bad data shard).

Deterministic: every draw comes from a seeded ``torch.Generator``.
"""
from __future__ import annotations

import torch

LETTERS = "abcdefghijklmnopqrstuvwxyz"
SPECIAL = ("<pad>", "<eos>")
TEXT_LEN = 24
PRETRAIN_STEPS = 60

_PRETRAINED: dict = {}


def tokenizer():
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    vocab = {t: i for i, t in enumerate((*SPECIAL, *LETTERS))}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>")


def _config():
    from transformers import LlamaConfig

    return LlamaConfig(vocab_size=len(SPECIAL) + len(LETTERS), hidden_size=64, intermediate_size=128,
                       num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                       max_position_embeddings=64, tie_word_embeddings=False,
                       pad_token_id=0, bos_token_id=1, eos_token_id=1)


def texts(n: int, seed: int, length: int = TEXT_LEN) -> list[str]:
    """``n`` pattern texts: the alphabet from a random letter, one random letter planted."""
    g = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, 26, (n, 1), generator=g)
    ids = (starts + torch.arange(length)) % 26
    pos = torch.randint(1, length, (n, 1), generator=g)
    ids.scatter_(1, pos, torch.randint(0, 26, (n, 1), generator=g))
    return ["".join(LETTERS[i] for i in row) for row in ids.tolist()]


def garbage(n: int, seed: int, length: int = TEXT_LEN) -> list[str]:
    """``n`` texts of uniform random letters (a bad data shard)."""
    g = torch.Generator().manual_seed(seed)
    return ["".join(LETTERS[i] for i in row) for row in torch.randint(0, 26, (n, length), generator=g).tolist()]


def model():
    """A fresh Llama that knows the pattern (the same weights on every call and every rank)."""
    from transformers import LlamaForCausalLM

    if "state" not in _PRETRAINED:
        torch.manual_seed(0)
        m = LlamaForCausalLM(_config())
        tok = tokenizer()
        opt = torch.optim.AdamW(m.parameters(), lr=1e-2, weight_decay=0.0)
        for step in range(PRETRAIN_STEPS):
            batch = tok([t + "<eos>" for t in texts(16, seed=1000 + step)], return_tensors="pt")
            m(**batch, labels=batch["input_ids"]).loss.backward()
            torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
            opt.step()
            opt.zero_grad()
        _PRETRAINED["state"] = {k: v.detach().clone() for k, v in m.state_dict().items()}
    m = LlamaForCausalLM(_config())
    m.load_state_dict(_PRETRAINED["state"])
    return m
