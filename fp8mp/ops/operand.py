"""`Fp8Operand`: one GEMM operand in FP8, whatever its scaling, and `operand_gemm`, the GEMM of two.

Every FP8 GEMM of fp8mp computes ``a @ b.T`` with both operands K-major (the layout FP8 tensor cores take), so
an operand is FP8 codes ``data`` [rows, K] and what decodes them:

    per-tensor scaling   scale_inv [1] float32                                   block_rows == block_k == 0
    block scaling        scale_inv [ceil(rows / block_rows), ceil(K / block_k)]  (float32, or float8_e8m0fnu
                         for MX; fp8mp/ops/blockwise.py has the layout)

`operand_gemm` picks the op from the operands: `fp8_gemm` for two per-tensor operands, `block_scaled_gemm`
for two block-scaled ones. The quantizers of fp8mp.scaling make operands; the autograd functions of
fp8mp.functions only hand them on, so they never ask which recipe made them.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from fp8mp.ops.blockwise import block_scaled_gemm
from fp8mp.ops.gemm import fp8_gemm

__all__ = ["Fp8Operand", "operand_gemm"]


class Fp8Operand(NamedTuple):
    """FP8 codes [rows, K] (K-major) and their scale(s); block_rows == block_k == 0 for one per-tensor scale."""

    data: torch.Tensor
    scale_inv: torch.Tensor
    block_rows: int = 0
    block_k: int = 0

    @property
    def is_block_scaled(self) -> bool:
        return self.block_k != 0

    def rows(self, start: int, stop: int) -> "Fp8Operand":
        """The operand of rows [start, stop): the rows' codes with their scales (block-scaled operands need
        one-row blocks, where each row's scales are a row of scale_inv)."""
        if not self.is_block_scaled:
            return Fp8Operand(self.data[start:stop], self.scale_inv)
        assert self.block_rows == 1, "row slices of a block-scaled operand need 1 x block_k blocks"
        return Fp8Operand(self.data[start:stop], self.scale_inv[start:stop], 1, self.block_k)

    def transposed(self) -> "Fp8Operand":
        """The operand of the transposed matrix, exact: the codes moved as bytes, and the scales transposed
        (per-tensor scaling, or square blocks, whose blocks are those of the transpose)."""
        data_t = self.data.view(torch.uint8).t().contiguous().view(self.data.dtype)
        if not self.is_block_scaled:
            return Fp8Operand(data_t, self.scale_inv)
        assert self.block_rows == self.block_k, "only square blocks are the blocks of the transpose"
        return Fp8Operand(data_t, self.scale_inv.t().contiguous(), self.block_rows, self.block_k)


def operand_gemm(a: Fp8Operand, b: Fp8Operand, bias: torch.Tensor | None, out_dtype: torch.dtype,
                 use_fast_accum: bool = False) -> torch.Tensor:
    """a @ b.T [rows of a, rows of b] in `out_dtype`, plus `bias` [rows of b] when given.

    Two per-tensor operands: fp8_gemm (use_fast_accum picks cuBLASLt's fast accumulation); two block-scaled
    ones: block_scaled_gemm (their K blocks must agree; it promotes every block to fp32, so use_fast_accum
    has nothing to choose).
    """
    if a.is_block_scaled != b.is_block_scaled:
        raise ValueError("operand_gemm: arguments 'a' and 'b' must both be per-tensor scaled or both block-scaled")
    if not a.is_block_scaled:
        return fp8_gemm(a.data, a.scale_inv, b.data, b.scale_inv, bias, out_dtype, use_fast_accum)
    return block_scaled_gemm(a.data, a.scale_inv, b.data, b.scale_inv, a.block_rows, b.block_rows, a.block_k, bias,
                             out_dtype)
