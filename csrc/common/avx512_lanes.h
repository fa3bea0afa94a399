// The 4 x 4 transpose of 128-bit lanes that fp8mp's AVX-512 transposes end with, after their unpacks
// within the lanes: the cast's 64x64 byte blocks (cast/encode_avx512.cpp) and the AMX GEMM's 16x16 blocks
// of words of b (gemm/bf16_gemm_amx.cpp). Include only from a file compiled for x86-64
// (FP8MP_AVX512_KERNELS); the function carries its own target attribute.
#pragma once

#include "common/cpu_features.h"

#if FP8MP_AVX512_KERNELS
#include <immintrin.h>

namespace fp8mp::cpu {

// o[j] = (lane j of a, lane j of b, lane j of c, lane j of d).
FP8MP_TARGET_AVX512 inline void transpose_lanes4x4(__m512i a, __m512i b, __m512i c, __m512i d, __m512i o[4]) {
  const __m512i ab_low = _mm512_shuffle_i64x2(a, b, 0x44), ab_high = _mm512_shuffle_i64x2(a, b, 0xEE);
  const __m512i cd_low = _mm512_shuffle_i64x2(c, d, 0x44), cd_high = _mm512_shuffle_i64x2(c, d, 0xEE);
  o[0] = _mm512_shuffle_i64x2(ab_low, cd_low, 0x88);
  o[1] = _mm512_shuffle_i64x2(ab_low, cd_low, 0xDD);
  o[2] = _mm512_shuffle_i64x2(ab_high, cd_high, 0x88);
  o[3] = _mm512_shuffle_i64x2(ab_high, cd_high, 0xDD);
}

}  // namespace fp8mp::cpu
#endif
