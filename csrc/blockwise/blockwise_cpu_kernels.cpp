// CPU kernels of block_quantize and block_scaled_gemm (see blockwise_cpu_kernels.h for the arithmetic).
//
// block_quantize reads each row block of x twice (tile amaxes, then the scaled cast), one
// parallel task per row block of tiles. block_scaled_gemm decodes a and b to fp32 once, laid out
// chunk-major ([K chunk][row][k in chunk]) so that all K chunks are one batched fp32 GEMM, then
// folds the chunks' partial products into an fp32 accumulator with their two scales, row by row.
#include "blockwise/blockwise_cpu_kernels.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <vector>

#include "common/fp8_decode_table.h"
#include "common/scratch_pool.h"

namespace fp8mp::cpu {
namespace {

constexpr int64_t kGrainElements = 1 << 15;           // elements per parallel task, roughly
constexpr int64_t kBlockElements = int64_t(1) << 22;  // fp32 values of a decoded at once (16 MiB)
constexpr float kNan = std::numeric_limits<float>::quiet_NaN();

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// max that keeps a NaN once seen (as torch.amax does).
inline float nan_max(float m, float v) { return (v > m || v != v) ? v : m; }

// E8M0 code -> its value 2^(code - 127); 255 is NaN.
const std::array<float, 256>& e8m0_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int code = 0; code < 255; ++code) t[code] = block_exact_pow2(code - 127);
    t[255] = kNan;
    return t;
  }();
  return table;
}

template <typename scalar_t, Fp8Format F>
void block_quantize_impl(const scalar_t* x, int64_t rows, int64_t cols, int64_t block_rows, int64_t block_cols,
                         BlockScaleMode mode, uint8_t* y, void* scale_inv, ParallelFor parallel_for) {
  const int64_t tile_rows = ceil_div(rows, block_rows), tile_cols = ceil_div(cols, block_cols);
  const bool clamp_first = is_e8m0(mode);
  const int64_t grain = std::max<int64_t>(1, kGrainElements / std::max<int64_t>(1, block_rows * cols));
  parallel_for(0, tile_rows, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> amax(static_cast<size_t>(tile_cols), 0.0f);
    std::vector<float> multiplier(static_cast<size_t>(tile_cols), 0.0f);
    for (int64_t tr = begin; tr < end; ++tr) {
      const int64_t r0 = tr * block_rows, r1 = std::min(rows, r0 + block_rows);
      std::fill(amax.begin(), amax.end(), 0.0f);
      for (int64_t r = r0; r < r1; ++r) {
        const scalar_t* row = x + r * cols;
        for (int64_t tc = 0; tc < tile_cols; ++tc) {
          float m = amax[tc];
          for (int64_t c = tc * block_cols, c1 = std::min(cols, c + block_cols); c < c1; ++c) {
            m = nan_max(m, std::fabs(static_cast<float>(row[c])));
          }
          amax[tc] = m;
        }
      }
      for (int64_t tc = 0; tc < tile_cols; ++tc) {
        const BlockTileScale s = block_tile_scale<F>(amax[tc], mode);
        multiplier[tc] = s.multiplier;
        if (clamp_first) {
          static_cast<uint8_t*>(scale_inv)[tr * tile_cols + tc] = s.e8m0_code;
        } else {
          static_cast<float*>(scale_inv)[tr * tile_cols + tc] = s.scale_inv;
        }
      }
      for (int64_t r = r0; r < r1; ++r) {
        const scalar_t* row = x + r * cols;
        uint8_t* out = y + r * cols;
        for (int64_t tc = 0; tc < tile_cols; ++tc) {
          const float mul = multiplier[tc];
          for (int64_t c = tc * block_cols, c1 = std::min(cols, c + block_cols); c < c1; ++c) {
            out[c] = block_encode<F>(static_cast<float>(row[c]), mul, clamp_first);
          }
        }
      }
    }
  });
}

void store_scale_inv(void* scale_inv, int64_t index, const BlockTileScale& s, bool e8m0) {
  if (e8m0) {
    static_cast<uint8_t*>(scale_inv)[index] = s.e8m0_code;
  } else {
    static_cast<float*>(scale_inv)[index] = s.scale_inv;
  }
}

