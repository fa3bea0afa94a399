"""The FP8 grouped linear of mixture-of-experts layers: y_g = x_g @ W_g.T + b_g for every expert g at once.

Tokens are sorted by expert and ``offs`` [E] int32 holds the experts' cumulative ends (torch._grouped_mm's
layout). The three GEMMs are fp8mp.ops.grouped_gemm's:

    fprop: y  = fp8_grouped_gemm(x [T, K], W [E, N, K])          E4M3 x E4M3
    dgrad: dx = fp8_grouped_gemm(dy [T, N], W^T [E, K, N])       E5M2 x E4M3
    wgrad: dW = fp8_grouped_gemm_wgrad(dy.T [N, T], x.T [K, T])  E5M2 x E4M3, [E, N, K]

under current scaling (the HYBRID format: E4M3 forward, E5M2 gradients): one scale for the tokens and for the
gradient, from their own amax, and one per expert for the weights, from each expert's amax (a rarely routed
expert keeps its own range). The input and gradient casts give their transposes from the same read
(cast_to_fp8_transpose), as Fp8LinearFunction's do. A weight stored [E, K, N] (``weight_in_out``: gpt-oss's
experts, y = x @ W_g) is cast in its own layout; that cast is dgrad's operand, its per-expert transpose fprop's,
and wgrad computes dW [E, K, N] = x.T @ dy as fp8_grouped_gemm_wgrad(x.T, dy.T).

With an Fp8Meta (fp8mp.nn.GroupedLinear) the tokens and the gradient are cast with the meta's INPUT and GRAD
scales instead (current scaling sets them from the tensor, delayed scaling from the amax history) and the casts
write their amaxes there, folded into step_amax for LossScaler's non-finite check, under the module's lock as
Fp8LinearFunction's; the weights keep one current scale per expert under every per-tensor recipe (a rarely
routed expert keeps its own range), the meta's WEIGHT column holding the largest expert amax and its scale.
"""
from __future__ import annotations

import torch

import contextlib

from fp8mp.nn.fp8_linear_function import Fp8LinearOptions
from fp8mp.ops.cast import cast_to_fp8_transpose
from fp8mp.ops.format import fp8_max_of
from fp8mp.ops.grouped_gemm import fp8_grouped_gemm, fp8_grouped_gemm_wgrad
from fp8mp.ops.scale_update import compute_scale
from fp8mp.scaling.fp8_meta import GRAD, INPUT, WEIGHT, columns_of, fold_amax_

FORWARD_FORMAT, BACKWARD_FORMAT = "e4m3", "e5m2"
_FP8_DTYPE = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}


def current_scale(amax: torch.Tensor, fmt: str, margin: int = 0) -> torch.Tensor:
    """Current scaling's scale for float32 `amax` (any shape): fp8_max / amax / 2**margin, or 1 where amax is 0 or
    not finite."""
    return compute_scale(amax, fp8_max_of(fmt), margin, torch.ones_like(amax))


