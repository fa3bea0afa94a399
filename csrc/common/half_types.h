// 16-bit floating-point storage types for the torch-free kernels: bf16 and fp16
// have the layout of torch's bfloat16 / float16 elements (2 bytes, the IEEE / bfloat16
// bits), and convert to and from float like torch does, so that kernels written
// against them give torch's bits:
//   * on the host, in software: round to nearest even; NaN becomes 0x7FC0 (bf16)
//     and sign|0x7E00 (fp16), as c10's software conversions produce;
//   * in CUDA device code, with the CUDA intrinsics c10 uses there, except for NaN:
//     the cvt instructions return a canonical NaN (0x7FFF, sign and payload
//     lost), so NaNs take the host's bits on the device too, and CPU and CUDA
//     kernels write the same bits for every input.
// HpType names the high-precision dtype of a buffer at run time, and
// FP8MP_DISPATCH_HP turns it into a compile-time scalar_t. Standard library
// (and, under nvcc, cuda_bf16.h / cuda_fp16.h) only.
#pragma once

#include <cstdint>

#include "common/fp8_format.h"

#if defined(__CUDACC__)
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#endif

namespace fp8mp {

enum class HpType : int { Float32 = 0, BFloat16 = 1, Float16 = 2 };

struct alignas(2) bf16 {
  uint16_t bits;

  bf16() = default;
  FP8MP_HOST_DEVICE explicit bf16(float value) : bits(from_float(value)) {}
  FP8MP_HOST_DEVICE explicit operator float() const {
#if defined(__CUDA_ARCH__)
    return __bfloat162float(__ushort_as_bfloat16(bits));
#else
    return bits_to_float(uint32_t(bits) << 16);
#endif
  }

 private:
  FP8MP_HOST_DEVICE static uint16_t from_float(float value) {
#if defined(__CUDA_ARCH__)
    const uint16_t converted = __bfloat16_as_ushort(__float2bfloat16(value));
    return value != value ? uint16_t(0x7FC0u) : converted;
#else
    const uint32_t u = float_to_bits(value);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0u;
    return uint16_t((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);  // ties to even
#endif
  }
};

struct alignas(2) fp16 {
  uint16_t bits;

  fp16() = default;
  FP8MP_HOST_DEVICE explicit fp16(float value) : bits(from_float(value)) {}
  FP8MP_HOST_DEVICE explicit operator float() const {
#if defined(__CUDA_ARCH__)
    const float converted = __half2float(__ushort_as_half(bits));
    const bool is_nan = (bits & 0x7C00u) == 0x7C00u && (bits & 0x3FFu) != 0;
    return is_nan ? bits_to_float((uint32_t(bits & 0x8000u) << 16) | 0x7FC00000u | (uint32_t(bits & 0x3FFu) << 13))
                  : converted;
#else
    const uint32_t sign = uint32_t(bits & 0x8000u) << 16;
    const uint32_t exponent = (bits >> 10) & 0x1Fu;
    const uint32_t mantissa = bits & 0x3FFu;
    if (exponent == 0x1Fu) {  // Inf; a NaN keeps its payload and comes out quiet, as from a float conversion
      return bits_to_float(sign | 0x7F800000u | (mantissa != 0 ? 0x400000u : 0u) | (mantissa << 13));
    }
    if (exponent == 0) return bits_to_float(sign | float_to_bits(float(mantissa) * 0x1p-24f));  // exact
    return bits_to_float(sign | ((exponent + 112u) << 23) | (mantissa << 13));
#endif
  }

 private:
  // Branch-free, like fp8_format.h's encode: the normal range rounds the fp32
  // mantissa to 10 bits by integer addition (a carry bumps the exponent, and
  // past 65504 reaches the Inf code); the subnormal range scales |x| so that
  // the subnormal step is 1 and rounds it to an integer with the 2^23 trick.
  FP8MP_HOST_DEVICE static uint16_t from_float(float value) {
#if defined(__CUDA_ARCH__)
    const uint16_t converted = __half_as_ushort(__float2half(value));
    return value != value ? uint16_t(((float_to_bits(value) >> 16) & 0x8000u) | 0x7E00u) : converted;
#else
    constexpr uint32_t kInfBits = 0x7F800000u;
    constexpr uint32_t kMinNormalBits = uint32_t(127 - 14) << 23;  // 2^-14
    const uint32_t u = float_to_bits(value);
    const uint32_t sign = (u >> 16) & 0x8000u;
    const uint32_t abs_bits = u & 0x7FFFFFFFu;
    const uint32_t rounded = abs_bits + 0xFFFu + ((abs_bits >> 13) & 1u);
    int32_t code = int32_t(rounded >> 13) - int32_t(uint32_t(127 - 15) << 10);
    const float q = bits_to_float(abs_bits) * 16777216.0f;  // 2^24
    const int32_t subnormal = int32_t((q + 8388608.0f) - 8388608.0f);
    code = select(abs_bits < kMinNormalBits, subnormal, code);
    code = code < 0x7C00 ? code : 0x7C00;  // overflow (and Inf) to Inf
    code = select(abs_bits > kInfBits, 0x7E00, code);
    return uint16_t(uint32_t(code) | sign);
#endif
  }
};

static_assert(sizeof(bf16) == 2 && sizeof(fp16) == 2, "16-bit storage types");

// Dispatch a runtime HpType to a compile-time scalar_t (float, bf16 or fp16):
//   FP8MP_DISPATCH_HP(type, [&] { kernel<scalar_t>(...); });
#define FP8MP_DISPATCH_HP(TYPE, ...)                   \
  [&] {                                                \
    switch (TYPE) {                                    \
      case ::fp8mp::HpType::BFloat16: {                \
        using scalar_t = ::fp8mp::bf16;                \
        return __VA_ARGS__();                          \
      }                                                \
      case ::fp8mp::HpType::Float16: {                 \
        using scalar_t = ::fp8mp::fp16;                \
        return __VA_ARGS__();                          \
      }                                                \
      default: {                                       \
        using scalar_t = float;                        \
        return __VA_ARGS__();                          \
      }                                                \
    }                                                  \
  }()

}  // namespace fp8mp