// Pass 1 of block_quantize_transpose: x is cut into pieces of at most piece_rows rows that never
// straddle two column tiles (col_block rows each). Each piece sets its rows' row-tile multipliers
// and scale_inv, and writes the amax of each of its columns into its own row of col_partial, so
// that no two tasks write the same value; a column tile's amax is then the max over its pieces.
template <typename scalar_t, Fp8Format F>
void row_scales_and_column_partials(const scalar_t* x, int64_t rows, int64_t cols, int64_t row_block,
                                    int64_t col_block, int64_t piece_rows, BlockScaleMode mode, float* row_mul,
                                    void* scale_inv, float* col_partial, ParallelFor parallel_for) {
  const int64_t row_tiles = ceil_div(cols, row_block), col_tiles = ceil_div(rows, col_block);
  const int64_t pieces_per_tile = ceil_div(std::min(col_block, rows), piece_rows);
  parallel_for(0, col_tiles * pieces_per_tile, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> amax(static_cast<size_t>(row_tiles), 0.0f);
    for (int64_t piece = begin; piece < end; ++piece) {
      float* col_amax = col_partial + piece * cols;
      std::fill(col_amax, col_amax + cols, 0.0f);
      const int64_t tile_r0 = (piece / pieces_per_tile) * col_block;
      const int64_t r0 = tile_r0 + (piece % pieces_per_tile) * piece_rows;
      const int64_t r1 = std::min({rows, tile_r0 + col_block, r0 + piece_rows});
      for (int64_t r = r0; r < r1; ++r) {
        const scalar_t* row = x + r * cols;
        for (int64_t tc = 0; tc < row_tiles; ++tc) {
          float m = 0.0f;
          for (int64_t c = tc * row_block, c1 = std::min(cols, c + row_block); c < c1; ++c) {
            const float a = std::fabs(static_cast<float>(row[c]));
            m = nan_max(m, a);
            col_amax[c] = nan_max(col_amax[c], a);
          }
          amax[size_t(tc)] = m;
        }
        for (int64_t tc = 0; tc < row_tiles; ++tc) {
          const BlockTileScale s = block_tile_scale<F>(amax[size_t(tc)], mode);
          row_mul[r * row_tiles + tc] = s.multiplier;
          store_scale_inv(scale_inv, r * row_tiles + tc, s, is_e8m0(mode));
        }
      }
    }
  });
}

