"""`saved_tensor_bytes(fn)`: the bytes autograd saves for backward while `fn` runs, each storage once, by category."""
from __future__ import annotations

import threading
from typing import Any, Callable

import torch

__all__ = ["saved_tensor_bytes"]


def _owner(x: torch.Tensor) -> torch.Tensor:
    return x._base if x._base is not None else x


def saved_tensor_bytes(fn: Callable[[], Any], model: torch.nn.Module | None = None,
                       category: Callable[[torch.nn.Module | None], str] | None = None) -> dict[str, int]:
    """Run `fn()` and return the bytes of what autograd saved for backward meanwhile: {category: bytes, ..., "total": bytes}.

    Every tensor an op saves passes through a `torch.autograd.graph.saved_tensors_hooks` pack hook,
    which counts the nbytes of its storage the first time it sees that storage (q, k and v split from
    one projection count once, as one storage). Not counted: parameters, leaves that require grad, the
    model's buffers, and views of them (they are memory of the model, not of the step). Hooks that
    modules enter themselves (fp8mp's FP8 saved activations) hand what they store to this one, so it
    counts their FP8 bytes.

    model, category: with both, each counted storage goes to ``category(module)``, where `module` is the
    innermost module of `model` whose forward was running when it was first saved (`model` itself for
    what its own forward saves, None outside any); forward pre/post hooks on model's modules track that
    while `fn` runs and are removed after. Without them everything is "total".
    Every saved tensor is held until `fn` returns (so that no storage is freed and its address reused
    meanwhile): the memory of the step grows by what backward would free early.
    """
    if not callable(fn):
        raise TypeError("fp8mp.memory.saved_tensors.saved_tensor_bytes: argument 'fn' must be callable with no arguments")
    if (model is None) != (category is None):
        raise ValueError("fp8mp.memory.saved_tensors.saved_tensor_bytes: arguments 'model' and 'category' go together "
                         f"(got model={'None' if model is None else type(model).__name__}, category={category!r})")
    if model is not None and not isinstance(model, torch.nn.Module):
        raise TypeError(f"fp8mp.memory.saved_tensors.saved_tensor_bytes: argument 'model' must be a torch.nn.Module, "
                        f"got {type(model).__name__}")
    if category is not None and not callable(category):
        raise TypeError("fp8mp.memory.saved_tensors.saved_tensor_bytes: argument 'category' must be callable as category(module) -> str")
    excluded = set()
    if model is not None:
        excluded = {t.untyped_storage().data_ptr() for t in list(model.parameters()) + list(model.buffers())}
    counts: dict[str, int] = {}
    held: dict[int, torch.Tensor] = {}
    running = threading.local()

    def current() -> torch.nn.Module | None:
        stack = getattr(running, "modules", None)
        return stack[-1] if stack else None

    def pack(x: torch.Tensor) -> torch.Tensor:
        owner = _owner(x)
        storage = x.untyped_storage()
        skip = isinstance(owner, torch.nn.Parameter) or (owner.is_leaf and owner.requires_grad)
        if not skip and storage.data_ptr() not in excluded and storage.data_ptr() not in held:
            held[storage.data_ptr()] = x
            name = category(current()) if category is not None else "total"
            counts[name] = counts.get(name, 0) + storage.nbytes()
        return x.detach()

    def enter(module, args):
        if not hasattr(running, "modules"):
            running.modules = []
        running.modules.append(module)

    def leave(module, args, output):
        running.modules.pop()

    handles = []
    if model is not None:
        for module in model.modules():
            handles += [module.register_forward_pre_hook(enter), module.register_forward_hook(leave, always_call=True)]
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda x: x):
            fn()
    finally:
        for handle in handles:
            handle.remove()
    counts["total"] = sum(counts.values()) if category is not None else counts.get("total", 0)
    return counts
