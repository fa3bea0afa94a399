// The AVX-512 encode: fp8_format.h's branch-free encode<F>, 16 lanes at a time,
// with the same integer rounding (so the same bits), rearranged to spend fewer
// instructions:
//   * normal range: the exponent re-bias is folded into the rounding constant
//     ((abs - ((127 - bias) << 23) + half - 1 + lsb) >> shift); for abs at or
//     above the smallest normal nothing wraps, so this is encode's normal_code;
//   * subnormal range: abs + 2^(24 - bias - m) in fp32 rounds abs to a multiple of
//     the subnormal step (that sum's ulp), ties to even, like encode's
//     (abs * 2^(bias-1+m) + 2^23) - 2^23, which is the same rounding scaled by a
//     power of two; the code is the difference of the bits;
//   * the saturation (min with the largest code) is applied to the normal code
//     only: subnormal codes are at most 2^m, below it.
#include "cast/encode_avx512.h"

#if FP8MP_AVX512_KERNELS
// GCC 12's AVX-512 headers start some intrinsics from _mm512_undefined_*(), which its
// -Wuninitialized flags in every caller: a known false positive (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

namespace fp8mp::cpu {
namespace {

FP8MP_TARGET_AVX512 inline __m512 load16(const float* x) { return _mm512_loadu_ps(x); }
FP8MP_TARGET_AVX512 inline __m512 load16(const bf16* x) {
  const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));  // bf16 is fp32's upper half
}
FP8MP_TARGET_AVX512 inline __m512 load16(const fp16* x) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x)));  // exact, NaN payload kept
}

// The first n (< 16) lanes, zeros after.
FP8MP_TARGET_AVX512 inline __m512 load_partial(const float* x, __mmask16 m) { return _mm512_maskz_loadu_ps(m, x); }
FP8MP_TARGET_AVX512 inline __m512 load_partial(const bf16* x, __mmask16 m) {
  const __m256i bits = _mm256_maskz_loadu_epi16(m, x);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}
FP8MP_TARGET_AVX512 inline __m512 load_partial(const fp16* x, __mmask16 m) {
  return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, x));
}

// The FP8 codes of 16 fp32 values, one per 32-bit lane.
template <Fp8Format F>
FP8MP_TARGET_AVX512 inline __m512i encode16(__m512 v) {
  using T = FormatTraits<F>;
  constexpr int kShift = 23 - T::kManBits;
  constexpr uint32_t kInfBits = 0x7F800000u;
  constexpr uint32_t kMinNormalBits = uint32_t(127 + 1 - T::kBias) << 23;
  constexpr uint32_t kRebias = uint32_t(127 - T::kBias) << 23;
  constexpr uint32_t kRoundDown = (1u << (kShift - 1)) - 1u;  // half an FP8 ulp, less one: ties go to even below
  const float kSubnormalMagic = bits_to_float(uint32_t(127 + 24 - T::kBias - T::kManBits) << 23);

  const __m512i bits = _mm512_castps_si512(v);
  const __m512i abs = _mm512_and_si512(bits, _mm512_set1_epi32(0x7FFFFFFF));
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(abs, kShift), _mm512_set1_epi32(1));
  const __m512i rounded = _mm512_add_epi32(_mm512_add_epi32(abs, _mm512_set1_epi32(int32_t(kRoundDown - kRebias))), lsb);
  __m512i code = _mm512_min_epu32(_mm512_srli_epi32(rounded, kShift), _mm512_set1_epi32(T::kMaxCode));

  const __m512 magic = _mm512_set1_ps(kSubnormalMagic);
  const __m512i subnormal = _mm512_sub_epi32(_mm512_castps_si512(_mm512_add_ps(_mm512_castsi512_ps(abs), magic)),
                                             _mm512_castps_si512(magic));
  code = _mm512_mask_mov_epi32(code, _mm512_cmplt_epu32_mask(abs, _mm512_set1_epi32(int32_t(kMinNormalBits))),
                               subnormal);
  if constexpr (T::kHasInf) {
    code = _mm512_mask_mov_epi32(code, _mm512_cmpeq_epi32_mask(abs, _mm512_set1_epi32(int32_t(kInfBits))),
                                 _mm512_set1_epi32(T::kInfCode));
  }
  code = _mm512_mask_mov_epi32(code, _mm512_cmpgt_epu32_mask(abs, _mm512_set1_epi32(int32_t(kInfBits))),
                               _mm512_set1_epi32(kNanCode));
  // code | ((bits >> 24) & 0x80): the sign, in one ternary-logic op (A | (B & C) is 0xF8).
  return _mm512_ternarylogic_epi32(code, _mm512_srli_epi32(bits, 24), _mm512_set1_epi32(0x80), 0xF8);
}

}  // namespace

