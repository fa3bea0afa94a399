"""An independent NVFP4 reference in numpy (fp32 where the format's recipe computes in fp32, fp64 to check).

Written from the formats' definitions, not by calling torchao:
- E2M1 (OCP MX v1.0, section 5.3.3): 1 sign, 2 exponent bits (bias 1), 1 mantissa bit, no Inf or NaN; the values
  0, 0.5, 1, 1.5, 2, 3, 4, 6 and their negatives, -0 included (code 0b1000).
- E4M3 block scales (OCP 8-bit FP v1.0, fp8mp's docs/formats.md): bias 7, max 448, NaN 0x7F/0xFF, no Inf;
  ml_dtypes.float8_e4m3fn rounds to nearest even, which is the rule these scales follow.
- NVFP4 (NVIDIA, arXiv 2509.25149, appendix on the quantization): blocks of 16 along the last axis, one E4M3
  scale per block, one fp32 scale per tensor, amax / (6 * 448), so a block holding the tensor's amax gets the
  block scale 448; the values are rounded to E2M1 after a multiplication by the reciprocal of the decoded scale.

The fp32 steps (their order and where a reciprocal replaces a division) are restated from torchao 0.18's
`torchao/prototype/mx_formats/nvfp4_tensor.py::nvfp4_quantize` and `per_tensor_amax_to_scale`, which follow
the paper's "multiply by the encode scale" form and the MSLK/TE kernels; each step below says which line.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

F4_MAX = 6.0
F8_MAX = 448.0
E4M3_TINY = 2.0 ** -6  # smallest normal E4M3: torchao's E4M3_EPS = finfo(float8_e4m3fn).tiny
BLOCK = 16

# E2M1 code -> value, from the format: code = s eem; e == 0 is subnormal (0 or 0.5), else 2**(e-1) * (1 + m/2).
E2M1_VALUES = np.array([(-1.0 if c >> 3 else 1.0)
                        * ((c & 1) * 0.5 if (c >> 1) & 3 == 0 else 2.0 ** (((c >> 1) & 3) - 1) * (1 + (c & 1) / 2))
                        for c in range(16)])
_GRID = E2M1_VALUES[:8]  # the non-negative values in code order: 0, 0.5, 1, 1.5, 2, 3, 4, 6


def e2m1_decode(codes: np.ndarray) -> np.ndarray:
    """fp64 values of 4-bit E2M1 codes (uint8, low 4 bits used)."""
    return E2M1_VALUES[np.asarray(codes, dtype=np.uint8) & 0xF]


def e2m1_encode(y: np.ndarray) -> np.ndarray:
    """E2M1 codes of y: round to nearest, ties to the even code (even mantissa), saturating at +-6; the sign bit
    is y's sign bit, so -0 and negatives that round to zero give code 8 (the format has a -0). NaN is not defined
    by E2M1 (no NaN code) and is refused."""
    y = np.asarray(y, dtype=np.float64)
    if np.isnan(y).any():
        raise ValueError("y: E2M1 has no NaN code; the input holds NaN")
    a = np.minimum(np.abs(y), F4_MAX)
    # Distance to every grid point; the nearest wins, on a tie the even code (codes 2k have mantissa bit 0).
    dist = np.abs(a[..., None] - _GRID)
    best = dist.min(axis=-1, keepdims=True)
    ties = dist == best
    even = ties & (np.arange(8) % 2 == 0)
    mag = np.where(even.any(axis=-1), np.argmax(even, axis=-1), np.argmax(ties, axis=-1)).astype(np.uint8)
    return mag | (np.signbit(y).astype(np.uint8) << 3)


def pack(codes: np.ndarray) -> np.ndarray:
    """Two codes per byte along the last axis: element 2i in the low nibble, 2i+1 in the high nibble, the order of
    torch.float4_e2m1fn_x2 and torchao's pack_uint4 (`data[::2] | data[1::2] << 4`)."""
    codes = np.asarray(codes, dtype=np.uint8)
    if codes.shape[-1] % 2:
        raise ValueError(f"codes: last dim must be even, got {codes.shape[-1]}")
    return (codes[..., 0::2] & 0xF) | ((codes[..., 1::2] & 0xF) << 4)


