// The CUDA fp8_grouped_gemm and fp8_grouped_gemm_wgrad, torch-free: one cuBLASLt FP8 GEMM per group
// (gemm/gemm_cuda_kernels.cuh's fp8_gemm, with its padding and plan cache) on `stream`. grouped_gemm_cuda.cpp
// is their glue.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "blockwise/block_gemm_cuda_kernels.cuh"
#include "common/fp8_format.h"
#include "common/half_types.h"

namespace fp8mp::cuda {

// The groups' cumulative ends, copied from the device to the host on `stream` (the call waits for it): the
// per-group launches need the group sizes on the host.
std::vector<int32_t> read_group_offsets(const int32_t* offs, int64_t groups, cudaStream_t stream);

// Grouped along M, as the CPU's fp8_grouped_gemm (grouped_gemm_cpu_kernels.h), device pointers; offs on the host.
struct Fp8GroupedGemmArgs {
  const uint8_t* a;
  Fp8Format a_format;
  const uint8_t* b;
  Fp8Format b_format;
  const int32_t* offs;  // host
  int64_t groups, N, K;
  const float* a_scale_inv;  // [1]
  const float* b_scale_inv;  // [groups]
  const void* bias;          // [groups, N] of out_type, or nullptr
  void* out;                 // [offs[groups - 1], N]
  HpType out_type;
  bool use_fast_accum;
};

size_t fp8_grouped_gemm_scratch_bytes(const Fp8GroupedGemmArgs& args);
void fp8_grouped_gemm(cublasLtHandle_t handle, const Fp8GroupedGemmArgs& args, void* scratch, cudaStream_t stream);

// Grouped along K, as the CPU's fp8_grouped_gemm_wgrad: a [N, T], b [K, T], out [groups, N, K].
struct Fp8GroupedGemmWgradArgs {
  const uint8_t* a;
  Fp8Format a_format;
  const uint8_t* b;
  Fp8Format b_format;
  const int32_t* offs;  // host
  int64_t groups, N, K, T;
  const float* a_scale_inv;  // [1]
  const float* b_scale_inv;  // [1]
  void* out;
  HpType out_type;
  bool use_fast_accum;
};

size_t fp8_grouped_gemm_wgrad_scratch_bytes(const Fp8GroupedGemmWgradArgs& args);
void fp8_grouped_gemm_wgrad(cublasLtHandle_t handle, const Fp8GroupedGemmWgradArgs& args, void* scratch,
                            cudaStream_t stream);

// Grouped along M with block scales, as the CPU's block_scaled_grouped_gemm: one block_scaled_gemm
// (blockwise/block_gemm_cuda_kernels.cuh, the recipe `recipe`) per non-empty group. `a` is the whole a [M, K]
// (block_rows 1, naive scale_inv [M, ceil(K / block_k)]), `b` the first group's [N, K] and its scales, the
// groups' matrices and scales following each other.
struct BlockScaledGroupedGemmArgs {
  BlockGemmRecipe recipe;
  BlockGemmOperand a, b;
  const int32_t* offs;  // host
  int64_t groups, N, K, block_k;
  const void* bias;  // [groups, N] of out_type, or nullptr
  void* out;
  HpType out_type;
};

size_t block_scaled_grouped_gemm_scratch_bytes(const BlockScaledGroupedGemmArgs& args);
void block_scaled_grouped_gemm(cublasLtHandle_t handle, const BlockScaledGroupedGemmArgs& args, void* scratch,
                               cudaStream_t stream);

// Grouped along K with block scales, as the CPU's block_scaled_grouped_gemm_wgrad: `a` the whole a [N, T] with its
// scale_inv [N, chunks], `b` the whole b [K, T] with [K, chunks] (rows N and K, block_rows 1), group g's columns and
// scale columns copied to contiguous scratch (cudaMemcpy2DAsync) for one block_scaled_gemm; zeros for an empty group.
struct BlockScaledGroupedGemmWgradArgs {
  BlockGemmRecipe recipe;
  BlockGemmOperand a, b;
  const int32_t* offs;  // host
  int64_t groups, N, K, T, chunks, block_k;
  void* out;  // [groups, N, K]
  HpType out_type;
};

size_t block_scaled_grouped_gemm_wgrad_scratch_bytes(const BlockScaledGroupedGemmWgradArgs& args);
void block_scaled_grouped_gemm_wgrad(cublasLtHandle_t handle, const BlockScaledGroupedGemmWgradArgs& args,
                                     void* scratch, cudaStream_t stream);

}  // namespace fp8mp::cuda
