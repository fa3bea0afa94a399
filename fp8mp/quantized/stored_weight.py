"""FP8 weight storage: Linear weights kept in float8_e4m3fn with their scale, FP32 masters elsewhere.

Which storage to use: frozen weights of any model (a LoRA base, inference) under per-tensor recipes are
stored by `fp8mp.convert(model, frozen_weights="fp8")` (fp8mp/quantized/frozen_weight.py), which keeps
`.weight` an ordinary-looking parameter; trained weights stay bf16 parameters updated by
`fp8mp.optim.AdamW` with FP8 states. `fp8_model_init` serves inference and frozen `fp8mp.nn.Linear`
layers, and is the one way to store a weight with a fine-grained recipe's block scales. Training its
weights through FP32 masters (`MasterWeightOptimizer`, below) is deprecated: the masters and their
gradients take 8 bytes a parameter, so it saves no memory.

    with fp8mp.fp8_model_init():                 # or fp8mp.nn.Linear(..., fp8_weight=True)
        model = build_model()                    # every fp8mp.nn.Linear stores its weight in FP8
    optimizer = fp8mp.optim.MasterWeightOptimizer(lambda p: torch.optim.AdamW(p, lr=1e-3), model)

Design. An FP8-weight Linear has no `weight` parameter (`layer.weight is None`). It keeps
three buffers, all in its state_dict:

    weight_fp8        [N, K] float8_e4m3fn, 1 byte per element
    weight_scale      [1] float32, the scale the weight was cast with (current scaling from its amax)
    weight_scale_inv  [1] float32, 1 / weight_scale, what the GEMM decodes with

so the model holds 0.25x the FP32 weight bytes plus 8 bytes per layer. The forward uses
`weight_fp8` as it is (no cast of a high-precision weight; backward transposes it).

Fine-grained recipes. `fp8_model_init(recipe=R)` with R a RowwiseScaling, BlockScaling or
MXFP8Scaling stores each weight as that recipe's forward quantizes it
(`BlockQuantizer.stored_weight`, fp8mp/scaling/block_quantizer.py), with its block scales as buffers:

    weight_fp8          [N, K] FP8 (the recipe's forward format), quantized along K in R's weight blocks
    weight_scale_inv    R's block scales of weight_fp8: [ceil(N / rows), ceil(K / block_k)] float32,
                        or float8_e8m0fnu for MXFP8 (layout: fp8mp/ops/blockwise.py)
    weight_fp8_t        [K, N], W.T quantized along N for dgrad, and
    weight_scale_inv_t  its scales; only where the blocks are not square (rowwise, MXFP8: a 1 x 32
                        block of W is not one of W.T, and re-quantizing the FP8 weight along the
                        other axis would round twice). BlockScaling's 128 x 128 blocks serve both.

so the model holds 0.25x (BlockScaling) or 0.5x (rowwise, MXFP8) the FP32 weight bytes plus the
scales. Such a layer runs under recipes with the same weight layout (`BlockQuantizer.block_weight_layout`: block
sizes, scale mode and format) and refuses others with an error naming both; the per-tensor
storage runs under DelayedScaling and CurrentScaling. Re-quantization after each step is
`stored_weight` of the master, so the stored codes and scales are exactly those the recipe
would give the master weight.

Gradients need an autograd leaf of the weight's shape, and an FP8 tensor cannot be one (autograd
would cast its gradient to FP8). The leaf is the FP32 master weight itself, an `nn.Parameter`
owned by `fp8mp.optim.MasterWeightOptimizer`: the optimizer attaches it to the layer (a weak
reference: the model does not own it, and it goes when the optimizer goes), and the layer passes
it to the autograd function as the tensor that receives dW, never reading its values in the
forward. So gradients land on the masters directly, with no copy and no hook, and everything
that looks at an optimizer's parameters' grads (`LossScaler.unscale_`/`step`,
`clip_grad_norm_`) sees them. The optimizer updates the masters in FP32 and re-quantizes each
layer's FP8 weight from its master after every step (`quantize_weight_`). We chose this over a
`torch.Tensor` subclass (an FP8 tensor posing as FP32, as Transformer Engine does): that needs
`__torch_dispatch__` coverage of every op a module or optimizer may apply to a parameter, and
here the whole mechanism is one argument of the autograd function.

A layer in training mode with grad enabled and no master attached raises, rather than silently
not training its weight: build the optimizer first, or use `.eval()` / `torch.no_grad()`.
"""
from __future__ import annotations

