"""Bytes moved by FSDP2's collectives, counted where FSDP2 calls torch.distributed.

`count_collective_bytes()` wraps torch.distributed's all-gather and reduce-scatter entry points (those
FSDP2 calls: `all_gather_single` / `reduce_scatter_single`, or `all_gather_into_tensor` /
`reduce_scatter_tensor` in torch versions without them) for the duration of the block, and adds up the
bytes of each call's output (all-gather: the gathered tensor, world size x the input; reduce-scatter:
its input, the whole gradient buffer, world size x the output). Per process: each rank counts its own.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import Iterator

import torch.distributed as dist

_ALL_GATHERS = ("all_gather_single", "all_gather_into_tensor")
_REDUCE_SCATTERS = ("reduce_scatter_single", "reduce_scatter_tensor")


@dataclass
class CollectiveBytes:
    all_gathered: int = 0
    reduce_scattered: int = 0
    all_gather_calls: int = 0
    reduce_scatter_calls: int = 0


@contextlib.contextmanager
def count_collective_bytes() -> Iterator[CollectiveBytes]:
    """Count the bytes all-gathered and reduce-scattered inside the block (module docstring)."""
    counts = CollectiveBytes()
    originals = {}

    def all_gather(original):
        def counted(output_tensor, input_tensor, *args, **kwargs):
            counts.all_gathered += output_tensor.numel() * output_tensor.element_size()
            counts.all_gather_calls += 1
            return original(output_tensor, input_tensor, *args, **kwargs)
        return counted

    def reduce_scatter(original):
        def counted(output, input, *args, **kwargs):
            counts.reduce_scattered += input.numel() * input.element_size()
            counts.reduce_scatter_calls += 1
            return original(output, input, *args, **kwargs)
        return counted

    for names, wrap in ((_ALL_GATHERS, all_gather), (_REDUCE_SCATTERS, reduce_scatter)):
        for name in names:
            if hasattr(dist, name):
                originals[name] = getattr(dist, name)
                setattr(dist, name, wrap(originals[name]))
    try:
        yield counts
    finally:
        for name, original in originals.items():
            setattr(dist, name, original)
