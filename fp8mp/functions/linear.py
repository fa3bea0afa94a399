"""The FP8 linear autograd function: three FP8 GEMMs (fprop, dgrad, wgrad), under every recipe.

    fprop: y  = x  @ W.T     a = x    [M,K], b = W    [N,K]
    dgrad: dx = dy @ W       a = dy   [M,N], b = W.T  [K,N]
    wgrad: dW = dy.T @ x     a = dy.T [N,M], b = x.T  [K,M]

(`operand_gemm(a, b)` computes a @ b.T with both operands K-major, the layout FP8 tensor cores take.) What
each tensor becomes is the call's business (`Quantizer.begin_linear`, fp8mp/scaling/quantizer.py): one scale
per tensor from the module's Fp8Meta, or one per block along each GEMM's K; this function only routes the
operands between the GEMMs, so it never asks which recipe is in use.

Forward quantizes the input for fprop and, from the same read, x.T for wgrad (saved in FP8 for backward), and
the weight for fprop only. Backward does not keep an FP8 copy of the weight: it saves the weight itself (a
parameter, alive anyway) and what the call needs to quantize it again with forward's very bits for dgrad; that
costs one read of the weight per backward and saves one byte per weight element held from forward to backward
(on a 110M-parameter Llama, 81 of the 1249 MiB a memory-lean step holds: benchmarks/bench_train_memory.py).

A weight already in FP8 (`stored`: a weight stored by fp8mp.fp8_model_init, a frozen FP8 weight, a weight
FSDP2 gathered in FP8; fp8mp/quantized/) is not quantized: fprop uses its operand, dgrad its dgrad operand (or
fprop's transposed), and `weight` is only the leaf that receives the weight gradient (or None).

A weight stored [K,N] (`weight_in_out`: transformers' Conv1D, y = x @ W) is quantized by the call in its own
layout, which makes its gradient [K,N] too.

When the weight is stepped in backward in row blocks (fp8mp.step_in_backward; fp8mp/optim/row_block_grads.py),
wgrad runs a block of output rows at a time (a row block of dy.T against x.T), each block handed to the
optimizer at once, and no weight gradient is returned. Not for a [K,N] weight or a weight already in FP8.
"""
from __future__ import annotations

import torch

from fp8mp.functions.output_dtype import output_dtype
from fp8mp.ops.format import HIGH_PRECISION_DTYPES
from fp8mp.ops.operand import Fp8Operand, operand_gemm
from fp8mp.optim.row_block_grads import referenced, sink_of, weight_ref_for_row_blocks
from fp8mp.quantized.weight_operands import StoredOperands

__all__ = ["LinearFunction", "fp8_linear", "fp8_linear_gathered", "check_input"]

class LinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x2d, weight, bias, stored: StoredOperands | None, fp8_input, call):
        """x2d [M,K]; weight [N,K] ([K,N] with call.weight_in_out), or the gradient leaf of a stored weight (or
        None); bias [N] or None.

        stored: None, or the StoredOperands of a weight already in FP8 (fp8mp/quantized/weight_operands.py).
        fp8_input: None, or (x_q, x_t_q), the input already quantized by the call (a fused norm, a gather of
        shards); `x2d` then only routes the input gradient.
        call: the call object of the module's quantizer (Quantizer.begin_linear).
        """
        x_q, x_t_q = call.quantize_input(x2d) if fp8_input is None else fp8_input
        if stored is None:
            w_q, w_saved = call.quantize_weight(weight)
            ctx.save_for_backward(x_t_q.data, x_t_q.scale_inv, weight, *w_saved)
        else:  # backward uses the dgrad operand as it is, or fprop's transposed (the stored tensors: no new bytes)
            w_q, w_t_q, _ = stored
            w_saved = w_q if w_t_q is None else w_t_q
            ctx.save_for_backward(x_t_q.data, x_t_q.scale_inv, w_saved.data, w_saved.scale_inv)
            ctx.w_blocks, ctx.transpose_weight = w_saved[2:], w_t_q is None
        call.record_forward(stored is None or stored.weight_amax_recorded)
        out_bias = bias.to(call.out_dtype) if bias is not None else None
        out = operand_gemm(x_q, w_q, out_bias, call.out_dtype, call.fast_accum[0])
        ctx.call, ctx.stored, ctx.x_blocks = call, stored is not None, x_t_q[2:]
        ctx.x_dtype, ctx.w_dtype = x2d.dtype, weight.dtype if weight is not None else None
        ctx.weight_ref = weight_ref_for_row_blocks(weight) if stored is None and not call.weight_in_out else None
        ctx.bias_dtype = bias.dtype if bias is not None else None
        return out

    @staticmethod
    def backward(ctx, grad_out):
        x_t_data, x_t_scale_inv, *w_saved = ctx.saved_tensors
        x_t_q = Fp8Operand(x_t_data, x_t_scale_inv, *ctx.x_blocks)
        call = ctx.call
        need_dgrad, need_wgrad = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        want_dbias = ctx.bias_dtype is not None and ctx.needs_input_grad[2]
        w_t_q = None
        if need_dgrad and not ctx.stored:  # forward's quantization again: same weight, same bits
            w_t_q = call.quantize_weight_again(w_saved[0], tuple(w_saved[1:]))
        elif need_dgrad:
            w_t_q = Fp8Operand(*w_saved, *ctx.w_blocks)
            w_t_q = w_t_q.transposed() if ctx.transpose_weight else w_t_q
        g_q, g_t_q, dbias = call.quantize_grad(grad_out.contiguous(), need_dgrad, need_wgrad, want_dbias)
        grad_x = grad_w = grad_b = None
        if need_dgrad:
            grad_x = operand_gemm(g_q, w_t_q, None, ctx.x_dtype, call.fast_accum[1])
        if need_wgrad and (sink := sink_of(param := referenced(ctx.weight_ref))) is not None:
            block = sink.block_rows(param)  # dW's rows [start, start + block) = dy.T's rows @ x, one block at a time
            for start in range(0, g_t_q.data.shape[0], block):
                sink.take_rows(param, start, operand_gemm(g_t_q.rows(start, start + block), x_t_q, None, ctx.w_dtype,
                                                          call.fast_accum[2]))
        elif need_wgrad:
            grad_w = call.weight_grad(g_t_q, x_t_q, ctx.w_dtype)
        if want_dbias:
            grad_b = dbias.to(ctx.bias_dtype)
        return grad_x, grad_w, grad_b, None, None, None