template <Fp8Format F, typename scalar_t>
FP8MP_TARGET_AVX512 uint32_t encode_span_avx512(const scalar_t* x, uint8_t* y, int64_t n, float scale) {
  const __m512 vscale = _mm512_set1_ps(scale);
  const __m512i abs_mask = _mm512_set1_epi32(0x7FFFFFFF);
  __m512i amax = _mm512_setzero_si512();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 v = load16(x + i);
    amax = _mm512_max_epu32(amax, _mm512_and_si512(_mm512_castps_si512(v), abs_mask));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + i), _mm512_cvtepi32_epi8(encode16<F>(_mm512_mul_ps(v, vscale))));
  }
  if (i < n) {
    const __mmask16 m = __mmask16((1u << (n - i)) - 1u);
    const __m512 v = load_partial(x + i, m);  // zeros in the unused lanes: |0| adds nothing to the max
    amax = _mm512_max_epu32(amax, _mm512_and_si512(_mm512_castps_si512(v), abs_mask));
    _mm512_mask_cvtepi32_storeu_epi8(y + i, m, encode16<F>(_mm512_mul_ps(v, vscale)));
  }
  return _mm512_reduce_max_epu32(amax);
}

// Four 16x16 byte transposes side by side, one per 128-bit lane, in the four rounds of
// unpacks of cast_cpu_kernels.cpp's SSE2 transpose16x16; lane j of register i then holds
// column 16j + i of the 16 rows.
FP8MP_TARGET_AVX512 void transpose16x64_avx512(const uint8_t* src, int64_t src_stride, uint8_t* dst,
                                               int64_t dst_stride) {
  __m512i r[16], o[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_si512(src + i * src_stride);
  for (int round = 0; round < 4; ++round) {
    for (int i = 0; i < 8; ++i) {
      o[2 * i] = _mm512_unpacklo_epi8(r[i], r[i + 8]);
      o[2 * i + 1] = _mm512_unpackhi_epi8(r[i], r[i + 8]);
    }
    for (int i = 0; i < 16; ++i) r[i] = o[i];
  }
  for (int i = 0; i < 16; ++i) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i * dst_stride), _mm512_castsi512_si128(r[i]));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + (16 + i) * dst_stride), _mm512_extracti32x4_epi32(r[i], 1));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + (32 + i) * dst_stride), _mm512_extracti32x4_epi32(r[i], 2));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + (48 + i) * dst_stride), _mm512_extracti32x4_epi32(r[i], 3));
  }
}

#define FP8MP_INSTANTIATE_ENCODE(F, T) template uint32_t encode_span_avx512<F, T>(const T*, uint8_t*, int64_t, float);
FP8MP_INSTANTIATE_ENCODE(Fp8Format::E4M3, float)
FP8MP_INSTANTIATE_ENCODE(Fp8Format::E4M3, bf16)
FP8MP_INSTANTIATE_ENCODE(Fp8Format::E4M3, fp16)
FP8MP_INSTANTIATE_ENCODE(Fp8Format::E5M2, float)
FP8MP_INSTANTIATE_ENCODE(Fp8Format::E5M2, bf16)
FP8MP_INSTANTIATE_ENCODE(Fp8Format::E5M2, fp16)
#undef FP8MP_INSTANTIATE_ENCODE

}  // namespace fp8mp::cpu
#endif
