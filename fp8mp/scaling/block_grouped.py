"""The block family's grouped linear call (`BlockGroupedLinearCall`): each group of tokens computed exactly as
fp8mp.functions.linear computes a linear call under the same block recipe on that group alone.

Blocks along K or N (fprop's x and W, dgrad's dy and W.T) lie within one token row or one expert, so the whole
x and dy are quantized by one call and the experts' weights by one call. The blocks along the tokens (wgrad's
x.T and dy.T) must not straddle two groups: under BlockScaling (1 x 128) and MXFP8 (1 x 32) every group is
zero-padded to a multiple of the block, so one block_quantize_transpose of the padded tokens gives each group its
own blocks (a partial block's scale and codes are those of its elements alone: an edge tile is scaled as if
zero-padded), and the padding columns are dropped again; under RowwiseScaling the block is the whole group, and
each group's columns are quantized by a call of their own (one block_quantize per non-empty group).

The GEMMs are fp8mp.ops.block_scaled_grouped_gemm (fprop, dgrad) and block_scaled_grouped_gemm_wgrad. Nothing is
read from or written to the module's Fp8Meta, as under a linear call of the family.
"""
from __future__ import annotations

import torch

from fp8mp.ops.blockwise import block_quantize, block_quantize_transpose
from fp8mp.ops.format import FP8_DTYPES
from fp8mp.ops.grouped_gemm import block_scaled_grouped_gemm, block_scaled_grouped_gemm_wgrad
from fp8mp.ops.operand import Fp8Operand

__all__ = ["BlockGroupedLinearCall", "quantize_tokens", "quantize_experts"]


