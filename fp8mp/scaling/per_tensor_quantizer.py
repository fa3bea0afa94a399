"""The per-tensor family (DelayedScaling, CurrentScaling): one scale per tensor, kept in the module's Fp8Meta.

The scale policy, one method per moment of a step:

- `prepare_forward_scales` before a forward's casts. Delayed scaling: one update of every column's scale
  from the amax history (`update_amax_history_and_scale`), after reducing the amaxes across fp8_group when
  the module already ran in the context (its last amaxes were not reduced at the context's entry). Current
  scaling, and the first step of delayed scaling: the INPUT and WEIGHT scales from the tensors themselves,
  each amax reduced across the group; the GRAD scale from the gradient, when backward casts it.
- `prepare_gathered_weight_scale` before FSDP2 all-gathers a weight in FP8 (fp8mp/quantized/all_gather_weight.py).

`LinearCall` casts a linear call's tensors with the module's columns: the input with its transpose from one
read (`cast_to_fp8_transpose`), the weight in fprop's layout only (backward casts it again with the scale
forward used: same weight, same scale, same bits, and no FP8 copy of the weight lives until backward), the
output gradient with its transpose and, when a bias needs one, its column sums, under the module's lock.
Each cast writes its amax into the column; `step_amax` folds them for LossScaler's non-finite check.
"""
from __future__ import annotations

import contextlib
from typing import Callable

import torch

from fp8mp.ops.cast import cast_to_fp8, cast_to_fp8_transpose, cast_to_fp8_transpose_dbias
from fp8mp.ops.norm import layer_norm_fp8, rms_norm_fp8
from fp8mp.ops.operand import Fp8Operand, operand_gemm
from fp8mp.ops.scale_update import update_amax_history_and_scale
from fp8mp.scaling import autocast as autocast_state
from fp8mp.scaling import distributed
from fp8mp.scaling.current_scale import current_scale
from fp8mp.scaling.columns import GRAD, INPUT, WEIGHT, columns_of, fold_amax_, tensor_amax
from fp8mp.scaling.per_tensor_grouped import PerTensorGroupedCall
from fp8mp.scaling.quantizer import Quantizer
from fp8mp.scaling.recipe import gemm_fast_accum

__all__ = ["PerTensorQuantizer", "PerTensorLinearCall"]

_NO_LOCK = contextlib.nullcontext()


