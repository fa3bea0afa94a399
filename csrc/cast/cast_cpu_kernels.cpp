// CPU implementations of the cast kernels: parallel over chunks, with
// branch-free inner loops (fp8_format.h) that the compiler vectorizes, and
// hand-written AVX-512 ones (encode_avx512.h, the same bits) where the CPU has it.
#include "cast/cast_cpu_kernels.h"

#include <algorithm>
#include <atomic>
#include <memory>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "cast/encode_avx512.h"
#include "common/cpu_isa.h"
#include "common/fp8_decode_table.h"
#include "common/nan_keeping_scale.h"

namespace fp8mp::cpu {
namespace {

constexpr int64_t kGrain = 1 << 15;  // elements per parallel task: big enough to amortize scheduling
// Transpose tiles: 64 rows (a full 64-byte line of the transpose per column, and the height of the
// AVX-512 cast-transpose block) by 512 columns (2 KiB runs of fp32 input, long enough that rows
// 16 KiB apart do not thrash the L1 sets).
constexpr int64_t kTileRows = 64;
constexpr int64_t kTileCols = 512;

template <Fp8Format F, typename scalar_t>
uint32_t cast_span_scalar(const scalar_t* __restrict x, uint8_t* __restrict y, int64_t n,
                          float scale) {
  uint32_t amax_bits = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float v = static_cast<float>(x[i]);
    const uint32_t abs_bits = float_to_bits(v) & 0x7FFFFFFFu;
    amax_bits = abs_bits > amax_bits ? abs_bits : amax_bits;
    y[i] = encode<F>(scale_keep_nan(v, scale));
  }
  return amax_bits;
}

// y[i] = encode<F>(float(x[i]) * scale) for n values; returns the amax's bits.
template <Fp8Format F, typename scalar_t>
uint32_t cast_span(const scalar_t* __restrict x, uint8_t* __restrict y, int64_t n, float scale) {
#if FP8MP_AVX512_KERNELS
  if (cpu_isa() == CpuIsa::Avx512) return encode_span_avx512<F>(x, y, n, scale);
#endif
  return with_cpu_isa([&] { return cast_span_scalar<F>(x, y, n, scale); });
}

#if defined(__SSE2__)
// dst[j][i] = src[i][j] for a 16x16 byte block in 64 SSE2 byte unpacks: four rounds of
// out[2i], out[2i+1] = unpack{lo,hi}(in[i], in[i+8]), each a perfect shuffle of the row
// index bits into the byte index, so four rounds swap rows and columns.
inline void transpose16x16(const uint8_t* src, int64_t src_stride, uint8_t* dst, int64_t dst_stride) {
  __m128i r[16], o[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i * src_stride));
  for (int round = 0; round < 4; ++round) {
    for (int i = 0; i < 8; ++i) {
      o[2 * i] = _mm_unpacklo_epi8(r[i], r[i + 8]);
      o[2 * i + 1] = _mm_unpackhi_epi8(r[i], r[i + 8]);
    }
    for (int i = 0; i < 16; ++i) r[i] = o[i];
  }
  for (int i = 0; i < 16; ++i) _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i * dst_stride), r[i]);
}
#else
// Portable fallback: the same block, element by element.
inline void transpose16x16(const uint8_t* src, int64_t src_stride, uint8_t* dst, int64_t dst_stride) {
  for (int i = 0; i < 16; ++i) {
    for (int j = 0; j < 16; ++j) dst[j * dst_stride + i] = src[i * src_stride + j];
  }
}
#endif
constexpr int64_t kBlock = 16;  // the transpose block edge

// Cast one tile [r0, r1) x [c0, c1) of the row-major (rows x cols) input to y and to its transpose yt.
template <Fp8Format F, typename scalar_t>
uint32_t cast_tile_transpose(const scalar_t* __restrict x, uint8_t* __restrict y, uint8_t* __restrict yt, int64_t rows,
                             int64_t cols, int64_t r0, int64_t r1, int64_t c0, int64_t c1, float scale) {
  uint32_t amax_bits = 0;
  const int64_t width = c1 - c0;
  for (int64_t r = r0; r < r1; ++r) {
    const uint32_t row_amax = cast_span<F>(x + r * cols + c0, y + r * cols + c0, width, scale);
    amax_bits = row_amax > amax_bits ? row_amax : amax_bits;
  }
  // The tile of y just written is in cache: transpose it into yt in 16x16 byte blocks through
  // registers, then the ragged edges byte by byte.
  const uint8_t* tile = y + r0 * cols + c0;
  const int64_t height = r1 - r0, full_rows = height / kBlock * kBlock, full_cols = width / kBlock * kBlock;
  for (int64_t bc = 0; bc < full_cols; bc += kBlock) {
    for (int64_t br = 0; br < full_rows; br += kBlock) {
      transpose16x16(tile + br * cols + bc, cols, yt + (c0 + bc) * rows + r0 + br, rows);
    }
  }
  for (int64_t c = 0; c < width; ++c) {
    uint8_t* out = yt + (c0 + c) * rows + r0;
    for (int64_t r = (c < full_cols ? full_rows : 0); r < height; ++r) out[r] = tile[r * cols + c];
  }
  return amax_bits;
}

