"""The per-tensor family's grouped linear call (`PerTensorGroupedCall`): a mixture-of-experts layer's tokens and
gradient with one scale each, every expert's weight with a current scale of its own.

The three GEMMs are fp8mp.ops.grouped_gemm's, per-tensor scaled (``b_scale_inv`` [E], one scale per expert):

    fprop: y  = fp8_grouped_gemm(x [T, K], W [E, N, K])          E4M3 x E4M3
    dgrad: dx = fp8_grouped_gemm(dy [T, N], W^T [E, K, N])       backward format x E4M3
    wgrad: dW = fp8_grouped_gemm_wgrad(dy.T [N, T], x.T [K, T])  [E, N, K]

The token and gradient casts give their transposes from the same read (cast_to_fp8_transpose), as a linear
call's do. Each expert's weight is cast with a current scale from its own amax under every per-tensor recipe (a
rarely routed expert keeps its own range), both layouts from one read of the expert (`cast_per_expert`); a
weight stored [E, K, N] (``weight_in_out``: gpt-oss's experts, y = x @ W_g) is cast in its own layout, which is
dgrad's operand, its per-expert transpose fprop's, and wgrad computes dW [E, K, N] = x.T @ dy.

With an Fp8Meta (`PerTensorQuantizer.begin_grouped`) the tokens and the gradient are cast with the meta's INPUT
and GRAD scales (current scaling sets them from the tensor, delayed scaling from the amax history), the casts
write their amaxes there, folded into step_amax for LossScaler's non-finite check, the gradient's under the
module's lock; the meta's WEIGHT column holds the largest expert amax and its scale. Without one
(`tensorwise_grouped_call`, fp8mp's functional fp8_grouped_linear) the tokens and the gradient are scaled from
their own amax in the HYBRID formats and nothing is recorded.
"""
from __future__ import annotations

import contextlib

import torch

from fp8mp.ops.cast import cast_to_fp8, cast_to_fp8_transpose
from fp8mp.ops.format import FP8_DTYPES
from fp8mp.ops.grouped_gemm import fp8_grouped_gemm, fp8_grouped_gemm_wgrad
from fp8mp.ops.operand import Fp8Operand
from fp8mp.scaling.columns import GRAD, INPUT, WEIGHT, columns_of, fold_amax_, tensor_amax
from fp8mp.scaling.current_scale import current_scale

__all__ = ["PerTensorGroupedCall", "tensorwise_grouped_call", "cast_per_expert"]

_NO_LOCK = contextlib.nullcontext()
HYBRID_FORMATS = ("e4m3", "e5m2")  # the functional form's: E4M3 forward, E5M2 gradients


