// The six norm ops' entry points (argument checks, then the LayerNorm or RMSNorm
// flavour of one device's kernels), written once for CPU and CUDA.
//
// A Device provides
//   template <bool kCentered> static NormFwdResult fwd(x, weight, bias, eps, zero_centered_gamma,
//                                                      optional<Fp8Format>, const Tensor* scale, Tensor* amax, op);
//   template <bool kCentered> static NormFwdResult bwd(grad_out, x, const Tensor* mean, rstd, weight,
//                                                      zero_centered_gamma, op);
// with kCentered = true for LayerNorm (mean subtracted) and false for RMSNorm.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/library.h>

#include <optional>
#include <tuple>

#include "norm/norm_checks.h"

namespace fp8mp {

using NormFwdResult = std::tuple<at::Tensor, at::Tensor, at::Tensor>;
using OptionalTensor = std::optional<at::Tensor>;

template <typename Device>
struct NormEntryPoints {
  static NormFwdResult layernorm_fwd(const at::Tensor& x, const OptionalTensor& weight, const OptionalTensor& bias,
                                     double eps, bool zero_centered_gamma) {
    constexpr const char* op = "fp8mp::layernorm_fwd";
    check_norm_fwd_args(x, weight, bias, eps, op);
    return Device::template fwd<true>(x, weight, bias, eps, zero_centered_gamma, std::nullopt, nullptr, nullptr, op);
  }

  static NormFwdResult layernorm_fwd_fp8(const at::Tensor& x, const OptionalTensor& weight, const OptionalTensor& bias,
                                         double eps, bool zero_centered_gamma, const at::Tensor& scale, at::Tensor& amax,
                                         c10::string_view fmt) {
    constexpr const char* op = "fp8mp::layernorm_fwd_fp8";
    const Fp8Format format = check_norm_fwd_fp8_args(x, weight, bias, eps, scale, amax, fmt, op);
    return Device::template fwd<true>(x, weight, bias, eps, zero_centered_gamma, format, &scale, &amax, op);
  }

  static NormFwdResult layernorm_bwd(const at::Tensor& grad_out, const at::Tensor& x, const at::Tensor& mean,
                                     const at::Tensor& rstd, const OptionalTensor& weight, bool zero_centered_gamma) {
    constexpr const char* op = "fp8mp::layernorm_bwd";
    check_norm_bwd_args(grad_out, x, &mean, rstd, weight, op);
    return Device::template bwd<true>(grad_out, x, &mean, rstd, weight, zero_centered_gamma, op);
  }

  static std::tuple<at::Tensor, at::Tensor> rmsnorm_fwd(const at::Tensor& x, const OptionalTensor& weight, double eps,
                                                        bool zero_centered_gamma) {
    constexpr const char* op = "fp8mp::rmsnorm_fwd";
    check_norm_fwd_args(x, weight, std::nullopt, eps, op);
    auto [out, mean, rstd] =
        Device::template fwd<false>(x, weight, std::nullopt, eps, zero_centered_gamma, std::nullopt, nullptr, nullptr, op);
    return {out, rstd};
  }

  static std::tuple<at::Tensor, at::Tensor> rmsnorm_fwd_fp8(const at::Tensor& x, const OptionalTensor& weight,
                                                            double eps, bool zero_centered_gamma,
                                                            const at::Tensor& scale, at::Tensor& amax,
                                                            c10::string_view fmt) {
    constexpr const char* op = "fp8mp::rmsnorm_fwd_fp8";
    const Fp8Format format = check_norm_fwd_fp8_args(x, weight, std::nullopt, eps, scale, amax, fmt, op);
    auto [out, mean, rstd] =
        Device::template fwd<false>(x, weight, std::nullopt, eps, zero_centered_gamma, format, &scale, &amax, op);
    return {out, rstd};
  }

  static std::tuple<at::Tensor, at::Tensor> rmsnorm_bwd(const at::Tensor& grad_out, const at::Tensor& x,
                                                        const at::Tensor& rstd, const OptionalTensor& weight,
                                                        bool zero_centered_gamma) {
    constexpr const char* op = "fp8mp::rmsnorm_bwd";
    check_norm_bwd_args(grad_out, x, nullptr, rstd, weight, op);
    auto [grad_x, grad_weight, unused] =
        Device::template bwd<false>(grad_out, x, nullptr, rstd, weight, zero_centered_gamma, op);
    return {grad_x, grad_weight};
  }
};

template <typename Device>
void register_norm_ops(torch::Library& m) {
  using Ops = NormEntryPoints<Device>;
  m.impl("layernorm_fwd", &Ops::layernorm_fwd);
  m.impl("layernorm_fwd_fp8", &Ops::layernorm_fwd_fp8);
  m.impl("layernorm_bwd", &Ops::layernorm_bwd);
  m.impl("rmsnorm_fwd", &Ops::rmsnorm_fwd);
  m.impl("rmsnorm_fwd_fp8", &Ops::rmsnorm_fwd_fp8);
  m.impl("rmsnorm_bwd", &Ops::rmsnorm_bwd);
}

}  // namespace fp8mp
