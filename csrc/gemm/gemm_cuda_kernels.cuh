// The CUDA fp8_gemm, torch-free: cuBLASLt on raw device buffers, launched on
// `stream` on the current device. gemm_cuda.cpp is its glue (checks, the
// output and scratch allocations, the cuBLASLt handle).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "common/fp8_format.h"
#include "common/half_types.h"

namespace fp8mp::cuda {

// out [M, N] = out_type((dec(a) @ dec(b)^T) * (*a_scale_inv * *b_scale_inv) + bias), all row-major and
// contiguous: a [M, K] and b [N, K] FP8 codes, bias [N] of out_type or nullptr, out 256-byte aligned.
struct Fp8GemmArgs {
  const uint8_t* a;
  Fp8Format a_format;
  const uint8_t* b;
  Fp8Format b_format;
  int64_t M, N, K;
  const float* a_scale_inv;
  const float* b_scale_inv;
  const void* bias;
  void* out;
  HpType out_type;
  bool use_fast_accum;
};

// Bytes of device scratch fp8_gemm needs for `args`: the cuBLASLt workspace and padded copies.
size_t fp8_gemm_scratch_bytes(const Fp8GemmArgs& args);

// fp8mp's own cuBLASLt handle for the current device, created on first use and kept for the
// process (the stable ABI does not reach torch's). A cuBLASLt handle holds no stream or
// workspace, so one per device serves every stream and thread.
cublasLtHandle_t blaslt_handle_for_current_device();

// Throws std::runtime_error naming the failed call (or a GPU older than compute capability 8.9).
void fp8_gemm(cublasLtHandle_t handle, const Fp8GemmArgs& args, void* scratch, cudaStream_t stream);

}  // namespace fp8mp::cuda
