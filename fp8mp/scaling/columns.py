"""The columns of a module's FP8 scaling state: which FP8 tensor each is, and 1-element views of them.

An `Fp8Meta` (fp8mp/scaling/fp8_meta.py) keeps one column per FP8 tensor a module casts (a Linear's input,
weight and output gradient); the cast and GEMM ops take 1-element views of a column as their scale and amax
arguments. The per-tensor quantizer (fp8mp/scaling/per_tensor_quantizer.py) reads and writes them.
"""
from __future__ import annotations

import enum
from typing import NamedTuple

import torch

__all__ = ["LinearTensor", "INPUT", "WEIGHT", "GRAD", "Fp8Columns", "columns_of", "fold_amax_", "tensor_amax"]


def fold_amax_(step_amax: torch.Tensor, amax: torch.Tensor) -> None:
    """step_amax <- max(step_amax, amax) in place, NaN-propagating: one kernel after a cast."""
    torch.maximum(step_amax, amax, out=step_amax)


class Fp8Columns(NamedTuple):
    """1-element views of each column of an Fp8Meta's scale, scale_inv, amax and step_amax (the scale and
    amax arguments the cast and GEMM ops take), and amax_head[n] / step_amax_head[n], the views [:n]
    that a forward folds. step_amax and step_amax_head are None where step_amax is."""

    scale: tuple[torch.Tensor, ...]
    scale_inv: tuple[torch.Tensor, ...]
    amax: tuple[torch.Tensor, ...]
    step_amax: tuple[torch.Tensor, ...] | None
    amax_head: tuple[torch.Tensor, ...]
    step_amax_head: tuple[torch.Tensor, ...] | None


def columns_of(scale: torch.Tensor, scale_inv: torch.Tensor, amax: torch.Tensor,
               step_amax: torch.Tensor | None) -> Fp8Columns:
    """The Fp8Columns of these buffers, sliced now (see Fp8Meta.columns for the cached ones)."""
    def cols(t):
        return tuple(t[i : i + 1] for i in range(t.shape[0]))

    def heads(t):
        return tuple(t[:n] for n in range(t.shape[0] + 1))

    return Fp8Columns(cols(scale), cols(scale_inv), cols(amax), None if step_amax is None else cols(step_amax),
                      heads(amax), None if step_amax is None else heads(step_amax))


def tensor_amax(tensor: torch.Tensor) -> torch.Tensor:
    """max |tensor| as a [1] float32 tensor (0 for an empty tensor: an amax of 0 keeps the previous scale)."""
    if tensor.numel() == 0:
        return torch.zeros(1, device=tensor.device)
    return tensor.detach().abs().amax().float().reshape(1)


class LinearTensor(enum.IntEnum):
    """Column of each FP8 tensor of a Linear in its Fp8Meta.

    Code that torch.compile traces uses the plain ints below (INPUT, WEIGHT, GRAD): torch 2.12's dynamo
    treats an enum member as an opaque value and cannot trace ``LinearTensor.INPUT + 1``.
    """

    INPUT = 0
    WEIGHT = 1
    GRAD_OUTPUT = 2


INPUT, WEIGHT, GRAD = int(LinearTensor.INPUT), int(LinearTensor.WEIGHT), int(LinearTensor.GRAD_OUTPUT)