import contextlib
import threading
from typing import Callable, Iterator

import torch

from fp8mp.ops.blockwise import block_dequantize
from fp8mp.ops.cast import cast_from_fp8, cast_to_fp8
from fp8mp.ops.operand import Fp8Operand
from fp8mp.quantized.weight_operands import StoredOperands, WeightOperands
from fp8mp.scaling.columns import tensor_amax
from fp8mp.scaling.current_scale import current_scale
from fp8mp.scaling.recipe_registry import is_recipe, quantizer_for

__all__ = ["fp8_model_init", "is_fp8_model_init", "model_init_recipe", "quantize_weight_", "decode_weight",
           "StoredFp8Weight", "stored_weight_layout"]

WEIGHT_FORMAT = "e4m3"
WEIGHT_DTYPE = torch.float8_e4m3fn
# The buffers an FP8-stored weight may have, codes first (the block quantizer's names).
STORED_WEIGHT_BUFFERS = ("weight_fp8", "weight_scale_inv", "weight_fp8_t", "weight_scale_inv_t", "weight_scale")
PER_TENSOR = "per-tensor scaling (DelayedScaling / CurrentScaling)"


class _ThreadInitContexts(threading.local):
    """This thread's open fp8_model_init contexts, (enabled, recipe) each (threading.local, like fp8_autocast's)."""

    def __init__(self) -> None:
        self.stack: list[tuple[bool, object]] = []


_INIT_CONTEXTS = _ThreadInitContexts()


@contextlib.contextmanager
def fp8_model_init(enabled: bool = True, recipe=None) -> Iterator[None]:
    """fp8mp modules created inside the block, in this thread, store their weights in FP8 (unless they say otherwise).

    recipe: the recipe the stored weights are quantized for. None, DelayedScaling or CurrentScaling:
    one per-tensor scale (usable under both); RowwiseScaling, BlockScaling or MXFP8Scaling: that
    recipe's block scales (usable under recipes of the same block weight layout).
    """
    if not isinstance(enabled, bool):
        raise TypeError(f"fp8_model_init: argument 'enabled' must be a bool, got {type(enabled).__name__}")
    if recipe is not None and not is_recipe(recipe):
        raise TypeError(f"fp8_model_init: argument 'recipe' must be a fp8mp.recipe recipe or None, got "
                        f"{type(recipe).__name__}")
    _INIT_CONTEXTS.stack.append((enabled, recipe))
    try:
        yield
    finally:
        _INIT_CONTEXTS.stack.pop()


def is_fp8_model_init() -> bool:
    """True inside `fp8_model_init()` in this thread (the innermost context wins)."""
    stack = _INIT_CONTEXTS.stack
    return len(stack) > 0 and stack[-1][0]  # len(): dynamo of torch 2.11 cannot trace bool(list)


def model_init_recipe():
    """The recipe of the innermost enabled `fp8_model_init` in this thread, or None."""
    stack = _INIT_CONTEXTS.stack
    return stack[-1][1] if len(stack) > 0 and stack[-1][0] else None


# ------------------------------------------------------------------------------ the stored weight
def stored_weight_layout(recipe):
    """The block weight layout a weight stored for `recipe` has; None for per-tensor storage (and recipe None)."""
    return None if recipe is None else quantizer_for(recipe).block_weight_layout


def stored_weight_buffers(weight: torch.Tensor, recipe) -> dict[str, torch.Tensor]:
    """`weight` [N, K] quantized for storage under `recipe`: the block quantizer's buffers, or per-tensor
    weight_fp8, weight_scale, weight_scale_inv (one current scale from the weight's amax)."""
    if stored_weight_layout(recipe) is not None:
        return quantizer_for(recipe).stored_weight(weight)
    factory = dict(dtype=torch.float32, device=weight.device)
    buffers = {"weight_fp8": torch.empty_like(weight, dtype=WEIGHT_DTYPE), "weight_scale": torch.ones(1, **factory),
               "weight_scale_inv": torch.ones(1, **factory)}
    quantize_weight_(weight, buffers["weight_fp8"], buffers["weight_scale"], buffers["weight_scale_inv"])
    return buffers