class PerTensorQuantizer(Quantizer):
    """DelayedScaling (`delayed=True`: scales from the amax history) or CurrentScaling (scales from the tensor)."""

    reduces_amaxes = True

    def __init__(self, recipe, delayed: bool):
        self.recipe = recipe
        self.delayed = delayed
        self.margin = recipe.margin
        self.formats = (recipe.fp8_format.forward_format, recipe.fp8_format.backward_format)
        self.fast_accum = gemm_fast_accum(recipe)
        self.amax_history_len = recipe.amax_history_len if delayed else None
        self.per_tensor_format = self.formats[0]

    # ------------------------------------------------------------------------------ the scale policy
    def scales_from_data(self, meta) -> bool:
        """True under current scaling, and on the first step of delayed scaling (nothing in the history yet)."""
        return not self.delayed or not meta.is_initialized()

    def prepare_forward_scales(self, meta, input: torch.Tensor | None, weight: torch.Tensor | None, group=None,
                               ran_before: bool = False) -> Callable[[torch.Tensor], None] | None:
        """Set the scales this forward's casts use (the caller holds `meta.lock()`); see the module docstring.
        `input` / `weight`: None for a tensor cast elsewhere (a fused norm's input, a stored FP8 weight). Returns
        what backward calls with the output gradient before its cast: None under delayed scaling, else a setter
        of the GRAD scale from the gradient."""
        if not self.scales_from_data(meta):
            prepared, meta._scales_prepared_in = meta._scales_prepared_in, None
            if prepared is not None and prepared is autocast_state.current_context():
                return None  # an FP8 all-gather of the weight updated the scales just before this forward
            self._update_delayed_scales(meta, group, ran_before)
            return None
        if input is not None:
            self.set_scale_from(meta, INPUT, input, group)
        if weight is not None:
            self.set_scale_from(meta, WEIGHT, weight, group)
        return lambda grad: self.set_scale_from(meta, GRAD, grad, group)

    def _update_delayed_scales(self, meta, group, ran_before: bool) -> None:
        if group is not None and ran_before:
            distributed.all_reduce_amax_(meta.amax, group)
        self.step_delayed_scaling(meta)

    def prepare_gathered_weight_scale(self, meta, weight_amax: Callable[[], torch.Tensor], group=None,
                                      ran_before: bool = False) -> torch.Tensor | None:
        """FP8 all-gather: set the WEIGHT scale before FSDP2 gathers the weight, before the module's forward (the
        caller holds `meta.lock()`, meta configured).

        Delayed scaling: the forward's whole scale update runs now instead, and the forward in the same
        fp8_autocast context skips it, so every column gets the scale it would have got. Current scaling (and
        delayed scaling's first step): the WEIGHT scale from `weight_amax()`, the whole weight's amax (the caller
        reduces the shards'); the INPUT and GRAD scales are left to the forward. Returns that whole amax, or None
        under delayed scaling (the cast then records its shard's amax, reduced at the next fp8_autocast entry).
        """
        if not self.scales_from_data(meta):
            self._update_delayed_scales(meta, group, ran_before)
            meta._scales_prepared_in = autocast_state.current_context()
            return None
        amax = weight_amax()
        self.set_scale_from_amax(meta, WEIGHT, amax)
        return amax

    def step_delayed_scaling(self, meta) -> None:
        """Push the last step's amaxes into the history and recompute every scale (one op call)."""
        assert self.delayed
        buffers = meta._buffers  # (not meta.amax etc.: five Module.__getattr__ calls per forward)
        update_amax_history_and_scale(buffers["amax"], buffers["amax_history"], buffers["scale"], buffers["scale_inv"],
                                      buffers["fp8_max"], self.margin, self.recipe.amax_compute_algo)

    def set_scale_from(self, meta, index: int, tensor: torch.Tensor, group=None) -> None:
        """Scale of column `index` from `tensor`'s own amax (an extra read of it), max-reduced over `group`
        (a ProcessGroup; None: this rank's amax alone) so every rank gets the same scale."""
        self.set_scale_from_amax(meta, index, tensor_amax(tensor), group)

    def set_scale_from_amax(self, meta, index: int, amax: torch.Tensor, group=None) -> None:
        """Scale of column `index` from `amax` ([1] float32), max-reduced over `group` first (in place)."""
        if group is not None:
            amax = distributed.all_reduce_amax_(amax, group)
        scale = meta.scale[index : index + 1]
        new_scale = current_scale(amax, meta.format_of(index), self.margin, scale)
        scale.copy_(new_scale)
        meta.scale_inv[index : index + 1].copy_(new_scale.reciprocal())

    # ------------------------------------------------------------------------------ calls
    def begin_linear(self, meta, x2d, weight, group, ran_before, out_dtype, weight_in_out=False):
        grad_scale_fn = self.prepare_forward_scales(meta, x2d, weight, group, ran_before)
        return PerTensorLinearCall(self, meta.forward_buffers(), meta.columns(), grad_scale_fn, meta.backward_lock(),
                                   out_dtype, weight_in_out)

    def begin_grouped(self, meta, x2d, offs, sizes, group, ran_before, out_dtype, weight_in_out=False):
        # No WEIGHT scale to prepare: each expert's weight takes a current scale of its own (per_tensor_grouped.py).
        grad_scale_fn = self.prepare_forward_scales(meta, x2d, None, group, ran_before)
        return PerTensorGroupedCall(offs, self.formats, self.fast_accum, self.margin, out_dtype, weight_in_out,
                                    meta.forward_buffers(), meta.columns(), grad_scale_fn, meta.backward_lock())

    def finish_forward(self, meta) -> None:
        meta.mark_initialized()

    def fuses_norm(self, meta, weight_stored: bool) -> bool:
        # The norm kernel casts with a scale set before it runs: delayed scaling from its second step on (current
        # scaling needs the norm output's amax first); a stored weight runs unfused.
        return self.delayed and meta.is_initialized() and not weight_stored


