"""The FP8 grouped linear of mixture-of-experts layers, y_g = x_g @ W_g.T + b_g for every expert g at once, under
every recipe.

Tokens are sorted by expert and ``offs`` [E] int32 holds the experts' cumulative ends (torch._grouped_mm's
layout); the GEMMs read it on the host. The three grouped GEMMs:

    fprop: y  = x  @ W_g.T     a = x    [T, K], b = W    [E, N, K]    grouped along the tokens
    dgrad: dx = dy @ W_g       a = dy   [T, N], b = W.T  [E, K, N]    grouped along the tokens
    wgrad: dW = dy.T @ x       a = dy.T [N, T], b = x.T  [K, T]       grouped along the reduction, [E, N, K]

What each tensor becomes is the *grouped call*'s business (`Quantizer.begin_grouped`; the per-tensor family's in
fp8mp/scaling/per_tensor_grouped.py, the block family's in fp8mp/scaling/block_grouped.py); this function only
routes the operands (fp8mp.ops.Fp8Operand) between the GEMMs, so it never asks which recipe is in use. A grouped
call offers:

    quantize_tokens(x2d) -> (x_q, x_t_q)            fprop's x, wgrad's x.T (along the tokens, group by group)
    quantize_experts(weight) -> (w_q, w_t_q)        fprop's W [E, N, K] and dgrad's W.T [E, K, N], per expert
    record_forward()                                after the forward's casts (the non-finite check's state)
    quantize_grad(dy, need_dgrad, need_wgrad) -> (g_q, g_t_q)
    grouped_gemm(a, b, bias, out_dtype, gemm)       fprop (gemm 0) or dgrad (gemm 1) over the groups
    weight_grad(g_t_q, x_t_q, out_dtype) -> dW      in the weight's own layout ([E, N, K], or [E, K, N])
    offs, out_dtype, weight_in_out                  host offsets, the output dtype, the weight's layout

A weight stored [E, K, N] (``weight_in_out``: gpt-oss's experts, y = x @ W_g) makes its gradient [E, K, N] too.
The bias gradient is each group's sum of the output gradient's rows, in float32 in a fixed order.
"""
from __future__ import annotations

import torch

from fp8mp.functions.output_dtype import output_dtype
from fp8mp.ops.operand import Fp8Operand
from fp8mp.quantized.weight_operands import readable_weight
from fp8mp.scaling import autocast as autocast_state
from fp8mp.scaling.per_tensor_grouped import tensorwise_grouped_call

__all__ = ["GroupedLinearFunction", "fp8_grouped_linear", "meta_grouped_linear", "group_sizes_of"]

FPROP, DGRAD = 0, 1


def group_sums(t: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """[E, N] float32: the sum of t's rows of each group (zeros for an empty group), in a fixed order. `offs` may
    lie on the CPU beside a CUDA `t` (its lengths are copied over without waiting on the device)."""
    lengths = torch.diff(offs.long(), prepend=offs.new_zeros(1, dtype=torch.long)).to(t.device, non_blocking=True)
    return torch.segment_reduce(t.float(), "sum", lengths=lengths, axis=0, initial=0)


class GroupedLinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, call):
        """x [T, K] rows sorted by expert; weight [E, N, K] ([E, K, N] with call.weight_in_out); bias [E, N] or
        None; call: the grouped call (module docstring). Returns [T, N] of call.out_dtype."""
        plain = readable_weight(weight)  # (a weight frozen in FP8: decoded once, not once per expert's slice)
        x_q, x_t_q = call.quantize_tokens(x)
        w_q, w_t_q = call.quantize_experts(plain)
        call.record_forward()
        out_bias = bias.to(call.out_dtype) if bias is not None else None
        out = call.grouped_gemm(x_q, w_q, out_bias, call.out_dtype, FPROP)
        ctx.save_for_backward(x_t_q.data, x_t_q.scale_inv, w_t_q.data, w_t_q.scale_inv)
        ctx.call, ctx.x_blocks, ctx.w_blocks = call, x_t_q[2:], w_t_q[2:]
        ctx.x_dtype, ctx.w_dtype = x.dtype, weight.dtype
        ctx.bias_dtype = bias.dtype if bias is not None else None
        return out

    @staticmethod
    def backward(ctx, grad_out):
        x_t_data, x_t_scale_inv, w_t_data, w_t_scale_inv = ctx.saved_tensors
        call = ctx.call
        need_dgrad, need_wgrad = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_out = grad_out.contiguous()
        g_q, g_t_q = call.quantize_grad(grad_out, need_dgrad, need_wgrad)
        grad_x = grad_w = grad_b = None
        if need_dgrad:
            w_t_q = Fp8Operand(w_t_data, w_t_scale_inv, *ctx.w_blocks)
            grad_x = call.grouped_gemm(g_q, w_t_q, None, ctx.x_dtype, DGRAD)
        if need_wgrad:
            grad_w = call.weight_grad(g_t_q, Fp8Operand(x_t_data, x_t_scale_inv, *ctx.x_blocks), ctx.w_dtype)
        if ctx.bias_dtype is not None and ctx.needs_input_grad[2]:
            grad_b = group_sums(grad_out, call.offs).to(ctx.bias_dtype)
        return grad_x, grad_w, grad_b, None


