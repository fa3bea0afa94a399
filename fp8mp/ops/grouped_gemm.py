"""Grouped FP8 GEMMs of mixture-of-experts layers: one GEMM per expert over tokens sorted by expert.

The ops ``fp8mp::fp8_grouped_gemm`` and ``fp8mp::fp8_grouped_gemm_wgrad`` are declared in csrc/ops.cpp and
implemented in csrc/grouped_gemm/: on CPU one call of fp8_gemm's CPU kernel per group from C++ (no Python loop
over the groups), so each group is bit for bit :func:`fp8mp.ops.fp8_gemm` on that group alone, on whichever CPU
path fp8_gemm takes; on CUDA one cuBLASLt FP8 GEMM per non-empty group on the current stream (compiled for every
release arch, not yet run on a GPU). Both check their arguments in C++ (grouped_gemm_checks.cpp), and again here
for the fake kernels, except the values of ``offs``, which only the kernels read.

Layout (torch._grouped_mm's): the token rows are sorted by group and ``offs`` [G] int32 holds the groups'
cumulative ends, so group g is rows ``offs[g - 1]:offs[g]`` (from 0 for g = 0); ``offs`` must be non-decreasing
and end at the token count. The three GEMMs of a grouped linear ``y_g = x_g @ W_g.T``:

    fprop: y  = fp8_grouped_gemm(x [T, K], W [G, N, K], offs)          grouped along M
    dgrad: dx = fp8_grouped_gemm(dy [T, N], W^T [G, K, N], offs)       grouped along M
    wgrad: dW = fp8_grouped_gemm_wgrad(dy.T [N, T], x.T [K, T], offs)  grouped along K, [G, N, K]

Scaling is tensorwise: one scale for the activation side, one per group for the weights (``b_scale_inv`` [G]).
K and N must be multiples of 16 (cuBLASLt's FP8 alignment) on every device.
"""
from __future__ import annotations

from typing import Optional

import torch

from fp8mp.ops import native  # noqa: F401  (loads the libraries and their registrations)
from fp8mp.ops import checks
from fp8mp.ops.blockwise import cuda_block_gemm_unsupported
from fp8mp.ops.checks import _require, sizes
from fp8mp.ops.errors import raising_value_errors

__all__ = ["fp8_grouped_gemm", "fp8_grouped_gemm_wgrad", "block_scaled_grouped_gemm", "block_scaled_grouped_gemm_wgrad"]

_OP = "fp8mp::fp8_grouped_gemm"
_WGRAD_OP = "fp8mp::fp8_grouped_gemm_wgrad"
_BLOCK_OP = "fp8mp::block_scaled_grouped_gemm"
_BLOCK_WGRAD_OP = "fp8mp::block_scaled_grouped_gemm_wgrad"


def _check_operands(a, b, offs, out_dtype, op: str) -> None:
    formats = checks.format_of(a, op, "a"), checks.format_of(b, op, "b")
    _require(formats != ("e5m2", "e5m2"), RuntimeError,
             f"{op}: arguments 'a' and 'b' cannot both be float8_e5m2 (cuBLASLt has no e5m2 x e5m2 FP8 GEMM); "
             "make at least one of them float8_e4m3fn")
    _require(b.device == a.device, RuntimeError, f"{op}: argument 'b' must be on the device of 'a' {a.device}, got {b.device}")


def _check_offs(offs, a, op: str) -> None:
    _require(offs.dtype == torch.int32, RuntimeError,
             f"{op}: argument 'offs' must be int32, got {checks.dtype_name(offs.dtype)}")
    # On the CPU beside a CUDA input too: host offsets spare the CUDA op a device-to-host copy and sync.
    _require(offs.device == a.device or offs.device.type == "cpu", RuntimeError,
             f"{op}: argument 'offs' must be on the input's device {a.device} or on the CPU, got {offs.device}")
    _require(offs.dim() == 1 and offs.shape[0] >= 1, ValueError,
             f"{op}: argument 'offs' must be 1-D [G] with G >= 1 (the groups' cumulative ends), got shape {sizes(offs)}")


def _check_multiple_of_16(size, op: str, arg: str, what: str) -> None:
    _require(size % 16 == 0, ValueError,
             f"{op}: argument '{arg}' must have {what} a multiple of 16 (cuBLASLt's FP8 alignment), got {size}")