// sums[c - c0] = sum over rows [r0, r1) of float(x[r, c]) for c in [c0, c1), in row order: columns are
// independent, so vectorizing over them keeps every column's order of additions.
template <typename scalar_t>
void column_sums(const scalar_t* __restrict x, int64_t cols, int64_t r0, int64_t r1, int64_t c0, int64_t c1,
                 float* __restrict sums) {
  for (int64_t c = c0; c < c1; ++c) sums[c - c0] = static_cast<float>(x[r0 * cols + c]);
  for (int64_t r = r0 + 1; r < r1; ++r) {
    const scalar_t* row = x + r * cols;
    for (int64_t c = c0; c < c1; ++c) sums[c - c0] += static_cast<float>(row[c]);
  }
}

// Cast columns [c0, c1) of tile row tile_row, left to right; where row_sums is not nullptr,
// row_sums[c] = the sum of column c over the tile row's rows (column_sums' order), for those columns.
template <Fp8Format F, typename scalar_t>
uint32_t cast_tiles_transpose(const scalar_t* __restrict x, uint8_t* __restrict y, uint8_t* __restrict yt, int64_t rows,
                              int64_t cols, int64_t tile_row, int64_t c0, int64_t c1, float scale, bool streaming,
                              float* row_sums) {
  const int64_t r0 = tile_row * kTileRows, r1 = std::min(r0 + kTileRows, rows);
  uint32_t amax_bits = 0;
#if FP8MP_AVX512_KERNELS
  // Whole 64x64 blocks in AVX-512, across the tiles in one run, so that its prefetches of the blocks
  // ahead do not stop at every tile edge; their column sums too, from the rows while in L1 rather than read
  // again after the tile (cast_to_fp8_transpose_dbias of bf16 4096 x 1024 on a Xeon, 2 threads, three
  // alternating rounds: 701-762 -> 646-700 us; without dbias 578-646 us).
  if (cpu_isa() == CpuIsa::Avx512 && r1 - r0 == kTileRows) {
    const int64_t blocks = (c1 - c0) / kTileRows;
    amax_bits = cast_transpose_rows64_avx512<F>(x + r0 * cols + c0, cols, y + r0 * cols + c0, cols,
                                                yt + c0 * rows + r0, rows, blocks, scale, streaming,
                                                row_sums != nullptr ? row_sums + c0 : nullptr);
    c0 += blocks * kTileRows;
  }
#endif
  if (row_sums != nullptr && c0 < c1) with_cpu_isa([&] { column_sums(x, cols, r0, r1, c0, c1, row_sums + c0); });
  for (; c0 < c1; c0 += kTileCols) {
    const uint32_t tile_amax =
        cast_tile_transpose<F>(x, y, yt, rows, cols, r0, r1, c0, std::min(c0 + kTileCols, c1), scale);
    amax_bits = tile_amax > amax_bits ? tile_amax : amax_bits;
  }
  return amax_bits;
}

}  // namespace

float cast_to_fp8(const void* x, HpType x_type, uint8_t* y, int64_t n, float scale, Fp8Format format,
                  ParallelFor parallel_for) {
  scale = checked_scale(scale);
  std::atomic<uint32_t> amax_bits{0};
  FP8MP_DISPATCH_HP(x_type, [&] {
    const scalar_t* x_ptr = static_cast<const scalar_t*>(x);
    FP8MP_DISPATCH_FORMAT(format, [&] {
      parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
        atomic_max_bits(amax_bits, cast_span<kFormat>(x_ptr + begin, y + begin, end - begin, scale));
      });
    });
  });
  return bits_to_float(amax_bits.load());
}