def fp8_grouped_linear(x: torch.Tensor, weight: torch.Tensor, offs: torch.Tensor, bias: torch.Tensor | None = None,
                       weight_in_out: bool = False) -> torch.Tensor:
    """y[rows of expert g] = x[rows of g] @ W_g.T + bias[g] in FP8 (current scaling, HYBRID), differentiable in
    x, weight and bias.

    Args:
        x: [T, K] float32/bfloat16/float16, rows sorted by expert.
        weight: [E, N, K] (nn.Linear's layout per expert), or [E, K, N] with `weight_in_out`.
        offs: [E] int32 on x's device or on the CPU, the experts' cumulative row ends (non-decreasing,
            offs[-1] == T); on the CPU, a CUDA step reads them with no device-to-host copy.
        bias: optional [E, N].
    Returns:
        [T, N] of x's dtype. K and N must be multiples of 16.
    """
    if x.dim() != 2:
        raise ValueError(f"fp8_grouped_linear: argument 'x' must be 2-D [T, K], got shape {tuple(x.shape)}")
    if weight.dim() != 3:
        raise ValueError(f"fp8_grouped_linear: argument 'weight' must be 3-D [E, N, K], got shape {tuple(weight.shape)}")
    # The GEMMs read the offsets on the host: a device offs is copied over once here, not in each of the three.
    call = tensorwise_grouped_call(offs.cpu(), x.dtype, weight_in_out)
    return GroupedLinearFunction.apply(x, weight, bias, call)


def group_sizes_of(offs: torch.Tensor) -> list[int]:
    """The groups' row counts from their cumulative ends `offs` (read on the host)."""
    ends = offs.tolist()
    return [end - start for start, end in zip([0, *ends[:-1]], ends)]


def meta_grouped_linear(meta, x2d: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                        offs: torch.Tensor, sizes: list[int] | None, weight_in_out: bool, ran_before: bool):
    """The FP8 grouped linear of an FP8 module (fp8mp.nn.GroupedLinear, the transformers experts' projections)
    under the recipe its Fp8Meta `meta` is configured with, inside that module's run_fp8 (the caller holds
    `meta.lock()`): the quantizer's grouped call reads and writes the meta's scaling state as its family does.
    sizes: the groups' row counts, or None to read them from offs. ran_before: the module already ran in the
    innermost fp8_autocast context.
    """
    offs = offs.cpu()  # the GEMMs read it on the host (one copy of a device offs, not one a GEMM)
    sizes = group_sizes_of(offs) if sizes is None else sizes
    quantizer = meta.quantizer
    call = quantizer.begin_grouped(meta, x2d, offs, sizes, autocast_state.get_fp8_group(), ran_before,
                                   output_dtype(x2d), weight_in_out)
    out = GroupedLinearFunction.apply(x2d, weight, bias, call)
    quantizer.finish_forward(meta)
    return out
