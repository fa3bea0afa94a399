"""Independent references for FP8 casts: ml_dtypes and torch's own float8 conversion.

The references use no fp8mp code (`cast` at the end is the call under test,
shared by the CPU and CUDA cast tests). Both are given the fp32 product x * scale (what the
kernels round) and the saturation fp8mp documents: finite overflow clamps to
+-max; Inf clamps in E4M3 and stays Inf in E5M2. The clamp is explicit because
torch 2.11 turns E4M3 overflow into NaN where 2.12+ saturates.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import torch

import fp8mp

FP8_DTYPES = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
ML_DTYPES = {"e4m3": ml_dtypes.float8_e4m3fn, "e5m2": ml_dtypes.float8_e5m2}
FP8_MAX = {"e4m3": float(ml_dtypes.finfo(ml_dtypes.float8_e4m3fn).max), "e5m2": float(ml_dtypes.finfo(ml_dtypes.float8_e5m2).max)}


def scaled_fp32(x: torch.Tensor, scale: float) -> torch.Tensor:
    return x.float() * torch.tensor(scale, dtype=torch.float32)


def saturate(v: torch.Tensor, fmt: str) -> torch.Tensor:
    clamped = v.clamp(-FP8_MAX[fmt], FP8_MAX[fmt])
    return torch.where(v.isinf(), v, clamped) if fmt == "e5m2" else clamped


def torch_reference_bits(x: torch.Tensor, scale: float, fmt: str) -> torch.Tensor:
    """uint8 codes from torch's own float8 cast."""
    return saturate(scaled_fp32(x, scale), fmt).to(FP8_DTYPES[fmt]).view(torch.uint8)


def ml_dtypes_reference_bits(x: torch.Tensor, scale: float, fmt: str) -> np.ndarray:
    """uint8 codes from ml_dtypes (its E5M2 NaN code differs: compare NaN positions by NaN-ness)."""
    v = saturate(scaled_fp32(x, scale), fmt).numpy()
    return v.astype(ML_DTYPES[fmt]).view(np.uint8)


def is_nan_code(bits: torch.Tensor, fmt: str) -> torch.Tensor:
    mag = bits.to(torch.int32) & 0x7F
    return mag == 0x7F if fmt == "e4m3" else mag > 0x7C


def decode_reference(bits: torch.Tensor, fmt: str) -> np.ndarray:
    """fp32 values of uint8 codes, decoded by ml_dtypes."""
    return bits.numpy().view(ML_DTYPES[fmt]).astype(np.float32)


def all_16bit_patterns(dtype: torch.dtype) -> torch.Tensor:
    return torch.from_numpy(np.arange(1 << 16, dtype=np.uint16).view(np.int16)).view(dtype)


def random_fp32_across_exponents(n: int, seed: int, min_exp: int = -40, max_exp: int = 40) -> torch.Tensor:
    """Random sign and mantissa, exponent uniform in [min_exp, max_exp], plus zeros, subnormals, Inf and NaN."""
    rng = np.random.default_rng(seed)
    sign = rng.integers(0, 2, n, dtype=np.uint32) << 31
    exponent = rng.integers(127 + min_exp, 127 + max_exp + 1, n, dtype=np.uint32) << 23
    mantissa = rng.integers(0, 1 << 23, n, dtype=np.uint32)
    bits = sign | exponent | mantissa
    specials = np.array([0, 0x80000000, 0x00000001, 0x807FFFFF, 0x7F800000, 0xFF800000, 0x7FC00000, 0xFFC00001], dtype=np.uint32)
    bits[: len(specials)] = specials
    return torch.from_numpy(bits.view(np.float32).copy())


FORMATS = ["e4m3", "e5m2"]
SCALES = [1.0, 0.5, 2.0**-7, 3.7, 448.0 / 1000.0, 2.0**10]  # exact, inexact, tiny, huge


def cast(x: torch.Tensor, scale: float, fmt: str) -> tuple[torch.Tensor, torch.Tensor]:
    """fp8mp.cast_to_fp8 with a Python-float scale: (y, amax)."""
    amax = torch.zeros(1)
    y = fp8mp.cast_to_fp8(x, torch.tensor([scale], dtype=torch.float32), amax, fmt)
    return y, amax


def dbias_reference(x: torch.Tensor, tile_rows: int = 64) -> np.ndarray:
    """The documented order of cast_to_fp8_transpose_dbias's sums, in numpy fp32 (each addition an IEEE
    fp32 addition of whole rows): per tile row of 64 rows, row by row; then the tile rows' sums in order."""
    values = x.float().numpy()
    total = None
    for r0 in range(0, values.shape[0], tile_rows):
        tile = values[r0 : r0 + tile_rows]
        sums = tile[0].copy()
        for row in tile[1:]:
            sums = (sums + row).astype(np.float32)
        total = sums if total is None else (total + sums).astype(np.float32)
    return total if total is not None else np.zeros(values.shape[1], np.float32)