def _token_layout(sizes: list[int], block: int, device) -> tuple[torch.Tensor | None, int]:
    """(rows of the real tokens in the per-group zero-padded layout, its row count), each group padded to a
    multiple of `block`; (None, T) where no group needs padding."""
    padded = [-(-size // block) * block for size in sizes]
    if padded == sizes:
        return None, sum(sizes)
    starts = torch.tensor([0, *padded[:-1]], dtype=torch.int64).cumsum(0)
    rows = torch.cat([torch.arange(size, dtype=torch.int64) + start for size, start in zip(sizes, starts.tolist())])
    return rows.to(device), sum(padded)


def quantize_tokens(t: torch.Tensor, sizes: list[int], quantizer, fmt: str, need_rows: bool = True,
                    need_columns: bool = True) -> tuple[Fp8Operand | None, Fp8Operand | None]:
    """(rows, columns) of a [T, C] token tensor whose rows are sorted in groups of `sizes`, under `quantizer` (a
    BlockQuantizer):

    rows: t along C in 1 x c_block tiles (fprop's x, dgrad's dy), data [T, C], scale_inv [T, ceil(C / c_block)];
    columns: t.T along the tokens in 1 x t_block tiles from each group's first token (wgrad's x.T and dy.T),
        data [C, T], scale_inv [C, chunks], block_scaled_grouped_gemm_wgrad's layout; its block_k is the wgrad's
        (rowwise: max(T, 1), one chunk per non-empty group). Either is None where not needed.
    """
    tokens, cols = t.shape
    c_block, mode = quantizer.block_k_of(cols), quantizer.scale_mode
    rows = columns = None
    if quantizer.block_k is None:  # rowwise: one block per group along the tokens
        if need_rows:
            rows = Fp8Operand(*block_quantize(t, 1, c_block, fmt, mode), 1, c_block)
        if need_columns:
            parts = [block_quantize(part.t(), 1, part.shape[0], fmt, mode) for part in torch.split(t, sizes)
                     if part.shape[0]]
            data_t = torch.cat([p[0] for p in parts], 1) if parts else t.new_empty((cols, 0), dtype=FP8_DTYPES[fmt])
            scale_t = torch.cat([p[1] for p in parts], 1) if parts else t.new_empty((cols, 0), dtype=torch.float32)
            columns = Fp8Operand(data_t, scale_t, 1, max(tokens, 1))
        return rows, columns
    t_block = quantizer.block_k
    if not need_columns:
        return Fp8Operand(*block_quantize(t, 1, c_block, fmt, mode), 1, c_block), None
    real_rows, padded_tokens = _token_layout(sizes, t_block, t.device)
    padded = t if real_rows is None else t.new_zeros((padded_tokens, cols)).index_copy_(0, real_rows, t)
    data, scale_inv, data_t, scale_inv_t = block_quantize_transpose(padded, c_block, t_block, fmt, mode)
    if real_rows is not None:
        data, scale_inv, data_t = data[real_rows], scale_inv[real_rows], data_t[:, real_rows]
    return (Fp8Operand(data, scale_inv, 1, c_block) if need_rows else None), Fp8Operand(data_t, scale_inv_t, 1, t_block)


def transpose_experts(t: torch.Tensor) -> torch.Tensor:
    """[E, a, b] -> contiguous [E, b, a] (FP8 codes moved as bytes)."""
    return t.view(torch.uint8).transpose(1, 2).contiguous().view(t.dtype)


def quantize_experts(w_nk: torch.Tensor, quantizer, fmt: str) -> tuple[Fp8Operand, Fp8Operand]:
    """(w, w_t) of the experts' weights w_nk [E, N, K] (any strides) under `quantizer` (a BlockQuantizer): each
    expert as its linear call quantizes a weight.

    w: data [E, N, K], scale_inv [E, ceil(N / rows), ceil(K / k_block)] in rows x k_block blocks, fprop's operand;
    w_t: the same for W.T [E, K, N] along N, dgrad's operand (square blocks: w's bytes and scales transposed per
    expert, exact)."""
    experts, n, k = w_nk.shape
    block_rows, k_block, mode = quantizer.weight_block_rows, quantizer.block_k_of(k), quantizer.scale_mode
    padded_n = -(-n // block_rows) * block_rows  # expert matrices padded to whole row blocks
    w = w_nk if padded_n == n else torch.nn.functional.pad(w_nk, (0, 0, 0, padded_n - n))
    data, scale_inv = block_quantize(w.reshape(experts * padded_n, k), block_rows, k_block, fmt, mode)
    data = data.view(experts, padded_n, k)[:, :n].contiguous() if padded_n != n else data.view(experts, n, k)
    w_q = Fp8Operand(data, scale_inv.view(experts, padded_n // block_rows, -1), block_rows, k_block)
    if quantizer.square_weight_blocks:
        return w_q, Fp8Operand(transpose_experts(data), w_q.scale_inv.transpose(1, 2).contiguous(), block_rows,
                               k_block)
    n_block = quantizer.block_k_of(n)
    data_t, scale_inv_t = block_quantize(w_nk.transpose(1, 2).reshape(experts * k, n), 1, n_block, fmt, mode)
    return w_q, Fp8Operand(data_t.view(experts, k, n), scale_inv_t.view(experts, k, -1), 1, n_block)


class BlockGroupedLinearCall:
    """One FP8 grouped linear call under a block recipe (the interface: fp8mp/functions/grouped_linear.py).

    offs: [E] int32 cumulative row ends on the host; sizes: the groups' row counts (host ints). A weight stored
    [E, K, N] (weight_in_out) is read through its [E, N, K] transpose view; its gradient is made [E, N, K] and
    handed back through that view."""

    def __init__(self, quantizer, offs: torch.Tensor, sizes: list[int], out_dtype: torch.dtype, weight_in_out: bool):
        self.quantizer, self.offs, self.sizes = quantizer, offs, sizes
        self.out_dtype, self.weight_in_out = out_dtype, weight_in_out
        self.formats, self.fast_accum = quantizer.formats, quantizer.fast_accum

    def quantize_tokens(self, x2d: torch.Tensor) -> tuple[Fp8Operand, Fp8Operand]:
        return quantize_tokens(x2d, self.sizes, self.quantizer, self.formats[0])

    def quantize_experts(self, weight: torch.Tensor) -> tuple[Fp8Operand, Fp8Operand]:
        w_nk = weight.transpose(1, 2) if self.weight_in_out else weight
        return quantize_experts(w_nk, self.quantizer, self.formats[0])

    def record_forward(self) -> None:
        pass  # no scaling state

    def quantize_grad(self, grad_out: torch.Tensor, need_dgrad: bool, need_wgrad: bool):
        return quantize_tokens(grad_out, self.sizes, self.quantizer, self.formats[1], need_dgrad, need_wgrad)

    def grouped_gemm(self, a: Fp8Operand, b: Fp8Operand, bias, out_dtype: torch.dtype, gemm: int) -> torch.Tensor:
        # (block_scaled_grouped_gemm promotes every block to fp32: no fast accumulation to choose)
        return block_scaled_grouped_gemm(a.data, a.scale_inv, b.data, b.scale_inv, self.offs, b.block_rows,
                                         b.block_k, bias, out_dtype)

    def weight_grad(self, g_t_q: Fp8Operand, x_t_q: Fp8Operand, out_dtype: torch.dtype) -> torch.Tensor:
        # dW [E, N, K] = dy.T @ x per expert; gpt-oss's [E, K, N] is its per-expert transpose
        grad_w = block_scaled_grouped_gemm_wgrad(g_t_q.data, g_t_q.scale_inv, x_t_q.data, x_t_q.scale_inv, self.offs,
                                                 x_t_q.block_k, out_dtype)
        return grad_w.transpose(1, 2) if self.weight_in_out else grad_w
