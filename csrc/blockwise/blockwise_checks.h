// Argument checks of the block-scaled ops (block_quantize, block_scaled_gemm) and their output
// allocation, shared by every device.
#pragma once

#include <optional>
#include <string>
#include <tuple>

#include "blockwise/blockwise_cpu_kernels.h"
#include "common/op_checks.h"
#include "common/stable.h"

namespace fp8mp {

struct BlockQuantizeArgs {
  Fp8Format format;
  cpu::BlockScaleMode mode;
};

// x 2-D float32/bfloat16/float16; block_rows, block_cols >= 1; fmt "e4m3"/"e5m2";
// scale_mode "fp32", "pow2", "e8m0_floor" or "e8m0_rceil".
BlockQuantizeArgs check_block_quantize_args(const Tensor& x, int64_t block_rows, int64_t block_cols,
                                            const std::string& fmt, const std::string& scale_mode);

// x as block_quantize's; row_block, col_block >= 1. `op` names the op in the messages.
BlockQuantizeArgs check_block_quantize_transpose_args(const Tensor& x, int64_t row_block, int64_t col_block,
                                                      const std::string& fmt, const std::string& scale_mode,
                                                      const char* op = "fp8mp::block_quantize_transpose");

// Uninitialized (data [rows, cols], scale_inv [ceil(rows / block_rows), ceil(cols / block_cols)]) on
// x's device: FP8 of args.format, scale_inv float32 or (E8M0 modes) float8_e8m0fnu.
std::tuple<Tensor, Tensor> empty_block_quantized(const Tensor& x, int64_t rows, int64_t cols, int64_t block_rows,
                                                 int64_t block_cols, const BlockQuantizeArgs& args);

struct BlockGemmFormats {
  Fp8Format a;
  Fp8Format b;
};

// a [M, K] and b [N, K] 2-D FP8 on one device, not both E5M2; block sizes >= 1; each scale_inv
// float32 or float8_e8m0fnu on that device, of shape [ceil(rows / block_rows), ceil(K / block_k)];
// out_dtype fp32/bf16/fp16; bias, when given, [N] of dtype out_dtype on that device.
BlockGemmFormats check_block_scaled_gemm_args(const Tensor& a, const Tensor& a_scale_inv, const Tensor& b,
                                              const Tensor& b_scale_inv, int64_t a_block_rows, int64_t b_block_rows,
                                              int64_t block_k, const std::optional<Tensor>& bias,
                                              ScalarType out_dtype);

}  // namespace fp8mp
