"""Where a parameter's local shard sits in the whole tensor, for the fused optimizers under FSDP2.

FSDP2 (``torch.distributed.fsdp.fully_shard``) holds each parameter as a DTensor sharded along dim 0
(``Shard(0)`` on its mesh dimension, ``Replicate`` on the others under HSDP), chunked as ``torch.chunk`` does:
``C = ceil(rows / N)`` rows a rank, the last ranks holding fewer rows (or none) when ``rows`` is not a multiple
of N. A shard is then a contiguous range of the whole tensor's elements, starting at element
``row_start * row_numel``: the ops take that offset (``element_offset``), so that the stochastic rounding
draws the bits of the unsharded step, and the FP8 states' blocks of 128 elements are the whole tensor's.

The blocks follow the whole tensor only when every shard starts on a block boundary: ``C * row_numel`` a
multiple of 128 (or a single rank holding every row). Otherwise :func:`check_fp8_blocks` raises, naming the
parameter and the way out (float32 or bfloat16 states for it, whose values are per element).

An FP8 state's scales of a DTensor parameter are a DTensor too, sharded like the parameter: shape
``[ceil(rows / k), k * row_numel / 128]`` with ``k = 128 / gcd(128, row_numel)`` rows per group of whole
blocks, so that ``torch.chunk`` of its dim 0 gives each rank exactly its shard's blocks (the whole tensor's
``ceil(numel / 128)`` blocks in order, the last group padded with unused zeros when ``rows`` is not a
multiple of k). A plain tensor's scales stay the 1-D ``[ceil(numel / 128)]``.

That global shape depends on the parameter's shape only, not on the number of ranks: torch.distributed.checkpoint
saves the scales of N ranks and hands each of M ranks its shard's blocks (fp8mp.parallel.distributed_checkpoint),
wherever M passes :func:`check_fp8_blocks`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from fp8mp.ops.optim import STATE_BLOCK
from fp8mp.utils.dtensor import is_dtensor

__all__ = ["ShardLayout", "check_fp8_blocks", "grad_matches", "reduction_groups", "scale_shape", "shard_layout"]


@dataclass(frozen=True)
class ShardLayout:
    """A parameter's local shard in the whole tensor: rows [row_start, row_start + local rows) of `rows`
    rows of `row_numel` elements, the full shards holding `chunk_rows` rows."""

    rows: int
    row_numel: int
    chunk_rows: int
    row_start: int

    @property
    def element_offset(self) -> int:
        return self.row_start * self.row_numel


def _where(name: str, p: torch.Tensor) -> str:
    return f"parameter {name} (global shape {list(p.shape)})"


def shard_layout(p: torch.Tensor, name: str) -> ShardLayout:
    """The layout of a plain tensor (one shard: everything) or of a DTensor sharded along dim 0 on at most one
    mesh dimension and replicated on the others (FSDP2, HSDP). Other placements raise ValueError naming the
    parameter (`name`)."""
    shape = tuple(p.shape)
    rows = shape[0] if shape else 1
    row_numel = math.prod(shape[1:]) if shape else 1
    if not is_dtensor(p):
        return ShardLayout(rows, row_numel, rows, 0)
    from torch.distributed.tensor import Replicate, Shard
    sharded = [d for d, placement in enumerate(p.placements) if not isinstance(placement, Replicate)]
    if len(sharded) > 1 or any(p.placements[d] != Shard(0) for d in sharded):
        raise ValueError(f"fp8mp.optim: {_where(name, p)} has placements {tuple(p.placements)}; the fused optimizers "
                         "step DTensor parameters sharded along dim 0 on one mesh dimension (FSDP2's Shard(0), "
                         "tensor parallel's column-wise Shard(0), Replicate elsewhere); step the others (row-wise "
                         "Shard(1) weights, FSDP2 x tensor parallel) with a torch.optim optimizer")
    if not sharded:
        return ShardLayout(rows, row_numel, rows, 0)
    mesh_dim = sharded[0]
    ranks = p.device_mesh.size(mesh_dim)
    chunk = -(-rows // ranks)
    row_start = min(p.device_mesh.get_local_rank(mesh_dim) * chunk, rows)
    return ShardLayout(rows, row_numel, chunk, row_start)


def grad_matches(p: torch.Tensor, grad: torch.Tensor) -> bool:
    """Whether DTensor `grad` is laid out like DTensor `p`, or awaits only sums where p is replicated (the
    `Partial` gradients of a replicated weight under tensor parallel, e.g. a norm under sequence parallel)."""
    return grad.device_mesh == p.device_mesh and all(
        g == q or (g.is_partial() and q.is_replicate()) for g, q in zip(grad.placements, p.placements))


def check_fp8_blocks(p: torch.Tensor, layout: ShardLayout, name: str) -> None:
    """ValueError unless every shard of `p` starts on a 128-element block boundary of the whole tensor, the
    condition for FP8 states whose blocks are the whole tensor's (the same on every rank: it depends on the
    global shape and the number of shards only)."""
    if layout.chunk_rows >= layout.rows or (layout.chunk_rows * layout.row_numel) % STATE_BLOCK == 0:
        return
    raise ValueError(
        f"fp8mp.optim: {_where(name, p)} is sharded in chunks of {layout.chunk_rows} rows of {layout.row_numel} "
        f"elements ({layout.chunk_rows * layout.row_numel} elements, not a multiple of {STATE_BLOCK}): its FP8 "
        f"states' blocks of {STATE_BLOCK} elements cannot follow the whole tensor. Give it float32 or bfloat16 "
        "states in a param group of its own ({'params': [...], 'state_dtype': torch.bfloat16}), or shard it so "
        f"that ceil(rows / shards) * row_numel is a multiple of {STATE_BLOCK}")


def scale_shape(layout: ShardLayout) -> tuple[int, int]:
    """The global shape of a DTensor parameter's FP8 block scales (module docstring)."""
    group_rows = STATE_BLOCK // math.gcd(STATE_BLOCK, layout.row_numel) if layout.row_numel else 1
    return -(-layout.rows // group_rows), group_rows * layout.row_numel // STATE_BLOCK


def reduction_groups(params) -> list:
    """The process groups over which DTensor parameters are sharded, each once, in parameter order (the same
    order on every rank): a flag computed from local shards, max-reduced over them, is every rank's."""
    groups = []
    for p in params:
        if not is_dtensor(p):
            continue
        for d, placement in enumerate(p.placements):
            if placement.is_shard():
                group = p.device_mesh.get_group(d)
                if not any(group is g for g in groups):
                    groups.append(group)
    return groups
