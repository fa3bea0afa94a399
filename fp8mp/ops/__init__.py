"""Layer ops: the Python face of csrc (one module per op family: fake kernels, autograd
registration, documented wrappers), FP8 format constants and argument checks (checks.py: the
C++ checks again, for the fake kernels). Imports only torch and fp8mp's native libraries
(native.py loads them); every other layer builds on this one."""
from fp8mp.ops import norm  # noqa: F401  (registers the norm ops' fake kernels and autograd)
from fp8mp.ops.blockwise import block_dequantize, block_quantize, block_quantize_transpose, block_scaled_gemm
from fp8mp.ops.cast import cast_from_fp8, cast_to_fp8, cast_to_fp8_transpose, cast_to_fp8_transpose_dbias
from fp8mp.ops.gemm import cpu_gemm_path, fp8_gemm
from fp8mp.ops.grouped_gemm import (block_scaled_grouped_gemm, block_scaled_grouped_gemm_wgrad, fp8_grouped_gemm,
                                    fp8_grouped_gemm_wgrad)
from fp8mp.ops.native import cpu_isa, cuda_kernels_available, cuda_kernels_status
from fp8mp.ops.optim import adamw_step, lion_step
from fp8mp.ops.scale_update import compute_scale, update_amax_history_and_scale

__all__ = ["cast_to_fp8", "cast_to_fp8_transpose", "cast_to_fp8_transpose_dbias", "cast_from_fp8",
           "cuda_kernels_available", "cuda_kernels_status", "fp8_gemm", "cpu_gemm_path", "cpu_isa", "compute_scale", "update_amax_history_and_scale", "block_quantize", "block_scaled_gemm",
           "block_dequantize", "block_quantize_transpose", "fp8_grouped_gemm", "fp8_grouped_gemm_wgrad",
           "block_scaled_grouped_gemm", "block_scaled_grouped_gemm_wgrad", "adamw_step", "lion_step"]