class PerTensorLinearCall:
    """One FP8 linear call under a per-tensor recipe (the interface: fp8mp/scaling/quantizer.py).

    buffers: the module's Fp8Meta.forward_buffers() (scale, scale_inv, amax, step_amax; step_amax None when the
    forward records no gradient); columns: Fp8Meta.columns() or None (sliced here: while torch.compile traces);
    grad_scale_fn: what prepare_forward_scales returned; lock: Fp8Meta.backward_lock(), held by backward around
    its scale update and cast (None while torch.compile traces). The buffers are state, read and written in
    place by backward: a module that runs twice in one step updates them between its forwards.
    """

    def __init__(self, quantizer: PerTensorQuantizer, buffers, columns, grad_scale_fn, lock, out_dtype, weight_in_out):
        self.quantizer, self.buffers, self.grad_scale_fn, self.lock = quantizer, buffers, grad_scale_fn, lock
        self.cols = columns if columns is not None else columns_of(*buffers)
        self.formats, self.fast_accum = quantizer.formats, quantizer.fast_accum
        self.out_dtype, self.weight_in_out = out_dtype, weight_in_out

    def quantize_input(self, x2d: torch.Tensor) -> tuple[Fp8Operand, Fp8Operand]:
        cols = self.cols
        x_fp8, x_fp8_t = cast_to_fp8_transpose(x2d, cols.scale[INPUT], cols.amax[INPUT], self.formats[0])
        return self.input_operands(x_fp8, x_fp8_t)

    def input_operands(self, x_fp8: torch.Tensor, x_fp8_t: torch.Tensor) -> tuple[Fp8Operand, Fp8Operand]:
        """The operands of codes cast with the INPUT scale (here, by a fused norm, or gathered from shards).
        Backward decodes with the scale of these casts whatever happens to the buffers meanwhile: a copy."""
        x_scale_inv = self.cols.scale_inv[INPUT].clone()
        return Fp8Operand(x_fp8, x_scale_inv), Fp8Operand(x_fp8_t, x_scale_inv)

    def cast_input(self, x2d: torch.Tensor) -> torch.Tensor:
        """x2d's codes alone (no transpose) with the INPUT scale, recording its amax: a shard to be gathered."""
        return cast_to_fp8(x2d, self.cols.scale[INPUT], self.cols.amax[INPUT], self.formats[0])

    def quantize_weight(self, weight: torch.Tensor) -> tuple[Fp8Operand, tuple[torch.Tensor, ...]]:
        cols = self.cols
        w_scale = cols.scale[WEIGHT].clone()  # backward casts the weight again with this very scale
        w_fp8 = self._cast_weight(weight, w_scale, cols.amax[WEIGHT], "fprop")
        w_scale_inv = cols.scale_inv[WEIGHT].clone()
        return Fp8Operand(w_fp8, w_scale_inv), (w_scale, w_scale_inv)

    def quantize_weight_again(self, weight: torch.Tensor, saved: tuple[torch.Tensor, ...]) -> Fp8Operand:
        w_scale, w_scale_inv = saved
        scratch_amax = torch.empty(1, dtype=torch.float32, device=weight.device)
        return Fp8Operand(self._cast_weight(weight, w_scale, scratch_amax, "dgrad"), w_scale_inv)

    def _cast_weight(self, weight, scale, amax, gemm: str) -> torch.Tensor:
        """The operand `gemm` ("fprop": [N,K], "dgrad": [K,N]) takes, cast from `weight` with `scale`. A weight
        stored [N,K] is fprop's operand as it is and dgrad's transposed; one stored [K,N] (weight_in_out) the
        other way round. A transposed operand comes from the fused cast-transpose, its other output dropped."""
        if (gemm == "fprop") != self.weight_in_out:
            return cast_to_fp8(weight, scale, amax, self.formats[0])
        return cast_to_fp8_transpose(weight, scale, amax, self.formats[0])[1]

    def quantize_norm(self, x2d, norm_weight, norm_bias, eps, zero_centered_gamma, is_layernorm):
        cols = self.cols
        if is_layernorm:
            y_fp8, mean, rstd = layer_norm_fp8(x2d, norm_weight, norm_bias, eps, cols.scale[INPUT], cols.amax[INPUT],
                                               self.formats[0], zero_centered_gamma=zero_centered_gamma)
        else:
            y_fp8, rstd = rms_norm_fp8(x2d, norm_weight, eps, cols.scale[INPUT], cols.amax[INPUT], self.formats[0],
                                       zero_centered_gamma=zero_centered_gamma)
            mean = None
        y_fp8_t = y_fp8.view(torch.uint8).t().contiguous().view(y_fp8.dtype)  # a byte transpose: exact
        return (y_fp8, y_fp8_t), (mean, rstd)

    def record_forward(self, weight_amax_written: bool) -> None:
        """Fold the amaxes this forward's casts wrote (INPUT, and WEIGHT when written) into step_amax."""
        if self.buffers[3] is not None:
            written = WEIGHT + 1 if weight_amax_written else INPUT + 1
            fold_amax_(self.cols.step_amax_head[written], self.cols.amax_head[written])

    def quantize_grad(self, grad_out, need_dgrad: bool, need_wgrad: bool, want_dbias: bool):
        cols = self.cols
        with self.lock if self.lock is not None else _NO_LOCK:
            if self.grad_scale_fn is not None:
                self.grad_scale_fn(grad_out)
            cast = cast_to_fp8_transpose_dbias if want_dbias else cast_to_fp8_transpose
            g_fp8, g_fp8_t, *dbias = cast(grad_out, cols.scale[GRAD], cols.amax[GRAD], self.formats[1])
            g_scale_inv = cols.scale_inv[GRAD].clone()
            if self.buffers[3] is not None:
                fold_amax_(cols.step_amax[GRAD], cols.amax[GRAD])
        return Fp8Operand(g_fp8, g_scale_inv), Fp8Operand(g_fp8_t, g_scale_inv), dbias[0] if dbias else None

    def weight_grad(self, g_t_q: Fp8Operand, x_t_q: Fp8Operand, out_dtype: torch.dtype) -> torch.Tensor:
        if self.weight_in_out:  # dW [K,N] = x.T @ dy
            return operand_gemm(x_t_q, g_t_q, None, out_dtype, self.fast_accum[2])
        return operand_gemm(g_t_q, x_t_q, None, out_dtype, self.fast_accum[2])  # dW [N,K] = dy.T @ x
