// Which recipe the block sizes of a CUDA block_scaled_gemm call select, and each operand's cuBLASLt scale
// layout: a pure host function (no CUDA, no torch), so that the CUDA glue that calls it runs in the CPU suite
// (tests/cpp/test_cuda_glue.cpp) and Catch2 checks it (tests/cpp/test_cross_device_rules.cpp).
#pragma once

#include <cstdint>
#include <string>

#include "blockwise/block_gemm_path.h"
#include "blockwise/block_scale_layout.h"

namespace fp8mp::cuda {

// The recipe and each operand's scale layout for these block sizes, or an empty string `why_not`
// filled with what CUDA supports (the same text the fake kernel raises, fp8mp/ops/blockwise.py).
struct BlockGemmPlanChoice {
  BlockGemmRecipe recipe;
  LtScaleLayout a_layout, b_layout;
  std::string why_not;  // non-empty: unsupported
};

inline BlockGemmPlanChoice block_gemm_recipe(int64_t K, int64_t a_block_rows, int64_t b_block_rows, int64_t block_k,
                                             bool a_e8m0, bool b_e8m0) {
  const bool fp32_scales = !a_e8m0 && !b_e8m0;
  if (fp32_scales && a_block_rows == 1 && b_block_rows == 1 && block_k >= K) {
    return {BlockGemmRecipe::Rowwise, LtScaleLayout::OuterVec, LtScaleLayout::OuterVec, ""};
  }
  const auto deepseek_rows = [](int64_t r) { return r == 1 || r == 128; };
  if (fp32_scales && block_k == 128 && deepseek_rows(a_block_rows) && deepseek_rows(b_block_rows) &&
      !(a_block_rows == 128 && b_block_rows == 128)) {
    const auto layout = [](int64_t r) { return r == 1 ? LtScaleLayout::Vec128 : LtScaleLayout::Blk128x128; };
    return {BlockGemmRecipe::DeepSeek, layout(a_block_rows), layout(b_block_rows), ""};
  }
  if (a_e8m0 && b_e8m0 && block_k == 32 && a_block_rows == 1 && b_block_rows == 1) {
    return {BlockGemmRecipe::Mxfp8, LtScaleLayout::Vec32Swizzled, LtScaleLayout::Vec32Swizzled, ""};
  }
  const auto dtype = [](bool e8m0) { return e8m0 ? "float8_e8m0fnu" : "float32"; };
  return {BlockGemmRecipe::Rowwise, LtScaleLayout::OuterVec, LtScaleLayout::OuterVec,
          std::string("fp8mp::block_scaled_gemm") +
              ": on CUDA the blocks must be those of a recipe cuBLASLt runs: rowwise (a_block_rows = b_block_rows = 1, "
              "block_k >= K, float32 scales), DeepSeek-V3 (block_k = 128, a_block_rows and b_block_rows 1 or 128, not "
              "both 128, float32 scales) or MXFP8 (a_block_rows = b_block_rows = 1, block_k = 32, float8_e8m0fnu "
              "scales); got a_block_rows = " +
              std::to_string(a_block_rows) + ", b_block_rows = " + std::to_string(b_block_rows) +
              ", block_k = " + std::to_string(block_k) + ", K = " + std::to_string(K) + ", scales " + dtype(a_e8m0) +
              " and " + dtype(b_e8m0)};
}

}  // namespace fp8mp::cuda
