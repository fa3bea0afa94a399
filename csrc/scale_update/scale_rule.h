// The scale update rule of delayed and current scaling, shared by the CPU and
// CUDA kernels (the functions are __host__ __device__) so both devices give
// identical bits. Standard library only, like fp8_format.h.
#pragma once

#include <cmath>
#include <cstdint>

#include "common/fp8_format.h"
#include "common/nan_keeping_scale.h"

namespace fp8mp {

// How update_amax_history_and_scale turns a column of the history into the amax a scale is computed from.
enum class AmaxComputeAlgo : int { Max = 0, MostRecent = 1 };

// 2^margin in fp32 (+Inf from margin 128 on, which makes every new scale 0 and so keeps the old one).
inline float pow2_margin(int64_t margin) {
  return std::ldexp(1.0f, static_cast<int>(margin < 1000 ? margin : 1000));
}

// max(a, b) that returns NaN when either is NaN (like torch.amax), so a NaN
// anywhere in the history window keeps the old scale.
FP8MP_HOST_DEVICE float nan_max(float a, float b) { return (a > b || a != a) ? a : b; }

// fp8_max / effective / pow2, in fp32 with IEEE division, when effective is
// finite and > 0 and the result is finite and > 0; otherwise old_scale. An
// fp8_max that is not finite and > 0 gives the canonical NaN (checked_scale):
// refused on the host (the CPU op), on a GPU a scale whose casts are all NaN.
FP8MP_HOST_DEVICE float updated_scale(float fp8_max, float effective, float pow2, float old_scale) {
  if (is_nan_bits(float_to_bits(checked_scale(fp8_max)))) return bits_to_float(kCanonicalNanBits);
#if defined(__CUDA_ARCH__)
  const float candidate = __fdiv_rn(__fdiv_rn(fp8_max, effective), pow2);
  const bool effective_ok = effective > 0.0f && isfinite(effective);
  const bool candidate_ok = candidate > 0.0f && isfinite(candidate);
#else
  const float candidate = (fp8_max / effective) / pow2;
  const bool effective_ok = effective > 0.0f && std::isfinite(effective);
  const bool candidate_ok = candidate > 0.0f && std::isfinite(candidate);
#endif
  return effective_ok && candidate_ok ? candidate : old_scale;
}

// 1 / scale, a NaN scale's as the canonical NaN on both devices.
FP8MP_HOST_DEVICE float reciprocal(float scale) {
#if defined(__CUDA_ARCH__)
  return pin_nan(__fdiv_rn(1.0f, scale));
#else
  return pin_nan(1.0f / scale);
#endif
}

}  // namespace fp8mp
