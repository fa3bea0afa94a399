"""Python face of the cast ops (csrc/cast/): fake kernels for torch.compile and thin wrappers.

The ops are declared once in csrc/ops.cpp (TORCH_LIBRARY(fp8mp, m)) and
implemented per device in C++; argument checks live there too, so
`torch.ops.fp8mp.*` called directly gives the same clear errors. The fake kernels
run the same checks (fp8mp/ops/checks.py), so do FakeTensor and torch.compile.
"""
from __future__ import annotations

import torch

from fp8mp.ops import native  # noqa: F401  (loads the libraries and their registrations)
from fp8mp.ops import checks
from fp8mp.ops.errors import raising_value_errors
from fp8mp.ops.format import FP8_DTYPES

__all__ = ["cast_to_fp8", "cast_to_fp8_transpose", "cast_to_fp8_transpose_dbias", "cast_from_fp8"]


@torch.library.register_fake("fp8mp::cast_to_fp8")
def _cast_to_fp8_fake(x, scale, amax, fmt):
    fmt = checks.check_cast_to_fp8_args(x, scale, amax, fmt, "fp8mp::cast_to_fp8")
    return torch.empty_like(x, dtype=FP8_DTYPES[fmt], memory_format=torch.contiguous_format)


@torch.library.register_fake("fp8mp::cast_to_fp8_transpose")
def _cast_to_fp8_transpose_fake(x, scale, amax, fmt):
    dtype = FP8_DTYPES[checks.check_cast_to_fp8_transpose_args(x, scale, amax, fmt)]
    rows, cols = x.shape
    return x.new_empty((rows, cols), dtype=dtype), x.new_empty((cols, rows), dtype=dtype)


@torch.library.register_fake("fp8mp::cast_to_fp8_transpose_dbias")
def _cast_to_fp8_transpose_dbias_fake(x, scale, amax, fmt):
    op = "fp8mp::cast_to_fp8_transpose_dbias"
    dtype = FP8_DTYPES[checks.check_cast_to_fp8_transpose_args(x, scale, amax, fmt, op)]
    rows, cols = x.shape
    return x.new_empty((rows, cols), dtype=dtype), x.new_empty((cols, rows), dtype=dtype), \
        x.new_empty((cols,), dtype=torch.float32)


@torch.library.register_fake("fp8mp::cast_from_fp8")
def _cast_from_fp8_fake(y, scale_inv, out_dtype):
    checks.check_cast_from_fp8_args(y, scale_inv, out_dtype)
    return torch.empty_like(y, dtype=out_dtype, memory_format=torch.contiguous_format)


@raising_value_errors
def cast_to_fp8(x: torch.Tensor, scale: torch.Tensor, amax: torch.Tensor, fmt: str = "e4m3") -> torch.Tensor:
    """Cast `x` to FP8: ``saturate(round_nearest_even(x * scale))``, writing ``max|x|`` into `amax`.

    Args:
        x: float32, bfloat16 or float16 tensor of any shape (non-contiguous is fine).
        scale: 1-element float32 tensor on x's device, finite and > 0. A CPU scale that is not is
            refused (ValueError); on CUDA, where reading it would cost a host sync, such a scale makes
            every output code NaN (+NaN, an input NaN keeping its sign), a non-finite result the loss
            scaler sees, never a silently wrong one (a negative scale would flip every sign).
        amax: 1-element float32 tensor on x's device; overwritten with max|x|
            (NaN if x holds a NaN, Inf if it holds an Inf), computed in the same pass.
        fmt: "e4m3" (max 448, Inf saturates) or "e5m2" (max 57344, Inf stays Inf).

    Returns:
        A contiguous float8_e4m3fn / float8_e5m2 tensor of x's shape.
    """
    return torch.ops.fp8mp.cast_to_fp8(x, scale, amax, fmt)


@raising_value_errors
def cast_to_fp8_transpose(
    x: torch.Tensor, scale: torch.Tensor, amax: torch.Tensor, fmt: str = "e4m3"
) -> tuple[torch.Tensor, torch.Tensor]:
    """Like :func:`cast_to_fp8` for a 2-D `x`, also returning the contiguous FP8 transpose from one read of x."""
    return torch.ops.fp8mp.cast_to_fp8_transpose(x, scale, amax, fmt)


@raising_value_errors
def cast_to_fp8_transpose_dbias(
    x: torch.Tensor, scale: torch.Tensor, amax: torch.Tensor, fmt: str = "e4m3"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """:func:`cast_to_fp8_transpose` that also returns ``dbias``, the float32 column sums of `x` (a bias
    gradient when `x` is the output gradient), from the same read of x.

    On CPU the sums are fused into the cast: each tile row of 64 rows summed row by row in fp32, then the
    tile rows' sums added in order, the same bits for any number of threads and any FP8MP_CPU_ISA; a sum that is
    NaN is written as the canonical +NaN (0x7FC00000). On CUDA they are torch's
    ``x.sum(0, dtype=torch.float32)`` after the cast (another order of additions).
    """
    return torch.ops.fp8mp.cast_to_fp8_transpose_dbias(x, scale, amax, fmt)


@raising_value_errors
def cast_from_fp8(y: torch.Tensor, scale_inv: torch.Tensor, out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Decode FP8 `y` and multiply by `scale_inv` (1-element float32 tensor), returning `out_dtype`.

    `scale_inv` must be finite and > 0: refused on CPU, on CUDA every output is then NaN (see
    :func:`cast_to_fp8`'s `scale`)."""
    return torch.ops.fp8mp.cast_from_fp8(y, scale_inv, out_dtype)
