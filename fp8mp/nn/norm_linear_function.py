"""Norm + FP8 Linear with the norm writing FP8 directly: no high-precision copy of the normalized input.

    x --NormToFp8--> (y_fp8, y_fp8_t) --Fp8LinearFunction--> out
            \\__ route (zero-storage [M,K] handle) ____/

The norm kernel casts its output to E4M3 and records its amax in the same pass
(fp8mp::layernorm_fwd_fp8 / rmsnorm_fwd_fp8). Autograd cannot flow through FP8
tensors, so NormToFp8 also returns `route`, an expanded zero scalar of x's
shape and dtype that the linear function takes as its input: the linear's
dgrad arrives there, and NormToFp8.backward turns it into the norm's gradients.
"""
from __future__ import annotations

import torch

from fp8mp.ops import norm as norm_ops
from fp8mp.scaling.fp8_meta import Fp8Meta
from fp8mp.scaling.recipe import gemm_fast_accum
from fp8mp.nn.fp8_linear_function import INPUT, GRAD, Fp8LinearFunction, prepare_scales, step_amax_to_fold


def _transpose_fp8(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8).t().contiguous().view(t.dtype)  # a byte transpose: exact


class NormToFp8(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x2d, norm_weight, norm_bias, eps, zero_centered_gamma, is_layernorm, scale, amax, fmt):
        if is_layernorm:
            y_fp8, mean, rstd = norm_ops.layer_norm_fp8(x2d, norm_weight, norm_bias, eps, scale, amax, fmt,
                                                        zero_centered_gamma=zero_centered_gamma)
        else:
            y_fp8, rstd = norm_ops.rms_norm_fp8(x2d, norm_weight, eps, scale, amax, fmt,
                                                zero_centered_gamma=zero_centered_gamma)
            mean = None
        y_fp8_t = _transpose_fp8(y_fp8)
        route = x2d.new_zeros(()).expand(x2d.shape)
        ctx.mark_non_differentiable(y_fp8, y_fp8_t)
        ctx.save_for_backward(x2d, norm_weight, mean, rstd)
        ctx.is_layernorm, ctx.zero_centered_gamma = is_layernorm, zero_centered_gamma
        ctx.has_bias = norm_bias is not None
        return y_fp8, y_fp8_t, route

    @staticmethod
    def backward(ctx, _grad_y_fp8, _grad_y_fp8_t, grad_route):
        x2d, norm_weight, mean, rstd = ctx.saved_tensors
        grad_route = grad_route.contiguous()
        if ctx.is_layernorm:
            grad_x, grad_w, grad_b = norm_ops.layer_norm_backward(grad_route, x2d, mean, rstd, norm_weight,
                                                                  ctx.zero_centered_gamma)
        else:
            grad_x, grad_w = norm_ops.rms_norm_backward(grad_route, x2d, rstd, norm_weight, ctx.zero_centered_gamma)
            grad_b = None
        return (grad_x, grad_w if norm_weight is not None else None, grad_b if ctx.has_bias else None,
                None, None, None, None, None, None)


def norm_fp8_linear(x: torch.Tensor, norm: torch.nn.Module, weight: torch.Tensor, bias: torch.Tensor | None,
                    meta: Fp8Meta, eps: float, is_layernorm: bool, group=None, ran_before: bool = False) -> torch.Tensor:
    """linear(norm(x)) with the norm's output cast to FP8 inside the norm kernel (delayed scaling only).

    group / ran_before: amax reduction across ranks, as for fp8mp.linear_function.fp8_linear. The caller
    holds `meta.lock()`.
    """
    x2d = x.reshape(-1, x.shape[-1]).contiguous()
    grad_scale_fn = prepare_scales(meta, None, weight, None, group, ran_before)
    formats = (meta.format_of(INPUT), meta.format_of(GRAD))
    y_fp8, y_fp8_t, route = NormToFp8.apply(
        x2d, norm.weight, getattr(norm, "bias", None), eps, norm.zero_centered_gamma, is_layernorm,
        meta.scale[INPUT : INPUT + 1], meta.amax[INPUT : INPUT + 1], formats[0],
    )
    out = Fp8LinearFunction.apply(route, weight, bias, meta.scale, meta.scale_inv, meta.amax, step_amax_to_fold(meta),
                                  formats, grad_scale_fn, meta.backward_lock(), None, (y_fp8, y_fp8_t), False,
                                  gemm_fast_accum(meta.recipe))
    meta.mark_initialized()
    return out.reshape(*x.shape[:-1], out.shape[-1])