class StoredFp8Weight:
    """The FP8 weight an fp8mp.nn.Linear stores in its buffers (module docstring), as the weight interface
    (fp8mp/quantized/weight_operands.py) offers it: `fp8_operands_for(quantizer)`.

    buffers: the module's stored-weight buffers by name; layout: the block weight layout they were quantized
    for (None: per tensor); recipe: the recipe they were quantized for (None: per tensor); grad_leaf: returns
    the tensor that receives the weight gradient (the attached master, or None), asked only for operands.
    """

    def __init__(self, buffers: dict[str, torch.Tensor], layout, recipe,
                 grad_leaf: Callable[[], torch.Tensor | None] = lambda: None):
        self.buffers, self.layout, self.recipe, self.grad_leaf = buffers, layout, recipe, grad_leaf

    def fp8_operands_for(self, quantizer) -> WeightOperands:
        """The operands under `quantizer`; refuses one of another weight layout."""
        if quantizer.block_weight_layout != self.layout:
            raise RuntimeError(
                f"fp8mp.nn.Linear: this layer's FP8 weight is stored for {self.layout or PER_TENSOR}, but it runs "
                f"under {quantizer.name}, which needs {quantizer.block_weight_layout or 'one per-tensor scale'}: "
                "create the model inside fp8mp.fp8_model_init(recipe=...) with the recipe it runs under")
        if self.layout is None:
            operand = Fp8Operand(self.buffers["weight_fp8"], self.buffers["weight_scale_inv"].clone())
            return WeightOperands(self.grad_leaf(), StoredOperands(operand))
        return WeightOperands(self.grad_leaf(), StoredOperands(*quantizer.stored_weight_operands(self.buffers)))

    @torch.no_grad()
    def quantize_from_(self, source: torch.Tensor) -> None:
        """In place: the buffers = `source`'s quantization for the recipe they were stored for (or per tensor)."""
        buffers = self.buffers
        if self.layout is None:
            quantize_weight_(source, buffers["weight_fp8"], buffers["weight_scale"], buffers["weight_scale_inv"])
            return
        for name, value in quantizer_for(self.recipe).stored_weight(source.detach()).items():
            buffers[name].copy_(value)

    def decode(self, dtype: torch.dtype, master: torch.Tensor | None = None, in_features: int | None = None):
        """The weight decoded to `dtype` [N, K]; differentiable into `master` when one is given."""
        layout = self.layout
        blocks = None if layout is None else (layout.block_rows, layout.block_k or in_features)
        return decode_weight(self.buffers["weight_fp8"], self.buffers["weight_scale_inv"], dtype, master, blocks)


@torch.no_grad()
def quantize_weight_(source: torch.Tensor, weight_fp8: torch.Tensor, scale: torch.Tensor, scale_inv: torch.Tensor) -> None:
    """Current scaling, in place: scale = 448 / amax(source); weight_fp8 = cast_to_fp8(source, scale).

    scale and scale_inv are [1] float32; an amax of 0, NaN or Inf keeps the previous scale (the
    rule of `fp8mp.scaling.current_scale`).
    """
    source = source.detach()
    scale.copy_(current_scale(tensor_amax(source), WEIGHT_FORMAT, 0, scale))
    scale_inv.copy_(scale.reciprocal())
    weight_fp8.copy_(cast_to_fp8(source, scale, torch.empty(1, device=source.device), WEIGHT_FORMAT))


class _DecodeWeight(torch.autograd.Function):
    """Forward: the decoded FP8 weight. Backward: its gradient goes to `master` (the leaf)."""

    @staticmethod
    def forward(ctx, master, weight_fp8, scale_inv, dtype, blocks):
        ctx.master_dtype = master.dtype
        return _decode(weight_fp8, scale_inv, dtype, blocks)

    @staticmethod
    def backward(ctx, grad):
        return grad.to(ctx.master_dtype), None, None, None, None


def _decode(weight_fp8, scale_inv, dtype, blocks):
    if blocks is None:
        return cast_from_fp8(weight_fp8, scale_inv, dtype)
    return block_dequantize(weight_fp8, scale_inv, *blocks, dtype)


def decode_weight(weight_fp8: torch.Tensor, scale_inv: torch.Tensor, dtype: torch.dtype,
                  master: torch.Tensor | None, blocks: tuple[int, int] | None = None) -> torch.Tensor:
    """The FP8 weight decoded to `dtype`; differentiable into `master` when one is given.

    blocks: None for a per-tensor scale_inv [1], else the (rows, cols) of scale_inv's blocks.
    """
    if master is None:
        return _decode(weight_fp8, scale_inv, dtype, blocks)
    return _DecodeWeight.apply(master, weight_fp8, scale_inv, dtype, blocks)
