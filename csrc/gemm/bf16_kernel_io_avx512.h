// What fp8mp's two bf16 GEMM kernels (bf16_gemm_avx512.cpp with vdpbf16ps,
// bf16_gemm_amx.cpp with AMX tiles) read and write in AVX-512 registers: FP8
// codes decoded to bf16 bits while packing, the bias, and the one rounding of the
// epilogue to out_dtype. Include only from a kernel file compiled for x86-64
// (FP8MP_AVX512_KERNELS); every function carries its own target attribute.
#pragma once

#include "common/cpu_features.h"

#if FP8MP_AVX512_KERNELS
// GCC 12's AVX-512 headers start some intrinsics from _mm512_undefined_*(), which its
// -Wuninitialized flags in every caller: a known false positive (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "common/half_types.h"

#define FP8MP_TARGET_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

namespace fp8mp::cpu {

// The bf16 bits of 32 FP8 codes, from the 128-entry magnitude table in four registers (vpermt2w
// looks up 64 entries of two registers; bit 6 of the code picks the pair) and the code's sign bit.
// A code 0 decodes to +0 (0x0000), so zero padding stays zero.
struct Bf16Decoder {
  __m512i t0, t1, t2, t3;

  FP8MP_TARGET_AVX512_BF16 explicit Bf16Decoder(const uint16_t* table)
      : t0(_mm512_loadu_si512(table)),
        t1(_mm512_loadu_si512(table + 32)),
        t2(_mm512_loadu_si512(table + 64)),
        t3(_mm512_loadu_si512(table + 96)) {}

  FP8MP_TARGET_AVX512_BF16 __m512i operator()(__m256i codes) const {
    const __m512i c = _mm512_cvtepu8_epi16(codes);
    const __m512i low = _mm512_permutex2var_epi16(t0, c, t1);   // magnitudes 0..63 (index bits 5:0)
    const __m512i high = _mm512_permutex2var_epi16(t2, c, t3);  // magnitudes 64..127
    const __m512i magnitude = _mm512_mask_mov_epi16(low, _mm512_test_epi16_mask(c, _mm512_set1_epi16(0x40)), high);
    // magnitude | ((c << 8) & 0x8000): the sign, in one ternary-logic op (A | (B & C) is 0xF8).
    return _mm512_ternarylogic_epi32(magnitude, _mm512_slli_epi16(c, 8), _mm512_set1_epi16(int16_t(0x8000)), 0xF8);
  }
};

// The first `count` (0..32) of 32 codes at src, zeros after: a row's codes past K (or past the matrix,
// count 0) read as code 0 without touching memory there.
FP8MP_TARGET_AVX512_BF16 inline __m256i load_codes(const uint8_t* src, int64_t count) {
  const __mmask32 mask = count >= 32 ? ~__mmask32(0) : __mmask32((1u << count) - 1u);
  return _mm256_maskz_loadu_epi8(mask, src);
}

FP8MP_TARGET_AVX512_BF16 inline __m512 load_bias(const float* bias) { return _mm512_loadu_ps(bias); }
FP8MP_TARGET_AVX512_BF16 inline __m512 load_bias(const bf16* bias) {
  const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bias));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}
FP8MP_TARGET_AVX512_BF16 inline __m512 load_bias(const fp16* bias) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(bias)));
}

// bias[0, count) as fp32, zeros after.
template <typename scalar_t>
FP8MP_TARGET_AVX512_BF16 inline __m512 load_bias(const scalar_t* bias, int count) {
  if (count == 16) return load_bias(bias);
  alignas(64) float tail[16] = {};
  for (int j = 0; j < count; ++j) tail[j] = static_cast<float>(bias[j]);
  return _mm512_load_ps(tail);
}

// The bf16 bits of v's lanes in the low halves of 32-bit lanes, as half_types.h's bf16(float) gives them:
// round to nearest even by integer addition; every NaN becomes 0x7FC0.
FP8MP_TARGET_AVX512_BF16 inline __m512i bf16_bits(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), lsb), 16);
  const __m512i abs = _mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF));
  return _mm512_mask_mov_epi32(r, _mm512_cmpgt_epu32_mask(abs, _mm512_set1_epi32(0x7F800000)), _mm512_set1_epi32(0x7FC0));
}

// out[0, count) = scalar_t(v[0, count)), as the scalar conversions of half_types.h do it.
FP8MP_TARGET_AVX512_BF16 inline void store_row(__m512 v, float* out, int count) {
  _mm512_mask_storeu_ps(out, __mmask16((1u << count) - 1u), v);
}
FP8MP_TARGET_AVX512_BF16 inline void store_row(__m512 v, bf16* out, int count) {
  _mm256_mask_storeu_epi16(out, __mmask16((1u << count) - 1u), _mm512_cvtepi32_epi16(bf16_bits(v)));
}
FP8MP_TARGET_AVX512_BF16 inline void store_row(__m512 v, fp16* out, int count) {
  alignas(64) float values[16];
  _mm512_store_ps(values, v);
  for (int j = 0; j < count; ++j) out[j] = fp16(values[j]);
}