template <typename scalar_t, Fp8Format F>
void block_quantize_transpose_impl(const scalar_t* x, int64_t rows, int64_t cols, int64_t row_block,
                                   int64_t col_block, BlockScaleMode mode, uint8_t* y, void* scale_inv, uint8_t* y_t,
                                   void* scale_inv_t, ParallelFor parallel_for) {
  const int64_t row_tiles = ceil_div(cols, row_block), col_tiles = ceil_div(rows, col_block);
  const bool clamp_first = is_e8m0(mode);
  // Pieces of about kGrainElements (at least 16 rows, so col_partial stays under 1 / 16 of x's elements).
  const int64_t piece_rows = std::min(std::min(col_block, rows), std::max<int64_t>(16, kGrainElements / cols));
  const int64_t pieces_per_tile = ceil_div(std::min(col_block, rows), piece_rows);
  std::vector<float> row_mul(static_cast<size_t>(rows * row_tiles));
  std::vector<float> col_partial(static_cast<size_t>(col_tiles * pieces_per_tile * cols));
  row_scales_and_column_partials<scalar_t, F>(x, rows, cols, row_block, col_block, piece_rows, mode, row_mul.data(),
                                              scale_inv, col_partial.data(), parallel_for);
  std::vector<float> col_mul(static_cast<size_t>(col_tiles * cols));  // [column tile][column]
  const int64_t col_grain = std::max<int64_t>(1, kGrainElements / (col_tiles * pieces_per_tile));
  parallel_for(0, cols, col_grain, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      for (int64_t tr = 0; tr < col_tiles; ++tr) {
        float m = 0.0f;
        for (int64_t p = tr * pieces_per_tile; p < (tr + 1) * pieces_per_tile; ++p) {
          m = nan_max(m, col_partial[size_t(p * cols + c)]);
        }
        const BlockTileScale s = block_tile_scale<F>(m, mode);
        col_mul[size_t(tr * cols + c)] = s.multiplier;
        store_scale_inv(scale_inv_t, c * col_tiles + tr, s, clamp_first);
      }
    }
  });
  // Pass 2: both casts from one more read, in kSquare x kSquare squares so the transposed writes stay in cache.
  constexpr int64_t kSquare = 64;
  const auto cast = [&](float v, float mul) { return block_encode<F>(v, mul, clamp_first); };
  parallel_for(0, ceil_div(rows, kSquare), 1, [&](int64_t begin, int64_t end) {
    for (int64_t r0 = begin * kSquare; r0 < std::min(rows, end * kSquare); r0 += kSquare) {
      const int64_t r1 = std::min(rows, r0 + kSquare);
      for (int64_t c0 = 0; c0 < cols; c0 += kSquare) {
        const int64_t c1 = std::min(cols, c0 + kSquare);
        for (int64_t r = r0; r < r1; ++r) {
          const scalar_t* row = x + r * cols;
          const float* mul_r = row_mul.data() + r * row_tiles;
          const float* mul_c = col_mul.data() + (r / col_block) * cols;
          for (int64_t c = c0; c < c1;) {  // row tile by row tile: one multiplier each
            const int64_t tc = c / row_block, tile_end = std::min(c1, (tc + 1) * row_block);
            const float row_multiplier = mul_r[tc];
            for (; c < tile_end; ++c) {
              const float v = static_cast<float>(row[c]);
              y[r * cols + c] = cast(v, row_multiplier);
              y_t[c * rows + r] = cast(v, mul_c[c]);
            }
          }
        }
      }
    }
  });
}

template <typename scalar_t, Fp8Format F>
void block_quantize_transpose_strip_impl(const scalar_t* strip, int64_t r0, int64_t strip_rows, int64_t rows,
                                         int64_t cols, int64_t row_block, int64_t col_block, BlockScaleMode mode,
                                         uint8_t* y, void* scale_inv, uint8_t* y_t, void* scale_inv_t) {
  const int64_t row_tiles = ceil_div(cols, row_block), col_tiles = ceil_div(rows, col_block), tr = r0 / col_block;
  const bool clamp_first = is_e8m0(mode);
  std::vector<float> row_mul(static_cast<size_t>(strip_rows * row_tiles)), col_mul(static_cast<size_t>(cols), 0.0f);
  for (int64_t r = 0; r < strip_rows; ++r) {  // col_mul holds the column amaxes first
    const scalar_t* row = strip + r * cols;
    for (int64_t tc = 0; tc < row_tiles; ++tc) {
      float m = 0.0f;
      for (int64_t c = tc * row_block, c1 = std::min(cols, c + row_block); c < c1; ++c) {
        const float a = std::fabs(static_cast<float>(row[c]));
        m = nan_max(m, a);
        col_mul[size_t(c)] = nan_max(col_mul[size_t(c)], a);
      }
      const BlockTileScale s = block_tile_scale<F>(m, mode);
      row_mul[size_t(r * row_tiles + tc)] = s.multiplier;
      store_scale_inv(scale_inv, (r0 + r) * row_tiles + tc, s, clamp_first);
    }
  }
  for (int64_t c = 0; c < cols; ++c) {
    const BlockTileScale s = block_tile_scale<F>(col_mul[size_t(c)], mode);
    col_mul[size_t(c)] = s.multiplier;
    store_scale_inv(scale_inv_t, c * col_tiles + tr, s, clamp_first);
  }
  const auto cast = [&](float v, float mul) { return block_encode<F>(v, mul, clamp_first); };
  for (int64_t r = 0; r < strip_rows; ++r) {
    const scalar_t* row = strip + r * cols;
    for (int64_t c = 0; c < cols;) {
      const int64_t tc = c / row_block, tile_end = std::min(cols, (tc + 1) * row_block);
      const float row_multiplier = row_mul[size_t(r * row_tiles + tc)];
      for (; c < tile_end; ++c) {
        const float v = static_cast<float>(row[c]);
        y[(r0 + r) * cols + c] = cast(v, row_multiplier);
        y_t[c * rows + r0 + r] = cast(v, col_mul[size_t(c)]);
      }
    }
  }
}

