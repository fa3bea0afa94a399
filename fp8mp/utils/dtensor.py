"""DTensor helpers that hold where torch.distributed is not built (the checks then answer "not a DTensor")."""
from __future__ import annotations

import math

import torch

__all__ = ["from_local", "is_dtensor", "local"]


def is_dtensor(t) -> bool:
    """Whether `t` is a torch.distributed.tensor.DTensor (False where torch.distributed is not built)."""
    if not torch.distributed.is_available():
        return False
    from torch.distributed.tensor import DTensor
    return isinstance(t, DTensor)


def local(t: torch.Tensor) -> torch.Tensor:
    """The local tensor of a DTensor (a view of its storage: in-place writes reach it), else `t`."""
    return t.to_local() if is_dtensor(t) else t


def from_local(local_tensor: torch.Tensor, mesh, placements, shape, stride=None):
    """The DTensor of `local_tensor` with the given mesh, placements and global shape, built without
    communication (run_check=False: every rank's shard is trusted to fit). `stride` None: contiguous."""
    from torch.distributed.tensor import DTensor
    shape = tuple(shape)
    if stride is None:
        stride = tuple(math.prod(shape[i + 1:]) for i in range(len(shape)))
    return DTensor.from_local(local_tensor, mesh, placements, run_check=False, shape=torch.Size(shape),
                              stride=tuple(stride))
