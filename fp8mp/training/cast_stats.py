"""How much of a tensor an FP8 cast loses at the top (saturation) and the bottom (flush to zero)."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from fp8mp.ops.format import fp8_max_of, normalize_format
from fp8mp.ops.cast import cast_to_fp8


@dataclass(frozen=True)
class CastCounts:
    """Counts over one or more casts of a tensor.

    Attributes:
        saturated: values with ``|x * scale| > fp8_max`` (fp32 product, as the cast kernel
            computes it), which the cast clips to ±fp8_max; ±Inf counts, NaN does not.
            A value landing exactly on fp8_max is representable and does not count.
        flushed: values with ``x != 0`` whose cast is ±0 (underflow below half the
            smallest subnormal), found by running the real cast kernel.
        total: number of values cast.
    """

    saturated: int = 0
    flushed: int = 0
    total: int = 0

    def __add__(self, other: "CastCounts") -> "CastCounts":
        return CastCounts(self.saturated + other.saturated, self.flushed + other.flushed, self.total + other.total)

    @property
    def saturated_fraction(self) -> float:
        """saturated / total; NaN when nothing was cast."""
        return self.saturated / self.total if self.total else float("nan")

    @property
    def flushed_fraction(self) -> float:
        """flushed / total; NaN when nothing was cast."""
        return self.flushed / self.total if self.total else float("nan")


def count_cast_losses(x: torch.Tensor, scale: torch.Tensor, fmt: str) -> CastCounts:
    """Count the values of `x` that a cast to `fmt` with `scale` saturates or flushes to zero.

    Args:
        x: float32, bfloat16 or float16 tensor (what the module casts).
        scale: 1-element float32 tensor, the scale the cast uses.
        fmt: "e4m3" or "e5m2".
    """
    fmt = normalize_format(fmt)
    if not isinstance(scale, torch.Tensor) or scale.numel() != 1:
        raise ValueError(f"argument 'scale' must be a 1-element tensor, got {scale!r}")
    x = x.detach()
    scale = scale.detach().reshape(1).float()
    saturated = int(((x.float() * scale).abs() > fp8_max_of(fmt)).sum())
    cast = cast_to_fp8(x, scale, torch.zeros(1, device=x.device), fmt)
    flushed = int(((cast.float() == 0) & (x != 0)).sum())
    return CastCounts(saturated, flushed, x.numel())