// Decode rows [row0, row0 + rows) of a row-major [*, K] FP8 operand into chunk-major fp32:
// chunk c (width kc = min(block_k, K - c * block_k)) starts at c * block_k * rows, row r at r * kc.
void decode_chunk_major(const uint8_t* codes, Fp8Format format, int64_t row0, int64_t rows, int64_t K, int64_t block_k,
                        float* out, ParallelFor parallel_for) {
  const float* table = decode_table_for(format);
  const int64_t grain = std::max<int64_t>(1, kGrainElements / std::max<int64_t>(1, K));
  parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const uint8_t* row = codes + (row0 + r) * K;
      for (int64_t k0 = 0; k0 < K; k0 += block_k) {
        const int64_t kc = std::min(block_k, K - k0);
        float* dst = out + k0 * rows + r * kc;
        for (int64_t j = 0; j < kc; ++j) dst[j] = table[row[k0 + j]];
      }
    }
  });
}

// scale_inv[row_block, chunk] of one operand, as fp32.
float scale_at(const BlockOperand& op, int64_t n_chunks, int64_t row, int64_t chunk) {
  const int64_t index = (row / op.block_rows) * n_chunks + chunk;
  if (op.scale_type == BlockScaleType::E8m0) return e8m0_table()[static_cast<const uint8_t*>(op.scale_inv)[index]];
  return static_cast<const float*>(op.scale_inv)[index];
}

template <typename scalar_t>
void block_scaled_gemm_impl(const BlockOperand& a, const BlockOperand& b, int64_t M, int64_t N, int64_t K,
                            int64_t block_k, const scalar_t* bias, scalar_t* out, const BatchedMatmulNtFp32& matmul,
                            ParallelFor parallel_for) {
  if (K == 0) {  // an empty sum: the result is the bias (or zeros), whatever the scales
    for (int64_t m = 0; m < M; ++m) {
      for (int64_t n = 0; n < N; ++n) out[m * N + n] = bias != nullptr ? bias[n] : scalar_t(0.0f);
    }
    return;
  }
  const int64_t full_chunks = K / block_k, tail = K % block_k, n_chunks = ceil_div(K, block_k);
  // Decoded operands and partial sums in scratch_pool.h's buffers: fresh pages each call would cost more
  // than the decode.
  const ScratchBuffer b_storage(size_t(N * K) * sizeof(float));
  float* const b_f32 = b_storage.as<float>();
  decode_chunk_major(b.data, b.format, 0, N, K, block_k, b_f32, parallel_for);
  std::vector<float> b_scales(static_cast<size_t>(n_chunks * N), 0.0f);  // [chunk][n]
  for (int64_t n = 0; n < N; ++n) {
    for (int64_t c = 0; c < n_chunks; ++c) b_scales[size_t(c * N + n)] = scale_at(b, n_chunks, n, c);
  }
  // Rows of a per pass: its fp32 copy and the partial products of all chunks stay within kBlockElements.
  const int64_t block_m = std::min(M, std::max<int64_t>(1, kBlockElements / std::max(K, n_chunks * N)));
  const ScratchBuffer a_storage(size_t(block_m * K) * sizeof(float));
  const ScratchBuffer partial_storage(size_t(block_m * N * n_chunks) * sizeof(float));  // [chunk][row][n]
  float* const a_f32 = a_storage.as<float>();
  float* const partial = partial_storage.as<float>();
  const int64_t row_grain = std::max<int64_t>(1, kGrainElements / (N * n_chunks));
  for (int64_t row0 = 0; row0 < M; row0 += block_m) {
    const int64_t rows = std::min(block_m, M - row0);
    decode_chunk_major(a.data, a.format, row0, rows, K, block_k, a_f32, parallel_for);
    // Every chunk's fp32 sums: the full chunks in one batched GEMM, the shorter last chunk in another.
    if (full_chunks > 0) matmul(a_f32, b_f32, partial, full_chunks, rows, N, block_k);
    if (tail > 0) {
      const int64_t k0 = full_chunks * block_k;
      matmul(a_f32 + k0 * rows, b_f32 + k0 * N, partial + full_chunks * rows * N, 1, rows, N, tail);
    }
    scalar_t* out_rows = out + row0 * N;
    parallel_for(0, rows, row_grain, [&](int64_t begin, int64_t end) {
      std::vector<float> acc(static_cast<size_t>(N), 0.0f);
      for (int64_t r = begin; r < end; ++r) {
        std::fill(acc.begin(), acc.end(), 0.0f);
        for (int64_t c = 0; c < n_chunks; ++c) {  // in chunk order
          const float sa = scale_at(a, n_chunks, row0 + r, c);
          const float* p = partial + (c * rows + r) * N;
          const float* sb = b_scales.data() + c * N;
          for (int64_t n = 0; n < N; ++n) acc[size_t(n)] = acc[size_t(n)] + p[n] * (sa * sb[n]);
        }
        for (int64_t n = 0; n < N; ++n) {
          const float v = bias != nullptr ? acc[size_t(n)] + static_cast<float>(bias[n]) : acc[size_t(n)];
          out_rows[r * N + n] = static_cast<scalar_t>(v);
        }
      }
    });
  }
}

}  // namespace

