"""FP8 GEMM: ``out = (a @ b.T) * (a_scale_inv * b_scale_inv) + bias``, as in nn.Linear.

The op ``fp8mp::fp8_gemm`` is declared in csrc/ops.cpp and implemented with
cuBLASLt on CUDA (csrc/gemm/gemm_cuda_kernels.cu) and as an exact emulation on CPU
(csrc/gemm/gemm_cpu_kernels.cpp: FP8 decoded to fp32 for an fp32 GEMM, or to bf16 inside fp8mp's
AMX or AVX512-BF16 kernels where the CPU has bf16 matrix units, see cpu_gemm_path); both check
their arguments in C++
(csrc/gemm/gemm_checks.cpp: check_fp8_gemm_args).
"""
from __future__ import annotations

import ctypes
import functools
import os
import warnings
from typing import Optional

import torch

from fp8mp.ops import native
from fp8mp.ops import checks
from fp8mp.ops.errors import raising_value_errors

__all__ = ["fp8_gemm", "cpu_gemm_path"]

_OP = "fp8mp::fp8_gemm"


@torch.library.register_fake(_OP)
def _fp8_gemm_fake(a, a_scale_inv, b, b_scale_inv, bias, out_dtype, use_fast_accum=False):
    checks.check_fp8_gemm_args(a, a_scale_inv, b, b_scale_inv, bias, out_dtype)
    return a.new_empty((a.shape[0], b.shape[0]), dtype=out_dtype)


@raising_value_errors
def fp8_gemm(
    a: torch.Tensor,
    a_scale_inv: torch.Tensor,
    b: torch.Tensor,
    b_scale_inv: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    out_dtype: torch.dtype = torch.bfloat16,
    use_fast_accum: bool = False,
) -> torch.Tensor:
    """FP8 matrix product in the layout of nn.Linear: ``out[m, n] = sum_k a[m, k] * b[n, k]``.

    ``out = (dec(a) @ dec(b).T) * (a_scale_inv * b_scale_inv) + bias``, with exact
    FP8 products, fp32 accumulation and fp32 epilogue, rounded once to `out_dtype`.

    Args:
        a: [M, K] float8_e4m3fn or float8_e5m2 (the input; made contiguous if it is not).
        a_scale_inv: 1-element float32 tensor on a's device (the inverse of a's cast scale).
        b: [N, K] float8_e4m3fn or float8_e5m2 (the weight); a and b cannot both be E5M2.
        b_scale_inv: 1-element float32 tensor on a's device.
        bias: optional [N] tensor of dtype `out_dtype`, added in fp32 before the final rounding.
        out_dtype: torch.float32, torch.bfloat16 or torch.float16.
        use_fast_accum: on Hopper/Ada, let cuBLASLt skip the periodic promotion of
            the tensor-core accumulator (faster, slightly less accurate; what
            forward passes usually use). Ignored on CPU.

    Returns:
        A contiguous [M, N] tensor of dtype `out_dtype`. K == 0 gives the bias (or zeros).

    On CUDA, K and N that are not multiples of 16 (a cuBLASLt FP8 requirement) are
    handled by zero padding, which does not change the result. CPU and CUDA agree
    up to the order of the fp32 additions.
    """
    return torch.ops.fp8mp.fp8_gemm(a, a_scale_inv, b, b_scale_inv, bias, out_dtype, use_fast_accum)


CPU_GEMM_PATHS = ("fp32", "avx512bf16", "amx")


@functools.cache
def cpu_gemm_path() -> str:
    """The CPU path of fp8_gemm in this process, decided once (csrc/gemm/cpu_gemm_path.h):

    * ``"amx"``: fp8mp's AMX kernel, decoding FP8 to bf16 while it packs the tiles' operands; chosen where
      the CPU has AMX-BF16 and Linux lets the process use the tiles;
    * ``"avx512bf16"``: fp8mp's AVX512-BF16 kernel, likewise; chosen where the CPU has AVX512-BF16 but no AMX
      and is not an Intel CPU (AMD Zen 4 and later: Intel cores run its dot products at half the fp32 FMAs'
      rate, so there the fp32 path is faster);
    * ``"fp32"``: FP8 decoded to fp32 and an IEEE fp32 GEMM (MKL's or oneDNN's); elsewhere.

    All form every product exactly and sum in fp32 (only the order of the additions differs), and none
    depends on torch's settings (fp32 matmul precision, autocast). The environment variable
    FP8MP_CPU_GEMM=fp32|avx512bf16|amx, read at the first CPU fp8_gemm, forces one (a path this CPU
    lacks falls back to fp32)."""
    forced = os.environ.get("FP8MP_CPU_GEMM", "")
    if forced and forced not in CPU_GEMM_PATHS:
        warnings.warn(f"FP8MP_CPU_GEMM={forced!r} is not one of {', '.join(CPU_GEMM_PATHS)}: "
                      "fp8_gemm chooses its CPU path itself", stacklevel=2)
    return native.cpu_library_function("fp8mp_cpu_gemm_path", ctypes.c_char_p)().decode()