def fp8_linear(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, meta,
               stored: StoredOperands | None = None, group=None, ran_before: bool = False,
               weight_in_out: bool = False) -> torch.Tensor:
    """y = x @ weight.T + bias in FP8 under the recipe `meta` (the module's Fp8Meta) is configured with, for x of
    shape [..., K]. The caller holds `meta.lock()`.

    stored: the StoredOperands of a weight already in FP8 (fp8mp/quantized/); `weight` then
    only receives the weight gradient (it may be None).
    group: fp8_autocast's fp8_group (None: no reduction); ran_before: the module already ran in this context
    (delayed scaling then reduces its last amaxes first). weight_in_out: `weight` is [K,N] (Conv1D's layout).
    """
    x2d = x.reshape(-1, x.shape[-1])
    quantizer = meta.quantizer
    call = quantizer.begin_linear(meta, x2d, weight if stored is None else None, group, ran_before, output_dtype(x),
                                  weight_in_out)
    out = LinearFunction.apply(x2d, weight, bias, stored, None, call)
    quantizer.finish_forward(meta)
    return out.reshape(*x.shape[:-1], out.shape[-1])


def fp8_linear_gathered(x_shard: torch.Tensor, gather, weight: torch.Tensor, bias: torch.Tensor | None, meta,
                        group=None, ran_before: bool = False) -> torch.Tensor:
    """y = X @ weight.T + bias [M, N], X [M, K] the rows every rank's `x_shard` [..., K] make together (sequence
    parallel), gathered in FP8: this rank's shard is cast with the INPUT scale every rank shares (its amax, like
    fp8_linear's, reduced over `group`), and `gather(codes)` returns (X's codes [M, K], route), route [M, K] the
    tensor standing for X in autograd, whose gradient it hands back to the shards. The cast is elementwise with
    one scale, so the gathered codes are those of casting X itself: per-tensor recipes only (the caller checks).
    The caller holds `meta.lock()`.
    """
    x2d = x_shard.reshape(-1, x_shard.shape[-1])
    quantizer = meta.quantizer
    call = quantizer.begin_linear(meta, x2d, weight, group, ran_before, output_dtype(x_shard))
    x_fp8, route = gather(call.cast_input(x2d.contiguous()))
    x_fp8_t = x_fp8.view(torch.uint8).t().contiguous().view(x_fp8.dtype)  # (a byte transpose: wgrad's operand)
    out = LinearFunction.apply(route, weight, bias, None, call.input_operands(x_fp8, x_fp8_t), call)
    quantizer.finish_forward(meta)
    return out


def check_input(module: str, input: torch.Tensor, in_features: int, weight: torch.Tensor) -> None:
    """The argument checks of an FP8 linear module's forward; `module` names it in the messages."""
    if input.dim() == 0 or input.shape[-1] != in_features:
        raise ValueError(f"{module}: argument 'input' must have last dimension {in_features}, got shape {tuple(input.shape)}")
    if input.dtype not in HIGH_PRECISION_DTYPES:
        raise TypeError(f"{module}: argument 'input' must be float32, bfloat16 or float16, got {input.dtype}")
    if input.device != weight.device:
        raise RuntimeError(f"{module}: argument 'input' is on {input.device} but the weight is on {weight.device}")
