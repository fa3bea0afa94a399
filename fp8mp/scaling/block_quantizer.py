"""The block family (RowwiseScaling, BlockScaling, MXFP8Scaling): one scale per block along each GEMM's K.

Each GEMM needs its operands quantized along its own reduction axis, so each tensor is quantized once per GEMM
that reads it (fp8mp.ops.block_quantize):

    fprop: y  = x  @ W.T    a = x    [M,K] along K,   b = W    [N,K] along K
    dgrad: dx = dy @ W      a = dy   [M,N] along N,   b = W.T  [K,N] along N
    wgrad: dW = dy.T @ x    a = dy.T [N,M] along M,   b = x.T  [K,M] along M

Every tensor two GEMMs read along different axes (x, dy, and W under rowwise and MXFP8) is quantized both
ways by one block_quantize_transpose, from the same reads. Activations and gradients use 1 x block_k tiles,
weights weight_block_rows x block_k blocks (block_k: the whole K of the GEMM for rowwise). A square weight
block (BlockScaling's 128 x 128) covers W and W.T alike, so dgrad's operand is fprop's transposed (bytes and
scales), as DeepSeek-V3 does; for the other recipes W.T is quantized along N. Scales come from each block's
own values (nothing is read from or written to the module's Fp8Meta, nothing is reduced across ranks), so
backward quantizing the weight again gets forward's very bits.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from fp8mp.ops.blockwise import block_dequantize, block_quantize, block_quantize_transpose
from fp8mp.ops.norm import norm_to_block_fp8
from fp8mp.ops.operand import Fp8Operand, operand_gemm
from fp8mp.scaling.block_grouped import BlockGroupedLinearCall
from fp8mp.scaling.quantizer import Quantizer

__all__ = ["BlockQuantizer", "BlockLinearCall", "BlockWeightLayout"]


@dataclass(frozen=True)
class BlockWeightLayout:
    """What the bytes of a weight quantized for a block recipe depend on."""

    recipe: str             # the recipe's class name (for messages)
    block_rows: int         # weight block rows
    block_k: int | None     # block length along K (None: the whole K, rowwise)
    scale_mode: str         # fp8mp.ops.block_quantize's scale_mode
    fmt: str                # "e4m3" or "e5m2"

    def __str__(self) -> str:
        cols = "K" if self.block_k is None else self.block_k
        return f"{self.recipe} ({self.block_rows} x {cols} blocks, scale_mode {self.scale_mode!r}, {self.fmt})"


class BlockQuantizer(Quantizer):
    """block_k: the blocks' length along K (None: the whole K, one scale per row); weight_block_rows: the weight
    blocks' rows (block_k for square blocks, else 1); scale_mode: fp8mp.ops.block_quantize's."""

    def __init__(self, recipe, block_k: int | None, weight_block_rows: int, scale_mode: str):
        self.recipe = recipe
        self.block_k, self.weight_block_rows, self.scale_mode = block_k, weight_block_rows, scale_mode
        self.formats = (recipe.fp8_format.forward_format, recipe.fp8_format.backward_format)
        self.fast_accum = (False, False, False)  # block_scaled_gemm promotes every block to fp32
        self.block_weight_layout = BlockWeightLayout(type(recipe).__name__, weight_block_rows, block_k, scale_mode,
                                                     self.formats[0])

    @property
    def square_weight_blocks(self) -> bool:
        return self.weight_block_rows == self.block_k

    # ------------------------------------------------------------------------------ geometry and quantization
    def block_k_of(self, k: int) -> int:
        """The blocks' length along a GEMM's reduction axis of length k: block_k, or all of k for rowwise."""
        return max(k, 1) if self.block_k is None else self.block_k

    def quantize(self, t: torch.Tensor, block_rows: int, fmt: str) -> Fp8Operand:
        """A 2-D t quantized along its last axis in block_rows x block_k blocks."""
        block_k = self.block_k_of(t.shape[1])
        data, scale_inv = block_quantize(t, block_rows, block_k, fmt, self.scale_mode)
        return Fp8Operand(data, scale_inv, block_rows, block_k)

    def both_blocks(self, rows: int, cols: int) -> tuple[int, int]:
        """(row_block, col_block) of `quantize_both` for a [rows, cols] tensor."""
        return self.block_k_of(cols), self.block_k_of(rows)

    def quantize_both(self, t: torch.Tensor, fmt: str) -> tuple[Fp8Operand, Fp8Operand]:
        """(t along its rows, t.T along t's columns), 1 x block_k tiles, from one block_quantize_transpose."""
        row_block, col_block = self.both_blocks(*t.shape)
        data, scale_inv, data_t, scale_inv_t = block_quantize_transpose(t, row_block, col_block, fmt, self.scale_mode)
        return Fp8Operand(data, scale_inv, 1, row_block), Fp8Operand(data_t, scale_inv_t, 1, col_block)

    def quantize_weight(self, weight: torch.Tensor) -> tuple[Fp8Operand, Fp8Operand | None]:
        """(w_q, w_t_q): weight [N,K] for fprop (along K, weight blocks) and dgrad (W.T along N); w_t_q is None
        for square blocks (dgrad's operand is then w_q transposed)."""
        fmt = self.formats[0]
        if self.square_weight_blocks:
            return self.quantize(weight, self.weight_block_rows, fmt), None
        return self.quantize_both(weight, fmt)

    def fprop_weight(self, weight: torch.Tensor) -> Fp8Operand:
        """quantize_weight's w_q alone (the same bits: block_quantize_transpose is the two block_quantize calls)."""
        return self.quantize(weight, self.weight_block_rows, self.formats[0])

    def dgrad_weight(self, weight: torch.Tensor) -> Fp8Operand:
        """quantize_weight's dgrad operand alone, the same bits."""
        if self.square_weight_blocks:
            return self.fprop_weight(weight).transposed()
        return self.quantize(weight.t(), 1, self.formats[0])

    # ------------------------------------------------------------------------------ stored weights
    def stored_weight(self, weight: torch.Tensor) -> dict[str, torch.Tensor]:
        """`weight` [N, K] stored for this recipe: weight_fp8, weight_scale_inv (+ weight_fp8_t, weight_scale_inv_t
        where the blocks are not square)."""
        w_q, w_t_q = self.quantize_weight(weight.detach())
        buffers = {"weight_fp8": w_q.data, "weight_scale_inv": w_q.scale_inv}
        if w_t_q is not None:
            buffers.update(weight_fp8_t=w_t_q.data, weight_scale_inv_t=w_t_q.scale_inv)
        return buffers

    def stored_weight_operands(self, stored: dict[str, torch.Tensor]) -> tuple[Fp8Operand, Fp8Operand | None]:
        """The (w_q, w_t_q) of `quantize_weight` from the tensors `stored_weight` made."""
        n, k = stored["weight_fp8"].shape
        w_q = Fp8Operand(stored["weight_fp8"], stored["weight_scale_inv"], self.weight_block_rows, self.block_k_of(k))
        if "weight_fp8_t" not in stored:
            return w_q, None
        return w_q, Fp8Operand(stored["weight_fp8_t"], stored["weight_scale_inv_t"], 1, self.block_k_of(n))

    def decode_stored_weight(self, stored: dict[str, torch.Tensor], dtype: torch.dtype) -> torch.Tensor:
        data = stored["weight_fp8"]
        return block_dequantize(data, stored["weight_scale_inv"], self.weight_block_rows,
                                self.block_k or data.shape[1], dtype)

    # ------------------------------------------------------------------------------ calls
    def begin_linear(self, meta, x2d, weight, group, ran_before, out_dtype, weight_in_out=False):
        return BlockLinearCall(self, out_dtype, weight_in_out)

    def begin_grouped(self, meta, x2d, offs, sizes, group, ran_before, out_dtype, weight_in_out=False):
        return BlockGroupedLinearCall(self, offs, sizes, out_dtype, weight_in_out)

    def fuses_norm(self, meta, weight_stored: bool) -> bool:
        # Rowwise's x.T scales span all M rows: no strip of rows can be quantized before the whole norm output.
        return self.block_k is not None


class BlockLinearCall:
    """One FP8 linear call under a block recipe (the interface: fp8mp/scaling/quantizer.py). A [K,N] weight
    (weight_in_out) is read through its [N,K] transpose view; its gradient is made [N,K] and handed back
    through that view."""

    def __init__(self, quantizer: BlockQuantizer, out_dtype: torch.dtype, weight_in_out: bool):
        self.quantizer, self.out_dtype, self.weight_in_out = quantizer, out_dtype, weight_in_out
        self.formats, self.fast_accum = quantizer.formats, quantizer.fast_accum

    def quantize_input(self, x2d: torch.Tensor) -> tuple[Fp8Operand, Fp8Operand]:
        return self.quantizer.quantize_both(x2d, self.formats[0])

    def quantize_weight(self, weight: torch.Tensor) -> tuple[Fp8Operand, tuple[torch.Tensor, ...]]:
        # fprop's operand only: backward quantizes the dgrad operand itself
        return self.quantizer.fprop_weight(self._nk(weight)), ()

    def quantize_weight_again(self, weight: torch.Tensor, saved: tuple[torch.Tensor, ...]) -> Fp8Operand:
        return self.quantizer.dgrad_weight(self._nk(weight))

    def _nk(self, weight: torch.Tensor) -> torch.Tensor:
        return weight.t() if self.weight_in_out else weight

    def quantize_norm(self, x2d, norm_weight, norm_bias, eps, zero_centered_gamma, is_layernorm):
        q = self.quantizer
        row_block, col_block = q.both_blocks(*x2d.shape)
        data, scale_inv, data_t, scale_inv_t, mean, rstd = norm_to_block_fp8(
            x2d, norm_weight, norm_bias, eps, is_layernorm, row_block, col_block, self.formats[0], q.scale_mode,
            zero_centered_gamma)
        return (data, scale_inv, data_t, scale_inv_t), (mean if is_layernorm else None, rstd)

    def input_operands(self, data, scale_inv, data_t, scale_inv_t) -> tuple[Fp8Operand, Fp8Operand]:
        """The operands of the tensors `quantize_norm` wrote."""
        row_block, col_block = self.quantizer.both_blocks(data.shape[0], data.shape[1])
        return Fp8Operand(data, scale_inv, 1, row_block), Fp8Operand(data_t, scale_inv_t, 1, col_block)

    def record_forward(self, weight_amax_written: bool) -> None:
        pass  # no scaling state

    def quantize_grad(self, grad_out, need_dgrad: bool, need_wgrad: bool, want_dbias: bool):
        q, fmt = self.quantizer, self.formats[1]
        if need_dgrad and need_wgrad:  # dy along N and dy.T along M from the same reads
            g_q, g_t_q = q.quantize_both(grad_out, fmt)
        else:
            g_q = q.quantize(grad_out, 1, fmt) if need_dgrad else None
            g_t_q = q.quantize(grad_out.t(), 1, fmt) if need_wgrad else None
        dbias = grad_out.sum(0, dtype=torch.float32) if want_dbias else None
        return g_q, g_t_q, dbias

    def weight_grad(self, g_t_q: Fp8Operand, x_t_q: Fp8Operand, out_dtype: torch.dtype) -> torch.Tensor:
        grad_w = operand_gemm(g_t_q, x_t_q, None, out_dtype)  # dW [N,K] = dy.T @ x
        return grad_w.t() if self.weight_in_out else grad_w
