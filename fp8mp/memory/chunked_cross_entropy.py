"""`chunked_linear_cross_entropy`: an LM head and its cross-entropy loss that never hold the whole
[tokens, vocab] logits, neither in forward nor for backward.

``F.cross_entropy(F.linear(x, w).float(), y)`` keeps the fp32 log-softmax of every token for backward
(4 bytes x tokens x vocab: 32 MiB for 4 x 256 tokens of an 8192-word vocabulary, the largest single saved
tensor of a small LM). Here forward computes the logits a chunk of tokens at a time, keeps only each token's
log-sum-exp (4 bytes a token), and backward computes each chunk's logits again (one more GEMM of the head)
to form the softmax gradient: saved for backward are x, the targets and the log-sum-exps.

The logits are computed as F.linear computes them (the GEMM in x's dtype, then .float()), the softmax
and its gradient in fp32; the gradient of the logits is rounded to x's dtype for the two backward GEMMs, as
autograd does for ``F.linear(x, w).float()``; the weight gradient of the chunks is summed in fp32 and rounded
to the weight's dtype once (for a bf16 weight that sum is a transient of 4 bytes x vocab x hidden during the
loss's backward; each chunk's product is added into it in place). The head runs in high precision (bf16 or fp32): an FP8 head is not chunked.

When the weight is stepped in backward in row blocks (fp8mp.step_in_backward; fp8mp/optim/row_block_grads.py),
backward runs by blocks of vocabulary rows instead: a block's logits for every token (from the saved
log-sum-exps), its softmax gradient, and that block's weight-gradient rows in one GEMM (grad_logits^T @ x, the
unchunked backward's rows) handed to the optimizer at once; the input gradient is summed over the blocks in fp32
(grad_logits @ the block's rows, from the rounded gradient) and rounded once, and no weight gradient is returned.
The transients are then a block's [tokens, rows] fp32 logits, its weight rows in fp32, and the fp32 input
gradient, instead of the fp32 [vocab, hidden] sum.
"""
from __future__ import annotations


import torch
import torch.nn.functional as F

from fp8mp.optim.row_block_grads import referenced, sink_of, weight_ref_for_row_blocks

__all__ = ["chunked_linear_cross_entropy", "default_chunk_tokens"]

_CHUNK_LOGIT_BYTES = 16 * 2**20  # the default chunk's fp32 logits: 16 MiB
_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.float64)


def default_chunk_tokens(vocab: int) -> int:
    """Tokens per chunk when none is given: as many as keep a chunk's fp32 logits within 16 MiB."""
    return max(1, _CHUNK_LOGIT_BYTES // (4 * vocab))


def _chunks(n: int, size: int):
    return ((start, min(start + size, n)) for start in range(0, n, size))


def _loss_dtype(x: torch.Tensor) -> torch.dtype:
    """fp32 for the softmax and the loss, fp64 for fp64 inputs (``.float()`` would round those down)."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _logits(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """A chunk's logits as ``F.linear(x, weight).float()`` computes them (fp64 kept in fp64)."""
    return F.linear(x, weight).to(_loss_dtype(x))


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, target, chunk, ignore_index, mean, row_blocks):
        valid = target != ignore_index
        safe_target = torch.where(valid, target, torch.zeros((), dtype=target.dtype, device=target.device))
        lse = torch.empty(x.shape[0], dtype=_loss_dtype(x), device=x.device)
        total = torch.zeros((), dtype=_loss_dtype(x), device=x.device)
        for start, end in _chunks(x.shape[0], chunk):
            logits = _logits(x[start:end], weight)
            lse[start:end] = torch.logsumexp(logits, dim=-1)
            picked = logits.gather(1, safe_target[start:end, None]).squeeze(1)
            losses = torch.where(valid[start:end], lse[start:end] - picked, torch.zeros((), device=x.device))
            total += losses.sum()
        count = valid.sum()
        ctx.save_for_backward(x, weight, safe_target, valid, lse, count)
        ctx.chunk, ctx.mean = chunk, mean
        ctx.weight_ref = weight_ref_for_row_blocks(weight) if row_blocks else None
        return total / count if mean else total

    @staticmethod
    def backward(ctx, grad_loss):
        x, weight, safe_target, valid, lse, count = ctx.saved_tensors
        scale = grad_loss.to(lse.dtype) / count if ctx.mean else grad_loss.to(lse.dtype)
        want_x, want_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        param = referenced(ctx.weight_ref) if want_w else None
        sink = sink_of(param)
        if sink is not None:
            return _backward_by_vocab_rows(x, weight, safe_target, valid, lse, scale, want_x, sink, param), *[None] * 6
        grad_x = torch.empty_like(x) if want_x else None
        several = x.shape[0] > ctx.chunk
        grad_w = torch.zeros(weight.shape, dtype=lse.dtype, device=weight.device) if want_w and several else None
        for start, end in _chunks(x.shape[0], ctx.chunk):
            x_c = x[start:end]
            probs = (_logits(x_c, weight) - lse[start:end, None]).exp_()
            rows = torch.arange(end - start, device=x.device)
            probs[rows, safe_target[start:end]] -= 1.0
            probs *= (valid[start:end].to(lse.dtype) * scale)[:, None]
            grad_logits = probs.to(x.dtype)
            if want_x:
                grad_x[start:end] = grad_logits @ weight
            if want_w and grad_w is None:  # one chunk: the GEMM of the unchunked backward
                grad_w = grad_logits.t() @ x_c
            elif want_w:  # summed in place in fp32, from the rounded gradient (the operand of the unchunked GEMM)
                grad_w.addmm_(probs.copy_(grad_logits).t(), x_c.to(grad_w.dtype))
            del probs, grad_logits
        return grad_x, None if grad_w is None else grad_w.to(weight.dtype), None, None, None, None, None


