// How a block-scaled tile's amax becomes its scale, and how an element is scaled and encoded: the one
// definition the CPU kernels (blockwise_cpu_kernels.cpp, the fused norm) and the CUDA kernels
// (blockwise_cuda_kernels.cu) share. The functions are __host__ __device__ and spell every step that
// could differ between the devices (IEEE divisions as __fdiv_rn / __ddiv_rn on the GPU, powers of two
// and logarithms from the exponent bits, NaN results fixed, not left to the hardware), so both devices
// write the same bits by construction. Standard library only, like fp8_format.h.
#pragma once

#include <cstdint>

#include "common/fp8_format.h"
#include "common/nan_keeping_scale.h"

namespace fp8mp {

// How a tile's amax becomes its scale (fp8_max: 448 for E4M3, 57344 for E5M2).
enum class BlockScaleMode : int {
  // scale = float(fp8_max / max(amax, 1e-12)) (the division in double, as torchao's amax_to_scale);
  // y = encode(float(x) * scale); scale_inv = 1 / scale (fp32).
  Fp32 = 0,
  // Same scale rounded down to a power of two (torchao's round_scales_to_power_of_2), so that
  // scale_inv = 1 / scale is exact.
  Pow2 = 1,
  // OCP MX v1.0: shared exponent = floor(log2(amax)) - emax_elem (emax_elem 8 for E4M3, 15 for E5M2),
  // an E8M0 code (biased by 127, clamped to [0, 254], 255 = NaN amax); y = encode(clamp(x / 2^e)).
  E8m0Floor = 2,
  // NVIDIA's rule (cuBLAS's "d-block quantization", PTX cvt.rp.satfinite.ue8m0x2.f32): the smallest
  // power of two 2^e >= amax / fp8_max, as an E8M0 code (NaN amax 255, Inf 254); y = encode(clamp(x / 2^e)).
  E8m0Rceil = 3,
};

FP8MP_HOST_DEVICE bool is_e8m0(BlockScaleMode mode) {
  return mode == BlockScaleMode::E8m0Floor || mode == BlockScaleMode::E8m0Rceil;
}

// What a tile's amax gives: the multiplier applied before the cast, and the stored scale_inv.
struct BlockTileScale {
  float multiplier;
  float scale_inv;    // Fp32 / Pow2
  uint8_t e8m0_code;  // E8m0Floor / E8m0Rceil
};

// 2^e for e in [-149, 127], exactly (subnormals included), from the bits.
FP8MP_HOST_DEVICE float block_exact_pow2(int e) {
  return e >= -126 ? bits_to_float(uint32_t(e + 127) << 23) : bits_to_float(1u << (e + 149));
}

// a / b in fp32, IEEE round to nearest on both devices.
FP8MP_HOST_DEVICE float block_div(float a, float b) {
#if defined(__CUDA_ARCH__)
  return __fdiv_rn(a, b);
#else
  return a / b;
#endif
}

// Fp32 / Pow2: torchao's amax_to_scale, fp8_max / clamp(amax, 1e-12) in double, then float.
FP8MP_HOST_DEVICE BlockTileScale block_fp32_scale(float amax, float fp8_max, bool pow2) {
  if (is_nan_bits(float_to_bits(amax))) {
    const float nan = bits_to_float(kCanonicalNanBits);
    return {nan, nan, 0};
  }
  const double a = double(amax);
  const double clamped = a < 1e-12 ? 1e-12 : a;
#if defined(__CUDA_ARCH__)
  float scale = __double2float_rn(__ddiv_rn(double(fp8_max), clamped));
#else
  float scale = float(double(fp8_max) / clamped);
#endif
  const uint32_t bits = float_to_bits(scale);
  if (pow2 && scale > 0.0f && (bits & 0x7F800000u) != 0x7F800000u) {
    // Round down to a power of two exactly (the exponent field); scale is a normal number here.
    scale = bits_to_float(bits & 0x7F800000u);
  }
  return {scale, block_div(1.0f, scale), 0};  // amax Inf: scale 0, scale_inv Inf
}

// OCP MX v1.0 (torchao's ScaleCalculationMode.FLOOR).
FP8MP_HOST_DEVICE BlockTileScale block_e8m0_floor_scale(float amax, int emax_elem) {
  uint8_t code = 255;
  const uint32_t bits = float_to_bits(amax);
  if (!is_nan_bits(bits)) {
    const int exponent = int((bits >> 23) & 0xFFu) - 127;  // floor(log2(amax)); -127 for 0/subnormals
    int e = exponent - emax_elem;
    e = e < -127 ? -127 : (e > 128 ? 128 : e);
    code = uint8_t(e + 127);
  }
  // The divisor: 2^(code - 127) with the code read as an fp32 exponent field (255 -> Inf), at least
  // the smallest normal float (so a code-0 block divides by 2^-126).
  const float field = bits_to_float(uint32_t(code) << 23);
  const float divisor = field > block_exact_pow2(-126) ? field : block_exact_pow2(-126);
  return {block_div(1.0f, divisor), 0.0f, code};  // 1 / 2^e is exact (0 for Inf), so x * it == x / 2^e
}

// NVIDIA's RCEIL (torchao's ScaleCalculationMode.RCEIL, its PyTorch fallback = the PTX instruction).
FP8MP_HOST_DEVICE BlockTileScale block_e8m0_rceil_scale(float amax, float fp8_max) {
  const float descale = block_div(amax, fp8_max);
  const uint32_t bits = float_to_bits(descale);
  if (is_nan_bits(bits)) return {bits_to_float(kCanonicalNanBits), 0.0f, 255};
  if ((bits & 0x7FFFFFFFu) == 0x7F800000u) return {block_exact_pow2(-127), 0.0f, 254};
  // ceil(log2(descale)) clamped to [-127, 127], from the bits (descale >= 0): a normal 1.f * 2^E gives
  // E, or E + 1 when f != 0; a subnormal one lies in (2^-127, 2^-126) -> -126, or <= 2^-127 -> -127.
  const int field = int((bits >> 23) & 0xFFu);
  int ceil_log2;
  if (field == 0) {
    ceil_log2 = bits > 0x00400000u ? -126 : -127;
  } else {
    ceil_log2 = field - 127 + ((bits & 0x7FFFFFu) != 0 ? 1 : 0);
    ceil_log2 = ceil_log2 > 127 ? 127 : ceil_log2;
  }
  const uint8_t code = uint8_t(ceil_log2 + 127);
  return {code == 0 ? 1.0f : block_exact_pow2(127 - int(code)), 0.0f, code};
}

template <Fp8Format F>
FP8MP_HOST_DEVICE BlockTileScale block_tile_scale(float amax, BlockScaleMode mode) {
  constexpr float fp8_max = FormatTraits<F>::kMax;
  switch (mode) {
    case BlockScaleMode::Fp32: return block_fp32_scale(amax, fp8_max, false);
    case BlockScaleMode::Pow2: return block_fp32_scale(amax, fp8_max, true);
    case BlockScaleMode::E8m0Floor: return block_e8m0_floor_scale(amax, F == Fp8Format::E4M3 ? 8 : 15);
    default: return block_e8m0_rceil_scale(amax, fp8_max);
  }
}

// The FP8 code of x in a tile of `multiplier`: E8M0 modes clamp to +-fp8_max first (NaN stays NaN),
// as torchao's to_mx does before its cast.
template <Fp8Format F>
FP8MP_HOST_DEVICE uint8_t block_encode(float v, float multiplier, bool clamp_first) {
  constexpr float limit = FormatTraits<F>::kMax;
  float scaled = scale_keep_nan(v, multiplier);  // a NaN tile multiplier or +-Inf x 0: the canonical NaN
  if (clamp_first) scaled = scaled > limit ? limit : (scaled < -limit ? -limit : scaled);
  return encode<F>(scaled);
}

}  // namespace fp8mp
