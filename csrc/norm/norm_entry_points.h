// The six norm ops' entry points, written once for CPU and CUDA: argument
// checks, the allocation of the outputs, and the torch-free arguments
// (norm_common.h) handed to one device's kernels.
//
// A Device provides
//   static void fwd(const NormFwdArgs&, const at::Tensor& x);
//   static void bwd(const NormBwdArgs&, const at::Tensor& x);
// which run that device's kernels (x only tells the device).
#pragma once

#include <ATen/ATen.h>
#include <torch/library.h>

#include <optional>
#include <tuple>
#include <vector>

#include "common/torch_glue.h"
#include "norm/norm_checks.h"
#include "norm/norm_common.h"

namespace fp8mp {

using NormFwdResult = std::tuple<at::Tensor, at::Tensor, at::Tensor>;
using OptionalTensor = std::optional<at::Tensor>;

// Shape of mean and rstd: x.shape[:-1].
inline std::vector<int64_t> norm_stats_shape(const at::Tensor& x) {
  return std::vector<int64_t>(x.sizes().begin(), x.sizes().end() - 1);
}

inline at::Tensor contiguous_or_undefined(const OptionalTensor& t) { return t.has_value() ? t->contiguous() : at::Tensor(); }

inline const void* data_or_null(const at::Tensor& t) { return t.defined() ? t.const_data_ptr() : nullptr; }

inline HpType hp_type_or_f32(const at::Tensor& t) { return t.defined() ? hp_type(t.scalar_type()) : HpType::Float32; }

// Forward of both norms, high-precision (fp8 == nullopt) or FP8 output.
template <typename Device>
NormFwdResult norm_fwd(bool centered, const at::Tensor& x, const OptionalTensor& weight, const OptionalTensor& bias,
                       double eps, bool zero_centered_gamma, std::optional<Fp8Format> fp8, const at::Tensor* scale,
                       at::Tensor* amax) {
  const at::Tensor xc = x.contiguous();
  const at::Tensor w = contiguous_or_undefined(weight), b = contiguous_or_undefined(bias);
  const int64_t hidden = x.size(-1);
  const auto stats_options = x.options().dtype(at::kFloat);
  at::Tensor mean = centered ? at::empty(norm_stats_shape(x), stats_options) : at::Tensor();
  at::Tensor rstd = at::empty(norm_stats_shape(x), stats_options);
  at::Tensor out = at::empty(x.sizes(), fp8 ? x.options().dtype(fp8_dtype(*fp8)) : x.options());
  const NormFwdArgs args{centered,
                         xc.const_data_ptr(),
                         hp_type(x.scalar_type()),
                         xc.numel() / hidden,
                         hidden,
                         data_or_null(w),
                         hp_type_or_f32(w),
                         data_or_null(b),
                         hp_type_or_f32(b),
                         zero_centered_gamma,
                         static_cast<float>(eps),
                         centered ? mean.mutable_data_ptr<float>() : nullptr,
                         rstd.mutable_data_ptr<float>(),
                         out.mutable_data_ptr(),
                         fp8.has_value(),
                         fp8.value_or(Fp8Format::E4M3),
                         fp8 ? scale->const_data_ptr<float>() : nullptr,
                         fp8 ? amax->mutable_data_ptr<float>() : nullptr};
  Device::fwd(args, x);
  return {out, mean, rstd};
}

// Backward of both norms; grad_weight / grad_bias in weight's dtype, empty float32 tensors without a weight.
template <typename Device>
NormFwdResult norm_bwd(bool centered, const at::Tensor& grad_out, const at::Tensor& x, const at::Tensor* mean,
                       const at::Tensor& rstd, const OptionalTensor& weight, bool zero_centered_gamma) {
  const at::Tensor xc = x.contiguous(), gc = grad_out.contiguous(), rstd_c = rstd.contiguous();
  const at::Tensor mean_c = mean != nullptr ? mean->contiguous() : at::Tensor();
  const at::Tensor w = contiguous_or_undefined(weight);
  const int64_t hidden = x.size(-1);
  at::Tensor grad_x = at::empty(x.sizes(), x.options());
  const auto param_options = w.defined() ? x.options().dtype(w.scalar_type()) : x.options().dtype(at::kFloat);
  at::Tensor grad_w = at::empty({w.defined() ? hidden : 0}, param_options);
  at::Tensor grad_b = at::empty({w.defined() ? hidden : 0}, param_options);
  const NormBwdArgs args{centered,
                         gc.const_data_ptr(),
                         xc.const_data_ptr(),
                         hp_type(x.scalar_type()),
                         xc.numel() / hidden,
                         hidden,
                         data_or_null(w),
                         hp_type_or_f32(w),
                         zero_centered_gamma,
                         centered ? mean_c.const_data_ptr<float>() : nullptr,
                         rstd_c.const_data_ptr<float>(),
                         grad_x.mutable_data_ptr(),
                         w.defined() ? grad_w.mutable_data_ptr() : nullptr,
                         w.defined() && centered ? grad_b.mutable_data_ptr() : nullptr};
  Device::bwd(args, x);
  return {grad_x, grad_w, grad_b};
}

template <typename Device>
struct NormEntryPoints {
  static NormFwdResult layernorm_fwd(const at::Tensor& x, const OptionalTensor& weight, const OptionalTensor& bias,
                                     double eps, bool zero_centered_gamma) {
    check_norm_fwd_args(x, weight, bias, eps, "fp8mp::layernorm_fwd");
    return norm_fwd<Device>(true, x, weight, bias, eps, zero_centered_gamma, std::nullopt, nullptr, nullptr);
  }

