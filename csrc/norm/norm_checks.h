// Argument checks of the norm ops (layernorm_* / rmsnorm_*), shared by CPU and CUDA.
#pragma once

#include <optional>
#include <string>

#include "common/op_checks.h"

namespace fp8mp {

// layernorm_fwd / rmsnorm_fwd (bias is absent for RMSNorm): x float32/bfloat16/float16 with
// dim >= 1 and a non-empty last dimension H; weight and bias, when given, of shape [H], of
// one high-precision dtype and on x's device; eps > 0 and finite as a float32.
void check_norm_fwd_args(const Tensor& x, const std::optional<Tensor>& weight, const std::optional<Tensor>& bias,
                         double eps, const char* op);

// layernorm_fwd_fp8 / rmsnorm_fwd_fp8: the forward checks plus scale, amax (written in place: it overlaps
// none of x, weight, bias and scale) and fmt; returns the format.
Fp8Format check_norm_fwd_fp8_args(const Tensor& x, const std::optional<Tensor>& weight,
                                  const std::optional<Tensor>& bias, double eps, const Tensor& scale,
                                  const Tensor& amax, const std::string& fmt, const char* op);

// layernorm_bwd / rmsnorm_bwd (mean is nullptr for RMSNorm): x and weight as in the forward,
// grad_out of x's shape and dtype, mean and rstd float32 of shape x.shape[:-1], all on x's device.
void check_norm_bwd_args(const Tensor& grad_out, const Tensor& x, const Tensor* mean, const Tensor& rstd,
                         const std::optional<Tensor>& weight, const char* op);

}  // namespace fp8mp
