"""The per-tensor family's amax -> scale rule, in one place: `current_scale`.

Every per-tensor scale fp8mp sets from an amax goes through it: a module's input, weight and gradient columns
under current scaling (fp8mp/scaling/per_tensor_quantizer.py), every expert's weight (per_tensor_grouped.py),
a weight stored or frozen in FP8 and a weight all-gathered in FP8 (fp8mp/quantized/). Delayed scaling's
update from the amax history is the op `update_amax_history_and_scale`, whose kernel applies the same rule
(csrc/scale_update/scale_rule.h).
"""
from __future__ import annotations

import torch

from fp8mp.ops.format import fp8_max_of
from fp8mp.ops.scale_update import compute_scale

__all__ = ["current_scale"]


def current_scale(amax: torch.Tensor, fmt: str, margin: int = 0, previous: torch.Tensor | None = None) -> torch.Tensor:
    """fp8_max(fmt) / amax / 2**margin for float32 `amax` (any shape); where amax is 0 or not finite (or the result
    is not a finite positive number), `previous` (default 1): an all-zero or overflowed tensor keeps its scale."""
    return compute_scale(amax, fp8_max_of(fmt), margin, torch.ones_like(amax) if previous is None else previous)
