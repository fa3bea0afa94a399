// The CUDA block_scaled_gemm, torch-free: cuBLASLt on raw device buffers (block_gemm_path.h), launched
// on `stream` on the current device. blockwise_cuda.cpp is its glue.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "blockwise/block_gemm_path.h"
#include "blockwise/block_scale_layout.h"
#include "common/fp8_format.h"
#include "common/half_types.h"

namespace fp8mp::cuda {

// One operand: row-major [rows, K] FP8 codes, its naive scale_inv ([ceil(rows / block_rows),
// ceil(K / block_k)] row-major, fp32 or E8M0 bytes) and the cuBLASLt layout its scales take.
struct BlockGemmOperand {
  const uint8_t* data;
  Fp8Format format;
  const void* scale_inv;
  int64_t rows;
  int64_t block_rows;
  LtScaleLayout layout;
};

struct BlockGemmArgs {
  BlockGemmRecipe recipe;
  BlockGemmOperand a, b;  // a [M, K], b [N, K]: out = a @ b^T
  int64_t K, block_k;
  const void* bias;  // [N] of out_type, or nullptr
  void* out;         // [M, N] of out_type
  HpType out_type;
};

// The recipe and each operand's scale layout for these block sizes, or an empty string `why_not`
// filled with what CUDA supports (the same text the fake kernel raises, fp8mp/ops/blockwise.py).
struct BlockGemmPlanChoice {
  BlockGemmRecipe recipe;
  LtScaleLayout a_layout, b_layout;
  std::string why_not;  // non-empty: unsupported
};
BlockGemmPlanChoice block_gemm_recipe(int64_t K, int64_t a_block_rows, int64_t b_block_rows, int64_t block_k,
                                      bool a_e8m0, bool b_e8m0);

// Bytes of device scratch block_scaled_gemm needs on the current GPU: cuBLASLt workspace, padded operands,
// rearranged scales (native path), the fp32 products and accumulator (block_gemm_path.h).
size_t block_scaled_gemm_scratch_bytes(const BlockGemmArgs& args);

// out = out_type(a @ b^T with the block scales + bias), M = a.rows, N = b.rows, on the path
// choose_block_gemm_path gives the current GPU and cuBLASLt. Throws std::runtime_error naming the GPU and
// what is needed where it has none (a GPU without FP8, or one this build holds no code for).
void block_scaled_gemm(cublasLtHandle_t handle, const BlockGemmArgs& args, void* scratch, cudaStream_t stream);

}  // namespace fp8mp::cuda
