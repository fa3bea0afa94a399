// The NaN bits fp8mp's arithmetic writes, the same on both devices. A NaN made by the arithmetic itself
// (+-Inf x 0, Inf - Inf, 0 / 0) comes out as the one canonical +quiet NaN 0x7FC00000: x86 would write its
// default NaN 0xFFC00000 (negative) and NVIDIA fp32 arithmetic 0x7FFFFFFF, so leaving it to the hardware
// would make the devices differ in the sign the FP8 and 16-bit codes keep. A NaN input keeps its own
// bits (its sign reaches the code: "NaN becomes sign|0x7F", fp8_format.h). Branch-free bit selects, so
// the CPU loops still vectorize. Host and device.
#pragma once

#include <cstdint>

#include "common/fp8_format.h"

namespace fp8mp {

constexpr uint32_t kCanonicalNanBits = 0x7FC00000u;

FP8MP_HOST_DEVICE bool is_nan_bits(uint32_t bits) { return (bits & 0x7FFFFFFFu) > 0x7F800000u; }

// v, or the canonical NaN where v is a NaN.
FP8MP_HOST_DEVICE float pin_nan(float v) {
  const uint32_t bits = float_to_bits(v);
  return bits_to_float(uint32_t(select(is_nan_bits(bits), int32_t(kCanonicalNanBits), int32_t(bits))));
}

// v * s in fp32 (round to nearest on both devices): a NaN v passes through unchanged, a NaN the
// multiplication makes (+-Inf x 0, a NaN s) is the canonical NaN.
FP8MP_HOST_DEVICE float scale_keep_nan(float v, float s) {
#if defined(__CUDA_ARCH__)
  const float product = __fmul_rn(v, s);
#else
  const float product = v * s;
#endif
  const uint32_t v_bits = float_to_bits(v);
  return bits_to_float(uint32_t(select(is_nan_bits(v_bits), int32_t(v_bits), int32_t(float_to_bits(pin_nan(product))))));
}

// The scale a cast applies: s where it is finite and > 0, else the canonical NaN, so that every value
// cast with it comes out NaN (a non-finite result the loss scaler skips) instead of a silently wrong one
// (a negative scale would flip every sign, a zero one flush everything to zero). The CPU ops refuse such
// a scale outright (its value is on the host); the CUDA ops cannot read it without a host sync.
FP8MP_HOST_DEVICE float checked_scale(float s) {
  const uint32_t bits = float_to_bits(s);
  return bits_to_float(uint32_t(select(bits - 1u < 0x7F7FFFFFu, int32_t(bits), int32_t(kCanonicalNanBits))));
}

}  // namespace fp8mp
