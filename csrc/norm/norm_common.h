// Arithmetic shared by the CPU and CUDA LayerNorm / RMSNorm kernels, so that
// both devices evaluate the same fp32 expressions in the same order (the build
// disables contraction: -ffp-contract=off, --fmad=false), plus host-side
// preparation of the gain and bias vectors.
#pragma once

#include <ATen/ATen.h>

#include <cmath>
#include <optional>

#include "common/fp8_format.h"

namespace fp8mp {

// Statistics of one row of length n from its two-pass sums: mean0 = sum(x) / n,
// then sum_d = sum(x - mean0) and sum_d2 = sum((x - mean0)^2). Adding the
// correction sum_d / n to mean0 makes the mean accurate even when the row's
// magnitude dwarfs its spread (mean ~ 1e4, std ~ 1), where a one-pass
// E[x^2] - E[x]^2 loses every digit. The variance is clamped at 0 with a
// comparison that lets NaN through.
FP8MP_HOST_DEVICE void layernorm_stats(float mean0, float sum_d, float sum_d2, float n, float eps, float& mean,
                                       float& rstd) {
  const float shift = sum_d / n;
  mean = mean0 + shift;
  float var = sum_d2 / n - shift * shift;
  var = var < 0.0f ? 0.0f : var;
  rstd = 1.0f / sqrtf(var + eps);
}

FP8MP_HOST_DEVICE float rmsnorm_rstd(float sum_sq, float n, float eps) { return 1.0f / sqrtf(sum_sq / n + eps); }

// y = ((x - mean) * rstd) * g (+ b); RMSNorm (kCentered = false) has no mean.
template <bool kCentered>
FP8MP_HOST_DEVICE float normalized(float x, float mean, float rstd) {
  return kCentered ? (x - mean) * rstd : x * rstd;
}

// grad_x from dy = grad_out * g, xhat, and the row means of dy and dy * xhat:
// LayerNorm: rstd * (dy - mean(dy) - xhat * mean(dy * xhat)); RMSNorm drops mean(dy).
template <bool kCentered>
FP8MP_HOST_DEVICE float norm_grad_x(float dy, float xhat, float mean_dy, float mean_dy_xhat, float rstd) {
  const float centered = kCentered ? dy - mean_dy : dy;
  return (centered - xhat * mean_dy_xhat) * rstd;
}

// The effective gain as a contiguous fp32 vector of length H: weight, 1 + weight
// with zero_centered_gamma, or ones without a weight (gain 1 either way).
inline at::Tensor norm_gain_fp32(const std::optional<at::Tensor>& weight, int64_t hidden, bool zero_centered_gamma,
                                 const at::Tensor& like) {
  const auto options = like.options().dtype(at::kFloat);
  if (!weight.has_value()) return at::ones({hidden}, options);
  at::Tensor g = weight->to(at::kFloat).contiguous();
  return zero_centered_gamma ? g + 1.0f : g;
}

inline at::Tensor norm_bias_fp32(const std::optional<at::Tensor>& bias) {
  return bias.has_value() ? bias->to(at::kFloat).contiguous() : at::Tensor();
}

// Shape of mean and rstd: x.shape[:-1].
inline std::vector<int64_t> norm_stats_shape(const at::Tensor& x) {
  return std::vector<int64_t>(x.sizes().begin(), x.sizes().end() - 1);
}

}  // namespace fp8mp