def _backward_by_vocab_rows(x, weight, safe_target, valid, lse, scale, want_x, sink, param):
    """The backward by blocks of vocabulary rows, each block's weight-gradient rows handed to `sink` as those of
    `param` (the parameter `weight` holds the values of; module docstring); returns the input gradient (None
    unless `want_x`)."""
    grad_x = torch.zeros(x.shape, dtype=lse.dtype, device=x.device) if want_x else None
    token_scale = (valid.to(lse.dtype) * scale)[:, None]
    block = sink.block_rows(param)
    for start, end in _chunks(weight.shape[0], block):
        w_rows = weight[start:end]
        probs = (_logits(x, w_rows) - lse[:, None]).exp_()
        in_block = (safe_target >= start) & (safe_target < end)
        tokens = in_block.nonzero().squeeze(1)
        probs[tokens, safe_target[tokens] - start] -= 1.0
        probs *= token_scale
        grad_logits = probs.to(x.dtype)
        grad_rows = (grad_logits.t() @ x).contiguous()
        if want_x:  # from the rounded gradient, as the unchunked GEMM's operand; before the rows are stepped
            grad_x.addmm_(probs.copy_(grad_logits), w_rows.to(grad_x.dtype))
        del probs, grad_logits
        sink.take_rows(param, start, grad_rows)
        del grad_rows
    return None if grad_x is None else grad_x.to(x.dtype)


def chunked_linear_cross_entropy(x: torch.Tensor, weight: torch.Tensor, target: torch.Tensor, *,
                                 ignore_index: int = -100, reduction: str = "mean",
                                 chunk_tokens: int | None = None, row_blocks: bool = True) -> torch.Tensor:
    """``F.cross_entropy(F.linear(x, weight).float(), target, ignore_index=..., reduction=...)`` a chunk of tokens
    at a time (see the module docstring): the same loss and gradients within fp32 rounding, without the
    [tokens, vocab] logits.

    Args:
        x: [..., hidden] bfloat16, float16, float32 or float64 (under torch.autocast, x and weight are cast to its dtype first, as
            F.linear would be).
        weight: [vocab, hidden], x's dtype (the LM head's weight; no bias).
        target: integer class indices of x's leading shape; `ignore_index` marks tokens without a loss.
        reduction: "mean" (over the tokens not ignored: NaN when all are, as F.cross_entropy) or "sum".
        chunk_tokens: tokens per chunk (default: default_chunk_tokens(vocab), 16 MiB of fp32 logits a chunk).
        row_blocks: hand the weight's gradient in row blocks to an optimizer that steps it in backward, when one
            has registered for `weight` (module docstring); False where the weight also gets a gradient elsewhere
            in the same backward (an LM head tied to the embedding).
    """
    name = "fp8mp.nn.chunked_linear_cross_entropy"
    if not isinstance(x, torch.Tensor) or x.dim() < 1 or x.dtype not in _DTYPES:
        raise TypeError(f"{name}: argument 'x' must be a bfloat16, float16, float32 or float64 tensor of shape "
                        "[..., hidden]")
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2 or weight.shape[1] != x.shape[-1]:
        raise ValueError(f"{name}: argument 'weight' must be [vocab, {x.shape[-1]}] (x's hidden size), "
                         f"got {list(weight.shape) if isinstance(weight, torch.Tensor) else type(weight).__name__}")
    if not isinstance(target, torch.Tensor) or target.dtype.is_floating_point or target.shape != x.shape[:-1]:
        raise ValueError(f"{name}: argument 'target' must be an integer tensor of shape {list(x.shape[:-1])}")
    if reduction not in ("mean", "sum"):
        raise ValueError(f"{name}: argument 'reduction' must be 'mean' or 'sum', got {reduction!r}")
    if chunk_tokens is None:
        chunk_tokens = default_chunk_tokens(weight.shape[0])
    if isinstance(chunk_tokens, bool) or not isinstance(chunk_tokens, int) or chunk_tokens < 1:
        raise ValueError(f"{name}: argument 'chunk_tokens' must be an int >= 1, got {chunk_tokens!r}")
    device_type = x.device.type
    if torch.is_autocast_enabled(device_type):
        dtype = torch.get_autocast_dtype(device_type)
        x, weight = x.to(dtype), weight.to(dtype)
    if weight.dtype != x.dtype:
        raise TypeError(f"{name}: argument 'weight' must have x's dtype {x.dtype}, got {weight.dtype}")
    with torch.autocast(device_type, enabled=False):
        return _ChunkedLinearCrossEntropy.apply(x.reshape(-1, x.shape[-1]), weight, target.reshape(-1).long(),
                                                chunk_tokens, ignore_index, reduction == "mean", bool(row_blocks))
