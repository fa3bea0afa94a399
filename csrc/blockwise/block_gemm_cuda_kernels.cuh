// The CUDA block_scaled_gemm, torch-free: cuBLASLt on raw device buffers (block_gemm_path.h), launched
// on `stream` on the current device. blockwise_cuda.cpp is its glue.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "blockwise/block_gemm_path.h"
#include "blockwise/block_gemm_recipe.h"
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

// Bytes of device scratch block_scaled_gemm needs on the current GPU: cuBLASLt workspace, padded operands,
// rearranged scales (native path), the fp32 products and accumulator (block_gemm_path.h).
size_t block_scaled_gemm_scratch_bytes(const BlockGemmArgs& args);

// out = out_type(a @ b^T with the block scales + bias), M = a.rows, N = b.rows, on the path
// choose_block_gemm_path gives the current GPU and cuBLASLt. Throws std::runtime_error naming the GPU and
// what is needed where it has none (a GPU without FP8, or one this build holds no code for).
void block_scaled_gemm(cublasLtHandle_t handle, const BlockGemmArgs& args, void* scratch, cudaStream_t stream);

}  // namespace fp8mp::cuda
