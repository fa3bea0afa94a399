"""Norm + FP8 Linear with the norm writing FP8 directly: no high-precision copy of the normalized input.

Per-tensor (delayed scaling) and block-scaled (BlockScaling, MXFP8Scaling: NormToBlockFp8, whose
kernel writes the norm's output in both block layouts the linear needs) alike.

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
from fp8mp.scaling.recipe import BlockRecipe
from fp8mp.nn.block_linear_function import BlockLinearFunction, block_linear, both_blocks
from fp8mp.nn.output_dtype import output_dtype
from fp8mp.nn.fp8_linear_function import INPUT, Fp8LinearFunction, linear_options


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
        return (*_norm_backward(ctx, grad_route), None, None, None, None, None, None)


def _norm_backward(ctx, grad_route):
    """(grad_x, grad_weight, grad_bias) of the norm, from the gradient that reached `route`."""
    x2d, norm_weight, mean, rstd = ctx.saved_tensors
    grad_route = grad_route.contiguous()
    if ctx.is_layernorm:
        grad_x, grad_w, grad_b = norm_ops.layer_norm_backward(grad_route, x2d, mean, rstd, norm_weight,
                                                              ctx.zero_centered_gamma)
    else:
        grad_x, grad_w = norm_ops.rms_norm_backward(grad_route, x2d, rstd, norm_weight, ctx.zero_centered_gamma)
        grad_b = None
    return grad_x, grad_w if norm_weight is not None else None, grad_b if ctx.has_bias else None


class NormToBlockFp8(torch.autograd.Function):
    """The norm's output as block-scaled FP8 along both axes (x along K, x.T along M), plus `route`."""

    @staticmethod
    def forward(ctx, x2d, norm_weight, norm_bias, eps, zero_centered_gamma, is_layernorm, recipe, fmt):
        row_block, col_block = both_blocks(recipe, *x2d.shape)
        data, scale_inv, data_t, scale_inv_t, mean, rstd = norm_ops.norm_block_fp8(
            x2d, norm_weight, norm_bias, eps, is_layernorm, row_block, col_block, fmt, recipe.quantize_mode,
            zero_centered_gamma)
        route = x2d.new_zeros(()).expand(x2d.shape)
        ctx.mark_non_differentiable(data, scale_inv, data_t, scale_inv_t)
        ctx.save_for_backward(x2d, norm_weight, mean if is_layernorm else None, rstd)
        ctx.is_layernorm, ctx.zero_centered_gamma = is_layernorm, zero_centered_gamma
        ctx.has_bias = norm_bias is not None
        return data, scale_inv, data_t, scale_inv_t, route

    @staticmethod
    def backward(ctx, _grad_data, _grad_scale, _grad_data_t, _grad_scale_t, grad_route):
        return (*_norm_backward(ctx, grad_route), None, None, None, None, None)


def norm_block_fp8_linear(x: torch.Tensor, norm: torch.nn.Module, weight: torch.Tensor | None, bias: torch.Tensor | None,
                          recipe: BlockRecipe, formats: tuple[str, str], eps: float, is_layernorm: bool,
                          stored_weight=None) -> torch.Tensor:
    """linear(norm(x)) under BlockScaling / MXFP8Scaling with the norm writing block-scaled FP8 itself.

    stored_weight, weight: as fp8mp.nn.block_linear_function.block_linear's. On CUDA, where
    norm_fwd_block_fp8 has no kernel, the norm runs first and block_linear quantizes its output
    (block_quantize_transpose), the unfused computation the fused CPU kernel equals bit for bit, at
    the cost of one more write and read of the normalized activation.
    """
    if x.is_cuda:
        return block_linear(norm(x), weight, bias, recipe, formats, stored_weight=stored_weight)
    x2d = x.reshape(-1, x.shape[-1]).contiguous()
    row_block, col_block = both_blocks(recipe, *x2d.shape)
    data, scale_inv, data_t, scale_inv_t, route = NormToBlockFp8.apply(
        x2d, norm.weight, getattr(norm, "bias", None), eps, norm.zero_centered_gamma, is_layernorm, recipe, formats[0])
    fp8_input = ((data, scale_inv, 1, row_block), (data_t, scale_inv_t, 1, col_block))
    out = BlockLinearFunction.apply(route, weight, bias, recipe, formats, stored_weight, fp8_input, output_dtype(x))
    return out.reshape(*x.shape[:-1], out.shape[-1])


def norm_fp8_linear(x: torch.Tensor, norm: torch.nn.Module, weight: torch.Tensor, bias: torch.Tensor | None,
                    meta: Fp8Meta, eps: float, is_layernorm: bool, group=None, ran_before: bool = False) -> torch.Tensor:
    """linear(norm(x)) with the norm's output cast to FP8 inside the norm kernel (delayed scaling only).

    group / ran_before: amax reduction across ranks, as for fp8mp.linear_function.fp8_linear. The caller
    holds `meta.lock()`.
    """
    x2d = x.reshape(-1, x.shape[-1]).contiguous()
    options = linear_options(meta, meta.prepare_forward_scales(None, weight, group, ran_before), output_dtype(x))
    columns = options.columns
    y_fp8, y_fp8_t, route = NormToFp8.apply(
        x2d, norm.weight, getattr(norm, "bias", None), eps, norm.zero_centered_gamma, is_layernorm,
        meta.scale[INPUT : INPUT + 1] if columns is None else columns.scale[INPUT],
        meta.amax[INPUT : INPUT + 1] if columns is None else columns.amax[INPUT], options.formats[0],
    )
    out = Fp8LinearFunction.apply(route, weight, bias, meta.forward_buffers(), None, (y_fp8, y_fp8_t), options)
    meta.mark_initialized()
    return out.reshape(*x.shape[:-1], out.shape[-1])