def unpack(packed: np.ndarray) -> np.ndarray:
    """Inverse of pack: the low nibble first."""
    packed = np.asarray(packed, dtype=np.uint8)
    return np.stack([packed & 0xF, packed >> 4], axis=-1).reshape(*packed.shape[:-1], -1)


def e4m3(x: np.ndarray) -> np.ndarray:
    """fp32 -> E4M3 (ml_dtypes.float8_e4m3fn), round to nearest even."""
    return np.asarray(x, dtype=np.float32).astype(ml_dtypes.float8_e4m3fn)


def per_tensor_scale(x: np.ndarray) -> np.float32:
    """The fp32 per-tensor scale amax(|x|) / (448 * 6) (torchao per_tensor_amax_to_scale: one fp32 division).

    Where the spec and torchao part: an all-zero tensor (amax 0). torchao returns scale 0, and its block scales
    become 0/0 = NaN. TE's global encode scale falls back to 1 when the amax is 0 (transformer_engine/common/cast/
    nvfp4/core_nvfp4.cuh, compute_global_encode_scaling_factor_FP4; the paper leaves 0/0 undefined); this
    reference follows TE and returns 1, so an all-zero tensor quantizes to zeros."""
    amax = np.float32(np.max(np.abs(np.asarray(x, dtype=np.float32)))) if np.size(x) else np.float32(0)
    if amax == 0:
        return np.float32(1.0)
    return np.float32(amax / np.float32(F8_MAX * F4_MAX))


def _check(x: np.ndarray, tile_rows: int) -> np.ndarray:
    x = np.asarray(x)
    if x.ndim != 2:
        raise ValueError(f"x: expected a 2-D tensor, got {x.ndim} dims")
    if x.shape[1] % BLOCK or x.shape[0] % tile_rows:
        raise ValueError(f"x: shape {tuple(x.shape)} must be a multiple of ({tile_rows}, {BLOCK})")
    return x.astype(np.float32)


def _finite(x: np.ndarray, two_level: bool) -> None:
    """Refuse what NVFP4 does not define. E2M1 has no NaN, so a NaN has no code (torchao gives its block the
    scale NaN and codes of no meaning). An Inf saturates under one-level scaling (its block scale clamps to 448
    and the Inf to +-6, as torchao does); under two-level scaling it makes the per-tensor scale Inf and every
    block scale NaN (torchao), so it is refused there."""
    if np.isnan(x).any():
        raise ValueError("x: holds NaN, which NVFP4 (E2M1) cannot encode")
    if two_level and np.isinf(x).any():
        raise ValueError("x: holds Inf, which makes the two-level per-tensor scale Inf")


def _quantize_blocks(blocks: np.ndarray, amax: np.ndarray, tensor_scale: np.float32 | None):
    """(codes, e4m3 block scales) of `blocks` [..., n] whose block amaxes are `amax` [...] (all fp32 math)."""
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        block_scale = (amax / np.float32(F4_MAX)).astype(np.float32)  # torchao: max_abs / F4_E2M1_MAX
        if tensor_scale is not None:
            # torchao: block_scale_fp32 / per_tensor_scale
            block_scale = (block_scale / tensor_scale).astype(np.float32)
        # torchao clamps to [E4M3 tiny, 448] before the cast: block scales never use E4M3 subnormals and an all-zero
        # block gets 2**-6; clip keeps NaN, as torch.clamp does.
        scale_f8 = e4m3(np.clip(block_scale, np.float32(E4M3_TINY), np.float32(F8_MAX)))
        scale = scale_f8.astype(np.float32)
        if tensor_scale is None:
            recip = (np.float32(1.0) / scale).astype(np.float32)  # torchao: 1.0 / block_scale_fp32
        else:
            recip = ((np.float32(1.0) / tensor_scale) / scale).astype(np.float32)  # (1 / pts) / scale_fp32
        y = (blocks * recip[..., None]).astype(np.float32)  # the paper's x * s_enc_b, one fp32 product
    return e2m1_encode(y), scale_f8