float cast_to_fp8_transpose(const void* x, HpType x_type, uint8_t* y, uint8_t* yt, int64_t rows, int64_t cols,
                            float scale, Fp8Format format, ParallelFor parallel_for, float* dbias, int threads) {
  static_assert(kDbiasRows == kTileRows, "dbias sums a tile row at a time, while it is in cache");
  scale = checked_scale(scale);
  // y and yt past the caches: measured (bench_cast --transpose, Xeon, 2 threads, 2 MiB L2 each) 16M values
  // 2.7-3.7 -> 2.4-2.7 ms (bf16), 5.3-12 -> 3.5-3.7 ms (fp32).
  const bool streaming = larger_than_l2_caches(2 * rows * cols, threads);
  std::atomic<uint32_t> amax_bits{0};
  const int64_t row_tiles = (rows + kTileRows - 1) / kTileRows, col_tiles = (cols + kTileCols - 1) / kTileCols;
  // Each tile row's column sums, then added in tile-row order below.
  std::unique_ptr<float[]> tile_row_sums(dbias != nullptr ? new float[size_t(row_tiles * cols)] : nullptr);
  // How the threads share the tiles: so that each writes long runs of the rows of y and yt. Split by tile rows,
  // a thread writes whole rows of y but only rows / threads bytes of each row of yt; split into bands of 64-column
  // strips, whole rows of yt but cols / threads bytes of each row of y. Where those runs are a few lines, the
  // hardware prefetchers of one thread take the lines next to its run, the other's, away from it. So bands
  // where the rows of yt are the shorter (and the strips divide evenly, or are many). 1M bf16 values, 2 threads,
  // kernel alone, split by tile rows -> bands: 256 x 4096 200-250 -> 145-170 us, 512 x 2048 195-255 -> 155-170;
  // 4096 x 256 by bands 125-140 -> 155-240.
  const int64_t strips = cols / kTileRows;
  const bool by_strips = threads > 1 && cols > rows && strips >= threads &&
                         (strips % threads == 0 || strips >= 8 * threads);
  FP8MP_DISPATCH_HP(x_type, [&] {
    const scalar_t* x_ptr = static_cast<const scalar_t*>(x);
    FP8MP_DISPATCH_FORMAT(format, [&] {
      // Casts columns [c0, c1) of tile rows [tile_row0, tile_row1); returns their amax's bits.
      const auto cast_rows = [&](int64_t tile_row0, int64_t tile_row1, int64_t c0, int64_t c1) {
        uint32_t local = 0;
        for (int64_t tile_row = tile_row0; tile_row < tile_row1; ++tile_row) {
          float* const row_sums = dbias != nullptr ? tile_row_sums.get() + tile_row * cols : nullptr;
          const uint32_t row_amax =
              cast_tiles_transpose<kFormat>(x_ptr, y, yt, rows, cols, tile_row, c0, c1, scale, streaming, row_sums);
          local = row_amax > local ? row_amax : local;
        }
        return local;
      };
      if (by_strips) {
        parallel_for(0, strips, 1, [&](int64_t begin, int64_t end) {  // the last band takes the ragged columns
          const int64_t c1 = end == strips ? cols : end * kTileRows;
          atomic_max_bits(amax_bits, cast_rows(0, row_tiles, begin * kTileRows, c1));
        });
        return;
      }
      const int64_t grain = std::max<int64_t>(1, kGrain / (kTileRows * kTileCols));
      parallel_for(0, row_tiles * col_tiles, grain, [&](int64_t begin, int64_t end) {
        uint32_t local = 0;
        // The tiles t in [begin, end) are numbered row-major: one call per tile row they cross.
        for (int64_t t = begin; t < end;) {
          const int64_t tile_row = t / col_tiles, row_end = std::min(end, (tile_row + 1) * col_tiles);
          const int64_t c0 = t % col_tiles * kTileCols;
          const int64_t c1 = std::min((row_end - tile_row * col_tiles) * kTileCols, cols);
          const uint32_t row_amax = cast_rows(tile_row, tile_row + 1, c0, c1);
          local = row_amax > local ? row_amax : local;
          t = row_end;
        }
        atomic_max_bits(amax_bits, local);
      });
    });
  });
  if (dbias != nullptr) {
    parallel_for(0, cols, kGrain / 16, [&](int64_t begin, int64_t end) {
      for (int64_t c = begin; c < end; ++c) dbias[c] = rows > 0 ? tile_row_sums[c] : 0.0f;
      for (int64_t tr = 1; tr < row_tiles; ++tr) {
        const float* sums = tile_row_sums.get() + tr * cols;
        for (int64_t c = begin; c < end; ++c) dbias[c] += sums[c];
      }
      // A NaN's payload in a sum is the first NaN operand's on x86, and the AVX-512 loop adds in another
      // operand order than column_sums: one NaN, the canonical one, for every path.
      for (int64_t c = begin; c < end; ++c) dbias[c] = pin_nan(dbias[c]);
    });
  }
  return bits_to_float(amax_bits.load());
}

void cast_from_fp8(const uint8_t* y, Fp8Format format, void* out, HpType out_type, int64_t n, float scale_inv,
                   ParallelFor parallel_for) {
  FP8MP_DISPATCH_HP(out_type, [&] {
    scalar_t* out_ptr = static_cast<scalar_t*>(out);
    FP8MP_DISPATCH_FORMAT(format, [&] {
      const float* table = decode_table<kFormat>().data();
      const float s = checked_scale(scale_inv);
      parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) out_ptr[i] = static_cast<scalar_t>(scale_keep_nan(table[y[i]], s));
      });
    });
  });
}

}  // namespace fp8mp::cpu