void block_quantize(const void* x, HpType x_type, int64_t rows, int64_t cols, int64_t block_rows, int64_t block_cols,
                    Fp8Format format, BlockScaleMode mode, uint8_t* y, void* scale_inv, ParallelFor parallel_for) {
  if (rows == 0 || cols == 0) return;
  FP8MP_DISPATCH_HP(x_type, [&] {
    FP8MP_DISPATCH_FORMAT(format, [&] {
      block_quantize_impl<scalar_t, kFormat>(static_cast<const scalar_t*>(x), rows, cols, block_rows, block_cols, mode,
                                             y, scale_inv, parallel_for);
    });
  });
}

void block_quantize_transpose(const void* x, HpType x_type, int64_t rows, int64_t cols, int64_t row_block,
                              int64_t col_block, Fp8Format format, BlockScaleMode mode, uint8_t* y, void* scale_inv,
                              uint8_t* y_t, void* scale_inv_t, ParallelFor parallel_for) {
  if (rows == 0 || cols == 0) return;
  FP8MP_DISPATCH_HP(x_type, [&] {
    FP8MP_DISPATCH_FORMAT(format, [&] {
      block_quantize_transpose_impl<scalar_t, kFormat>(static_cast<const scalar_t*>(x), rows, cols, row_block,
                                                       col_block, mode, y, scale_inv, y_t, scale_inv_t, parallel_for);
    });
  });
}

void block_quantize_transpose_strip(const void* strip, HpType x_type, int64_t r0, int64_t strip_rows, int64_t rows,
                                    int64_t cols, int64_t row_block, int64_t col_block, Fp8Format format,
                                    BlockScaleMode mode, uint8_t* y, void* scale_inv, uint8_t* y_t, void* scale_inv_t) {
  if (strip_rows == 0 || cols == 0) return;
  FP8MP_DISPATCH_HP(x_type, [&] {
    FP8MP_DISPATCH_FORMAT(format, [&] {
      block_quantize_transpose_strip_impl<scalar_t, kFormat>(static_cast<const scalar_t*>(strip), r0, strip_rows, rows,
                                                             cols, row_block, col_block, mode, y, scale_inv, y_t,
                                                             scale_inv_t);
    });
  });
}

void block_scaled_gemm(const BlockOperand& a, const BlockOperand& b, int64_t M, int64_t N, int64_t K, int64_t block_k,
                       const void* bias, void* out, HpType out_type, const BatchedMatmulNtFp32& matmul,
                       ParallelFor parallel_for) {
  if (M == 0 || N == 0) return;
  FP8MP_DISPATCH_HP(out_type, [&] {
    block_scaled_gemm_impl<scalar_t>(a, b, M, N, K, block_k, static_cast<const scalar_t*>(bias),
                                     static_cast<scalar_t*>(out), matmul, parallel_for);
  });
}

}  // namespace fp8mp::cpu