def quantize(x: np.ndarray, two_level: bool = True):
    """NVFP4 of a 2-D x along its last axis in blocks of 16: (codes uint8 [M, K], block scales e4m3 [M, K/16],
    per-tensor fp32 scale or None for the one-level variant)."""
    x = _check(x, 1)
    _finite(x, two_level)
    m, k = x.shape
    blocks = x.reshape(m, k // BLOCK, BLOCK)
    amax = np.max(np.abs(blocks), axis=-1)  # NaN propagates, as torch.amax does
    ts = per_tensor_scale(x) if two_level else None
    codes, scales = _quantize_blocks(blocks, amax, ts)
    return codes.reshape(m, k), scales, ts


def quantize_2d(w: np.ndarray, two_level: bool = True):
    """NVFP4 of a weight in 16x16 tiles (one E4M3 scale per tile, the paper's 2-D weight scaling, so W and W^T
    quantize to the same values): (codes [N, K], scales e4m3 [N/16, K/16], per-tensor scale or None)."""
    w = _check(w, BLOCK)
    _finite(w, two_level)
    n, k = w.shape
    tiles = w.reshape(n // BLOCK, BLOCK, k // BLOCK, BLOCK).transpose(0, 2, 1, 3).reshape(n // BLOCK, k // BLOCK, -1)
    amax = np.max(np.abs(tiles), axis=-1)
    ts = per_tensor_scale(w) if two_level else None
    codes, scales = _quantize_blocks(tiles, amax, ts)
    codes = codes.reshape(n // BLOCK, k // BLOCK, BLOCK, BLOCK).transpose(0, 2, 1, 3).reshape(n, k)
    return codes, scales, ts


def dequantize(codes: np.ndarray, scales: np.ndarray, tensor_scale: np.float32 | None, tile_rows: int = 1):
    """fp64 values of NVFP4 codes: e2m1 * block scale * per-tensor scale (tile_rows 16 for quantize_2d's scales)."""
    s = np.asarray(scales).astype(np.float64)
    s = np.repeat(np.repeat(s, tile_rows, axis=0), BLOCK, axis=1)
    return e2m1_decode(codes) * s * (1.0 if tensor_scale is None else float(tensor_scale))


def hadamard16() -> np.ndarray:
    """The 16x16 Sylvester Hadamard matrix (H_1 = [1], H_2n = [[H, H], [H, -H]]), entries +-1, fp64."""
    h = np.ones((1, 1))
    while h.shape[0] < BLOCK:
        h = np.block([[h, h], [h, -h]])
    return h


def rht_signs(seed: int) -> np.ndarray:
    """The random signs of the transform: bit i of numpy.random.default_rng(seed).integers(0, 2, 16) gives
    sign 1 - 2 * bit (0 -> +1, 1 -> -1); the same seed gives the same signs on every machine (PCG64)."""
    bits = np.random.default_rng(seed).integers(0, 2, BLOCK)
    return 1.0 - 2.0 * bits


def rht_matrix(seed: int) -> np.ndarray:
    """R = diag(signs(seed)) @ H16 / 4: orthogonal (H16 H16^T = 16 I), so R^-1 = R^T."""
    return rht_signs(seed)[:, None] * hadamard16() / 4.0


def rht(x: np.ndarray, seed: int) -> np.ndarray:
    """The random Hadamard transform of x along its last axis, each block of 16 times R (fp64)."""
    x = np.asarray(x, dtype=np.float64)
    if x.shape[-1] % BLOCK:
        raise ValueError(f"x: last dim {x.shape[-1]} must be a multiple of {BLOCK}")
    b = x.reshape(*x.shape[:-1], -1, BLOCK)
    return (b @ rht_matrix(seed)).reshape(x.shape)


def rht_inverse(y: np.ndarray, seed: int) -> np.ndarray:
    """Undoes rht: each block of 16 times R^T (fp64)."""
    y = np.asarray(y, dtype=np.float64)
    if y.shape[-1] % BLOCK:
        raise ValueError(f"y: last dim {y.shape[-1]} must be a multiple of {BLOCK}")
    b = y.reshape(*y.shape[:-1], -1, BLOCK)
    return (b @ rht_matrix(seed).T).reshape(y.shape)