def cast_tensorwise_transpose(t: torch.Tensor, fmt: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(t in fmt, its transpose, scale_inv [1]) for a 2-D `t`, the scale from t's own amax."""
    scale = current_scale(tensor_amax(t), fmt)
    data, data_t = cast_to_fp8_transpose(t, scale, torch.zeros(1, device=t.device), fmt)
    return data, data_t, scale.reciprocal()


def cast_per_expert(weight: torch.Tensor, fmt: str, margin: int = 0
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(weight [E, a, b] in fmt with one scale per expert, its per-expert transpose [E, b, a], scale_inv [E], amax [E]).

    Expert e is cast_to_fp8_transpose(weight[e], scale[e]): one read of each expert writes both layouts, with the
    cast op's arithmetic (fp32 product, round to nearest even, saturation, NaN pinned), so the dgrad operand
    needs no transpose of its own. One op call per expert: a few microseconds each, where casting all experts at
    once with torch's elementwise ops took five passes and three float32 temporaries of the whole weight."""
    experts = weight.shape[0]
    weight = weight.detach()
    # Each expert's amax from the cast op's own pass (with scale 1; those codes are dropped): on the CPU a fifth
    # of the time of torch's abs().amax() over a bf16 weight, which makes a bf16 copy first.
    amax = torch.zeros(experts, dtype=torch.float32, device=weight.device)
    unit_scale = torch.ones(1, dtype=torch.float32, device=weight.device)
    for e in range(experts):
        cast_to_fp8(weight[e], unit_scale, amax[e:e + 1], fmt)
    scale = current_scale(amax, fmt, margin)
    scratch_amax = torch.empty(1, dtype=torch.float32, device=weight.device)
    data = torch.empty(weight.shape, dtype=FP8_DTYPES[fmt], device=weight.device)
    data_t = torch.empty((experts, *weight.shape[:0:-1]), dtype=FP8_DTYPES[fmt], device=weight.device)
    for e in range(experts):  # copies, not torch.stack: autocast refuses to promote float8 operands
        cast, cast_t = cast_to_fp8_transpose(weight[e], scale[e:e + 1], scratch_amax, fmt)
        data[e].copy_(cast)
        data_t[e].copy_(cast_t)
    return data, data_t, scale.reciprocal(), amax


class PerTensorGroupedCall:
    """One FP8 grouped linear call under a per-tensor recipe (the interface: fp8mp/functions/grouped_linear.py).

    offs: [E] int32 cumulative row ends on the host; formats, fast_accum, margin: the recipe's (margin for the
    experts' scales); buffers: the module's Fp8Meta.forward_buffers(), or None (tokens and gradient scaled from
    their own amax, nothing recorded); columns: Fp8Meta.columns() or None (sliced here); grad_scale_fn: what
    prepare_forward_scales returned; lock: Fp8Meta.backward_lock(), held around the gradient's scale update and
    cast (None: none).
    """

    def __init__(self, offs, formats, fast_accum, margin, out_dtype, weight_in_out, buffers=None, columns=None,
                 grad_scale_fn=None, lock=None):
        self.offs, self.formats, self.fast_accum, self.margin = offs, formats, fast_accum, margin
        self.out_dtype, self.weight_in_out = out_dtype, weight_in_out
        self.buffers, self.grad_scale_fn, self.lock = buffers, grad_scale_fn, lock
        self.cols = None if buffers is None else columns if columns is not None else columns_of(*buffers)

    def quantize_tokens(self, x2d: torch.Tensor) -> tuple[Fp8Operand, Fp8Operand]:
        cols = self.cols
        if cols is None:
            x_fp8, x_fp8_t, x_scale_inv = cast_tensorwise_transpose(x2d, self.formats[0])
        else:
            x_fp8, x_fp8_t = cast_to_fp8_transpose(x2d, cols.scale[INPUT], cols.amax[INPUT], self.formats[0])
            x_scale_inv = cols.scale_inv[INPUT].clone()  # backward decodes with this cast's scale
        return Fp8Operand(x_fp8, x_scale_inv), Fp8Operand(x_fp8_t, x_scale_inv)

    def quantize_experts(self, weight: torch.Tensor) -> tuple[Fp8Operand, Fp8Operand]:
        fmt = self.formats[0]
        w_fp8, w_fp8_t, w_scale_inv, w_amax = cast_per_expert(weight, fmt, self.margin)
        cols = self.cols
        if cols is not None:  # the WEIGHT column: the largest expert amax and its scale (NaN-propagating max)
            cols.amax[WEIGHT].copy_(w_amax.max().reshape(1))
            weight_scale = current_scale(cols.amax[WEIGHT], fmt, self.margin)
            cols.scale[WEIGHT].copy_(weight_scale)
            cols.scale_inv[WEIGHT].copy_(weight_scale.reciprocal())
        # fprop takes [E, N, K]; dgrad [E, K, N]: the cast is one of them, its per-expert transpose the other.
        fprop_w, dgrad_w = (w_fp8_t, w_fp8) if self.weight_in_out else (w_fp8, w_fp8_t)
        return Fp8Operand(fprop_w, w_scale_inv), Fp8Operand(dgrad_w, w_scale_inv)

    def record_forward(self) -> None:
        """Fold the INPUT and WEIGHT amaxes this forward wrote into step_amax."""
        if self.buffers is not None and self.buffers[3] is not None:
            fold_amax_(self.cols.step_amax_head[WEIGHT + 1], self.cols.amax_head[WEIGHT + 1])

    def quantize_grad(self, grad_out: torch.Tensor, need_dgrad: bool, need_wgrad: bool
                      ) -> tuple[Fp8Operand, Fp8Operand]:
        cols, fmt = self.cols, self.formats[1]
        if cols is None:
            g_fp8, g_fp8_t, g_scale_inv = cast_tensorwise_transpose(grad_out, fmt)
        else:
            with self.lock if self.lock is not None else _NO_LOCK:
                if self.grad_scale_fn is not None:
                    self.grad_scale_fn(grad_out)
                g_fp8, g_fp8_t = cast_to_fp8_transpose(grad_out, cols.scale[GRAD], cols.amax[GRAD], fmt)
                g_scale_inv = cols.scale_inv[GRAD].clone()
                if self.buffers[3] is not None:
                    fold_amax_(cols.step_amax[GRAD], cols.amax[GRAD])
        return Fp8Operand(g_fp8, g_scale_inv), Fp8Operand(g_fp8_t, g_scale_inv)

    def grouped_gemm(self, a: Fp8Operand, b: Fp8Operand, bias, out_dtype: torch.dtype, gemm: int) -> torch.Tensor:
        return fp8_grouped_gemm(a.data, a.scale_inv, b.data, b.scale_inv, self.offs, bias, out_dtype,
                                self.fast_accum[gemm])

    def weight_grad(self, g_t_q: Fp8Operand, x_t_q: Fp8Operand, out_dtype: torch.dtype) -> torch.Tensor:
        a, b = (x_t_q, g_t_q) if self.weight_in_out else (g_t_q, x_t_q)  # dW [E,K,N] = x.T @ dy; [E,N,K] = dy.T @ x
        return fp8_grouped_gemm_wgrad(a.data, a.scale_inv, b.data, b.scale_inv, self.offs, out_dtype,
                                      self.fast_accum[2])


def tensorwise_grouped_call(offs: torch.Tensor, out_dtype: torch.dtype, weight_in_out: bool) -> PerTensorGroupedCall:
    """The call of fp8mp's functional fp8_grouped_linear: no Fp8Meta, each tensor scaled from its own amax (the
    experts' weights one scale each, margin 0), HYBRID formats, no fast accumulation."""
    return PerTensorGroupedCall(offs, HYBRID_FORMATS, (False, False, False), 0, out_dtype, weight_in_out)
