// Argument checks of fp8_gemm, shared by CPU and CUDA.
#pragma once

#include <optional>

#include "common/op_checks.h"

namespace fp8mp {

struct GemmFormats {
  Fp8Format a;
  Fp8Format b;
};

// All checks of fp8_gemm: a [M, K] and b [N, K] 2-D FP8 on one device, not both
// E5M2; 1-element fp32 scale_invs on that device; out_dtype fp32/bf16/fp16;
// bias, when given, [N] of dtype out_dtype on that device. Dtype and device
// errors raise RuntimeError, shape errors ValueError, each naming the argument.
GemmFormats check_fp8_gemm_args(const Tensor& a, const Tensor& a_scale_inv, const Tensor& b, const Tensor& b_scale_inv,
                                const std::optional<Tensor>& bias, ScalarType out_dtype);
}  // namespace fp8mp
