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
#include <algorithm>

#include "common/fp8_decode_table.h"
#include "common/scratch_pool.h"
#include "gemm/bf16_kernel_io_avx512.h"

namespace fp8mp::cpu {
namespace {

constexpr int kRows = 12;                             // rows of a micro-tile: 24 accumulators + 3 registers
constexpr int kCols = 32;                             // columns of a micro-tile: two registers of 16 fp32
constexpr int64_t kChunkPairs = kAvx512ChunkK / 2;   // pairs of k summed in registers before adding to the sums
constexpr int64_t kBlockElements = int64_t(1) << 22;  // values of a packed at once
constexpr int64_t kL2GroupBytes = int64_t(1) << 18;   // a panels processed together (a quarter of a 1 MiB L2)

int64_t pairs_of(int64_t K) { return (K + 1) / 2; }

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
      _mm512_store_si512(chunk, decode(load_codes(src + k0, left)));
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

// One micro-tile: rows x cols (at most kRows x kCols) of out from an a panel and a b panel. The registers sum
// kChunkPairs pairs at a time from zero and the chunks' sums are added in `sums` (add_chunk_sums: the
// summation rule of bf16_kernel_io_avx512.h).
template <typename scalar_t>
FP8MP_TARGET_AVX512_BF16 void micro_tile(const uint32_t* a_panel, const uint32_t* b_panel, int64_t pairs, float scale,
                                         const scalar_t* bias, scalar_t* out, int64_t ldo, int rows, int cols) {
  __m512 acc[kRows][2];
  alignas(64) float sums[kRows][kCols];
  alignas(64) float compensation[kRows][kCols];  // zeroed by the first chunk where used
  const bool compensated = compensates(2 * pairs);
  for (int64_t p0 = 0; p0 < pairs; p0 += kChunkPairs) {
    for (int i = 0; i < kRows; ++i) acc[i][0] = acc[i][1] = _mm512_setzero_ps();
    for (int64_t p = p0; p < std::min(pairs, p0 + kChunkPairs); ++p) {
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
    for (int i = 0; i < kRows; ++i) {
      for (int h = 0; h < 2; ++h) {
        add_chunk_sums(sums[i] + 16 * h, compensated ? compensation[i] + 16 * h : nullptr, acc[i][h], p0 == 0);
      }
    }
  }
  // The epilogue of gemm_cpu_kernels.cpp: v = acc * scale, then + bias, then one rounding to scalar_t.
  const __m512 vscale = _mm512_set1_ps(scale);
  for (int h = 0; h < 2; ++h) {
    const int count = std::min(16, cols - 16 * h);
    if (count <= 0) break;
    const __m512 bias_v = bias != nullptr ? load_bias(bias + 16 * h, count) : _mm512_setzero_ps();
    for (int i = 0; i < rows; ++i) {
      store_epilogue_row(_mm512_load_ps(sums[i] + 16 * h), vscale, bias != nullptr, bias_v, out + i * ldo + 16 * h,
                         count);
    }
  }
}

}  // namespace

template <typename scalar_t>
void fp8_gemm_avx512_bf16(const uint8_t* a, Fp8Format a_format, const uint8_t* b, Fp8Format b_format, int64_t M,
                          int64_t N, int64_t K, float scale, const scalar_t* bias, scalar_t* out,
                          ParallelFor parallel_for) {
  const int64_t pairs = pairs_of(K);
  const int64_t col_panels = (N + kCols - 1) / kCols;
  const ScratchBuffer b_storage(size_t(col_panels * pairs * kCols) * 4);
  uint32_t* const b_packed = b_storage.as<uint32_t>();
  pack_panels(b, N, K, 0, col_panels, kCols, b_format, b_packed, parallel_for);
  const int64_t block_panels = std::max<int64_t>(1, kBlockElements / (int64_t(kRows) * K));
  const int64_t row_panels_total = (M + kRows - 1) / kRows;
  const int64_t block_rows_panels = std::min(block_panels, row_panels_total);
  const ScratchBuffer a_storage(size_t(block_rows_panels * pairs * kRows) * 4);
  uint32_t* const a_packed = a_storage.as<uint32_t>();
  for (int64_t panel0 = 0; panel0 < row_panels_total; panel0 += block_rows_panels) {
    const int64_t row_panels = std::min(block_rows_panels, row_panels_total - panel0);
    pack_panels(a, M, K, panel0 * kRows, row_panels, kRows, a_format, a_packed, parallel_for);
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
        micro_tile(a_packed + rp * pairs * kRows, b_packed + cp * pairs * kCols, pairs, scale,
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
