"""Fine-grained (block) scaling ops: quantize with one scale per tile, and the GEMM of two such operands.

Declared in csrc/ops.cpp, implemented on CPU in csrc/blockwise/ (checks in blockwise_checks.cpp,
again in Python in checks.py for the fake kernels). The recipes of fp8mp.scaling.recipe use:

================  ==============================  ==================  ==========================
recipe            block (rows x cols)             scale_mode          scale_inv dtype
================  ==============================  ==================  ==========================
rowwise           1 x K                           "pow2" or "fp32"    float32
DeepSeek-V3       activations 1 x 128,            "fp32" or "pow2"    float32
                  weights 128 x 128
MXFP8 (OCP MX)    1 x 32                          "e8m0_floor" /      float8_e8m0fnu
                                                  "e8m0_rceil"
================  ==============================  ==================  ==========================

Layout: ``scale_inv`` is row-major ``[ceil(R / block_rows), ceil(C / block_cols)]`` for data
``[R, C]``; ``scale_inv[i, j]`` dequantizes tile (i, j). This is the "naive" layout (torchao's
to_mx before swizzling); cuBLASLt's MXFP8 path wants the scales swizzled into 128 x 4 tiles and its
blockwise path K-major 1 x 128 scales, which a CUDA implementation rearranges. Shapes need not be
multiples of the block: an edge tile is scaled from the elements it has (the same as zero padding),
and the GEMM's last K chunk is shorter.

Non-finite inputs are not refused: a NaN makes its tile's scale NaN (E8M0 code 255), so the whole
tile decodes as NaN, and an Inf makes it decode as NaN too (scale_inv Inf or a NaN data code), so
an overflow stays visible.

On CUDA (compiled for every release arch but not yet run on a GPU; tests/ops/test_blockwise_cuda.py):
block_quantize and block_quantize_transpose have their own kernels, bit for bit the CPU's (the tile
scale and the cast are csrc/blockwise/block_scale_rule.h, shared by both devices), for every block
size, dtype, format and scale mode. block_scaled_gemm runs on every FP8 GPU (compute capability 8.9+),
by one of two paths (csrc/blockwise/block_gemm_path.h): cuBLASLt's own block scale mode where it has
one (rowwise 1 x K blocks as OUTER_VEC_32F and DeepSeek-V3 1 x 128 / 128 x 128 blocks as VEC128_32F /
BLK128x128_32F on compute capability 9.x with cuBLASLt 12.9+; MXFP8 1 x 32 E8M0 blocks as VEC32_UE8M0
on 10.x and 12.x with cuBLASLt 12.8+), elsewhere one FP8 GEMM per K chunk with fp32 output whose
chunks are folded with their scales in the CPU emulation's order and arithmetic. Both produce fp32,
add the bias in fp32 and round once to the output dtype. It agrees with the CPU emulation to fp32
accumulation-order noise (bit for bit on the chunked path where every chunk's sum is exact);
``FP8MP_BLOCK_GEMM_PATH=chunked`` takes the chunked path on any GPU. Other block sizes on CUDA raise
RuntimeError in the kernel and in the fake kernel alike (:func:`cuda_block_gemm_unsupported`); a GPU
without FP8 tensor cores, or one this build holds no code for, raises one naming the GPU, its
compute capability and what is needed.
"""
from __future__ import annotations

from typing import Optional

import torch

from fp8mp.ops import native  # noqa: F401  (loads the libraries and their registrations)
from fp8mp.ops import checks
from fp8mp.ops.errors import raising_value_errors
from fp8mp.ops.format import FP8_DTYPES

__all__ = ["block_quantize", "block_quantize_transpose", "block_scaled_gemm", "block_dequantize", "BLOCK_SCALE_MODES"]

BLOCK_SCALE_MODES = checks.BLOCK_SCALE_MODES


def _ceil_div(a, b):
    return (a + b - 1) // b


def refuse_cuda(what: str, why: str, *tensors) -> None:
    """NotImplementedError naming `what` and `why` when any of `tensors` is on CUDA (no kernel, no fallback)."""
    if any(t is not None and t.is_cuda for t in tensors):
        raise NotImplementedError(f"{what} on CUDA tensors: {why}")