// out[0, count) = scalar_t of (v0, v1)'s 32 lanes, count <= 32: one 64-byte store of bf16 where it can.
template <typename scalar_t>
FP8MP_TARGET_AVX512_BF16 inline void store_row32(__m512 v0, __m512 v1, scalar_t* out, int count) {
  store_row(v0, out, std::min(count, 16));
  if (count > 16) store_row(v1, out + 16, count - 16);
}
// The bf16 bits of v0's 16 lanes, then of v1's, in one register.
FP8MP_TARGET_AVX512_BF16 inline __m512i bf16_bits32(__m512 v0, __m512 v1) {
  // The low 16 bits of each 32-bit lane of v0's bits, then of v1's.
  const __m512i low_halves = _mm512_set_epi16(62, 60, 58, 56, 54, 52, 50, 48, 46, 44, 42, 40, 38, 36, 34, 32,
                                              30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  return _mm512_permutex2var_epi16(bf16_bits(v0), low_halves, bf16_bits(v1));
}
FP8MP_TARGET_AVX512_BF16 inline void store_row32(__m512 v0, __m512 v1, bf16* out, int count) {
  _mm512_mask_storeu_epi16(out, count >= 32 ? ~__mmask32(0) : __mmask32((1u << count) - 1u), bf16_bits32(v0, v1));
}

// store_row32 of 32 values to a 64-byte aligned out with non-temporal stores (straight to memory, no read of
// the lines first), where scalar_t has them (fp16's conversion is scalar: stored as store_row32 does).
template <typename scalar_t>
FP8MP_TARGET_AVX512_BF16 inline void stream_row32(__m512 v0, __m512 v1, scalar_t* out) {
  store_row32(v0, v1, out, 32);
}
FP8MP_TARGET_AVX512_BF16 inline void stream_row32(__m512 v0, __m512 v1, float* out) {
  _mm512_stream_ps(out, v0);
  _mm512_stream_ps(out + 16, v1);
}
FP8MP_TARGET_AVX512_BF16 inline void stream_row32(__m512 v0, __m512 v1, bf16* out) {
  _mm512_stream_si512(reinterpret_cast<__m512i*>(out), bf16_bits32(v0, v1));
}

// How both kernels sum: the matrix units sum a chunk of k from zero (kAmxChunkK values in the AMX kernel,
// kAvx512ChunkK in the AVX512-BF16 one), and the chunks' sums are added in fp32 memory: two levels (error
// growing with chunk + K / chunk rather than K), as an fp32 GEMM blocks K. Beyond kPlainMaxK the chunks'
// sums are added with Kahan's compensation: plain, their error grew past the fp32 path's (MKL's sgemm,
// which these paths are to be no less accurate than: 1.5x its mean error at K = 16384 with chunks of 256;
// within 5 % up to 4096); the compensation costs about 8 % of the AMX kernel's time. Chunks of 512 rather
// than 256 (emulated against float64, 64 x K x 64 random E4M3: mean error 1.07x, 1.02x, 1.06x MKL's at
// K = 1024, 2048, 4096; one chain of K = 1024 would be 1.37x) halve the AMX kernel's chunk ends, where its
// tiles wait on their stores. tests/ops/test_gemm_cpu_paths.py holds each element to the rigorous error bound
// of this order.
constexpr int64_t kAmxChunkK = 512;
constexpr int64_t kAvx512ChunkK = 256;
constexpr int64_t kPlainMaxK = 4096;

inline bool compensates(int64_t K) { return K > kPlainMaxK; }

// 16 lanes of a block's sums: sum = chunk (the first chunk) or sum + chunk, with Kahan's compensation where
// `compensation` is not nullptr (its lanes then start at zero with the first chunk).
FP8MP_TARGET_AVX512_BF16 inline void add_chunk_sums(float* sum, float* compensation, __m512 chunk, bool first) {
  if (first) {
    _mm512_store_ps(sum, chunk);
    if (compensation != nullptr) _mm512_store_ps(compensation, _mm512_setzero_ps());
    return;
  }
  const __m512 old = _mm512_load_ps(sum);
  if (compensation == nullptr) {
    _mm512_store_ps(sum, _mm512_add_ps(old, chunk));
    return;
  }
  // Kahan: the rounding error of each addition is carried into the next one.
  const __m512 y = _mm512_sub_ps(chunk, _mm512_load_ps(compensation));
  const __m512 t = _mm512_add_ps(old, y);
  _mm512_store_ps(compensation, _mm512_sub_ps(_mm512_sub_ps(t, old), y));
  _mm512_store_ps(sum, t);
}

// The epilogue of gemm_cpu_kernels.cpp for one row of up to 16 sums: out = scalar_t(acc * scale + bias),
// with bias_v zero and has_bias false where there is none.
template <typename scalar_t>
FP8MP_TARGET_AVX512_BF16 inline void store_epilogue_row(__m512 acc, __m512 vscale, bool has_bias, __m512 bias_v,
                                                        scalar_t* out, int count) {
  __m512 v = _mm512_mul_ps(acc, vscale);
  if (has_bias) v = _mm512_add_ps(v, bias_v);
  store_row(v, out, count);
}

}  // namespace fp8mp::cpu
#endif
