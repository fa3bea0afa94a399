"""The fine-grained FP8 linear: three block-scaled GEMMs under RowwiseScaling, BlockScaling or MXFP8Scaling.

Each GEMM needs its operands quantized along its own reduction axis, so each tensor is quantized
once per GEMM that reads it (fp8mp.ops.block_quantize; `fp8_gemm`'s layout, a @ b.T, both K-major):

    fprop: y  = x  @ W.T    a = x    [M,K] along K,   b = W    [N,K] along K
    dgrad: dx = dy @ W      a = dy   [M,N] along N,   b = W.T  [K,N] along N
    wgrad: dW = dy.T @ x    a = dy.T [N,M] along M,   b = x.T  [K,M] along M

Every tensor that two GEMMs read along different axes (x, dy, and W under rowwise and MXFP8) is
quantized both ways by one block_quantize_transpose, from the same reads.

Activations and gradients use 1 x block_k tiles, weights weight_block_rows x block_k blocks
(block_k = the whole K of the GEMM for rowwise). A square weight block (BlockScaling's 128 x 128)
covers W and W.T alike, so dgrad reuses fprop's quantized weight, transposed (bytes and scales),
as DeepSeek-V3 does; for the other recipes W.T is quantized with W (block_quantize_transpose). Forward saves x.T
already quantized (FP8, not the high-precision input) and the weight itself, which backward quantizes again (as
the per-tensor FP8 linear casts it again): the scales come from each block's own values (current-style, no
Fp8Meta scale or amax is read or written), so backward gets forward's very bits, and no FP8 copy of every weight
lives from forward to backward (one byte a parameter of saved activations).

Under fp8mp.step_in_backward the weight gradient is made a block of output rows at a time (dy.T's 1 x block_k
tiles are rows, so a block of them is dy.T's rows, as quantized) and handed to the optimizer as it comes
(fp8mp/optim/row_block_grads.py), after the input gradient, which reads the weight.

A weight stored in FP8 (fp8mp/nn/fp8_weight.py) is stored as `quantize_weight` makes it, so the
forward reads it as it is and never quantizes a weight.
"""
from __future__ import annotations

import torch

from fp8mp.nn.output_dtype import output_dtype
from fp8mp.ops.blockwise import block_quantize, block_quantize_transpose, block_scaled_gemm
from fp8mp.optim.row_block_grads import referenced, sink_of, weight_ref_for_row_blocks
from fp8mp.scaling.recipe import BlockRecipe


def block_k_of(recipe: BlockRecipe, k: int) -> int:
    """The blocks' length along a GEMM's reduction axis of length k: the recipe's, or all of k for rowwise."""
    return max(k, 1) if recipe.block_k is None else recipe.block_k


def _quantize(t: torch.Tensor, block_rows: int, recipe: BlockRecipe, fmt: str):
    """(data, scale_inv, block_rows, block_k) of a 2-D t quantized along its last axis."""
    block_k = block_k_of(recipe, t.shape[1])
    data, scale_inv = block_quantize(t, block_rows, block_k, fmt, recipe.quantize_mode)
    return data, scale_inv, block_rows, block_k


def both_blocks(recipe: BlockRecipe, rows: int, cols: int) -> tuple[int, int]:
    """(row_block, col_block) of `_quantize_both` for a [rows, cols] tensor."""
    return block_k_of(recipe, cols), block_k_of(recipe, rows)


def _quantize_both(t: torch.Tensor, recipe: BlockRecipe, fmt: str):
    """(q, q_t): `_quantize(t, 1, ...)` and `_quantize(t.t(), 1, ...)` of a 2-D t, from one block_quantize_transpose."""
    row_block, col_block = both_blocks(recipe, *t.shape)
    data, scale_inv, data_t, scale_inv_t = block_quantize_transpose(t, row_block, col_block, fmt, recipe.quantize_mode)
    return (data, scale_inv, 1, row_block), (data_t, scale_inv_t, 1, col_block)


def _gemm(a, b, out_dtype, bias=None):
    """block_scaled_gemm of two _quantize results (same block_k)."""
    (a_data, a_scale, a_rows, block_k), (b_data, b_scale, b_rows, _) = a, b
    return block_scaled_gemm(a_data, a_scale, b_data, b_scale, a_rows, b_rows, block_k, bias, out_dtype)


def _transposed(q):
    """A square-block quantization of W as one of W.T: bytes and scales transposed (exact)."""
    data, scale_inv, block_rows, block_k = q
    data_t = data.view(torch.uint8).t().contiguous().view(data.dtype)
    return data_t, scale_inv.t().contiguous(), block_rows, block_k


def quantize_weight(weight: torch.Tensor, recipe: BlockRecipe, fmt: str):
    """(w_q, w_t_q): weight [N,K] quantized for fprop (along K, weight blocks) and dgrad (W.T along N).

    w_t_q is None for square weight blocks: W.T's quantization is then w_q transposed (`_transposed`).
    """
    if recipe.weight_block_rows == recipe.block_k:  # square
        return _quantize(weight, recipe.weight_block_rows, recipe, fmt), None
    assert recipe.weight_block_rows == 1
    return _quantize_both(weight, recipe, fmt)


def _fprop_weight(weight: torch.Tensor, recipe: BlockRecipe, fmt: str):
    """quantize_weight's w_q alone (the same bits: block_quantize_transpose is the two block_quantize calls)."""
    return _quantize(weight, recipe.weight_block_rows, recipe, fmt)


def _dgrad_weight(weight: torch.Tensor, recipe: BlockRecipe, fmt: str):
    """The dgrad operand (W.T along N) of quantize_weight alone, the same bits."""
    if recipe.weight_block_rows == recipe.block_k:  # square: fprop's blocks, transposed
        return _transposed(_fprop_weight(weight, recipe, fmt))
    return _quantize(weight.t(), 1, recipe, fmt)


