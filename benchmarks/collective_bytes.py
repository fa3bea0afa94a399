"""Bytes moved by FSDP2's collectives, counted where FSDP2 calls torch.distributed.

`count_collective_bytes()` wraps torch.distributed's all-gather and reduce-scatter entry points (those
FSDP2 calls: `all_gather_single` / `reduce_scatter_single`, or `all_gather_into_tensor` /
`reduce_scatter_tensor` in torch versions without them) for the duration of the block, and adds up the
bytes of each call's output (all-gather: the gathered tensor, world size x the input; reduce-scatter:
its input, the whole gradient buffer, world size x the output). Per process: each rank counts its own.
"""
from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass
from typing import Iterator

import torch.distributed as dist

_ALL_GATHERS = ("all_gather_single", "all_gather_into_tensor")
_REDUCE_SCATTERS = ("reduce_scatter_single", "reduce_scatter_tensor")


@dataclass
class CollectiveBytes:
    all_gathered: int = 0
    reduce_scattered: int = 0
    all_gathered_calls: int = 0
    reduce_scattered_calls: int = 0


@contextlib.contextmanager
def count_collective_bytes() -> Iterator[CollectiveBytes]:
    """Count the bytes all-gathered and reduce-scattered inside the block (module docstring)."""
    counts = CollectiveBytes()
    originals = {}

    def counted(original, kind: str, counted_arg: int):
        name = list(inspect.signature(original).parameters)[counted_arg]  # (output, input, ...) for both kinds

        def call(*args, **kwargs):  # FSDP2 passes them by keyword
            tensor = args[counted_arg] if len(args) > counted_arg else kwargs[name]
            setattr(counts, kind, getattr(counts, kind) + tensor.numel() * tensor.element_size())
            setattr(counts, kind + "_calls", getattr(counts, kind + "_calls") + 1)
            return original(*args, **kwargs)
        return call

    for names, kind, counted_arg in ((_ALL_GATHERS, "all_gathered", 0), (_REDUCE_SCATTERS, "reduce_scattered", 1)):
        for name in names:
            if hasattr(dist, name):
                originals[name] = getattr(dist, name)
                setattr(dist, name, counted(originals[name], kind, counted_arg))
    try:
        yield counts
    finally:
        for name, original in originals.items():
            setattr(dist, name, original)
