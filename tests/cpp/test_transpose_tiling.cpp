// transpose_tiling.h, the CUDA cast-transpose's index math, on the CPU: a grid-stride
// walk over the 1-D tile range visits every element exactly once, for shapes past
// the old 2,097,120-row limit of a grid.y launch, with a grid no larger than asked.
#include <catch2/catch.hpp>

#include <cstdint>
#include <vector>

#include "cast/transpose_tiling.h"

using fp8mp::kTransposeTile;
using fp8mp::transpose_blocks;
using fp8mp::TransposeTiling;

namespace {

// Walks the tiles as the kernel's blocks do and counts visits per tile row/column band.
void check_covers_once(int64_t rows, int64_t cols, int64_t max_blocks) {
  const TransposeTiling tiling(rows, cols);
  const unsigned blocks = transpose_blocks(tiling.tiles, max_blocks);
  REQUIRE(blocks >= 1);
  REQUIRE(int64_t(blocks) <= max_blocks);
  const int64_t band_rows = (rows + kTransposeTile - 1) / kTransposeTile;
  const int64_t band_cols = (cols + kTransposeTile - 1) / kTransposeTile;
  std::vector<uint8_t> visits(size_t(band_rows * band_cols), 0);
  int64_t covered = 0;
  for (unsigned b = 0; b < blocks; ++b) {
    for (int64_t t = b; t < tiling.tiles; t += blocks) {
      const int64_t r0 = tiling.row0(t), c0 = tiling.col0(t);
      REQUIRE(r0 % kTransposeTile == 0);
      REQUIRE(c0 % kTransposeTile == 0);
      REQUIRE(r0 < rows);
      REQUIRE(c0 < cols);
      const int64_t h = tiling.height(t), w = tiling.width(t);
      REQUIRE(h == std::min<int64_t>(kTransposeTile, rows - r0));
      REQUIRE(w == std::min<int64_t>(kTransposeTile, cols - c0));
      ++visits[size_t(r0 / kTransposeTile * band_cols + c0 / kTransposeTile)];
      covered += h * w;
    }
  }
  for (const uint8_t v : visits) REQUIRE(v == 1);
  REQUIRE(covered == rows * cols);
}

}  // namespace

TEST_CASE("transpose tiling covers small and ragged shapes once", "[transpose_tiling]") {
  check_covers_once(1, 1, 1056);
  check_covers_once(33, 65, 1056);
  check_covers_once(64, 64, 1056);
  check_covers_once(4097, 31, 7);
  check_covers_once(1024, 4096, 1056);
}

TEST_CASE("transpose tiling has no row limit beyond 2,097,120", "[transpose_tiling]") {
  // 65535 tiles of 32 rows was the old grid.y cap; these need far more tile rows.
  check_covers_once(2097121, 16, 1056);
  check_covers_once(4194304 + 17, 80, 1056);
  const TransposeTiling huge(int64_t(1) << 31, 8192);  // 2^31 rows: tile numbers past 2^32
  REQUIRE(huge.tiles == (int64_t(1) << 25) * 128);
  REQUIRE(huge.row0(huge.tiles - 1) == (int64_t(1) << 31) - kTransposeTile);
  REQUIRE(huge.col0(huge.tiles - 1) == 8192 - kTransposeTile);
  REQUIRE(transpose_blocks(huge.tiles, 1056) == 1056u);
  REQUIRE(transpose_blocks(0, 1056) == 1u);
}
