"""The FP8 linear autograd function: three FP8 GEMMs (fprop, dgrad, wgrad).

Forward casts input and weight to the forward format together with their
transposes (one read each), so backward needs no second pass over them:

    fprop: y  = x  @ W.T     a = x    [M,K], b = W    [N,K]
    dgrad: dx = dy @ W       a = dy   [M,N], b = W.T  [K,N]
    wgrad: dW = dy.T @ x     a = dy.T [N,M], b = x.T  [K,M]

(`fp8_gemm(a, b)` computes a @ b.T with both operands K-major, the layout FP8
tensor cores take.)
"""
from __future__ import annotations

import torch

from fp8mp.fp8_meta import Fp8Meta, LinearTensor
from fp8mp.gemm import fp8_gemm
from fp8mp.ops import cast_to_fp8_transpose

INPUT, WEIGHT, GRAD = LinearTensor.INPUT, LinearTensor.WEIGHT, LinearTensor.GRAD_OUTPUT


def _col(t: torch.Tensor, index: int) -> torch.Tensor:
    return t[index : index + 1]


class Fp8LinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x2d, weight, bias, meta_scale, meta_scale_inv, meta_amax, formats, grad_scale_fn):
        """x2d [M,K], weight [N,K]; meta_* are the module's Fp8Meta buffers (amax is written in place).

        formats: (forward_format, backward_format); grad_scale_fn: None (delayed scaling) or a
        callable setting the grad_output scale from the gradient itself (current scaling).
        """
        forward_format, backward_format = formats
        x_fp8, x_fp8_t = cast_to_fp8_transpose(x2d, _col(meta_scale, INPUT), _col(meta_amax, INPUT), forward_format)
        w_fp8, w_fp8_t = cast_to_fp8_transpose(weight, _col(meta_scale, WEIGHT), _col(meta_amax, WEIGHT), forward_format)
        # Backward must decode with the scales these casts used, whatever happens to the buffers meanwhile.
        used_scale_inv = meta_scale_inv[: WEIGHT + 1].clone()
        out_bias = bias.to(x2d.dtype) if bias is not None else None
        out = fp8_gemm(x_fp8, _col(used_scale_inv, INPUT), w_fp8, _col(used_scale_inv, WEIGHT), out_bias, x2d.dtype)
        ctx.save_for_backward(x_fp8_t, w_fp8_t, used_scale_inv, meta_scale, meta_scale_inv, meta_amax)
        ctx.backward_format = backward_format
        ctx.grad_scale_fn = grad_scale_fn
        ctx.x_dtype, ctx.w_dtype = x2d.dtype, weight.dtype
        ctx.bias_dtype = bias.dtype if bias is not None else None
        return out

    @staticmethod
    def backward(ctx, grad_out):
        x_fp8_t, w_fp8_t, used_scale_inv, meta_scale, meta_scale_inv, meta_amax = ctx.saved_tensors
        grad_out = grad_out.contiguous()
        if ctx.grad_scale_fn is not None:
            ctx.grad_scale_fn(grad_out)
        g_fp8, g_fp8_t = cast_to_fp8_transpose(grad_out, _col(meta_scale, GRAD), _col(meta_amax, GRAD), ctx.backward_format)
        g_scale_inv = _col(meta_scale_inv, GRAD).clone()
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            grad_x = fp8_gemm(g_fp8, g_scale_inv, w_fp8_t, _col(used_scale_inv, WEIGHT), None, ctx.x_dtype)
        if ctx.needs_input_grad[1]:
            grad_w = fp8_gemm(g_fp8_t, g_scale_inv, x_fp8_t, _col(used_scale_inv, INPUT), None, ctx.w_dtype)
        if ctx.bias_dtype is not None and ctx.needs_input_grad[2]:
            grad_b = grad_out.sum(0, dtype=torch.float32).to(ctx.bias_dtype)
        return grad_x, grad_w, grad_b, None, None, None, None, None


def fp8_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, meta: Fp8Meta) -> torch.Tensor:
    """y = x @ weight.T + bias in FP8 per `meta`'s recipe, for x of shape [..., K]."""
    x2d = x.reshape(-1, x.shape[-1])
    if meta.uses_current_scaling():
        meta.set_scale_from(INPUT, x2d)
        meta.set_scale_from(WEIGHT, weight)
        grad_scale_fn = lambda grad: meta.set_scale_from(GRAD, grad)  # noqa: E731
    else:
        meta.step_delayed_scaling()
        grad_scale_fn = None
    formats = (meta.format_of(INPUT), meta.format_of(GRAD))
    out = Fp8LinearFunction.apply(x2d, weight, bias, meta.scale, meta.scale_inv, meta.amax, formats, grad_scale_fn)
    meta.initialized = True
    return out.reshape(*x.shape[:-1], weight.shape[0])