def cuda_block_gemm_unsupported(k: int, a_block_rows: int, b_block_rows: int, block_k: int, a_e8m0: bool,
                                b_e8m0: bool) -> Optional[str]:
    """The error fp8mp's CUDA block_scaled_gemm raises for blocks no cuBLASLt recipe takes, or None.

    The same rule and text as block_gemm_recipe in csrc/blockwise/block_gemm_cuda_kernels.cu, so that
    the fake kernel (torch.compile's tracing) refuses on CUDA what the CUDA kernel refuses.
    """
    fp32_scales = not a_e8m0 and not b_e8m0
    if fp32_scales and a_block_rows == 1 and b_block_rows == 1 and block_k >= k:
        return None  # rowwise
    if (fp32_scales and block_k == 128 and a_block_rows in (1, 128) and b_block_rows in (1, 128)
            and not (a_block_rows == 128 and b_block_rows == 128)):
        return None  # DeepSeek-V3
    if a_e8m0 and b_e8m0 and block_k == 32 and a_block_rows == 1 and b_block_rows == 1:
        return None  # MXFP8

    def dtype(e8m0):
        return "float8_e8m0fnu" if e8m0 else "float32"

    return ("fp8mp::block_scaled_gemm: on CUDA the blocks must be those of a recipe cuBLASLt runs: rowwise "
            "(a_block_rows = b_block_rows = 1, block_k >= K, float32 scales), DeepSeek-V3 (block_k = 128, a_block_rows "
            "and b_block_rows 1 or 128, not both 128, float32 scales) or MXFP8 (a_block_rows = b_block_rows = 1, "
            f"block_k = 32, float8_e8m0fnu scales); got a_block_rows = {a_block_rows}, b_block_rows = {b_block_rows}, "
            f"block_k = {block_k}, K = {k}, scales {dtype(a_e8m0)} and {dtype(b_e8m0)}")


@torch.library.register_fake("fp8mp::block_quantize")
def _block_quantize_fake(x, block_rows, block_cols, fmt, scale_mode):
    fmt, scale_mode = checks.check_block_quantize_args(x, block_rows, block_cols, fmt, scale_mode)
    rows, cols = x.shape
    scale_dtype = torch.float8_e8m0fnu if scale_mode.startswith("e8m0") else torch.float32
    return (x.new_empty((rows, cols), dtype=FP8_DTYPES[fmt]),
            x.new_empty((_ceil_div(rows, block_rows), _ceil_div(cols, block_cols)), dtype=scale_dtype))


@torch.library.register_fake("fp8mp::block_quantize_transpose")
def _block_quantize_transpose_fake(x, row_block, col_block, fmt, scale_mode):
    fmt, scale_mode = checks.check_block_quantize_transpose_args(x, row_block, col_block, fmt, scale_mode)
    rows, cols = x.shape
    data_dtype = FP8_DTYPES[fmt]
    scale_dtype = torch.float8_e8m0fnu if scale_mode.startswith("e8m0") else torch.float32
    return (x.new_empty((rows, cols), dtype=data_dtype), x.new_empty((rows, _ceil_div(cols, row_block)), dtype=scale_dtype),
            x.new_empty((cols, rows), dtype=data_dtype), x.new_empty((cols, _ceil_div(rows, col_block)), dtype=scale_dtype))


@torch.library.register_fake("fp8mp::block_scaled_gemm")
def _block_scaled_gemm_fake(a, a_scale_inv, b, b_scale_inv, a_block_rows, b_block_rows, block_k, bias, out_dtype):
    checks.check_block_scaled_gemm_args(a, a_scale_inv, b, b_scale_inv, a_block_rows, b_block_rows, block_k, bias,
                                        out_dtype)
    if a.is_cuda:
        e8m0 = torch.float8_e8m0fnu
        unsupported = cuda_block_gemm_unsupported(a.shape[1], a_block_rows, b_block_rows, block_k,
                                                  a_scale_inv.dtype == e8m0, b_scale_inv.dtype == e8m0)
        if unsupported is not None:
            raise RuntimeError(unsupported)
    return a.new_empty((a.shape[0], b.shape[0]), dtype=out_dtype)


