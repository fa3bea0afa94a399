"""`fp8_recompute(function, *args)`: a function of activations whose inputs are saved for backward in FP8 and
which backward computes again from them, for the tensors that functional code saves outside modules.

A Llama MLP's ``act_fn(gate) * up`` keeps, for backward, ``act_fn(gate)`` and ``up`` in the activations' dtype
(2 x 2 bytes an element of the MLP's widest tensor, besides the activation module's own input); scaled dot-product
attention keeps query, key, value, its output and the log-sum-exps. ``fp8_recompute(function, *args)`` returns
``function(*args)`` bit for bit, but saves for backward only its differentiable inputs, each as E4M3 with one fp32
scale per 1 x 128 group (fp8mp.memory.saved_activations.quantize_saved: 1 + 4/128 bytes an element), and the other
tensor arguments (masks) as they are. Backward decodes the inputs, runs `function` on them again (under the
torch.autocast state of the forward) and returns its gradients there: the exact gradient of `function` at inputs
each within half an E4M3 spacing of its value, ``|x' - x| <= 2^-4 |x|`` (or ``2^-10 * group amax / 448`` for
elements below E4M3's normal range in their group). So the gated multiply keeps 2 x 1.03 bytes an element and
recomputes one activation function and one product; attention keeps 3 x 1.03 bytes an element of q, k and v
instead of 4 x 2 and one more attention forward in backward (the path of activation checkpointing).

`function` must be deterministic (no dropout: the recomputation would draw other numbers), return one tensor, and
hold no FP8 modules. While the recomputation runs, saved-tensor hooks are off (its graph is used at once), so
fp8mp's FP8-saved activation modules inside `function` do not quantize twice. Where nothing needs a gradient,
and while torch.compile traces (its partitioner decides what is saved), `function(*args)` runs as it is.
"""
from __future__ import annotations

from typing import Any, Callable

import torch
from torch.autograd.function import once_differentiable

from fp8mp.memory.saved_activations import STORED_DTYPES, dequantize_saved, quantize_saved

__all__ = ["fp8_recompute"]

_FP8, _KEPT, _VALUE = "fp8", "kept", "value"
_RECOMPUTING = "fp8mp.nn.fp8_recompute: backward computes the function again from its FP8-saved inputs"


class _Fp8Recompute(torch.autograd.Function):
    @staticmethod
    def forward(ctx, function, *args):
        out = function(*args)
        if not isinstance(out, torch.Tensor):
            raise TypeError(f"fp8mp.nn.fp8_recompute: argument 'function' must return one tensor, got {type(out).__name__}")
        slots, tensors = [], []
        for arg, needs_grad in zip(args, ctx.needs_input_grad[1:]):
            if needs_grad:
                slots.append((_FP8, arg.shape, arg.dtype))
                tensors += quantize_saved(arg)
            elif isinstance(arg, torch.Tensor):
                slots.append((_KEPT,))
                tensors.append(arg)
            else:
                slots.append((_VALUE, arg))
        ctx.save_for_backward(*tensors)
        ctx.function, ctx.slots = function, slots
        device_type = out.device.type
        ctx.autocast = (device_type, torch.get_autocast_dtype(device_type), torch.is_autocast_enabled(device_type))
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        saved = iter(ctx.saved_tensors)
        args, wanted = [], []
        for slot in ctx.slots:
            if slot[0] == _FP8:
                data, scale_inv = next(saved), next(saved)
                arg = dequantize_saved(data, scale_inv, slot[1], slot[2]).requires_grad_(True)
                wanted.append(arg)
            elif slot[0] == _KEPT:
                arg = next(saved)
            else:
                arg = slot[1]
            args.append(arg)
        device_type, dtype, enabled = ctx.autocast
        with torch.enable_grad(), torch.autocast(device_type, dtype=dtype, enabled=enabled), \
                torch.autograd.graph.disable_saved_tensors_hooks(_RECOMPUTING):
            out = ctx.function(*args)
        grads = iter(torch.autograd.grad(out, wanted, grad_out, allow_unused=True))
        return (None, *(next(grads) if slot[0] == _FP8 else None for slot in ctx.slots))


def fp8_recompute(function: Callable[..., torch.Tensor], *args: Any, **kwargs: Any) -> torch.Tensor:
    """``function(*args, **kwargs)``, with the floating-point tensors of `args` that require grad saved for backward as
    E4M3 in 1 x 128 groups and `function` computed again from them in backward (module docstring).

    Args:
        function: deterministic, returns one tensor; called with `args` in forward and once more in backward.
        args: tensors (those that require grad must be float32, bfloat16 or float16) and any other values.
        kwargs: passed to `function` as they are (held until backward; no tensors that require grad).
    """
    if not callable(function):
        raise TypeError(f"fp8mp.nn.fp8_recompute: argument 'function' must be callable, got {type(function).__name__}")
    differentiable = [a for a in args if isinstance(a, torch.Tensor) and a.requires_grad]
    if not differentiable or not torch.is_grad_enabled() or torch.compiler.is_compiling():
        return function(*args, **kwargs)
    for a in differentiable:
        if a.dtype not in STORED_DTYPES:
            raise TypeError(f"fp8mp.nn.fp8_recompute: an argument that requires grad is {a.dtype}; FP8 storage takes "
                            "float32, bfloat16 or float16")
    if kwargs:  # autograd.Function.apply takes positional arguments only
        return _Fp8Recompute.apply(lambda *a: function(*a, **kwargs), *args)
    return _Fp8Recompute.apply(function, *args)
