// The CUDA block_scaled_gemm, torch-free: cuBLASLt's block scale modes on raw device buffers, launched
// on `stream` on the current device. blockwise_cuda.cpp is its glue.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "blockwise/block_scale_layout.h"
#include "common/fp8_format.h"
#include "common/half_types.h"

namespace fp8mp::cuda {

// The cuBLASLt recipe a call's block sizes select (block_gemm_recipe), with what it needs.
enum class BlockGemmRecipe : int {
  Rowwise = 0,   // 1 x K blocks on both operands, fp32 scales: OUTER_VEC_32F; compute capability 9.0, cuBLASLt 12.9
  DeepSeek = 1,  // 1 x 128 / 128 x 128 blocks, fp32 scales: VEC128_32F / BLK128x128_32F; 9.0, cuBLASLt 12.9
  Mxfp8 = 2,     // 1 x 32 blocks, E8M0 scales: VEC32_UE8M0 (swizzled); 10.0, cuBLASLt 12.8
};

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

// Bytes of device scratch block_scaled_gemm needs: cuBLASLt workspace, padded operands, rearranged
// scales and the product (in the output dtype, N padded).
size_t block_scaled_gemm_scratch_bytes(const BlockGemmArgs& args);

// out = out_type(a @ b^T with the block scales + bias), M = a.rows, N = b.rows. Throws std::runtime_error
// naming what is missing when the GPU or cuBLASLt cannot run the recipe (never another algorithm instead).
void block_scaled_gemm(cublasLtHandle_t handle, const BlockGemmArgs& args, void* scratch, cudaStream_t stream);

}  // namespace fp8mp::cuda
