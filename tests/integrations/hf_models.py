"""Tiny transformers models built from configs (no downloads) and a learnable token task, for the HF tests."""
from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing in these tests may reach the Hub

import torch  # noqa: E402

VOCAB = 256
SEQ = 32


def config(family: str):
    import transformers

    if family == "gpt2":
        return transformers.GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=VOCAB, n_positions=SEQ,
                                       bos_token_id=0, eos_token_id=0)
    if family == "llama":
        return transformers.LlamaConfig(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
                                        num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=SEQ,
                                        bos_token_id=0, eos_token_id=0)
    raise ValueError(family)


def build(family: str, seed: int = 0):
    import transformers

    torch.manual_seed(seed)
    return transformers.AutoModelForCausalLM.from_config(config(family))


class RandomWalks(torch.utils.data.Dataset):
    """Token sequences that step up by 1, 2 or 3 (mod VOCAB): a causal LM can learn it down to ln 3 = 1.10 nats."""

    def __init__(self, n: int, seed: int):
        gen = torch.Generator().manual_seed(seed)
        start = torch.randint(0, VOCAB, (n, 1), generator=gen)
        steps = torch.randint(1, 4, (n, SEQ - 1), generator=gen)
        self.ids = torch.cat([start, start + steps.cumsum(1)], 1) % VOCAB

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}
