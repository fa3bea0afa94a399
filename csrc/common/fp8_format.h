// Scalar FP8 encode/decode following the OCP 8-bit floating point spec (v1.0).
//
// This header is the single definition of fp8mp's rounding semantics. It is
// used by the CPU kernels, the CUDA kernels (the functions are __host__
// __device__) and the Catch2 tests, so CPU and GPU agree bit for bit by
// construction. It depends on nothing but the C++ standard library.
//
// Semantics of encode<F>(x):
//   * round to nearest, ties to even, directly from fp32 (no double rounding);
//   * finite values beyond the largest finite code saturate to +-max
//     (E4M3: 448, E5M2: 57344);
//   * +-Inf saturates to +-448 in E4M3 (the format has no Inf) and stays +-Inf
//     in E5M2, matching torch's own `.to(torch.float8_e5m2)`: an Inf gradient
//     stays visible to the loss scaler instead of turning into a plausible
//     finite number;
//   * NaN becomes sign|0x7F in both formats (what torch's casts produce);
//   * subnormals are exact and signed zero is kept.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define FP8MP_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define FP8MP_HOST_DEVICE inline
#endif

namespace fp8mp {

enum class Fp8Format : int { E4M3 = 0, E5M2 = 1 };

template <Fp8Format F>
struct FormatTraits;

// E4M3: bias 7, no Inf, NaN = S.1111.111, max = S.1111.110 = 448.
template <>
struct FormatTraits<Fp8Format::E4M3> {
  static constexpr int kManBits = 3;
  static constexpr int kBias = 7;
  static constexpr int32_t kMaxCode = 0x7E;
  static constexpr float kMax = 448.0f;
  static constexpr bool kHasInf = false;
  static constexpr int32_t kInfCode = 0x7E;  // Inf saturates
};

// E5M2: bias 15, Inf = S.11111.00, NaN = S.11111.{01,10,11}, max = S.11110.11 = 57344.
template <>
struct FormatTraits<Fp8Format::E5M2> {
  static constexpr int kManBits = 2;
  static constexpr int kBias = 15;
  static constexpr int32_t kMaxCode = 0x7B;
  static constexpr float kMax = 57344.0f;
  static constexpr bool kHasInf = true;
  static constexpr int32_t kInfCode = 0x7C;
};

constexpr int32_t kNanCode = 0x7F;

FP8MP_HOST_DEVICE uint32_t float_to_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  return __builtin_bit_cast(uint32_t, f);  // unlike memcpy, keeps the CPU loops vectorizable
#endif
}

FP8MP_HOST_DEVICE float bits_to_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  return __builtin_bit_cast(float, u);
#endif
}

FP8MP_HOST_DEVICE int32_t select(bool condition, int32_t if_true, int32_t if_false) {
  const int32_t mask = -int32_t(condition);
  return (if_true & mask) | (if_false & ~mask);
}

// Branch-free so that the CPU loop auto-vectorizes and CUDA warps don't diverge.
template <Fp8Format F>
FP8MP_HOST_DEVICE uint8_t encode(float x) {
  using T = FormatTraits<F>;
  constexpr int kShift = 23 - T::kManBits;
  constexpr uint32_t kInfBits = 0x7F800000u;
  constexpr uint32_t kMinNormalBits = uint32_t(127 + 1 - T::kBias) << 23;
  // 2^(bias - 1 + mantissa bits): maps the subnormal step of the format to 1.
  constexpr float kSubnormalScale = float(1u << (T::kBias - 1 + T::kManBits));
  constexpr float kRoundMagic = 8388608.0f;  // 2^23: adding it rounds [0, 2^22) to an integer, ties to even

  const uint32_t bits = float_to_bits(x);
  const uint32_t sign = (bits >> 24) & 0x80u;
  const uint32_t abs_bits = bits & 0x7FFFFFFFu;

  // Normal range: round the fp32 mantissa to kManBits bits, ties to even, by
  // integer addition; a carry out of the mantissa correctly bumps the exponent.
  const uint32_t rounded = abs_bits + ((1u << (kShift - 1)) - 1u) + ((abs_bits >> kShift) & 1u);
  const int32_t normal_code = int32_t(rounded >> kShift) - int32_t(uint32_t(127 - T::kBias) << T::kManBits);

  // Subnormal range: |x| * 2^(bias-1+m) is exact and < 2^m, so rounding it to
  // an integer is the subnormal code; rounding up to 2^m yields the smallest
  // normal code, which is also right.
#if defined(__CUDA_ARCH__)
  const float q = __fmul_rn(bits_to_float(abs_bits), kSubnormalScale);
  const float q_rounded = __fsub_rn(__fadd_rn(q, kRoundMagic), kRoundMagic);
#else
  const float q = bits_to_float(abs_bits) * kSubnormalScale;
  const float q_rounded = (q + kRoundMagic) - kRoundMagic;
#endif
  const int32_t subnormal_code = int32_t(q_rounded);

  // Selections as bit masks: GCC turns chains of ?: into branches, which stop the CPU loops from vectorizing.
  int32_t code = select(abs_bits < kMinNormalBits, subnormal_code, normal_code);
  code = code < T::kMaxCode ? code : T::kMaxCode;  // saturate finite overflow (and Inf, for E4M3)
  if (T::kHasInf) code = select(abs_bits == kInfBits, T::kInfCode, code);
  code = select(abs_bits > kInfBits, kNanCode, code);
  return uint8_t(uint32_t(code) | sign);
}

template <Fp8Format F>
FP8MP_HOST_DEVICE float decode(uint8_t code) {
  using T = FormatTraits<F>;
  const uint32_t sign = uint32_t(code & 0x80u) << 24;
  const uint32_t mag = code & 0x7Fu;
  const uint32_t exponent = mag >> T::kManBits;
  const uint32_t mantissa = mag & ((1u << T::kManBits) - 1u);
  constexpr uint32_t kMaxExponent = (1u << (7 - T::kManBits)) - 1u;

  const bool is_nan = T::kHasInf ? (exponent == kMaxExponent && mantissa != 0) : (mag == uint32_t(kNanCode));
  if (is_nan) return bits_to_float(sign | 0x7FC00000u);
  if (T::kHasInf && exponent == kMaxExponent) return bits_to_float(sign | 0x7F800000u);
  if (exponent == 0) {
    // value = mantissa * 2^(1 - bias - m); exact in fp32.
    const float magnitude = float(mantissa) / float(1u << (T::kBias - 1 + T::kManBits));
    return bits_to_float(sign | float_to_bits(magnitude));
  }
  return bits_to_float(sign | ((exponent + 127u - T::kBias) << 23) | (mantissa << (23 - T::kManBits)));
}

// Dispatch a runtime format to a compile-time one:
//   FP8MP_DISPATCH_FORMAT(fmt, [&] { kernel<kFormat>(...); });
#define FP8MP_DISPATCH_FORMAT(FMT, ...)                     \
  [&] {                                                     \
    if ((FMT) == ::fp8mp::Fp8Format::E4M3) {                \
      constexpr auto kFormat = ::fp8mp::Fp8Format::E4M3;    \
      return __VA_ARGS__();                                 \
    } else {                                                \
      constexpr auto kFormat = ::fp8mp::Fp8Format::E5M2;    \
      return __VA_ARGS__();                                 \
    }                                                       \
  }()

}  // namespace fp8mp
