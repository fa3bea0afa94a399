"""FP8 weight storage: Linear weights kept in float8_e4m3fn with their scale, FP32 masters elsewhere.

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
from typing import Iterator

import torch

from fp8mp.nn.checkpoint import fp8_state_owner
from fp8mp.ops.format import FP8_MAX
from fp8mp.ops.cast import cast_from_fp8, cast_to_fp8
from fp8mp.ops.scale_update import compute_scale

__all__ = ["fp8_model_init", "is_fp8_model_init", "quantize_weight_", "decode_weight", "state_dict_bytes"]

WEIGHT_FORMAT = "e4m3"
WEIGHT_DTYPE = torch.float8_e4m3fn

class _ThreadInitContexts(threading.local):
    """This thread's open fp8_model_init contexts (threading.local, like fp8_autocast's)."""

    def __init__(self) -> None:
        self.stack: list[bool] = []


_INIT_CONTEXTS = _ThreadInitContexts()


@contextlib.contextmanager
def fp8_model_init(enabled: bool = True) -> Iterator[None]:
    """fp8mp modules created inside the block, in this thread, store their weights in FP8 (unless they say otherwise)."""
    if not isinstance(enabled, bool):
        raise TypeError(f"fp8_model_init: argument 'enabled' must be a bool, got {type(enabled).__name__}")
    _INIT_CONTEXTS.stack.append(enabled)
    try:
        yield
    finally:
        _INIT_CONTEXTS.stack.pop()


def is_fp8_model_init() -> bool:
    """True inside `fp8_model_init()` in this thread (the innermost context wins)."""
    stack = _INIT_CONTEXTS.stack
    return len(stack) > 0 and stack[-1]  # len(): dynamo of torch 2.11 cannot trace bool(list)


@torch.no_grad()
def quantize_weight_(source: torch.Tensor, weight_fp8: torch.Tensor, scale: torch.Tensor, scale_inv: torch.Tensor) -> None:
    """Current scaling, in place: scale = 448 / amax(source); weight_fp8 = cast_to_fp8(source, scale).

    scale and scale_inv are [1] float32; an amax of 0, NaN or Inf keeps the previous scale (the
    rule of `fp8mp.scaling.compute_scale`).
    """
    source = source.detach()
    amax = source.abs().amax().float().reshape(1) if source.numel() else torch.zeros(1, device=source.device)
    scale.copy_(compute_scale(amax, FP8_MAX[WEIGHT_FORMAT], 0, scale))
    scale_inv.copy_(scale.reciprocal())
    weight_fp8.copy_(cast_to_fp8(source, scale, torch.empty(1, device=source.device), WEIGHT_FORMAT))


class _DecodeWeight(torch.autograd.Function):
    """Forward: the decoded FP8 weight. Backward: its gradient goes to `master` (the leaf)."""

    @staticmethod
    def forward(ctx, master, weight_fp8, scale_inv, dtype):
        ctx.master_dtype = master.dtype
        return cast_from_fp8(weight_fp8, scale_inv, dtype)

    @staticmethod
    def backward(ctx, grad):
        return grad.to(ctx.master_dtype), None, None, None


def decode_weight(weight_fp8: torch.Tensor, scale_inv: torch.Tensor, dtype: torch.dtype,
                  master: torch.Tensor | None) -> torch.Tensor:
    """The FP8 weight decoded to `dtype`; differentiable into `master` when one is given."""
    if master is None:
        return cast_from_fp8(weight_fp8, scale_inv, dtype)
    return _DecodeWeight.apply(master, weight_fp8, scale_inv, dtype)


def state_dict_bytes(module: torch.nn.Module) -> int:
    """Bytes of a module's parameters and persistent buffers, each storage once.

    The FP8 scaling state of fp8mp modules (amax history, scales) is not weights and is not counted.
    """
    seen, total = set(), 0
    for key, tensor in module.state_dict(keep_vars=True).items():
        if not isinstance(tensor, torch.Tensor) or fp8_state_owner(key) is not None:
            continue
        key = (tensor.untyped_storage().data_ptr(), tensor.device)
        if key not in seen:
            seen.add(key)
            total += tensor.untyped_storage().nbytes()
    return total
