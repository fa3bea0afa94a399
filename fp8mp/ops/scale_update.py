"""Scale updates: the fused delayed-scaling op, and the current-scaling rule computed by it.

``update_amax_history_and_scale`` is declared in csrc/ops.cpp and implemented
in csrc/scale_update/scale_update_{cpu,cuda}_kernels.*, whose glue (scale_update_cpu.cpp / scale_update_cuda.cpp) checks the arguments.
"""
from __future__ import annotations

import math

import torch

from fp8mp.ops import native  # noqa: F401  (loads the libraries and their registrations)
from fp8mp.ops import checks
from fp8mp.ops.errors import raising_value_errors
from fp8mp.ops.format import fp8_max_of

__all__ = ["update_amax_history_and_scale", "compute_scale", "fp8_max_of"]


@torch.library.register_fake("fp8mp::update_amax_history_and_scale")
def _update_amax_history_and_scale_fake(amax, amax_history, scale, scale_inv, fp8_max, margin, amax_compute_algo):
    # Only mutates its (a!)/(b!)/(c!) arguments, which the schema declares.
    checks.check_update_amax_history_args(amax, amax_history, scale, scale_inv, fp8_max, margin, amax_compute_algo)


@raising_value_errors
def update_amax_history_and_scale(
    amax: torch.Tensor,
    amax_history: torch.Tensor,
    scale: torch.Tensor,
    scale_inv: torch.Tensor,
    fp8_max: torch.Tensor,
    margin: int = 0,
    amax_compute_algo: str = "max",
) -> None:
    """One delayed-scaling step for a group of T tensors, in place, in one kernel.

    Args:
        amax: [T] float32, the newest amax of each tensor (as written by the cast ops).
        amax_history: [H, T] float32, row 0 newest; updated in place: rolled
            down one row (the oldest row drops out) with `amax` written into
            row 0, so afterwards ``amax_history[i, t]`` is tensor t's amax i steps ago.
        scale: [T] float32, updated in place to
            ``fp8_max / effective / 2**margin`` (fp32 arithmetic), where
            effective is the column max of the updated history ("max") or
            `amax` ("most_recent"). Where effective is 0, negative, NaN or Inf,
            or the new scale would not be a finite positive number, the old
            scale is kept (a NaN/Inf amax is still recorded in the history).
        scale_inv: [T] float32, set to ``1 / scale`` for every column, kept or not.
        fp8_max: [T] float32, the largest finite value of each tensor's format
            (a group may mix E4M3 tensors, 448, and E5M2 gradients, 57344).
        margin: int >= 0.
        amax_compute_algo: "max" or "most_recent".

    All tensors must be contiguous float32 on one device, and the three
    updated ones must not share memory with any other argument.
    """
    torch.ops.fp8mp.update_amax_history_and_scale(
        amax, amax_history, scale, scale_inv, fp8_max, margin, amax_compute_algo
    )


def compute_scale(amax: torch.Tensor, fp8_max: float, margin: int, previous_scale: torch.Tensor) -> torch.Tensor:
    """Current scaling: ``fp8_max / amax / 2**margin`` where that is usable, else `previous_scale`.

    The rule of :func:`update_amax_history_and_scale` with ``amax_compute_algo="most_recent"``, computed
    by that op (its one definition is csrc/scale_update/scale_rule.h, shared by the CPU and CUDA
    kernels), for float32 `amax` and `previous_scale` of the same shape: the new scale (fp32 arithmetic,
    two IEEE divisions) is used where amax is finite and > 0 and the result is finite and > 0. Out of
    place (the op updates fresh tensors), so it traces under torch.compile. Returns a new tensor.
    """
    if margin < 0:
        raise ValueError(f"margin must be >= 0, got {margin}")
    if isinstance(fp8_max, bool) or not isinstance(fp8_max, (int, float)) or not 0 < fp8_max < math.inf:
        raise ValueError(f"fp8_max must be a finite number > 0 (the format's largest value), got {fp8_max!r}")
    scale = previous_scale.reshape(-1).clone(memory_format=torch.contiguous_format)
    count = scale.numel()
    torch.ops.fp8mp.update_amax_history_and_scale(amax.reshape(-1).contiguous(), scale.new_empty(1, count), scale,
                                                  torch.empty_like(scale), torch.full_like(scale, fp8_max), margin,
                                                  "most_recent")
    return scale.view(previous_scale.shape)
