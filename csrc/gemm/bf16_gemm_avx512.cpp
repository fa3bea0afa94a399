// The AVX512-BF16 kernel of bf16_gemm_avx512.h.
//
// Layout: a panel of kRows rows of a (kCols columns of b) holds, for each pair of
// k, one 32-bit word per row (column): the bf16 of k in the low half, of k + 1 in
// the high half, zero past K or past the matrix's edge. The micro-kernel
// broadcasts a row's word and multiplies it by two registers of 16 column words:
// vdpbf16ps then adds both products of the pair to each column's fp32 sum.
//
// a is packed by blocks of rows (about kBlockElements values), so memory stays
// bounded for any M; b, the weight, is packed once per call.
#include "gemm/bf16_gemm_avx512.h"

#if FP8MP_AVX512_KERNELS
// GCC 12's AVX-512 headers start some intrinsics from _mm512_undefined_*(), which its
// -Wuninitialized flags in every caller: a known false positive (GCC bug 105593).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <algorithm>
#include <memory>

#include "common/fp8_decode_table.h"

#define FP8MP_TARGET_AVX512_BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")))

namespace fp8mp::cpu {
namespace {

constexpr int kRows = 12;                             // rows of a micro-tile: 24 accumulators + 3 registers
constexpr int kCols = 32;                             // columns of a micro-tile: two registers of 16 fp32
constexpr int64_t kBlockElements = int64_t(1) << 22;  // values of a packed at once
constexpr int64_t kL2GroupBytes = int64_t(1) << 18;   // a panels processed together (a quarter of a 1 MiB L2)

int64_t pairs_of(int64_t K) { return (K + 1) / 2; }

// The bf16 bits of 32 FP8 codes, from the 128-entry magnitude table in four registers (vpermt2w
// looks up 64 entries of two registers; bit 6 of the code picks the pair) and the code's sign bit.
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

// Pack rows [row0, row0 + width) of codes [rows, K] into one panel: panel[p * width + i] = pair p of row row0 + i.
// Each row is decoded 32 codes (16 pairs) at a time in registers, then its pairs are stored width words apart.
FP8MP_TARGET_AVX512_BF16 void pack_panel(const uint8_t* codes, int64_t rows, int64_t K, int64_t row0, int width,
                                         const Bf16Decoder& decode, uint32_t* panel) {
  const int64_t pairs = pairs_of(K);
  alignas(64) uint32_t chunk[16];
  for (int i = 0; i < width; ++i) {
    const int64_t row = row0 + i;
    const uint8_t* src = codes + row * K;
    for (int64_t k0 = 0; k0 < K; k0 += 32) {
      const int64_t left = row < rows ? std::min<int64_t>(32, K - k0) : 0;  // codes past K (or the matrix) read as 0
      const __m256i c = _mm256_maskz_loadu_epi8(left >= 32 ? ~__mmask32(0) : __mmask32((1u << left) - 1u), src + k0);
      // A code 0 decodes to +0 (0x0000): the padding stays zero.
      _mm512_store_si512(chunk, decode(c));
      const int64_t p0 = k0 / 2, count = std::min<int64_t>(16, pairs - p0);
      for (int64_t q = 0; q < count; ++q) panel[(p0 + q) * width + i] = chunk[q];
    }
  }
}

// All panels of rows [row0, row0 + count * width) of codes, in parallel.
FP8MP_TARGET_AVX512_BF16 void pack_panels(const uint8_t* codes, int64_t rows, int64_t K, int64_t row0, int64_t count,
                                          int width, Fp8Format format, uint32_t* panels, ParallelFor parallel_for) {
  const Bf16Decoder decode(bf16_decode_table_for(format));
  const int64_t panel_words = pairs_of(K) * width;
  const int64_t grain = std::max<int64_t>(1, (int64_t(1) << 15) / std::max<int64_t>(1, panel_words));
  parallel_for(0, count, grain, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) pack_panel(codes, rows, K, row0 + t * width, width, decode, panels + t * panel_words);
  });
}

FP8MP_TARGET_AVX512_BF16 inline __m512 load_bias(const float* bias) { return _mm512_loadu_ps(bias); }
FP8MP_TARGET_AVX512_BF16 inline __m512 load_bias(const bf16* bias) {
  const __m256i bits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(bias));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(bits), 16));
}
FP8MP_TARGET_AVX512_BF16 inline __m512 load_bias(const fp16* bias) {
  return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(bias)));
}

// out[0, count) = scalar_t(v[0, count)), as the scalar conversions of half_types.h do it.
FP8MP_TARGET_AVX512_BF16 inline void store_row(__m512 v, float* out, int count) {
  _mm512_mask_storeu_ps(out, __mmask16((1u << count) - 1u), v);
}
FP8MP_TARGET_AVX512_BF16 inline void store_row(__m512 v, bf16* out, int count) {
  // bf16(float): round to nearest even by integer addition; every NaN becomes 0x7FC0.
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7FFF)), lsb), 16);
  const __m512i abs = _mm512_and_si512(u, _mm512_set1_epi32(0x7FFFFFFF));
  r = _mm512_mask_mov_epi32(r, _mm512_cmpgt_epu32_mask(abs, _mm512_set1_epi32(0x7F800000)), _mm512_set1_epi32(0x7FC0));
  _mm256_mask_storeu_epi16(out, __mmask16((1u << count) - 1u), _mm512_cvtepi32_epi16(r));
}
FP8MP_TARGET_AVX512_BF16 inline void store_row(__m512 v, fp16* out, int count) {
  alignas(64) float values[16];
  _mm512_store_ps(values, v);
  for (int j = 0; j < count; ++j) out[j] = fp16(values[j]);
}