def stored_weight_operands(recipe: BlockRecipe, w_data, w_scale_inv, w_t_data=None, w_t_scale_inv=None):
    """The (w_q, w_t_q) of `quantize_weight` from its stored tensors (the block sizes follow from the recipe)."""
    n, k = w_data.shape
    w_q = (w_data, w_scale_inv, recipe.weight_block_rows, block_k_of(recipe, k))
    return w_q, None if w_t_data is None else (w_t_data, w_t_scale_inv, 1, block_k_of(recipe, n))


class BlockLinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x2d, weight, bias, recipe, formats, stored_weight=None, fp8_input=None, out_dtype=None):
        """x2d [M,K], weight [N,K] (may be a transposed view); formats: (forward, backward) op format strings.

        stored_weight: None, or the (w_q, w_t_q) of a weight stored in FP8 (`stored_weight_operands`),
        used as it is; `weight` then only receives the weight gradient (the FP32 master, or None).
        fp8_input: None, or (x_q, x_t_q) as `_quantize_both(x2d)` would give them, written by a fused
        norm (fp8mp/nn/norm_linear_function.py); `x2d` then only routes the input gradient.
        out_dtype: the output's dtype (output_dtype.py; None: x2d's); the input gradient has x2d's.
        """
        out_dtype = x2d.dtype if out_dtype is None else out_dtype
        forward_format = formats[0]
        x_q, x_t_q = _quantize_both(x2d, recipe, forward_format) if fp8_input is None else fp8_input
        ctx.requantize_weight = stored_weight is None  # (a stored weight's operands are saved: no new bytes)
        if ctx.requantize_weight:  # fprop's operand only: backward quantizes the dgrad operand itself
            w_q = _fprop_weight(weight, recipe, forward_format)
            ctx.save_for_backward(x_t_q[0], x_t_q[1], weight)
        else:
            w_q, w_t_q = stored_weight
            ctx.transpose_weight = w_t_q is None  # square blocks: backward transposes fprop's weight
            w_saved = w_q if w_t_q is None else w_t_q
            ctx.save_for_backward(x_t_q[0], x_t_q[1], w_saved[0], w_saved[1])
            ctx.w_blocks = w_saved[2:]
        out_bias = bias.to(out_dtype) if bias is not None else None
        out = _gemm(x_q, w_q, out_dtype, out_bias)
        ctx.x_blocks = x_t_q[2:]
        ctx.weight_ref = weight_ref_for_row_blocks(weight) if ctx.requantize_weight else None
        ctx.recipe, ctx.formats = recipe, formats
        ctx.x_dtype = x2d.dtype
        ctx.w_dtype = weight.dtype if weight is not None else None
        ctx.bias_dtype = bias.dtype if bias is not None else None
        return out

    @staticmethod
    def backward(ctx, grad_out):
        x_t_data, x_t_scale, *w_saved = ctx.saved_tensors
        x_t_q = (x_t_data, x_t_scale, *ctx.x_blocks)
        grad_out = grad_out.contiguous()
        grad_x = grad_w = grad_b = None
        recipe, (forward_format, fmt) = ctx.recipe, ctx.formats
        need_dgrad, need_wgrad = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        if need_dgrad and need_wgrad:  # dy along N and dy.T along M from the same reads
            g_q, g_t_q = _quantize_both(grad_out, recipe, fmt)
        else:
            g_q = _quantize(grad_out, 1, recipe, fmt) if need_dgrad else None
            g_t_q = _quantize(grad_out.t(), 1, recipe, fmt) if need_wgrad else None
        if need_dgrad:
            if ctx.requantize_weight:  # quantize_weight's dgrad operand: same weight, same blocks, same bits
                w_t_q = _dgrad_weight(w_saved[0], recipe, forward_format)
            else:
                w_t_q = (*w_saved, *ctx.w_blocks)
                w_t_q = _transposed(w_t_q) if ctx.transpose_weight else w_t_q
            grad_x = _gemm(g_q, w_t_q, ctx.x_dtype)
        if need_wgrad and (sink := sink_of(param := referenced(ctx.weight_ref))) is not None:
            g_t_data, g_t_scale, *g_t_blocks = g_t_q
            block = sink.block_rows(param)  # dW's rows [start, start + block) = dy.T's rows @ x, one block at a time
            for start in range(0, g_t_data.shape[0], block):
                rows = (g_t_data[start:start + block], g_t_scale[start:start + block], *g_t_blocks)
                sink.take_rows(param, start, _gemm(rows, x_t_q, ctx.w_dtype))
        elif need_wgrad:
            grad_w = _gemm(g_t_q, x_t_q, ctx.w_dtype)
        if ctx.bias_dtype is not None and ctx.needs_input_grad[2]:
            grad_b = grad_out.sum(0, dtype=torch.float32).to(ctx.bias_dtype)
        return grad_x, grad_w, grad_b, None, None, None, None, None


def block_linear(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, recipe: BlockRecipe,
                 formats: tuple[str, str], weight_in_out: bool = False, stored_weight=None) -> torch.Tensor:
    """y = x @ weight.T + bias for x [..., K] under a fine-grained recipe.

    weight_in_out: `weight` is [K,N] (transformers' Conv1D); it is read through its transpose view.
    stored_weight: see BlockLinearFunction.forward (`weight` is then the gradient leaf or None).
    """
    x2d = x.reshape(-1, x.shape[-1])
    w_nk = weight.t() if weight_in_out and weight is not None else weight
    out = BlockLinearFunction.apply(x2d, w_nk, bias, recipe, formats, stored_weight, None, output_dtype(x))
    return out.reshape(*x.shape[:-1], out.shape[-1])