def _check_m_grouped_shapes(a, b, offs, bias, out_dtype, op: str) -> None:
    """a [M, K], b [G, N, K] with G = offs.size(0), K and N multiples of 16, bias [G, N] (grouped_gemm_checks.cpp)."""
    _check_offs(offs, a, op)
    checks.check_high_precision_dtype(out_dtype, op, "out_dtype")
    _require(a.dim() == 2, ValueError, f"{op}: argument 'a' must be 2-D [M, K], got shape {sizes(a)}")
    _require(b.dim() == 3, ValueError, f"{op}: argument 'b' must be 3-D [G, N, K], got shape {sizes(b)}")
    groups = offs.shape[0]
    _require(b.shape[0] == groups, ValueError,
             f"{op}: argument 'b' must have one matrix per group, G = offs.size(0) = {groups}, got shape {sizes(b)}")
    _require(b.shape[2] == a.shape[1], ValueError,
             f"{op}: argument 'b' must be [G, N, K] with K = a.size(1) = {a.shape[1]} (out = a @ b[g].T), "
             f"got shape {sizes(b)}")
    _check_multiple_of_16(a.shape[1], op, "a", "K = a.size(1)")
    _check_multiple_of_16(b.shape[1], op, "b", "N = b.size(1)")
    if bias is not None:
        _require(bias.dtype == out_dtype, RuntimeError,
                 f"{op}: argument 'bias' must have dtype out_dtype = {checks.dtype_name(out_dtype)}, "
                 f"got {checks.dtype_name(bias.dtype)}")
        _require(bias.device == a.device, RuntimeError,
                 f"{op}: argument 'bias' must be on the input's device {a.device}, got {bias.device}")
        _require(bias.dim() == 2 and bias.shape[0] == groups and bias.shape[1] == b.shape[1], ValueError,
                 f"{op}: argument 'bias' must have shape [G, N] = [{groups}, {b.shape[1]}], got shape {sizes(bias)}")


def check_fp8_grouped_gemm_args(a, a_scale_inv, b, b_scale_inv, offs, bias, out_dtype) -> None:
    """grouped_gemm_checks.cpp's check_fp8_grouped_gemm_args, for the fake kernel."""
    op = _OP
    _check_operands(a, b, offs, out_dtype, op)
    checks.check_scalar_tensor(a_scale_inv, a, op, "a_scale_inv")
    _check_m_grouped_shapes(a, b, offs, bias, out_dtype, op)
    groups = offs.shape[0]
    _require(b_scale_inv.dtype == torch.float32, RuntimeError,
             f"{op}: argument 'b_scale_inv' must be a float32 tensor, got dtype {checks.dtype_name(b_scale_inv.dtype)}")
    _require(b_scale_inv.device == a.device, RuntimeError,
             f"{op}: argument 'b_scale_inv' must be on the input's device {a.device}, got {b_scale_inv.device}")
    _require(b_scale_inv.dim() == 1 and b_scale_inv.shape[0] == groups, ValueError,
             f"{op}: argument 'b_scale_inv' must be [G] = [{groups}] (one scale per group's matrix), "
             f"got shape {sizes(b_scale_inv)}")


def _check_block_scale_tensor(scale_inv, a, expected: tuple, what: str, op: str, arg: str) -> None:
    _require(scale_inv.dtype in (torch.float32, torch.float8_e8m0fnu), RuntimeError,
             f"{op}: argument '{arg}' must be float32 or float8_e8m0fnu, got {checks.dtype_name(scale_inv.dtype)}")
    _require(scale_inv.device == a.device, RuntimeError,
             f"{op}: argument '{arg}' must be on the input's device {a.device}, got {scale_inv.device}")
    _require(tuple(scale_inv.shape) == expected, ValueError,
             f"{op}: argument '{arg}' must have shape [{', '.join(map(str, expected))}] ({what}), "
             f"got shape {sizes(scale_inv)}")