def cast_tensorwise_transpose(t: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(t in fmt, its transpose, scale_inv [1]) for a 2-D `t`, the scale from t's own amax."""
    amax = t.detach().abs().amax().float().reshape(1) if t.numel() else torch.zeros(1, device=t.device)
    scale = current_scale(amax, fmt)
    data, data_t = cast_to_fp8_transpose(t, scale, torch.zeros(1, device=t.device), fmt)
    return data, data_t, scale.reciprocal()


def cast_per_expert(weight: torch.Tensor, fmt: str, margin: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(weight [E, ...] in fmt with one scale per expert, scale_inv [E], amax [E]).

    Expert e is saturate(round_nearest_even(float32(weight[e]) * scale[e])), cast_to_fp8's arithmetic (fp32
    product, torch's round-to-nearest-even conversion, saturation to the format's max, NaN kept), for all
    experts in one pass instead of E op calls."""
    experts = weight.shape[0]
    amax = weight.detach().abs().reshape(experts, -1).amax(dim=1).float() if weight.numel() else \
        torch.zeros(experts, device=weight.device)
    scale = current_scale(amax, fmt, margin)
    fp8_max = fp8_max_of(fmt)
    scaled = weight.detach().float() * scale.view(experts, *([1] * (weight.dim() - 1)))
    return scaled.clamp(-fp8_max, fp8_max).to(_FP8_DTYPE[fmt]), scale.reciprocal(), amax


def transpose_experts(t: torch.Tensor) -> torch.Tensor:
    """[E, a, b] -> contiguous [E, b, a] (FP8 codes moved as bytes)."""
    return t.view(torch.uint8).transpose(1, 2).contiguous().view(t.dtype)


def group_sums(t: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """[E, N] float32: the sum of t's rows of each group (zeros for an empty group), in a fixed order."""
    lengths = torch.diff(offs.long(), prepend=offs.new_zeros(1, dtype=torch.long))
    return torch.segment_reduce(t.float(), "sum", lengths=lengths, axis=0, initial=0)


class Fp8GroupedLinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, offs, weight_in_out=False, meta_buffers=None,
                options: Fp8LinearOptions | None = None, margin: int = 0):
        """x [T, K] rows sorted by expert; weight [E, N, K] ([E, K, N] with weight_in_out); bias [E, N] or None;
        offs [E] int32 cumulative ends. Returns [T, N] in x's dtype (options.out_dtype with options).

        meta_buffers, options: None (each tensor scaled from its own amax, HYBRID formats, nothing recorded), or
        an Fp8Meta's forward_buffers() and the call's Fp8LinearOptions (see fp8mp.nn.fp8_linear_function), whose
        INPUT and GRAD scales the casts use; margin: the recipe's, for the weights' per-expert scales.
        """
        formats = options.formats if options is not None else (FORWARD_FORMAT, BACKWARD_FORMAT)
        if options is None:
            x_fp8, x_fp8_t, x_scale_inv = cast_tensorwise_transpose(x, formats[0])
            cols, out_dtype, fast_accum = None, x.dtype, (False, False, False)
        else:
            cols = options.columns if options.columns is not None else columns_of(*meta_buffers)
            x_fp8, x_fp8_t = cast_to_fp8_transpose(x, cols.scale[INPUT], cols.amax[INPUT], formats[0])
            x_scale_inv = cols.scale_inv[INPUT].clone()
            out_dtype, fast_accum = options.out_dtype, options.fast_accum
        w_fp8, w_scale_inv, w_amax = cast_per_expert(weight, formats[0], margin)
        if cols is not None:  # the WEIGHT column: the largest expert amax and its scale (NaN-propagating max)
            cols.amax[WEIGHT].copy_(w_amax.max().reshape(1))
            weight_scale = current_scale(cols.amax[WEIGHT], formats[0], margin)
            cols.scale[WEIGHT].copy_(weight_scale)
            cols.scale_inv[WEIGHT].copy_(weight_scale.reciprocal())
            if meta_buffers[3] is not None:
                fold_amax_(cols.step_amax_head[WEIGHT + 1], cols.amax_head[WEIGHT + 1])
        # fprop takes [E, N, K]; dgrad [E, K, N]: the cast is one of them, its per-expert transpose the other.
        fprop_w = transpose_experts(w_fp8) if weight_in_out else w_fp8
        out_bias = bias.to(out_dtype) if bias is not None else None
        out = fp8_grouped_gemm(x_fp8, x_scale_inv, fprop_w, w_scale_inv, offs, out_bias, out_dtype, fast_accum[0])
        # With weight_in_out the cast is dgrad's operand as it is; otherwise backward transposes it.
        ctx.save_for_backward(x_fp8_t, x_scale_inv, w_fp8, w_scale_inv, offs)
        ctx.weight_in_out = weight_in_out
        ctx.meta_buffers, ctx.options, ctx.formats, ctx.fast_accum = meta_buffers, options, formats, fast_accum
        ctx.x_dtype, ctx.w_dtype = x.dtype, weight.dtype
        ctx.bias_dtype = bias.dtype if bias is not None else None
        return out

    @staticmethod
    def backward(ctx, grad_out):
        x_fp8_t, x_scale_inv, w_fp8, w_scale_inv, offs = ctx.saved_tensors
        grad_out = grad_out.contiguous()
        options, fast_accum = ctx.options, ctx.fast_accum
        if options is None:
            g_fp8, g_fp8_t, g_scale_inv = cast_tensorwise_transpose(grad_out, ctx.formats[1])
        else:
            cols = options.columns if options.columns is not None else columns_of(*ctx.meta_buffers)
            with options.lock if options.lock is not None else contextlib.nullcontext():
                if options.grad_scale_fn is not None:
                    options.grad_scale_fn(grad_out)
                g_fp8, g_fp8_t = cast_to_fp8_transpose(grad_out, cols.scale[GRAD], cols.amax[GRAD], ctx.formats[1])
                g_scale_inv = cols.scale_inv[GRAD].clone()
                if ctx.meta_buffers[3] is not None:
                    fold_amax_(cols.step_amax[GRAD], cols.amax[GRAD])
        grad_x = grad_w = grad_b = None
        if ctx.needs_input_grad[0]:
            dgrad_w = w_fp8 if ctx.weight_in_out else transpose_experts(w_fp8)
            grad_x = fp8_grouped_gemm(g_fp8, g_scale_inv, dgrad_w, w_scale_inv, offs, None, ctx.x_dtype, fast_accum[1])
        if ctx.needs_input_grad[1] and ctx.weight_in_out:  # dW [E, K, N] = x.T @ dy per expert
            grad_w = fp8_grouped_gemm_wgrad(x_fp8_t, x_scale_inv, g_fp8_t, g_scale_inv, offs, ctx.w_dtype, fast_accum[2])
        elif ctx.needs_input_grad[1]:  # dW [E, N, K] = dy.T @ x per expert
            grad_w = fp8_grouped_gemm_wgrad(g_fp8_t, g_scale_inv, x_fp8_t, x_scale_inv, offs, ctx.w_dtype, fast_accum[2])
        if ctx.bias_dtype is not None and ctx.needs_input_grad[2]:
            grad_b = group_sums(grad_out, offs).to(ctx.bias_dtype)
        return grad_x, grad_w, grad_b, None, None, None, None, None


def fp8_grouped_linear(x: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor, bias: torch.Tensor | None = None,
                       weight_in_out: bool = False) -> torch.Tensor:
    """y[rows of expert g] = x[rows of g] @ W_g.T + bias[g] in FP8 (current scaling, HYBRID), differentiable in
    x, weight and bias.

    Args:
        x: [T, K] float32/bfloat16/float16, rows sorted by expert.
        weight: [E, N, K] (nn.Linear's layout per expert), or [E, K, N] with `weight_in_out`.
        offs: [E] int32 on x's device, the experts' cumulative row ends (non-decreasing, offs[-1] == T).
        bias: optional [E, N].
    Returns:
        [T, N] of x's dtype. K and N must be multiples of 16.
    """
    if x.dim() != 2:
        raise ValueError(f"fp8_grouped_linear: argument 'x' must be 2-D [T, K], got shape {tuple(x.shape)}")
    if weight.dim() != 3:
        raise ValueError(f"fp8_grouped_linear: argument 'weight' must be 3-D [E, N, K], got shape {tuple(weight.shape)}")
    return Fp8GroupedLinearFunction.apply(x, weight, bias, offs, weight_in_out)
