// The CUDA glue of the block-scaled ops (blockwise_cuda.cpp), declared so that the CPU test suite runs it on
// CPU tensors with the kernel launches and cuBLASLt stubbed (tests/cpp/test_cuda_glue.cpp).
#pragma once

#include <optional>
#include <string>
#include <tuple>

#include "common/stable.h"

namespace fp8mp::cuda_glue {

std::tuple<Tensor, Tensor> block_quantize(Tensor x, int64_t block_rows, int64_t block_cols, std::string fmt,
                                          std::string scale_mode);
std::tuple<Tensor, Tensor, Tensor, Tensor> block_quantize_transpose(Tensor x, int64_t row_block, int64_t col_block,
                                                                    std::string fmt, std::string scale_mode);
Tensor block_scaled_gemm(Tensor a, Tensor a_scale_inv, Tensor b, Tensor b_scale_inv, int64_t a_block_rows,
                         int64_t b_block_rows, int64_t block_k, std::optional<Tensor> bias, ScalarType out_dtype);

}  // namespace fp8mp::cuda_glue