def check_block_scaled_grouped_gemm_args(a, a_scale_inv, b, b_scale_inv, offs, a_block_rows: int, b_block_rows: int,
                                         block_k: int, bias, out_dtype) -> None:
    """grouped_gemm_checks.cpp's check_block_scaled_grouped_gemm_args, for the fake kernel."""
    op = _BLOCK_OP
    _check_operands(a, b, offs, out_dtype, op)
    _check_m_grouped_shapes(a, b, offs, bias, out_dtype, op)
    _require(a_block_rows == 1, ValueError, f"{op}: argument 'a_block_rows' must be 1 (1 x block_k blocks, so that no "
             f"block of a spans two groups), got {a_block_rows}")
    _require(b_block_rows >= 1, ValueError, f"{op}: argument 'b_block_rows' must be >= 1, got {b_block_rows}")
    _require(block_k >= 1, ValueError, f"{op}: argument 'block_k' must be >= 1, got {block_k}")
    chunks = -(-a.shape[1] // block_k)
    _check_block_scale_tensor(a_scale_inv, a, (a.shape[0], chunks), "one scale per row and K block", op, "a_scale_inv")
    _check_block_scale_tensor(b_scale_inv, a, (b.shape[0], -(-b.shape[1] // b_block_rows), chunks),
                              "one scale per group, b_block_rows x block_k block", op, "b_scale_inv")


def check_fp8_grouped_gemm_wgrad_args(a, a_scale_inv, b, b_scale_inv, offs, out_dtype) -> None:
    """grouped_gemm_checks.cpp's check_fp8_grouped_gemm_wgrad_args, for the fake kernel."""
    op = _WGRAD_OP
    _check_operands(a, b, offs, out_dtype, op)
    checks.check_scalar_tensor(a_scale_inv, a, op, "a_scale_inv")
    checks.check_scalar_tensor(b_scale_inv, a, op, "b_scale_inv")
    _check_k_grouped_shapes(a, b, offs, out_dtype, op)


def _check_k_grouped_shapes(a, b, offs, out_dtype, op: str) -> None:
    """a [N, T], b [K, T], N and K multiples of 16 (grouped_gemm_checks.cpp)."""
    _check_offs(offs, a, op)
    checks.check_high_precision_dtype(out_dtype, op, "out_dtype")
    _require(a.dim() == 2, ValueError, f"{op}: argument 'a' must be 2-D [N, T], got shape {sizes(a)}")
    _require(b.dim() == 2, ValueError, f"{op}: argument 'b' must be 2-D [K, T], got shape {sizes(b)}")
    _require(b.shape[1] == a.shape[1], ValueError,
             f"{op}: argument 'b' must be [K, T] with T = a.size(1) = {a.shape[1]} "
             f"(out[g] = a[:, group g] @ b[:, group g].T), got shape {sizes(b)}")
    _check_multiple_of_16(a.shape[0], op, "a", "N = a.size(0)")
    _check_multiple_of_16(b.shape[0], op, "b", "K = b.size(0)")


def check_block_scaled_grouped_gemm_wgrad_args(a, a_scale_inv, b, b_scale_inv, offs, block_k: int, out_dtype) -> None:
    """grouped_gemm_checks.cpp's check_block_scaled_grouped_gemm_wgrad_args, for the fake kernel (the scales'
    column count against the values of offs is the kernels' check)."""
    op = _BLOCK_WGRAD_OP
    _check_operands(a, b, offs, out_dtype, op)
    _check_k_grouped_shapes(a, b, offs, out_dtype, op)
    _require(block_k >= 1, ValueError, f"{op}: argument 'block_k' must be >= 1, got {block_k}")
    _require(a_scale_inv.dim() == 2, ValueError,
             f"{op}: argument 'a_scale_inv' must be 2-D [N, C] (the groups' chunks), got shape {sizes(a_scale_inv)}")
    chunks = a_scale_inv.shape[1]
    _check_block_scale_tensor(a_scale_inv, a, (a.shape[0], chunks), "one scale per row and group chunk", op,
                              "a_scale_inv")
    _check_block_scale_tensor(b_scale_inv, a, (b.shape[0], chunks), "one scale per row and group chunk, as a_scale_inv",
                              op, "b_scale_inv")


@torch.library.register_fake(_OP)
def _fp8_grouped_gemm_fake(a, a_scale_inv, b, b_scale_inv, offs, bias, out_dtype, use_fast_accum=False):
    check_fp8_grouped_gemm_args(a, a_scale_inv, b, b_scale_inv, offs, bias, out_dtype)
    return a.new_empty((a.shape[0], b.shape[1]), dtype=out_dtype)


@torch.library.register_fake(_WGRAD_OP)
def _fp8_grouped_gemm_wgrad_fake(a, a_scale_inv, b, b_scale_inv, offs, out_dtype, use_fast_accum=False):
    check_fp8_grouped_gemm_wgrad_args(a, a_scale_inv, b, b_scale_inv, offs, out_dtype)
    return a.new_empty((offs.shape[0], a.shape[0], b.shape[0]), dtype=out_dtype)


@torch.library.register_fake(_BLOCK_OP)
def _block_scaled_grouped_gemm_fake(a, a_scale_inv, b, b_scale_inv, offs, a_block_rows, b_block_rows, block_k, bias,
                                    out_dtype):
    check_block_scaled_grouped_gemm_args(a, a_scale_inv, b, b_scale_inv, offs, a_block_rows, b_block_rows, block_k,
                                         bias, out_dtype)
    if a.is_cuda:  # the recipes CUDA's block_scaled_gemm runs, refused as the kernel refuses them
        why_not = cuda_block_gemm_unsupported(a.shape[1], a_block_rows, b_block_rows, block_k,
                                              a_scale_inv.dtype == torch.float8_e8m0fnu,
                                              b_scale_inv.dtype == torch.float8_e8m0fnu)
        _require(why_not is None, RuntimeError, why_not or "")
    return a.new_empty((a.shape[0], b.shape[1]), dtype=out_dtype)


@torch.library.register_fake(_BLOCK_WGRAD_OP)
def _block_scaled_grouped_gemm_wgrad_fake(a, a_scale_inv, b, b_scale_inv, offs, block_k, out_dtype):
    check_block_scaled_grouped_gemm_wgrad_args(a, a_scale_inv, b, b_scale_inv, offs, block_k, out_dtype)
    if a.is_cuda:  # every group's reduction is at most T long: block_k over K = T is each group's recipe
        why_not = cuda_block_gemm_unsupported(a.shape[1], 1, 1, block_k, a_scale_inv.dtype == torch.float8_e8m0fnu,
                                              b_scale_inv.dtype == torch.float8_e8m0fnu)
        _require(why_not is None, RuntimeError, why_not or "")
    return a.new_empty((offs.shape[0], a.shape[0], b.shape[0]), dtype=out_dtype)


@raising_value_errors
def fp8_grouped_gemm(
    a: torch.Tensor,
    a_scale_inv: torch.Tensor,
    b: torch.Tensor,
    b_scale_inv: torch.Tensor,
    offs: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    out_dtype: torch.dtype = torch.bfloat16,
    use_fast_accum: bool = False,
) -> torch.Tensor:
    """FP8 GEMM grouped along M: ``out[rows of g] = (a[rows of g] @ b[g].T) * (a_scale_inv * b_scale_inv[g]) + bias[g]``.

    Args:
        a: [M, K] float8_e4m3fn or float8_e5m2, rows sorted by group (tokens sorted by expert).
        a_scale_inv: 1-element float32 tensor on a's device.
        b: [G, N, K] float8 (one [N, K] matrix per group, nn.Linear's layout); a and b cannot both be E5M2.
        b_scale_inv: [G] float32 on a's device, one inverse scale per group's matrix.
        offs: [G] int32 on a's device or on the CPU, the groups' cumulative ends: non-decreasing, offs[-1] == M.
            Empty groups (equal consecutive offsets) are allowed. On the CPU beside CUDA operands they are read
            there, which spares the CUDA op a device-to-host copy and stream sync.
        bias: optional [G, N] of dtype `out_dtype`, group g's row added to its rows in fp32 before the rounding.
        out_dtype: torch.float32, torch.bfloat16 or torch.float16.
        use_fast_accum: as in :func:`fp8mp.ops.fp8_gemm` (CUDA only).

    Returns:
        [M, N] of `out_dtype`; each group's rows bit for bit ``fp8_gemm(a[rows], a_scale_inv, b[g],
        b_scale_inv[g:g+1], bias[g], out_dtype)`` on CPU. K and N must be multiples of 16.
    """
    return torch.ops.fp8mp.fp8_grouped_gemm(a, a_scale_inv, b, b_scale_inv, offs, bias, out_dtype, use_fast_accum)


@raising_value_errors
def fp8_grouped_gemm_wgrad(
    a: torch.Tensor,
    a_scale_inv: torch.Tensor,
    b: torch.Tensor,
    b_scale_inv: torch.Tensor,
    offs: torch.Tensor,
    out_dtype: torch.dtype = torch.bfloat16,
    use_fast_accum: bool = False,
) -> torch.Tensor:
    """FP8 GEMM grouped along K, one output per group: ``out[g] = (a[:, cols of g] @ b[:, cols of g].T) * scale``.

    The weight gradient of a grouped linear: a = dy.T [N, T], b = x.T [K, T] (the transposes the casts give),
    the T token columns sorted by group as `offs` [G] int32 (cumulative ends, offs[-1] == T) says.

    Args:
        a: [N, T] float8; b: [K, T] float8, not both E5M2.
        a_scale_inv, b_scale_inv: 1-element float32 tensors on a's device (scale = a_scale_inv * b_scale_inv).
        offs: [G] int32 on a's device or on the CPU (as in :func:`fp8_grouped_gemm`).
        out_dtype: torch.float32, torch.bfloat16 or torch.float16.
        use_fast_accum: as in :func:`fp8mp.ops.fp8_gemm` (CUDA only).

    Returns:
        [G, N, K] of `out_dtype`; on CPU out[g] is bit for bit ``fp8_gemm(a_g, a_scale_inv, b_g, b_scale_inv)``
        with ``a_g = a[:, cols].contiguous()`` and ``b_g = b[:, cols].contiguous()``, the columns of group g;
        zeros for an empty group. N and K must be multiples of 16.
    """
    return torch.ops.fp8mp.fp8_grouped_gemm_wgrad(a, a_scale_inv, b, b_scale_inv, offs, out_dtype, use_fast_accum)


@raising_value_errors
def block_scaled_grouped_gemm(
    a: torch.Tensor,
    a_scale_inv: torch.Tensor,
    b: torch.Tensor,
    b_scale_inv: torch.Tensor,
    offs: torch.Tensor,
    b_block_rows: int,
    block_k: int,
    bias: Optional[torch.Tensor] = None,
    out_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """FP8 GEMM grouped along M under the fine-grained recipes (fp8mp.ops.block_scaled_gemm per group).

    Args:
        a: [M, K] float8, rows sorted by group, quantized in 1 x block_k blocks (block_quantize(x, 1, block_k)).
        a_scale_inv: [M, ceil(K / block_k)] float32 or float8_e8m0fnu.
        b: [G, N, K] float8, each group's matrix quantized in b_block_rows x block_k blocks.
        b_scale_inv: [G, ceil(N / b_block_rows), ceil(K / block_k)] float32 or float8_e8m0fnu: group g's
            block_quantize(w[g], b_block_rows, block_k) scales, stacked.
        offs: [G] int32 cumulative ends of the groups (non-decreasing, offs[-1] == M).
        b_block_rows, block_k: the recipe's blocks: rowwise 1 and K (or more), DeepSeek-V3 128 and 128,
            MXFP8 1 and 32 (E8M0 scales).
        bias: optional [G, N] of `out_dtype`.
        out_dtype: torch.float32, torch.bfloat16 or torch.float16.

    Returns:
        [M, N]; group g's rows bit for bit ``block_scaled_gemm(a[rows], a_scale_inv[rows], b[g], b_scale_inv[g], 1,
        b_block_rows, block_k, bias[g], out_dtype)`` on CPU. On CUDA, one cuBLASLt block-scaled GEMM per group
        for the recipes :func:`fp8mp.ops.block_scaled_gemm` runs there (compiled, not yet run on a GPU). K and N
        must be multiples of 16.
    """
    return torch.ops.fp8mp.block_scaled_grouped_gemm(a, a_scale_inv, b, b_scale_inv, offs, 1, b_block_rows, block_k,
                                                     bias, out_dtype)


@raising_value_errors
def block_scaled_grouped_gemm_wgrad(
    a: torch.Tensor,
    a_scale_inv: torch.Tensor,
    b: torch.Tensor,
    b_scale_inv: torch.Tensor,
    offs: torch.Tensor,
    block_k: int,
    out_dtype: torch.dtype = torch.bfloat16,
) -> torch.Tensor:
    """FP8 GEMM grouped along K with block scales, one output per group (the fine-grained weight gradient).

    ``out[g] = block_scaled_gemm(a[:, cols of g], its scales, b[:, cols of g], its scales, 1, 1, block_k)``: a = dy.T,
    b = x.T, the T token columns sorted by group as `offs` says. Each group's columns are quantized on their own
    (1 x block_k blocks from the group's first column, so that no block spans two groups): group g has
    ``ceil(T_g / block_k)`` scale columns, after those of the groups before it.

    Args:
        a: [N, T] float8; b: [K, T] float8, not both E5M2.
        a_scale_inv: [N, C] float32 or float8_e8m0fnu, C = sum over the groups of ceil(T_g / block_k).
        b_scale_inv: [K, C], the same layout.
        offs: [G] int32 cumulative ends of the groups along T (non-decreasing, offs[-1] == T).
        block_k: the blocks' length along T (rowwise: any value >= every group's T_g, one chunk per group).
        out_dtype: torch.float32, torch.bfloat16 or torch.float16.

    Returns:
        [G, N, K]; on CPU out[g] is bit for bit ``block_scaled_gemm(a_g, sa_g, b_g, sb_g, 1, 1, block_k,
        None, out_dtype)`` on the group's columns made contiguous; zeros for an empty group. On CUDA one
        block_scaled_gemm per non-empty group for the recipes it runs there (compiled, not yet run on a GPU).
        N and K must be multiples of 16.
    """
    return torch.ops.fp8mp.block_scaled_grouped_gemm_wgrad(a, a_scale_inv, b, b_scale_inv, offs, block_k, out_dtype)
