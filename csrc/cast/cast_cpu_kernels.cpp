// CPU implementations of the cast kernels: parallel over chunks, with
// branch-free inner loops (fp8_format.h) that the compiler vectorizes.
#include "cast/cast_cpu_kernels.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "common/cpu_clones.h"
#include "common/fp8_decode_table.h"

namespace fp8mp::cpu {
namespace {

constexpr int64_t kGrain = 1 << 15;  // elements per parallel task: big enough to amortize scheduling
// Transpose tiles: 64 rows (a full 64-byte line of the transpose per column) by 512 columns
// (2 KiB runs of fp32 input, long enough that rows 16 KiB apart do not thrash the L1 sets).
constexpr int64_t kTileRows = 64;
constexpr int64_t kTileCols = 512;

template <Fp8Format F, typename scalar_t>
FP8MP_CPU_CLONES uint32_t cast_span(const scalar_t* __restrict x, uint8_t* __restrict y, int64_t n, float scale) {
  uint32_t amax_bits = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float v = static_cast<float>(x[i]);
    const uint32_t abs_bits = float_to_bits(v) & 0x7FFFFFFFu;
    amax_bits = abs_bits > amax_bits ? abs_bits : amax_bits;
    y[i] = encode<F>(v * scale);
  }
  return amax_bits;
}

// dst[j][i] = src[i][j] for an 8x8 byte block: rows held as uint64 words and transposed by
// swapping 1-, 2- and 4-byte sub-blocks (three rounds of masked shifts).
inline void transpose8x8(const uint8_t* src, int64_t src_stride, uint8_t* dst, int64_t dst_stride) {
  uint64_t row[8];
  for (int i = 0; i < 8; ++i) std::memcpy(&row[i], src + i * src_stride, 8);
  constexpr struct { int shift; uint64_t mask; } kRounds[3] = {
      {8, 0x00FF00FF00FF00FFull}, {16, 0x0000FFFF0000FFFFull}, {32, 0x00000000FFFFFFFFull}};
  for (const auto& round : kRounds) {
    for (int i = 0; i < 8; ++i) {
      if (i & round.shift / 8) continue;  // i is the upper row of a pair (i, i + shift/8)
      const int j = i + round.shift / 8;
      const uint64_t t = ((row[i] >> round.shift) ^ row[j]) & round.mask;
      row[j] ^= t;
      row[i] ^= t << round.shift;
    }
  }
  for (int i = 0; i < 8; ++i) std::memcpy(dst + i * dst_stride, &row[i], 8);
}

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
  // The tile of y just written is in cache: transpose it into yt in 8x8 byte blocks through
  // registers, then the ragged edges byte by byte.
  const uint8_t* tile = y + r0 * cols + c0;
  const int64_t height = r1 - r0, full_rows = height / 8 * 8, full_cols = width / 8 * 8;
  for (int64_t bc = 0; bc < full_cols; bc += 8) {
    for (int64_t br = 0; br < full_rows; br += 8) {
      transpose8x8(tile + br * cols + bc, cols, yt + (c0 + bc) * rows + r0 + br, rows);
    }
  }
  for (int64_t c = 0; c < width; ++c) {
    uint8_t* out = yt + (c0 + c) * rows + r0;
    for (int64_t r = (c < full_cols ? full_rows : 0); r < height; ++r) out[r] = tile[r * cols + c];
  }
  return amax_bits;
}

}  // namespace

float cast_to_fp8(const void* x, HpType x_type, uint8_t* y, int64_t n, float scale, Fp8Format format,
                  ParallelFor parallel_for) {
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
                            float scale, Fp8Format format, ParallelFor parallel_for) {
  std::atomic<uint32_t> amax_bits{0};
  const int64_t row_tiles = (rows + kTileRows - 1) / kTileRows, col_tiles = (cols + kTileCols - 1) / kTileCols;
  FP8MP_DISPATCH_HP(x_type, [&] {
    const scalar_t* x_ptr = static_cast<const scalar_t*>(x);
    FP8MP_DISPATCH_FORMAT(format, [&] {
      const int64_t grain = std::max<int64_t>(1, kGrain / (kTileRows * kTileCols));
      parallel_for(0, row_tiles * col_tiles, grain, [&](int64_t begin, int64_t end) {
        uint32_t local = 0;
        for (int64_t t = begin; t < end; ++t) {
          const int64_t r0 = (t / col_tiles) * kTileRows, c0 = (t % col_tiles) * kTileCols;
          const uint32_t tile_amax =
              cast_tile_transpose<kFormat>(x_ptr, y, yt, rows, cols, r0, std::min(r0 + kTileRows, rows), c0,
                                           std::min(c0 + kTileCols, cols), scale);
          local = tile_amax > local ? tile_amax : local;
        }
        atomic_max_bits(amax_bits, local);
      });
    });
  });
  return bits_to_float(amax_bits.load());
}

void cast_from_fp8(const uint8_t* y, Fp8Format format, void* out, HpType out_type, int64_t n, float scale_inv,
                   ParallelFor parallel_for) {
  FP8MP_DISPATCH_HP(out_type, [&] {
    scalar_t* out_ptr = static_cast<scalar_t*>(out);
    FP8MP_DISPATCH_FORMAT(format, [&] {
      const float* table = decode_table<kFormat>().data();
      parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) out_ptr[i] = static_cast<scalar_t>(table[y[i]] * scale_inv);
      });
    });
  });
}

}  // namespace fp8mp::cpu