@raising_value_errors
def block_quantize(x: torch.Tensor, block_rows: int, block_cols: int, fmt: str = "e4m3",
                   scale_mode: str = "fp32") -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize a 2-D `x` to FP8 with one scale per block_rows x block_cols tile.

    For each tile with ``amax = max|x|`` over the tile and ``fp8_max`` the format's largest value:

    - ``"fp32"``: ``scale = float32(fp8_max / max(amax, 1e-12))`` (division in float64, as torchao's
      ``amax_to_scale``), ``data = fp8(x * scale)``, ``scale_inv = 1 / scale``.
    - ``"pow2"``: the same scale rounded down to a power of two (torchao's ``round_scales_to_power_of_2``),
      so dequantization is exact. (torchao rounds with a float32 log2, which may round a scale just below
      a power of two up; fp8mp reads the exponent, which never does.)
    - ``"e8m0_floor"``: OCP MX v1.0, ``e = floor(log2(amax)) - emax_elem`` (emax_elem 8 for E4M3,
      15 for E5M2), ``data = fp8(clamp(x / 2^e))``; scale_inv is the E8M0 code of ``2^e``.
    - ``"e8m0_rceil"``: NVIDIA's rule, the smallest ``2^e >= amax / fp8_max``.

    Args:
        x: [R, C] float32, bfloat16 or float16 (made contiguous if it is not).
        block_rows, block_cols: tile size, >= 1 (see the module docstring for edge tiles).
        fmt: "e4m3" or "e5m2".
        scale_mode: one of BLOCK_SCALE_MODES.

    Returns:
        (data [R, C] float8, scale_inv [ceil(R / block_rows), ceil(C / block_cols)] float32 or float8_e8m0fnu).
    """
    return torch.ops.fp8mp.block_quantize(x, block_rows, block_cols, fmt, scale_mode)


@raising_value_errors
def block_quantize_transpose(x: torch.Tensor, row_block: int, col_block: int, fmt: str = "e4m3",
                             scale_mode: str = "fp32") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Both 1-row quantizations of a 2-D `x` that a GEMM and its backward need, from the same reads of `x`.

    Returns (data, scale_inv, data_t, scale_inv_t), bit for bit
    ``block_quantize(x, 1, row_block, fmt, scale_mode)`` and ``block_quantize(x.T, 1, col_block, fmt, scale_mode)``:
    data [R, C] in 1 x row_block tiles along each row, scale_inv [R, ceil(C / row_block)]; data_t [C, R],
    x's transpose, in 1 x col_block tiles along each column of x, scale_inv_t [C, ceil(R / col_block)].
    The kernel reads x twice (every tile amax of both layouts, then both casts), where the two calls
    would read it four times and copy its transpose.
    """
    return torch.ops.fp8mp.block_quantize_transpose(x, row_block, col_block, fmt, scale_mode)


@raising_value_errors
def block_scaled_gemm(a: torch.Tensor, a_scale_inv: torch.Tensor, b: torch.Tensor, b_scale_inv: torch.Tensor,
                      a_block_rows: int, b_block_rows: int, block_k: int, bias: Optional[torch.Tensor] = None,
                      out_dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """``out = a @ b.T`` for block-scaled FP8 operands, in the layout of nn.Linear.

    The arithmetic it defines (DeepSeek-V3's "promotion to FP32 every block_k elements"): for each
    K chunk c of block_k elements, the exact FP8 products are summed in fp32, multiplied by
    ``a_scale_inv[m // a_block_rows, c] * b_scale_inv[n // b_block_rows, c]`` (that product in fp32)
    and accumulated in fp32; bias is added in fp32 and the result rounded once to `out_dtype`. The
    order of the fp32 additions inside a chunk is the fp32 GEMM's (torch's), so results agree with
    another implementation to fp32 accumulation noise.

    Args:
        a: [M, K] float8 (activation or gradient); b: [N, K] float8 (weight); not both E5M2.
        a_scale_inv: [ceil(M / a_block_rows), ceil(K / block_k)] float32 or float8_e8m0fnu; b_scale_inv likewise.
        a_block_rows, b_block_rows, block_k: the blocks the scales were computed over (>= 1).
        bias: optional [N] tensor of dtype `out_dtype`.
        out_dtype: float32, bfloat16 or float16.
    """
    return torch.ops.fp8mp.block_scaled_gemm(a, a_scale_inv, b, b_scale_inv, a_block_rows, b_block_rows, block_k,
                                             bias, out_dtype)


def block_dequantize(data: torch.Tensor, scale_inv: torch.Tensor, block_rows: int, block_cols: int,
                     dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The values a block_quantize result stands for: ``fp32(data) * scale_inv[tile]``, rounded once to `dtype`.

    data [R, C] float8, scale_inv [ceil(R / block_rows), ceil(C / block_cols)] float32 or float8_e8m0fnu.
    (Composite torch ops: each element is one fp32 multiplication, exact for power-of-two scales.)
    """
    rows, cols = data.shape
    expected = (_ceil_div(rows, block_rows), _ceil_div(cols, block_cols))
    if tuple(scale_inv.shape) != expected:
        raise ValueError(f"fp8mp.block_dequantize: argument 'scale_inv' must have shape {expected} for data "
                         f"{tuple(data.shape)} in {block_rows} x {block_cols} blocks, got {tuple(scale_inv.shape)}")
    per_element = scale_inv.float().repeat_interleave(block_rows, 0).repeat_interleave(block_cols, 1)
    return (data.float() * per_element[:rows, :cols]).to(dtype)
