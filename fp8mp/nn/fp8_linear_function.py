"""The FP8 linear autograd function: three FP8 GEMMs (fprop, dgrad, wgrad).

Forward casts the input to the forward format together with its transpose (one
read), and the weight to fprop's layout only:

    fprop: y  = x  @ W.T     a = x    [M,K], b = W    [N,K]
    dgrad: dx = dy @ W       a = dy   [M,N], b = W.T  [K,N]
    wgrad: dW = dy.T @ x     a = dy.T [N,M], b = x.T  [K,M]

(`fp8_gemm(a, b)` computes a @ b.T with both operands K-major, the layout FP8
tensor cores take.)

Backward does not keep an FP8 copy of the weight: it saves the weight itself
(a parameter, alive anyway) and the scale forward cast it with, and casts it
again for dgrad. The cast is deterministic, so dgrad's operand has exactly the
bits forward's transpose had; what it costs is one read of the weight per
backward, what it saves is one byte per weight element held from forward to
backward (on a 110M-parameter Llama, 81 of the 1249 MiB a memory-lean step
holds: benchmarks/bench_train_memory.py).

A weight stored [K,N] (`weight_in_out=True`: transformers' Conv1D, y = x @ W) is
cast the other way round (fprop's [N,K] operand is its cast's transpose, dgrad's
[K,N] operand the cast itself), and wgrad computes dW = x.T @ dy as
fp8_gemm(x.T, dy.T). So no layout costs a transpose copy per step.

With a stored FP8 weight (`fp8mp.nn.Linear(..., fp8_weight=True)`, see
fp8mp/nn/fp8_weight.py) the weight is not cast: fprop uses the stored FP8 tensor
and its scale_inv, backward transposes it, and `weight` is only the leaf (the
FP32 master, or None) that receives the weight gradient.

When the weight is stepped in backward in row blocks (fp8mp.step_in_backward;
fp8mp/optim/row_block_grads.py), wgrad runs a block of output rows at a time
(fp8_gemm of a row block of dy.T against x.T: the rows of the whole GEMM, each
a dot product over the tokens), each block handed to the optimizer at once, and
no weight gradient is returned. Not for a [K,N] weight or a stored FP8 weight.
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Callable

import torch

from fp8mp.scaling.recipe import BlockRecipe
from fp8mp.nn.block_linear_function import block_linear
from fp8mp.nn.output_dtype import output_dtype
from fp8mp.scaling.fp8_meta import GRAD, INPUT, WEIGHT, Fp8Columns, Fp8Meta, columns_of, fold_amax_
from fp8mp.ops.gemm import fp8_gemm
from fp8mp.ops.cast import cast_to_fp8, cast_to_fp8_transpose, cast_to_fp8_transpose_dbias
from fp8mp.ops.format import HIGH_PRECISION_DTYPES
from fp8mp.optim.row_block_grads import referenced, sink_of, weight_ref_for_row_blocks


@dataclasses.dataclass(frozen=True)
class Fp8LinearOptions:
    """What one call of Fp8LinearFunction needs besides its tensors (`linear_options` makes it from an Fp8Meta).

    formats: (forward_format, backward_format) of the recipe in use.
    fast_accum: (fprop, dgrad, wgrad) use_fast_accum of the three GEMMs (recipe.gemm_fast_accum).
    grad_scale_fn: what Fp8Meta.prepare_forward_scales returned: None (delayed scaling) or a callable
        setting the grad_output scale from the gradient itself (current scaling).
    lock: the module's Fp8Meta.backward_lock(), held by backward around its scale update and cast
        (None while torch.compile traces).
    out_dtype: the output's dtype (output_dtype.py); the input gradient has the input's.
    weight_in_out: the weight is [K,N] (Conv1D) instead of [N,K]; not with a stored FP8 weight.
    columns: the module's Fp8Meta.columns() (views of the meta buffers' columns), or None: slice them here.
    """

    formats: tuple[str, str]
    fast_accum: tuple[bool, bool, bool]
    grad_scale_fn: Callable[[torch.Tensor], None] | None
    lock: object
    out_dtype: torch.dtype
    weight_in_out: bool = False
    columns: Fp8Columns | None = None


def linear_options(meta: Fp8Meta, grad_scale_fn, out_dtype: torch.dtype, weight_in_out: bool = False) -> Fp8LinearOptions:
    """The Fp8LinearOptions of a call with `meta` (configured, its forward scales prepared)."""
    formats, fast_accum = meta.linear_settings()
    return Fp8LinearOptions(formats, fast_accum, grad_scale_fn, meta.backward_lock(), out_dtype, weight_in_out,
                            meta.columns())


class Fp8LinearFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x2d, weight, bias, meta_buffers, fp8_weight, fp8_input, options: Fp8LinearOptions):
        """x2d [M,K], weight [N,K] (or [K,N], options.weight_in_out), bias [N] or None.

        meta_buffers: Fp8Meta.forward_buffers(), (scale, scale_inv, amax, step_amax), the module's scaling
        buffers (amax is written in place; every cast's amax is folded into step_amax, the step's
        non-finite check, which is None for a forward that records no gradient).
        fp8_weight: None, or (w_fp8 [N,K] float8_e4m3fn, w_scale_inv [1]): a stored FP8 weight used
        instead of casting `weight`, which then only receives the gradient (it may be None).
        fp8_input: None, or (x_fp8, x_fp8_t) already cast with the INPUT scale (by a fused norm, see
        fp8mp/nn/norm_linear_function.py); `x2d` then only routes the input gradient.
        options: the call's Fp8LinearOptions.
        """
        meta_step_amax = meta_buffers[3]
        forward_format = options.formats[0]
        cols = options.columns if options.columns is not None else columns_of(*meta_buffers)
        if fp8_input is None:
            x_fp8, x_fp8_t = cast_to_fp8_transpose(x2d, cols.scale[INPUT], cols.amax[INPUT], forward_format)
        else:
            x_fp8, x_fp8_t = fp8_input
        # Backward must decode with the scales these casts used, whatever happens to the buffers meanwhile:
        # copies, one per operand (they are the GEMMs' arguments as they are, no slicing of a joint copy).
        x_scale_inv = cols.scale_inv[INPUT].clone()
        if fp8_weight is None:
            w_scale = cols.scale[WEIGHT].clone()  # backward casts the weight again with this very scale
            w_fp8 = _cast_weight(weight, w_scale, cols.amax[WEIGHT], forward_format, options.weight_in_out, "fprop")
            w_scale_inv = cols.scale_inv[WEIGHT].clone()
            w_saved = weight
        else:  # stored FP8 weight; backward transposes it (the stored tensor: no copy is saved)
            w_fp8, w_scale = fp8_weight[0], None
            w_scale_inv = fp8_weight[1].clone()
            w_saved = w_fp8
        if meta_step_amax is not None:  # the columns this forward's casts wrote (a stored weight is not cast)
            # (a weight FSDP2 gathered in FP8 was cast by its shards' owners, who recorded its amax column)
            written = WEIGHT + 1 if fp8_weight is None or getattr(weight, "records_weight_amax", False) else INPUT + 1
            fold_amax_(cols.step_amax_head[written], cols.amax_head[written])
        out_bias = bias.to(options.out_dtype) if bias is not None else None
        out = fp8_gemm(x_fp8, x_scale_inv, w_fp8, w_scale_inv, out_bias, options.out_dtype, options.fast_accum[0])
        ctx.save_for_backward(x_fp8_t, w_saved, x_scale_inv, w_scale_inv, w_scale)
        # The scaling buffers are state, read and written in place by backward, not saved values: a module
        # that runs twice in one step updates them between its forwards, which save_for_backward would reject.
        ctx.meta_buffers = meta_buffers
        ctx.options = options
        ctx.x_dtype, ctx.w_dtype = x2d.dtype, weight.dtype if weight is not None else None
        ctx.weight_ref = weight_ref_for_row_blocks(weight) if fp8_weight is None and not options.weight_in_out else None
        ctx.bias_dtype = bias.dtype if bias is not None else None
        return out

    @staticmethod
    def backward(ctx, grad_out):
        x_fp8_t, w_saved, x_scale_inv, w_scale_inv, w_scale = ctx.saved_tensors
        meta_step_amax, options = ctx.meta_buffers[3], ctx.options
        cols = options.columns if options.columns is not None else columns_of(*ctx.meta_buffers)
        w_fp8_t = None
        if ctx.needs_input_grad[0] and w_scale is None:  # a stored FP8 weight [N,K]
            w_fp8_t = w_saved.t().contiguous()
        elif ctx.needs_input_grad[0]:  # the forward's cast again: same weight, same scale, same bits
            scratch_amax = torch.empty(1, dtype=torch.float32, device=w_saved.device)
            w_fp8_t = _cast_weight(w_saved, w_scale, scratch_amax, options.formats[0], options.weight_in_out, "dgrad")
        grad_out = grad_out.contiguous()
        # The bias gradient (fp32 column sums of grad_out) comes from the cast's own read of grad_out.
        wants_bias_grad = ctx.bias_dtype is not None and ctx.needs_input_grad[2]
        with options.lock if options.lock is not None else contextlib.nullcontext():
            if options.grad_scale_fn is not None:
                options.grad_scale_fn(grad_out)
            cast = cast_to_fp8_transpose_dbias if wants_bias_grad else cast_to_fp8_transpose
            g_fp8, g_fp8_t, *dbias = cast(grad_out, cols.scale[GRAD], cols.amax[GRAD], options.formats[1])
            g_scale_inv = cols.scale_inv[GRAD].clone()
            if meta_step_amax is not None:
                fold_amax_(cols.step_amax[GRAD], cols.amax[GRAD])
        grad_x = grad_w = grad_b = None
        _, dgrad_fast, wgrad_fast = options.fast_accum
        if ctx.needs_input_grad[0]:
            grad_x = fp8_gemm(g_fp8, g_scale_inv, w_fp8_t, w_scale_inv, None, ctx.x_dtype, dgrad_fast)
        if ctx.needs_input_grad[1] and options.weight_in_out:  # dW [K,N] = x.T @ dy
            grad_w = fp8_gemm(x_fp8_t, x_scale_inv, g_fp8_t, g_scale_inv, None, ctx.w_dtype, wgrad_fast)
        elif ctx.needs_input_grad[1] and (sink := sink_of(param := referenced(ctx.weight_ref))) is not None:
            block = sink.block_rows(param)  # dW's rows [start, start + block) = dy.T's rows @ x, one block at a time
            for start in range(0, g_fp8_t.shape[0], block):
                sink.take_rows(param, start, fp8_gemm(g_fp8_t[start:start + block], g_scale_inv, x_fp8_t, x_scale_inv,
                                                        None, ctx.w_dtype, wgrad_fast))
        elif ctx.needs_input_grad[1]:  # dW [N,K] = dy.T @ x
            grad_w = fp8_gemm(g_fp8_t, g_scale_inv, x_fp8_t, x_scale_inv, None, ctx.w_dtype, wgrad_fast)
        if wants_bias_grad:
            grad_b = dbias[0].to(ctx.bias_dtype)
        return grad_x, grad_w, grad_b, None, None, None, None


def _cast_weight(weight: torch.Tensor, scale: torch.Tensor, amax: torch.Tensor, fmt: str, weight_in_out: bool,
                 gemm: str) -> torch.Tensor:
    """The FP8 weight operand `gemm` ("fprop": [N,K], "dgrad": [K,N]) takes, cast from `weight` with `scale`.

    A weight stored [N,K] is fprop's operand as it is and dgrad's transposed; one stored [K,N]
    (weight_in_out) the other way round. A transposed operand comes from the fused cast-transpose,
    whose other output is dropped at once.
    """
    if (gemm == "fprop") != weight_in_out:
        return cast_to_fp8(weight, scale, amax, fmt)
    return cast_to_fp8_transpose(weight, scale, amax, fmt)[1]


def fp8_linear(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, meta: Fp8Meta,
               fp8_weight: tuple[torch.Tensor, torch.Tensor] | None = None, group=None,
               ran_before: bool = False, weight_in_out: bool = False) -> torch.Tensor:
    """y = x @ weight.T + bias in FP8 per `meta`'s recipe, for x of shape [..., K].

    fp8_weight: (w_fp8, w_scale_inv), a stored FP8 weight to use as it is; `weight` then only
    receives the weight gradient (see Fp8LinearFunction.forward); under a fine-grained recipe the
    stored weight's (w_q, w_t_q) of block_linear_function.stored_weight_operands instead. The
    caller holds `meta.lock()`.
    group: fp8_autocast's fp8_group (None: no reduction). Current scaling reduces each amax it
    computes; delayed scaling reduces the module's amaxes first when `ran_before` (the module
    already ran in this context: its last amaxes were not reduced at the context's entry).
    weight_in_out: `weight` is [K,N] (transformers' Conv1D layout), not [N,K].
    """
    if isinstance(meta.recipe, BlockRecipe):  # fine-grained: scales per block, nothing in meta to update or reduce
        return block_linear(x, weight, bias, meta.recipe, (meta.format_of(INPUT), meta.format_of(GRAD)), weight_in_out,
                            stored_weight=fp8_weight)
    x2d = x.reshape(-1, x.shape[-1])
    grad_scale_fn = meta.prepare_forward_scales(x2d, weight if fp8_weight is None else None, group, ran_before)
    options = linear_options(meta, grad_scale_fn, output_dtype(x), weight_in_out)
    out = Fp8LinearFunction.apply(x2d, weight, bias, meta.forward_buffers(), fp8_weight, None, options)
    meta.mark_initialized()
    return out.reshape(*x.shape[:-1], out.shape[-1])


def fp8_linear_gathered(x_shard: torch.Tensor, gather: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
                        weight: torch.Tensor, bias: torch.Tensor | None, meta: Fp8Meta, group=None,
                        ran_before: bool = False) -> torch.Tensor:
    """y = X @ weight.T + bias [M, N], X [M, K] the rows every rank's `x_shard` [..., K] make together (sequence
    parallel), gathered in FP8: this rank's shard is cast with the INPUT scale every rank shares (its amax, like
    fp8_linear's, reduced over `group`), and `gather(codes)` returns (X's codes [M, K], route), route [M, K] the
    tensor standing for X in autograd, whose gradient it hands back to the shards. The cast is elementwise with
    one scale, so the gathered codes are those of casting X itself. The caller holds `meta.lock()`.
    """
    x2d = x_shard.reshape(-1, x_shard.shape[-1])
    grad_scale_fn = meta.prepare_forward_scales(x2d, weight, group, ran_before)
    options = linear_options(meta, grad_scale_fn, output_dtype(x_shard))
    cols = options.columns if options.columns is not None else columns_of(*meta.forward_buffers())
    x_fp8, route = gather(cast_to_fp8(x2d.contiguous(), cols.scale[INPUT], cols.amax[INPUT], options.formats[0]))
    x_fp8_t = x_fp8.view(torch.uint8).t().contiguous().view(x_fp8.dtype)  # (a byte transpose: wgrad's operand)
    out = Fp8LinearFunction.apply(route, weight, bias, meta.forward_buffers(), None, (x_fp8, x_fp8_t), options)
    meta.mark_initialized()
    return out


def check_input(module: str, input: torch.Tensor, in_features: int, weight: torch.Tensor) -> None:
    """The argument checks of an FP8 linear module's forward; `module` names it in the messages."""
    if input.dim() == 0 or input.shape[-1] != in_features:
        raise ValueError(f"{module}: argument 'input' must have last dimension {in_features}, got shape {tuple(input.shape)}")
    if input.dtype not in HIGH_PRECISION_DTYPES:
        raise TypeError(f"{module}: argument 'input' must be float32, bfloat16 or float16, got {input.dtype}")
    if input.device != weight.device:
        raise RuntimeError(f"{module}: argument 'input' is on {input.device} but the weight is on {weight.device}")
