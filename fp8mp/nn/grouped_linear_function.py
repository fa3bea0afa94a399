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

from fp8mp.nn.block_linear_function import block_k_of
from fp8mp.nn.fp8_frozen_weight import Fp8FrozenWeight
from fp8mp.nn.fp8_linear_function import Fp8LinearOptions, linear_options
from fp8mp.nn.output_dtype import output_dtype
from fp8mp.ops.blockwise import block_quantize, block_quantize_transpose
from fp8mp.ops.cast import cast_to_fp8, cast_to_fp8_transpose
from fp8mp.ops.format import FP8_DTYPES, fp8_max_of
from fp8mp.ops.grouped_gemm import (block_scaled_grouped_gemm, block_scaled_grouped_gemm_wgrad, fp8_grouped_gemm,
                                    fp8_grouped_gemm_wgrad)
from fp8mp.ops.scale_update import compute_scale
from fp8mp.scaling import autocast as autocast_state
from fp8mp.scaling.fp8_meta import GRAD, INPUT, WEIGHT, Fp8Meta, columns_of, fold_amax_
from fp8mp.scaling.recipe import BlockRecipe

FORWARD_FORMAT, BACKWARD_FORMAT = "e4m3", "e5m2"


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


def cast_per_expert(weight: torch.Tensor, fmt: str, margin: int = 0
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(weight [E, a, b] in fmt with one scale per expert, its per-expert transpose [E, b, a], scale_inv [E], amax [E]).

    Expert e is cast_to_fp8_transpose(weight[e], scale[e]): one read of each expert writes both layouts, with the
    cast op's arithmetic (fp32 product, round to nearest even, saturation, NaN pinned), so the dgrad operand
    needs no transpose of its own. One op call per expert: a few microseconds each, where casting all experts at
    once with torch's elementwise ops took five passes and three float32 temporaries of the whole weight."""
    experts = weight.shape[0]
    weight = weight.detach()
    if isinstance(weight, Fp8FrozenWeight):  # decoded once here, not once per expert's slice below
        weight = weight.decode()
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


def transpose_experts(t: torch.Tensor) -> torch.Tensor:
    """[E, a, b] -> contiguous [E, b, a] (FP8 codes moved as bytes)."""
    return t.view(torch.uint8).transpose(1, 2).contiguous().view(t.dtype)


def group_sums(t: torch.Tensor, offs: torch.Tensor) -> torch.Tensor:
    """[E, N] float32: the sum of t's rows of each group (zeros for an empty group), in a fixed order. `offs` may
    lie on the CPU beside a CUDA `t` (its lengths are copied over without waiting on the device)."""
    lengths = torch.diff(offs.long(), prepend=offs.new_zeros(1, dtype=torch.long)).to(t.device, non_blocking=True)
    return torch.segment_reduce(t.float(), "sum", lengths=lengths, axis=0, initial=0)


def _save_dtypes(ctx, x, weight, bias) -> None:
    """The dtypes of the gradients backward returns: x's, weight's and bias's (None without a bias)."""
    ctx.x_dtype, ctx.w_dtype = x.dtype, weight.dtype
    ctx.bias_dtype = bias.dtype if bias is not None else None


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
        w_fp8, w_fp8_t, w_scale_inv, w_amax = cast_per_expert(weight, formats[0], margin)
        if cols is not None:  # the WEIGHT column: the largest expert amax and its scale (NaN-propagating max)
            cols.amax[WEIGHT].copy_(w_amax.max().reshape(1))
            weight_scale = current_scale(cols.amax[WEIGHT], formats[0], margin)
            cols.scale[WEIGHT].copy_(weight_scale)
            cols.scale_inv[WEIGHT].copy_(weight_scale.reciprocal())
            if meta_buffers[3] is not None:
                fold_amax_(cols.step_amax_head[WEIGHT + 1], cols.amax_head[WEIGHT + 1])
        # fprop takes [E, N, K]; dgrad [E, K, N]: the cast is one of them, its per-expert transpose the other.
        fprop_w, dgrad_w = (w_fp8_t, w_fp8) if weight_in_out else (w_fp8, w_fp8_t)
        del w_fp8, w_fp8_t
        out_bias = bias.to(out_dtype) if bias is not None else None
        # The GEMMs read the offsets on the host: a device offs is copied over once here, not in each of the three.
        offs = offs.cpu()
        out = fp8_grouped_gemm(x_fp8, x_scale_inv, fprop_w, w_scale_inv, offs, out_bias, out_dtype, fast_accum[0])
        ctx.save_for_backward(x_fp8_t, x_scale_inv, dgrad_w, w_scale_inv, offs)
        ctx.weight_in_out = weight_in_out
        ctx.meta_buffers, ctx.options, ctx.formats, ctx.fast_accum = meta_buffers, options, formats, fast_accum
        _save_dtypes(ctx, x, weight, bias)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        x_fp8_t, x_scale_inv, dgrad_w, w_scale_inv, offs = ctx.saved_tensors
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
    return Fp8GroupedLinearFunction.apply(x, weight, bias, offs, weight_in_out)


# ----------------------------------------------------------------------------- the fine-grained recipes
#
# Under RowwiseScaling, BlockScaling and MXFP8Scaling each group is computed exactly as fp8mp.nn.Linear's block
# path (block_linear_function) computes it on that group alone. Blocks along K or N (fprop's x and W, dgrad's dy and
# W.T) lie within one token row or one expert, so the whole x and dy are quantized by one call and the experts'
# weights by one call. The blocks along the tokens (wgrad's x.T and dy.T) must not straddle two groups: under
# BlockScaling (1 x 128) and MXFP8 (1 x 32) every group is zero-padded to a multiple of the block, so one
# block_quantize_transpose of the padded tokens gives each group its own blocks (a partial block's scale and
# codes are those of its elements alone: an edge tile is scaled as if zero-padded), and the padding columns are
# dropped again; under RowwiseScaling the block is the whole group, and each group's columns are quantized by a
# call of their own (one block_quantize per non-empty group).


def _token_layout(sizes: list[int], block: int, device) -> tuple[torch.Tensor | None, int]:
    """(rows of the real tokens in the per-group zero-padded layout, its row count), each group padded to a
    multiple of `block`; (None, T) where no group needs padding."""
    padded = [-(-size // block) * block for size in sizes]
    if padded == sizes:
        return None, sum(sizes)
    starts = torch.tensor([0, *padded[:-1]], dtype=torch.int64).cumsum(0)
    rows = torch.cat([torch.arange(size, dtype=torch.int64) + start for size, start in zip(sizes, starts.tolist())])
    return rows.to(device), sum(padded)


def quantize_tokens(t: torch.Tensor, sizes: list[int], recipe: BlockRecipe, fmt: str, need_rows: bool = True,
                    need_columns: bool = True):
    """(rows, columns, t_block) of a [T, C] token tensor whose rows are sorted in groups of `sizes`:

    rows: (data [T, C], scale_inv [T, ceil(C / c_block)], c_block), t along C in 1 x c_block tiles (fprop's x,
        dgrad's dy); columns: (data_t [C, T], scale_inv_t [C, chunks], t_block), t.T along the tokens in
        1 x t_block tiles from each group's first token (wgrad's x.T and dy.T), block_scaled_grouped_gemm_wgrad's
        layout; t_block the wgrad's block_k (rowwise: max(T, 1), one chunk per non-empty group). Either is None
        where not needed.
    """
    tokens, cols = t.shape
    c_block = block_k_of(recipe, cols)
    rows = columns = None
    if recipe.block_k is None:  # rowwise: one block per group along the tokens
        if need_rows:
            rows = (*block_quantize(t, 1, c_block, fmt, recipe.quantize_mode), c_block)
        if need_columns:
            parts = [block_quantize(part.t(), 1, part.shape[0], fmt, recipe.quantize_mode)
                     for part in torch.split(t, sizes) if part.shape[0]]
            data_t = torch.cat([p[0] for p in parts], 1) if parts else t.new_empty((cols, 0), dtype=FP8_DTYPES[fmt])
            scale_t = torch.cat([p[1] for p in parts], 1) if parts else t.new_empty((cols, 0), dtype=torch.float32)
            columns = (data_t, scale_t, max(tokens, 1))
        return rows, columns
    t_block = recipe.block_k
    if not need_columns:
        return (*block_quantize(t, 1, c_block, fmt, recipe.quantize_mode), c_block), None
    real_rows, padded_tokens = _token_layout(sizes, t_block, t.device)
    padded = t if real_rows is None else t.new_zeros((padded_tokens, cols)).index_copy_(0, real_rows, t)
    data, scale_inv, data_t, scale_inv_t = block_quantize_transpose(padded, c_block, t_block, fmt,
                                                                    recipe.quantize_mode)
    if real_rows is not None:
        data, scale_inv, data_t = data[real_rows], scale_inv[real_rows], data_t[:, real_rows]
    return ((data, scale_inv, c_block) if need_rows else None), (data_t, scale_inv_t, t_block)


def quantize_experts(w_nk: torch.Tensor, recipe: BlockRecipe, fmt: str):
    """(w, w_t) of the experts' weights w_nk [E, N, K] (any strides): each expert as quantize_weight quantizes it.

    w: (data [E, N, K], scale_inv [E, ceil(N / rows), ceil(K / k_block)], rows, k_block), fprop's operand;
    w_t: the same for W.T [E, K, N] along N, dgrad's operand (square blocks: w's bytes and scales transposed
    per expert, exact)."""
    experts, n, k = w_nk.shape
    block_rows, k_block = recipe.weight_block_rows, block_k_of(recipe, k)
    padded_n = -(-n // block_rows) * block_rows  # expert matrices padded to whole row blocks
    w = w_nk if padded_n == n else torch.nn.functional.pad(w_nk, (0, 0, 0, padded_n - n))
    data, scale_inv = block_quantize(w.reshape(experts * padded_n, k), block_rows, k_block, fmt,
                                     recipe.quantize_mode)
    data = data.view(experts, padded_n, k)[:, :n].contiguous() if padded_n != n else data.view(experts, n, k)
    w_q = (data, scale_inv.view(experts, padded_n // block_rows, -1), block_rows, k_block)
    if block_rows == recipe.block_k:  # square
        return w_q, (transpose_experts(data), w_q[1].transpose(1, 2).contiguous(), block_rows, k_block)
    n_block = block_k_of(recipe, n)
    data_t, scale_inv_t = block_quantize(w_nk.transpose(1, 2).reshape(experts * k, n), 1, n_block, fmt,
                                         recipe.quantize_mode)
    return w_q, (data_t.view(experts, k, n), scale_inv_t.view(experts, k, -1), 1, n_block)


def _grouped_gemm(a, b, offs, out_dtype, bias=None):
    """block_scaled_grouped_gemm of quantize_tokens' rows and a quantize_experts result (the same block_k)."""
    (a_data, a_scale, _), (b_data, b_scale, b_rows, block_k) = a, b
    return block_scaled_grouped_gemm(a_data, a_scale, b_data, b_scale, offs, b_rows, block_k, bias, out_dtype)


class BlockGroupedLinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, offs, sizes, recipe, formats, weight_in_out=False, out_dtype=None):
        """x [T, K] rows sorted by expert in groups of `sizes` (host ints; `offs` [E] int32 their cumulative ends
        on x's device); weight [E, N, K] ([E, K, N] with weight_in_out); bias [E, N] or None; formats (forward,
        backward) op format strings. Returns [T, N] of out_dtype (None: x's)."""
        out_dtype = x.dtype if out_dtype is None else out_dtype
        w_nk = weight.transpose(1, 2) if weight_in_out else weight
        x_q, x_t_q = quantize_tokens(x, sizes, recipe, formats[0])
        w_q, w_t_q = quantize_experts(w_nk, recipe, formats[0])
        out = _grouped_gemm(x_q, w_q, offs, out_dtype, bias.to(out_dtype) if bias is not None else None)
        ctx.save_for_backward(x_t_q[0], x_t_q[1], w_t_q[0], w_t_q[1], offs)
        ctx.blocks = (x_t_q[2], w_t_q[2:])
        ctx.sizes, ctx.recipe, ctx.backward_format, ctx.weight_in_out = sizes, recipe, formats[1], weight_in_out
        _save_dtypes(ctx, x, weight, bias)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        need_dgrad, need_wgrad = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        g_q, g_t_q = quantize_tokens(grad_out.contiguous(), ctx.sizes, ctx.recipe, ctx.backward_format, need_dgrad,
                                     need_wgrad)
        x_t_data, x_t_scale, w_t_data, w_t_scale, offs = ctx.saved_tensors
        grad_x = grad_w = grad_b = None
        if need_dgrad:
            grad_x = _grouped_gemm(g_q, (w_t_data, w_t_scale, *ctx.blocks[1]), offs, ctx.x_dtype)
        if need_wgrad:  # dW [E, N, K] = dy.T @ x per expert; gpt-oss's [E, K, N] is its per-expert transpose
            grad_w = block_scaled_grouped_gemm_wgrad(g_t_q[0], g_t_q[1], x_t_data, x_t_scale, offs, ctx.blocks[0],
                                                     ctx.w_dtype)
            if ctx.weight_in_out:
                grad_w = grad_w.transpose(1, 2)
        if ctx.bias_dtype is not None and ctx.needs_input_grad[2]:
            grad_b = group_sums(grad_out, offs).to(ctx.bias_dtype)
        return grad_x, grad_w, grad_b, None, None, None, None, None, None


def group_sizes_of(offs: torch.Tensor) -> list[int]:
    """The groups' row counts from their cumulative ends `offs` (read on the host)."""
    ends = offs.tolist()
    return [end - start for start, end in zip([0, *ends[:-1]], ends)]


def meta_grouped_linear(meta: Fp8Meta, x2d: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                        offs: torch.Tensor, sizes: list[int] | None, weight_in_out: bool, ran_before: bool):
    """The FP8 grouped linear of an FP8 module (fp8mp.nn.GroupedLinear, the transformers experts' projections)
    under its meta's recipe, inside that module's run_fp8: the per-tensor recipes through Fp8GroupedLinearFunction
    with the meta's scales (its casts recording amaxes and non-finite values there), the fine-grained ones through
    BlockGroupedLinearFunction (nothing read from or written to the meta, as fp8mp.nn.Linear's block path).
    sizes: the groups' row counts, or None to read them from offs (the fine-grained recipes need them on the host).
    """
    recipe = meta.recipe
    if isinstance(recipe, BlockRecipe):
        formats = (meta.format_of(INPUT), meta.format_of(GRAD))
        offs = offs.cpu()  # the GEMMs read it on the host (one copy of a device offs, not one a GEMM)
        sizes = group_sizes_of(offs) if sizes is None else sizes
        return BlockGroupedLinearFunction.apply(x2d, weight, bias, offs, sizes, recipe, formats, weight_in_out,
                                                output_dtype(x2d))
    grad_scale_fn = meta.prepare_forward_scales(x2d, None, autocast_state.get_fp8_group(), ran_before)
    options = linear_options(meta, grad_scale_fn, output_dtype(x2d))
    out = Fp8GroupedLinearFunction.apply(x2d, weight, bias, offs, weight_in_out, meta.forward_buffers(), options,
                                         recipe.margin)
    meta.mark_initialized()
    return out