// One micro-tile: rows x cols (at most kRows x kCols) of out from an a panel and a b panel.
template <typename scalar_t>
FP8MP_TARGET_AVX512_BF16 void micro_tile(const uint32_t* a_panel, const uint32_t* b_panel, int64_t pairs, float scale,
                                         const scalar_t* bias, scalar_t* out, int64_t ldo, int rows, int cols) {
  __m512 acc[kRows][2];
  for (int i = 0; i < kRows; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
  for (int64_t p = 0; p < pairs; ++p) {
    const __m512bh b0 = (__m512bh)_mm512_loadu_si512(b_panel + p * kCols);
    const __m512bh b1 = (__m512bh)_mm512_loadu_si512(b_panel + p * kCols + 16);
    const uint32_t* a_pair = a_panel + p * kRows;
#pragma GCC unroll 12
    for (int i = 0; i < kRows; ++i) {
      const __m512bh a = (__m512bh)_mm512_set1_epi32(int32_t(a_pair[i]));
      acc[i][0] = _mm512_dpbf16_ps(acc[i][0], a, b0);
      acc[i][1] = _mm512_dpbf16_ps(acc[i][1], a, b1);
    }
  }
  // The epilogue of gemm_cpu_kernels.cpp: v = acc * scale, then + bias, then one rounding to scalar_t.
  const __m512 vscale = _mm512_set1_ps(scale);
  for (int h = 0; h < 2; ++h) {
    const int count = std::min(16, cols - 16 * h);
    if (count <= 0) break;
    __m512 bias_v = _mm512_setzero_ps();
    if (bias != nullptr) {
      if (count == 16) {
        bias_v = load_bias(bias + 16 * h);
      } else {
        alignas(64) float tail[16] = {};
        for (int j = 0; j < count; ++j) tail[j] = static_cast<float>(bias[16 * h + j]);
        bias_v = _mm512_load_ps(tail);
      }
    }
    for (int i = 0; i < rows; ++i) {
      __m512 v = _mm512_mul_ps(acc[i][h], vscale);
      if (bias != nullptr) v = _mm512_add_ps(v, bias_v);
      store_row(v, out + i * ldo + 16 * h, count);
    }
  }
}

template <typename T>
std::unique_ptr<T[]> uninitialized(int64_t n) {
  return std::unique_ptr<T[]>(new T[size_t(n)]);
}

}  // namespace

template <typename scalar_t>
void fp8_gemm_avx512_bf16(const uint8_t* a, Fp8Format a_format, const uint8_t* b, Fp8Format b_format, int64_t M,
                          int64_t N, int64_t K, float scale, const scalar_t* bias, scalar_t* out,
                          ParallelFor parallel_for) {
  const int64_t pairs = pairs_of(K);
  const int64_t col_panels = (N + kCols - 1) / kCols;
  const auto b_packed = uninitialized<uint32_t>(col_panels * pairs * kCols);
  pack_panels(b, N, K, 0, col_panels, kCols, b_format, b_packed.get(), parallel_for);
  const int64_t block_panels = std::max<int64_t>(1, kBlockElements / (int64_t(kRows) * K));
  const int64_t row_panels_total = (M + kRows - 1) / kRows;
  const int64_t block_rows_panels = std::min(block_panels, row_panels_total);
  const auto a_packed = uninitialized<uint32_t>(block_rows_panels * pairs * kRows);
  for (int64_t panel0 = 0; panel0 < row_panels_total; panel0 += block_rows_panels) {
    const int64_t row_panels = std::min(block_rows_panels, row_panels_total - panel0);
    pack_panels(a, M, K, panel0 * kRows, row_panels, kRows, a_format, a_packed.get(), parallel_for);
    // Tiles by groups of row panels that fit in L2 together, each group against every b panel: a group's
    // a panels are read from L2 for every b panel, and each b panel from L3 once per group.
    const int64_t group = std::min(row_panels, std::max<int64_t>(1, kL2GroupBytes / (pairs * kRows * 4)));
    parallel_for(0, row_panels * col_panels, 1, [&](int64_t begin, int64_t end) {
      for (int64_t t = begin; t < end; ++t) {
        const int64_t group0 = t / (group * col_panels) * group;
        const int64_t in_group = std::min(group, row_panels - group0);
        const int64_t u = t - group0 * col_panels;
        const int64_t cp = u / in_group, rp = group0 + u % in_group;
        const int64_t row = (panel0 + rp) * kRows, col = cp * kCols;
        micro_tile(a_packed.get() + rp * pairs * kRows, b_packed.get() + cp * pairs * kCols, pairs, scale,
                   bias != nullptr ? bias + col : nullptr, out + row * N + col, N,
                   int(std::min<int64_t>(kRows, M - row)), int(std::min<int64_t>(kCols, N - col)));
      }
    });
  }
}

template void fp8_gemm_avx512_bf16<float>(const uint8_t*, Fp8Format, const uint8_t*, Fp8Format, int64_t, int64_t,
                                          int64_t, float, const float*, float*, ParallelFor);
template void fp8_gemm_avx512_bf16<bf16>(const uint8_t*, Fp8Format, const uint8_t*, Fp8Format, int64_t, int64_t,
                                         int64_t, float, const bf16*, bf16*, ParallelFor);
template void fp8_gemm_avx512_bf16<fp16>(const uint8_t*, Fp8Format, const uint8_t*, Fp8Format, int64_t, int64_t,
                                         int64_t, float, const fp16*, fp16*, ParallelFor);

}  // namespace fp8mp::cpu
#endif
