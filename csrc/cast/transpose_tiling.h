// Index math of the CUDA cast-transpose kernel, host and device, torch-free so
// that Catch2 can check it on the CPU (tests/cpp/test_transpose_tiling.cpp).
//
// The rows x cols input is cut into kTransposeTile x kTransposeTile tiles,
// numbered row-major over a 1-D range; blocks walk that range grid-stride. A 1-D
// range has no 65535 limit (grid.y's, which capped rows at 2,097,120 when tile
// rows were mapped to blockIdx.y), and the tile number is 64-bit, so any rows x
// cols that fits in memory is covered, each tile exactly once.
#pragma once

#include <cstdint>

#include "common/fp8_format.h"  // FP8MP_HOST_DEVICE

namespace fp8mp {

constexpr int kTransposeTile = 64;  // a 64-byte line of the transpose per tile column

struct TransposeTiling {
  int64_t rows, cols;
  int64_t tile_cols;  // tiles per tile row
  int64_t tiles;

  FP8MP_HOST_DEVICE TransposeTiling(int64_t rows_, int64_t cols_)
      : rows(rows_),
        cols(cols_),
        tile_cols((cols_ + kTransposeTile - 1) / kTransposeTile),
        tiles(((rows_ + kTransposeTile - 1) / kTransposeTile) * ((cols_ + kTransposeTile - 1) / kTransposeTile)) {}

  // First row and column of tile t.
  FP8MP_HOST_DEVICE int64_t row0(int64_t t) const { return (t / tile_cols) * kTransposeTile; }
  FP8MP_HOST_DEVICE int64_t col0(int64_t t) const { return (t % tile_cols) * kTransposeTile; }
  // Rows / columns of tile t inside the matrix (kTransposeTile except at the bottom / right edge).
  FP8MP_HOST_DEVICE int64_t height(int64_t t) const {
    const int64_t left = rows - row0(t);
    return left < kTransposeTile ? left : kTransposeTile;
  }
  FP8MP_HOST_DEVICE int64_t width(int64_t t) const {
    const int64_t left = cols - col0(t);
    return left < kTransposeTile ? left : kTransposeTile;
  }
};

// Blocks of a grid-stride launch over `tiles` tiles: at most max_blocks, at least 1.
inline unsigned transpose_blocks(int64_t tiles, int64_t max_blocks) {
  const int64_t blocks = tiles < max_blocks ? tiles : max_blocks;
  return unsigned(blocks > 0 ? blocks : 1);
}

}  // namespace fp8mp
