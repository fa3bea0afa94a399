"""A minimal GPT whose every projection is an `fp8mp.nn.Linear`.

Token + position embeddings, `n_layers` pre-norm blocks (causal self-attention
through `F.scaled_dot_product_attention`, then a GELU MLP), a final norm and an
LM head tied to the token embedding. Outside `fp8mp.fp8_autocast` the model is
an ordinary PyTorch GPT (fp8mp.nn.Linear is then exactly nn.Linear), so the same
model, seed and batches serve the FP8, BF16 and FP32 runs of train_gpt.py.

The LM head (tied embedding) never runs in FP8: it stays in the run's high precision.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

import fp8mp


@dataclass(frozen=True)
class GPTConfig:
    """Shape of the GPT. Byte-level by default (vocab 256)."""

    vocab_size: int = 256
    context: int = 128
    n_layers: int = 4
    d_model: int = 256
    n_heads: int = 4
    mlp_ratio: int = 4
    # Memory levers (the same numbers, fewer bytes saved for backward): attention's q, k and v saved in FP8 and the
    # attention computed again in backward (fp8mp.nn.fp8_recompute); the LM head and its loss a chunk of tokens at
    # a time (fp8mp.nn.chunked_linear_cross_entropy: forward then returns no logits when given targets).
    fp8_saved_attention: bool = False
    chunked_loss: bool = False

    def __post_init__(self) -> None:
        for name in ("vocab_size", "context", "n_layers", "d_model", "n_heads", "mlp_ratio"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"GPTConfig: argument '{name}' must be an int >= 1, got {value!r}")
        for name in ("fp8_saved_attention", "chunked_loss"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"GPTConfig: argument '{name}' must be a bool, got {getattr(self, name)!r}")
        if self.d_model % self.n_heads:
            raise ValueError(f"GPTConfig: argument 'd_model' ({self.d_model}) must be divisible by n_heads ({self.n_heads})")


def make_norm(d_model: int) -> torch.nn.Module:
    """The model's one norm factory: swap in `fp8mp.nn.LayerNorm` here when it exists."""
    return torch.nn.LayerNorm(d_model)


class CausalSelfAttention(torch.nn.Module):
    """Multi-head causal self-attention: fused QKV projection, SDPA, output projection."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.n_heads = config.n_heads
        self.fp8_saved = config.fp8_saved_attention
        self.qkv = fp8mp.nn.Linear(config.d_model, 3 * config.d_model)
        self.proj = fp8mp.nn.Linear(config.d_model, config.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, time, d_model = x.shape
        q, k, v = self.qkv(x).split(d_model, dim=-1)
        heads = lambda t: t.view(batch, time, self.n_heads, -1).transpose(1, 2)  # noqa: E731
        if self.fp8_saved:
            y = fp8mp.nn.fp8_recompute(F.scaled_dot_product_attention, heads(q), heads(k), heads(v), is_causal=True)
        else:
            y = F.scaled_dot_product_attention(heads(q), heads(k), heads(v), is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(batch, time, d_model))


class MLP(torch.nn.Module):
    """Two fp8mp.nn.Linear layers with a GELU between them (a module, so that convert finds it)."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        hidden = config.mlp_ratio * config.d_model
        self.fc = fp8mp.nn.Linear(config.d_model, hidden)
        self.act = torch.nn.GELU()
        self.proj = fp8mp.nn.Linear(hidden, config.d_model)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(self.act(self.fc(x)))


class Block(torch.nn.Module):
    """Pre-norm transformer block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.norm1 = make_norm(config.d_model)
        self.attn = CausalSelfAttention(config)
        self.norm2 = make_norm(config.d_model)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class GPT(torch.nn.Module):
    """Decoder-only transformer LM; `forward(idx, targets)` returns (logits, loss or None); (None, loss) with
    config.chunked_loss and targets."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.tok_emb = torch.nn.Embedding(config.vocab_size, config.d_model)
        self.pos_emb = torch.nn.Embedding(config.context, config.d_model)
        self.blocks = torch.nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.norm_f = make_norm(config.d_model)
        self.apply(_init_weights)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        time = idx.shape[1]
        if time > self.config.context:
            raise ValueError(f"GPT: argument 'idx' has {time} positions, more than the context {self.config.context}")
        x = self.tok_emb(idx) + self.pos_emb(torch.arange(time, device=idx.device))
        for block in self.blocks:
            x = block(x)
        x = self.norm_f(x)
        if targets is not None and self.config.chunked_loss:
            # tied to the embedding: the head's gradient stays whole (the embedding's part joins it), no row blocks
            return None, fp8mp.nn.chunked_linear_cross_entropy(x, self.tok_emb.weight, targets, row_blocks=False)
        logits = F.linear(x, self.tok_emb.weight)  # tied LM head, never FP8
        if targets is None:
            return logits, None
        return logits, F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


def _init_weights(module: torch.nn.Module) -> None:
    """GPT-2 style: N(0, 0.02) weights, zero biases."""
    if isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
        torch.nn.init.normal_(module.weight, std=0.02)
    if isinstance(module, torch.nn.Linear) and module.bias is not None:
        torch.nn.init.zeros_(module.bias)
