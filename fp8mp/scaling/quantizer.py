"""`Quantizer`: what a recipe family does to a GEMM's tensors, behind one interface.

A recipe (fp8mp/scaling/recipe.py) is a frozen configuration; `quantizer_for(recipe)`
(fp8mp/scaling/recipe_registry.py, the one place that looks at recipe types) turns it into a quantizer of
its family:

    PerTensorQuantizer (per_tensor_quantizer.py)   DelayedScaling, CurrentScaling: one scale per tensor,
                                                   kept in the module's Fp8Meta (amaxes, amax history,
                                                   delayed or current scales, amax reduction over fp8_group)
    BlockQuantizer (block_quantizer.py)            RowwiseScaling, BlockScaling, MXFP8Scaling: one scale per
                                                   block along each GEMM's K, from the block's own values

The autograd functions of fp8mp.functions are written once against this interface: per call they ask
`begin_linear` (or `begin_grouped`) for a *call* object, which quantizes the call's tensors for their role
(input, weight, gradient) along the axis each GEMM reduces over and returns `fp8mp.ops.Fp8Operand`s;
`fp8mp.ops.operand_gemm` multiplies two operands with the op their scaling needs. The weight forms of
fp8mp.quantized ask the quantizer what stored FP8 codes it can take as they are.

A linear call (`begin_linear`) offers:

    quantize_input(x2d) -> (x_q, x_t_q)            fprop's x along K, wgrad's x.T along M
    quantize_weight(w) -> (w_q, saved)             fprop's W along K; `saved`: tensors backward needs to
                                                   quantize W again with the same bits
    quantize_weight_again(w, saved) -> w_t_q       dgrad's W.T along N, the bits of forward's quantization
    quantize_norm(x2d, norm, eps, is_layernorm)    the norm's output written as (x_q, x_t_q) by the norm
                                                   kernel itself, plus (mean, rstd)
    record_forward(weight_amax_written)            after the forward's casts (the non-finite check's state)
    quantize_grad(dy, need_dgrad, need_wgrad, want_dbias) -> (g_q, g_t_q, dbias fp32 or None)
    weight_grad(g_t_q, x_t_q, out_dtype) -> dW     in the weight's own layout ([N,K], or [K,N] weight_in_out)
    fast_accum, out_dtype, weight_in_out           the three GEMMs' accumulation, the output dtype, the layout
"""
from __future__ import annotations

import torch

__all__ = ["Quantizer"]


class Quantizer:
    """Base of the recipe families' quantizers (module docstring). Attributes every quantizer has:

    recipe: the recipe it was made from.
    formats: (forward_format, backward_format), the op format strings of inputs and weights, and of gradients.
    fast_accum: (fprop, dgrad, wgrad): whether each GEMM uses fast accumulation.
    amax_history_len: the amax history a module's Fp8Meta keeps for it, or None (no history: keep any).
    reduces_amaxes: the module's amaxes must agree across fp8_group's ranks (per-tensor scales); block scales
        come from each block's own values and need no reduction.
    per_tensor_format: the format of per-tensor scaled weight codes it takes as they are (stored, frozen or
        FP8-gathered weights), or None where it needs a weight in blocks.
    block_weight_layout: for a block quantizer, what the bytes of a weight quantized for it depend on
        (`BlockWeightLayout`), so that a stored weight is used only by a quantizer of the same layout; None.
    """

    recipe: object
    formats: tuple[str, str]
    fast_accum: tuple[bool, bool, bool]
    amax_history_len: int | None = None
    reduces_amaxes: bool = False
    per_tensor_format: str | None = None
    block_weight_layout: object = None

    @property
    def name(self) -> str:
        """The recipe's class name, for messages."""
        return type(self.recipe).__name__

    # ------------------------------------------------------------------------------ linear GEMMs
    def begin_linear(self, meta, x2d: torch.Tensor | None, weight: torch.Tensor | None, group, ran_before: bool,
                     out_dtype: torch.dtype, weight_in_out: bool = False):
        """Set up one FP8 linear call of the module owning `meta` (its Fp8Meta, configured with this quantizer;
        the caller holds its lock) and return the call object (module docstring).

        x2d / weight: the input and the weight the call casts (None where they come cast already: a fused
        norm's output, a stored FP8 weight), for quantizers that scale from the tensor itself.
        group, ran_before: fp8_autocast's fp8_group and whether the module already ran in the innermost
        context (amax reduction). out_dtype: the output's dtype. weight_in_out: the weight is [K,N].
        """
        raise NotImplementedError

    def finish_forward(self, meta) -> None:
        """After a module's FP8 forward: record in `meta` what this family's scaling state needs."""

    def fuses_norm(self, meta, weight_stored: bool) -> bool:
        """Whether a norm before a linear may write this family's FP8 input itself (fp8mp.nn.LayerNormLinear)."""
        return False

    def begin_grouped(self, meta, x2d: torch.Tensor, offs: torch.Tensor, sizes: list[int], group, ran_before: bool,
                      out_dtype: torch.dtype, weight_in_out: bool = False):
        """Set up one FP8 grouped linear call (a mixture-of-experts layer: tokens sorted by expert, `offs` the
        groups' cumulative ends on the host, `sizes` their row counts) and return the grouped call object
        (fp8mp/functions/grouped_linear.py lists its interface). The other arguments as `begin_linear`'s."""
        raise NotImplementedError
