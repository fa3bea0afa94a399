// The CUDA glue of the grouped GEMMs (grouped_gemm_cuda.cpp), declared so that the CPU test suite runs it on CPU
// tensors with the per-group cuBLASLt launches stubbed (tests/cpp/test_cuda_glue.cpp).
#pragma once

#include <optional>

#include "common/stable.h"

namespace fp8mp::cuda_glue {

Tensor fp8_grouped_gemm(Tensor a, Tensor a_scale_inv, Tensor b, Tensor b_scale_inv, Tensor offs,
                        std::optional<Tensor> bias, ScalarType out_dtype, bool use_fast_accum);
Tensor fp8_grouped_gemm_wgrad(Tensor a, Tensor a_scale_inv, Tensor b, Tensor b_scale_inv, Tensor offs,
                              ScalarType out_dtype, bool use_fast_accum);
Tensor block_scaled_grouped_gemm(Tensor a, Tensor a_scale_inv, Tensor b, Tensor b_scale_inv, Tensor offs,
                                 int64_t a_block_rows, int64_t b_block_rows, int64_t block_k,
                                 std::optional<Tensor> bias, ScalarType out_dtype);
Tensor block_scaled_grouped_gemm_wgrad(Tensor a, Tensor a_scale_inv, Tensor b, Tensor b_scale_inv, Tensor offs,
                                       int64_t block_k, ScalarType out_dtype);

}  // namespace fp8mp::cuda_glue
