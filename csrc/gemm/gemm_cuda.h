// The CUDA glue of fp8_gemm (gemm_cuda.cpp), declared so that the CPU test suite runs it on CPU tensors with
// cuBLASLt stubbed (tests/cpp/test_cuda_glue.cpp).
#pragma once

#include <optional>

#include "common/stable.h"

namespace fp8mp::cuda_glue {

Tensor fp8_gemm(Tensor a, Tensor a_scale_inv, Tensor b, Tensor b_scale_inv, std::optional<Tensor> bias,
                ScalarType out_dtype, bool use_fast_accum);

}  // namespace fp8mp::cuda_glue
