// The six norm ops' entry points, written once for CPU and CUDA: argument
// checks, the allocation of the outputs, and the torch-free arguments
// (norm_common.h) handed to one device's kernels.
//
// A Device provides
//   static void fwd(const NormFwdArgs&, const Tensor& x);
//   static void bwd(const NormBwdArgs&, const Tensor& x);
// which run that device's kernels (x only tells the device).
#pragma once

#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "common/stable.h"
#include "norm/norm_checks.h"
#include "norm/norm_common.h"

namespace fp8mp {

using NormFwdResult = std::tuple<Tensor, Tensor, Tensor>;
using OptionalTensor = std::optional<Tensor>;

// Shape of mean and rstd: x.shape[:-1].
inline std::vector<int64_t> norm_stats_shape(const Tensor& x) {
  std::vector<int64_t> sizes = sizes_of(x);
  sizes.pop_back();
  return sizes;
}

inline OptionalTensor contiguous_or_none(const OptionalTensor& t) {
  return t.has_value() ? OptionalTensor(as_contiguous(*t)) : std::nullopt;
}

inline const void* data_or_null(const OptionalTensor& t) { return t.has_value() ? t->const_data_ptr() : nullptr; }

inline HpType hp_type_or_f32(const OptionalTensor& t) { return t.has_value() ? hp_type(t->scalar_type()) : HpType::Float32; }

// Forward of both norms, high-precision (fp8 == nullopt) or FP8 output.
template <typename Device>
NormFwdResult norm_fwd(bool centered, const Tensor& x, const OptionalTensor& weight, const OptionalTensor& bias,
                       double eps, bool zero_centered_gamma, std::optional<Fp8Format> fp8, const Tensor* scale,
                       Tensor* amax) {
  const Tensor xc = as_contiguous(x);
  const OptionalTensor w = contiguous_or_none(weight), b = contiguous_or_none(bias);
  const int64_t hidden = x.size(-1);
  Tensor mean = centered ? empty_on(norm_stats_shape(x), kFloat, x) : Tensor();
  Tensor rstd = empty_on(norm_stats_shape(x), kFloat, x);
  Tensor out = empty_on(sizes_of(x), fp8 ? fp8_dtype(*fp8) : x.scalar_type(), x);
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
                         centered ? static_cast<float*>(mean.mutable_data_ptr()) : nullptr,
                         static_cast<float*>(rstd.mutable_data_ptr()),
                         out.mutable_data_ptr(),
                         fp8.has_value(),
                         fp8.value_or(Fp8Format::E4M3),
                         fp8 ? static_cast<const float*>(scale->const_data_ptr()) : nullptr,
                         fp8 ? static_cast<float*>(amax->mutable_data_ptr()) : nullptr};
  Device::fwd(args, x);
  return {out, mean, rstd};
}

// Backward of both norms; grad_weight / grad_bias in weight's dtype, empty float32 tensors without a weight.
template <typename Device>
NormFwdResult norm_bwd(bool centered, const Tensor& grad_out, const Tensor& x, const Tensor* mean, const Tensor& rstd,
                       const OptionalTensor& weight, bool zero_centered_gamma) {
  const Tensor xc = as_contiguous(x), gc = as_contiguous(grad_out), rstd_c = as_contiguous(rstd);
  const Tensor mean_c = mean != nullptr ? as_contiguous(*mean) : Tensor();
  const OptionalTensor w = contiguous_or_none(weight);
  const int64_t hidden = x.size(-1);
  Tensor grad_x = empty_on(sizes_of(x), x.scalar_type(), x);
  const ScalarType param_dtype = w.has_value() ? w->scalar_type() : kFloat;
  Tensor grad_w = empty_on({w.has_value() ? hidden : 0}, param_dtype, x);
  Tensor grad_b = empty_on({w.has_value() ? hidden : 0}, param_dtype, x);
  const NormBwdArgs args{centered,
                         gc.const_data_ptr(),
                         xc.const_data_ptr(),
                         hp_type(x.scalar_type()),
                         xc.numel() / hidden,
                         hidden,
                         data_or_null(w),
                         hp_type_or_f32(w),
                         zero_centered_gamma,
                         centered ? static_cast<const float*>(mean_c.const_data_ptr()) : nullptr,
                         static_cast<const float*>(rstd_c.const_data_ptr()),
                         grad_x.mutable_data_ptr(),
                         w.has_value() ? grad_w.mutable_data_ptr() : nullptr,
                         w.has_value() && centered ? grad_b.mutable_data_ptr() : nullptr};
  Device::bwd(args, x);
  return {grad_x, grad_w, grad_b};
}

