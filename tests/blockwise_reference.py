"""Independent references for the block-scaled ops, in plain PyTorch (no fp8mp code).

- deepseek_quantize: DeepSeek-V3 (arXiv 2412.19437, section 3.3.2) fine-grained quantization: the
  max-abs of each 1 x 128 activation tile / 128 x 128 weight block is mapped onto the FP8 maximum;
  written with general tile sizes, zero padding for partial edge tiles, and torchao's scale
  convention (scale = fp8_max / max(amax, 1e-12) in float64, then float32; data = fp8(x * scale)).
- block_gemm_reference: the arithmetic of the paper's "promotion to FP32 every N_C = 128
  elements": each K chunk's products summed exactly (float64; exact for E4M3 x E4M3 chunks of
  integers), rounded to fp32, multiplied by the fp32 product of the two scales, accumulated in
  fp32 chunk after chunk.
"""
from __future__ import annotations

import torch

FP8_MAX = {torch.float8_e4m3fn: 448.0, torch.float8_e5m2: 57344.0}


def _pad_to(x: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    return torch.nn.functional.pad(x, (0, cols - x.shape[1], 0, rows - x.shape[0]))


def tile_amax(x: torch.Tensor, block_rows: int, block_cols: int) -> torch.Tensor:
    """[ceil(R / br), ceil(C / bc)] max|x| per tile, zero padded."""
    R, C = x.shape
    tr, tc = -(-R // block_rows), -(-C // block_cols)
    padded = _pad_to(x.float().abs(), tr * block_rows, tc * block_cols)
    return padded.reshape(tr, block_rows, tc, block_cols).amax(dim=(1, 3))


def expand_tiles(s: torch.Tensor, block_rows: int, block_cols: int, shape) -> torch.Tensor:
    """Each tile's value repeated over its elements, cropped to `shape`."""
    return s.repeat_interleave(block_rows, 0).repeat_interleave(block_cols, 1)[: shape[0], : shape[1]]


def deepseek_quantize(x: torch.Tensor, block_rows: int, block_cols: int, dtype: torch.dtype, pow2: bool = False):
    """(data, scale_inv [tiles]) of x quantized per block_rows x block_cols tile."""
    amax = tile_amax(x, block_rows, block_cols)
    scale = (FP8_MAX[dtype] / amax.double().clamp(min=1e-12)).float()
    if pow2:
        scale = torch.exp2(torch.floor(torch.log2(scale)))
    scaled = x.float() * expand_tiles(scale, block_rows, block_cols, x.shape)
    data = scaled.clamp(-FP8_MAX[dtype], FP8_MAX[dtype]).to(dtype)
    return data, scale.reciprocal()


def decode_scale(s: torch.Tensor) -> torch.Tensor:
    """float32 values of a float32 or float8_e8m0fnu scale tensor (torch's own conversion)."""
    return s.float()


def block_gemm_reference(a, sa, b, sb, a_block_rows: int, b_block_rows: int, block_k: int, bias=None,
                         out_dtype=torch.float32) -> torch.Tensor:
    M, K = a.shape
    N = b.shape[0]
    a64, b64 = a.float().double(), b.float().double()
    sa_rows = decode_scale(sa).repeat_interleave(a_block_rows, 0)[:M]  # [M, chunks]
    sb_rows = decode_scale(sb).repeat_interleave(b_block_rows, 0)[:N]  # [N, chunks]
    acc = torch.zeros(M, N, dtype=torch.float32)
    for c, k0 in enumerate(range(0, K, block_k)):
        chunk = (a64[:, k0:k0 + block_k] @ b64[:, k0:k0 + block_k].T).float()
        acc = acc + chunk * (sa_rows[:, c : c + 1] * sb_rows[:, c].unsqueeze(0))
    if bias is not None:
        acc = acc + bias.float()
    return acc.to(out_dtype)