  static NormFwdResult layernorm_fwd_fp8(const at::Tensor& x, const OptionalTensor& weight, const OptionalTensor& bias,
                                         double eps, bool zero_centered_gamma, const at::Tensor& scale, at::Tensor& amax,
                                         c10::string_view fmt) {
    const Fp8Format format =
        check_norm_fwd_fp8_args(x, weight, bias, eps, scale, amax, fmt, "fp8mp::layernorm_fwd_fp8");
    return norm_fwd<Device>(true, x, weight, bias, eps, zero_centered_gamma, format, &scale, &amax);
  }

  static NormFwdResult layernorm_bwd(const at::Tensor& grad_out, const at::Tensor& x, const at::Tensor& mean,
                                     const at::Tensor& rstd, const OptionalTensor& weight, bool zero_centered_gamma) {
    check_norm_bwd_args(grad_out, x, &mean, rstd, weight, "fp8mp::layernorm_bwd");
    return norm_bwd<Device>(true, grad_out, x, &mean, rstd, weight, zero_centered_gamma);
  }

  static std::tuple<at::Tensor, at::Tensor> rmsnorm_fwd(const at::Tensor& x, const OptionalTensor& weight, double eps,
                                                        bool zero_centered_gamma) {
    check_norm_fwd_args(x, weight, std::nullopt, eps, "fp8mp::rmsnorm_fwd");
    auto [out, mean, rstd] =
        norm_fwd<Device>(false, x, weight, std::nullopt, eps, zero_centered_gamma, std::nullopt, nullptr, nullptr);
    return {out, rstd};
  }

  static std::tuple<at::Tensor, at::Tensor> rmsnorm_fwd_fp8(const at::Tensor& x, const OptionalTensor& weight,
                                                            double eps, bool zero_centered_gamma,
                                                            const at::Tensor& scale, at::Tensor& amax,
                                                            c10::string_view fmt) {
    const Fp8Format format =
        check_norm_fwd_fp8_args(x, weight, std::nullopt, eps, scale, amax, fmt, "fp8mp::rmsnorm_fwd_fp8");
    auto [out, mean, rstd] =
        norm_fwd<Device>(false, x, weight, std::nullopt, eps, zero_centered_gamma, format, &scale, &amax);
    return {out, rstd};
  }

  static std::tuple<at::Tensor, at::Tensor> rmsnorm_bwd(const at::Tensor& grad_out, const at::Tensor& x,
                                                        const at::Tensor& rstd, const OptionalTensor& weight,
                                                        bool zero_centered_gamma) {
    check_norm_bwd_args(grad_out, x, nullptr, rstd, weight, "fp8mp::rmsnorm_bwd");
    auto [grad_x, grad_weight, unused] = norm_bwd<Device>(false, grad_out, x, nullptr, rstd, weight, zero_centered_gamma);
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
