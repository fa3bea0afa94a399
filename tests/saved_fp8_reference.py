"""Independent references for what fp8mp stores in FP8 for backward (E4M3 in 1 x 128 groups along the last
dimension, one fp32 scale per group): torch's float8_e4m3fn cast, and the bound on how far storing moves an element."""
from __future__ import annotations

import math

import torch

E4M3_MAX = 448.0
GROUP = 128
# E4M3 has 3 mantissa bits: within a binade the spacing is 2^-3 of its lower end, so rounding to nearest
# moves a normal value by at most 2^-4 of itself; below 2^-6 (subnormals) the spacing is 2^-9, half of it 2^-10.
HALF_SPACING = 2.0 ** -4
SUBNORMAL_HALF_SPACING = 2.0 ** -10
# fp32 steps around the FP8 rounding (x * scale, 1 / scale, data * scale_inv): a few 2^-24 each.
FP32_SLACK = 2.0 ** -20


def grouped_input(rows: int, cols: int, seed: int = 0, offset: float = 0.0) -> torch.Tensor:
    """fp32 [rows, cols] whose 128-element groups along each row have magnitudes from 1e-4 to 1e3, so that
    one scale for a whole row (or tensor) would flush its small groups to zero."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, cols, generator=gen, dtype=torch.float64)
    groups = math.ceil(cols / GROUP)
    magnitude = 10.0 ** (torch.rand(rows, groups, generator=gen, dtype=torch.float64) * 7 - 4)
    return (x * magnitude.repeat_interleave(GROUP, 1)[:, :cols] + offset).float()


def group_amax(x64: torch.Tensor) -> torch.Tensor:
    """max|x| of each element's 1 x 128 group along the last dimension, per element (x64 [rows, cols])."""
    rows, cols = x64.shape
    padded = torch.nn.functional.pad(x64.abs(), (0, -cols % GROUP)).view(rows, -1, GROUP)
    return padded.amax(-1).repeat_interleave(GROUP, 1)[:, :cols]


def fp8_error_bound(x64: torch.Tensor) -> torch.Tensor:
    """Per element, the most that storing x as E4M3 in 1 x 128 groups (scale 448 / group amax) can move it."""
    step_inv = group_amax(x64) / E4M3_MAX  # one unit of the scaled domain, in x's units
    return torch.maximum(HALF_SPACING * x64.abs(), SUBNORMAL_HALF_SPACING * step_inv) * (1 + FP32_SLACK) + FP32_SLACK * x64.abs()


def reference_fake_quant(x: torch.Tensor) -> torch.Tensor:
    """x through per-group E4M3 with torch's float8_e4m3fn cast: scale = fp32(448 / amax), data = e4m3(x * scale),
    value = fp32(data) * fp32(1 / scale) (x [rows, cols] with cols >= 128, fp32)."""
    amax = group_amax(x.double())
    scale = (E4M3_MAX / amax.clamp_min(1e-12)).float()
    data = (x * scale).to(torch.float8_e4m3fn)
    return data.float() * (1 / scale)
