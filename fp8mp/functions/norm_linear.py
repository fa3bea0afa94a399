"""Norm + FP8 Linear with the norm writing FP8 directly: no high-precision copy of the normalized input.

    x --NormToFp8--> (x_q, x_t_q) --LinearFunction--> out
            \\__ route (zero-storage [M,K] handle) ____/

The call's `quantize_norm` runs the norm kernel that writes the linear's quantized input itself: one scale
(cast to E4M3 in the norm's pass, its amax recorded) or blocks along both axes the GEMMs read (x along K for
fprop, x.T along M for wgrad). Autograd cannot flow through FP8 tensors, so NormToFp8 also returns `route`, an
expanded zero scalar of x's shape and dtype that the linear function takes as its input: the linear's dgrad
arrives there, and NormToFp8.backward turns it into the norm's gradients.
"""
from __future__ import annotations

import torch

from fp8mp.functions.linear import LinearFunction
from fp8mp.functions.output_dtype import output_dtype
from fp8mp.ops import norm as norm_ops

__all__ = ["NormToFp8", "norm_fp8_linear"]


class NormToFp8(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x2d, norm_weight, norm_bias, eps, zero_centered_gamma, is_layernorm, call):
        """(the tensors of the quantized norm output, as call.quantize_norm gives them..., route)."""
        quantized, (mean, rstd) = call.quantize_norm(x2d, norm_weight, norm_bias, eps, zero_centered_gamma,
                                                     is_layernorm)
        route = x2d.new_zeros(()).expand(x2d.shape)
        ctx.mark_non_differentiable(*quantized)
        ctx.save_for_backward(x2d, norm_weight, mean, rstd)
        ctx.is_layernorm, ctx.zero_centered_gamma = is_layernorm, zero_centered_gamma
        ctx.has_bias = norm_bias is not None
        return (*quantized, route)

    @staticmethod
    def backward(ctx, *grads):
        """(grad_x, grad_weight, grad_bias) of the norm, from the gradient that reached `route` (the last)."""
        x2d, norm_weight, mean, rstd = ctx.saved_tensors
        grad_route = grads[-1].contiguous()
        if ctx.is_layernorm:
            grad_x, grad_w, grad_b = norm_ops.layer_norm_backward(grad_route, x2d, mean, rstd, norm_weight,
                                                                  ctx.zero_centered_gamma)
        else:
            grad_x, grad_w = norm_ops.rms_norm_backward(grad_route, x2d, rstd, norm_weight, ctx.zero_centered_gamma)
            grad_b = None
        return (grad_x, grad_w if norm_weight is not None else None, grad_b if ctx.has_bias else None,
                None, None, None, None)


def norm_fp8_linear(x: torch.Tensor, norm: torch.nn.Module, weight: torch.Tensor | None, bias: torch.Tensor | None,
                    meta, eps: float, is_layernorm: bool, stored=None, group=None,
                    ran_before: bool = False) -> torch.Tensor:
    """linear(norm(x)) with the norm's output quantized inside the norm kernel, under the quantizer `meta` (the
    linear's Fp8Meta) is configured with, where `quantizer.fuses_norm` says it may. stored, weight: as
    fp8mp.functions.linear.fp8_linear's; group / ran_before: amax reduction across ranks, as there. The caller
    holds `meta.lock()`."""
    x2d = x.reshape(-1, x.shape[-1]).contiguous()
    quantizer = meta.quantizer
    call = quantizer.begin_linear(meta, None, weight if stored is None else None, group, ran_before, output_dtype(x))
    *quantized, route = NormToFp8.apply(x2d, norm.weight, getattr(norm, "bias", None), eps, norm.zero_centered_gamma,
                                        is_layernorm, call)
    out = LinearFunction.apply(route, weight, bias, stored, call.input_operands(*quantized), call)
    quantizer.finish_forward(meta)
    return out.reshape(*x.shape[:-1], out.shape[-1])