// The six ops, in the argument types the stable ABI boxes (tensors by value, std::string).
template <typename Device>
struct NormEntryPoints {
  static NormFwdResult layernorm_fwd(Tensor x, OptionalTensor weight, OptionalTensor bias, double eps,
                                     bool zero_centered_gamma) {
    check_norm_fwd_args(x, weight, bias, eps, "fp8mp::layernorm_fwd");
    return norm_fwd<Device>(true, x, weight, bias, eps, zero_centered_gamma, std::nullopt, nullptr, nullptr);
  }

  static NormFwdResult layernorm_fwd_fp8(Tensor x, OptionalTensor weight, OptionalTensor bias, double eps,
                                         bool zero_centered_gamma, Tensor scale, Tensor amax, std::string fmt) {
    const Fp8Format format =
        check_norm_fwd_fp8_args(x, weight, bias, eps, scale, amax, fmt, "fp8mp::layernorm_fwd_fp8");
    return norm_fwd<Device>(true, x, weight, bias, eps, zero_centered_gamma, format, &scale, &amax);
  }

  static NormFwdResult layernorm_bwd(Tensor grad_out, Tensor x, Tensor mean, Tensor rstd, OptionalTensor weight,
                                     bool zero_centered_gamma) {
    check_norm_bwd_args(grad_out, x, &mean, rstd, weight, "fp8mp::layernorm_bwd");
    return norm_bwd<Device>(true, grad_out, x, &mean, rstd, weight, zero_centered_gamma);
  }

  static std::tuple<Tensor, Tensor> rmsnorm_fwd(Tensor x, OptionalTensor weight, double eps, bool zero_centered_gamma) {
    check_norm_fwd_args(x, weight, std::nullopt, eps, "fp8mp::rmsnorm_fwd");
    auto [out, mean, rstd] =
        norm_fwd<Device>(false, x, weight, std::nullopt, eps, zero_centered_gamma, std::nullopt, nullptr, nullptr);
    return {out, rstd};
  }

  static std::tuple<Tensor, Tensor> rmsnorm_fwd_fp8(Tensor x, OptionalTensor weight, double eps,
                                                    bool zero_centered_gamma, Tensor scale, Tensor amax,
                                                    std::string fmt) {
    const Fp8Format format =
        check_norm_fwd_fp8_args(x, weight, std::nullopt, eps, scale, amax, fmt, "fp8mp::rmsnorm_fwd_fp8");
    auto [out, mean, rstd] =
        norm_fwd<Device>(false, x, weight, std::nullopt, eps, zero_centered_gamma, format, &scale, &amax);
    return {out, rstd};
  }

  static std::tuple<Tensor, Tensor> rmsnorm_bwd(Tensor grad_out, Tensor x, Tensor rstd, OptionalTensor weight,
                                                bool zero_centered_gamma) {
    check_norm_bwd_args(grad_out, x, nullptr, rstd, weight, "fp8mp::rmsnorm_bwd");
    auto [grad_x, grad_weight, unused] = norm_bwd<Device>(false, grad_out, x, nullptr, rstd, weight, zero_centered_gamma);
    return {grad_x, grad_weight};
  }
};

template <typename Device>
void register_norm_ops(torch::stable::detail::StableLibrary& m) {
  using Ops = NormEntryPoints<Device>;
  m.impl("layernorm_fwd", TORCH_BOX(&Ops::layernorm_fwd));
  m.impl("layernorm_fwd_fp8", TORCH_BOX(&Ops::layernorm_fwd_fp8));
  m.impl("layernorm_bwd", TORCH_BOX(&Ops::layernorm_bwd));
  m.impl("rmsnorm_fwd", TORCH_BOX(&Ops::rmsnorm_fwd));
  m.impl("rmsnorm_fwd_fp8", TORCH_BOX(&Ops::rmsnorm_fwd_fp8));
  m.impl("rmsnorm_bwd", TORCH_BOX(&Ops::rmsnorm_bwd));
}

}  // namespace fp8mp
