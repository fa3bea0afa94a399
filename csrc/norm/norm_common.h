// Arithmetic shared by the CPU and CUDA LayerNorm / RMSNorm kernels, so that
// both devices evaluate the same fp32 expressions in the same order (the build
// disables contraction: -ffp-contract=off, --fmad=false), and the arguments of
// their torch-free entry points. Standard library only.
#pragma once

#include <cmath>

#include "common/fp8_format.h"
#include "common/half_types.h"
#include "common/nan_keeping_scale.h"

namespace fp8mp {

// Statistics of one row of length n from its two-pass sums: mean0 = sum(x) / n,
// then sum_d = sum(x - mean0) and sum_d2 = sum((x - mean0)^2). Adding the
// correction sum_d / n to mean0 makes the mean accurate even when the row's
// magnitude dwarfs its spread (mean ~ 1e4, std ~ 1), where a one-pass
// E[x^2] - E[x]^2 loses every digit. The variance is clamped at 0 with a
// comparison that lets NaN through. A NaN the statistics make (Inf - Inf) is the canonical NaN on both
// devices (nan_keeping_scale.h), as is every NaN the norm's outputs and gradients carry.
FP8MP_HOST_DEVICE void layernorm_stats(float mean0, float sum_d, float sum_d2, float n, float eps, float& mean,
                                       float& rstd) {
  const float shift = sum_d / n;
  mean = mean0 + shift;
  float var = sum_d2 / n - shift * shift;
  var = var < 0.0f ? 0.0f : var;
  mean = pin_nan(mean);
  rstd = pin_nan(1.0f / sqrtf(var + eps));
}

FP8MP_HOST_DEVICE float rmsnorm_rstd(float sum_sq, float n, float eps) { return pin_nan(1.0f / sqrtf(sum_sq / n + eps)); }

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
  return pin_nan((centered - xhat * mean_dy_xhat) * rstd);
}

// The arguments of one norm forward, for LayerNorm (centered) or RMSNorm, on raw
// row-major contiguous buffers of one device. weight / bias are [hidden] of their
// own high-precision types or nullptr (RMSNorm has no bias); the effective gain is
// weight, 1 + weight with zero_centered_gamma, or 1 without a weight.
struct NormFwdArgs {
  bool centered;
  const void* x;  // [rows, hidden] of x_type
  HpType x_type;
  int64_t rows, hidden;
  const void* weight;
  HpType weight_type;
  const void* bias;
  HpType bias_type;
  bool zero_centered_gamma;
  float eps;
  float* mean;  // [rows], LayerNorm only
  float* rstd;  // [rows]
  void* out;    // [rows, hidden] of x_type, or FP8 codes when fp8
  bool fp8;
  Fp8Format format;
  const float* scale;  // fp8 only: 1 value
  float* amax;         // fp8 only: 1 value, max |out in x_type| written
};

// The arguments of one norm backward: grad_x, and with a weight grad_weight / grad_bias
// (LayerNorm only) of weight_type, summed over rows.
struct NormBwdArgs {
  bool centered;
  const void* grad_out;  // [rows, hidden] of x_type
  const void* x;
  HpType x_type;
  int64_t rows, hidden;
  const void* weight;
  HpType weight_type;
  bool zero_centered_gamma;
  const float* mean;  // [rows], LayerNorm only
  const float* rstd;  // [rows]
  void* grad_x;       // [rows, hidden] of x_type
  void* grad_weight;  // [hidden] of weight_type, with a weight
  void* grad_bias;    // [hidden] of weight_type, with a weight, LayerNorm only
};

}  // namespace fp8mp
