// Where cuBLASLt wants each block scale of a GEMM operand, host and device, torch-free so that Catch2
// checks it on the CPU (tests/cpp/test_blockwise_kernels.cpp).
//
// An operand is cuBLASLt's column-major K x rows matrix (fp8mp's row-major [rows, K]); its naive
// scales (block_quantize's scale_inv) are [outer, k_tiles] row-major, outer = rows (1-row blocks) or
// ceil(rows / 128) (128 x 128 blocks). cuBLASLt's layouts, as its documentation (cuBLASLt "Block
// scaling factors layout") and NVIDIA's cuBLASMp reference code give them:
//   OuterVec     CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F: one fp32 per row, [rows].
//   Vec128       CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F: fp32 per row and 128-element K chunk, K chunk
//                major: offset k * round_up(rows, 4) + row.
//   Blk128x128   CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F: fp32 per 128 x 128 block, K-block minor:
//                offset row_block * round_up(k_tiles, 4) + k.
//   Vec32Swizzled CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0: one E8M0 byte per row and 32-element chunk,
//                in 128 x 4 tiles of 512 bytes (rows padded to 128, chunks to 4), tiles row-block major;
//                inside a tile, row r and chunk c sit at (r % 32) * 16 + (r / 32) * 4 + c (NVIDIA's
//                documented 32 x 4 x 4 layout, torchao's to_blocked).
// Padding slots are written with zeros (they scale zero-padded data or are never read).
#pragma once

#include <cstdint>

#include "common/fp8_format.h"  // FP8MP_HOST_DEVICE

namespace fp8mp {

enum class LtScaleLayout : int { OuterVec = 0, Vec128 = 1, Blk128x128 = 2, Vec32Swizzled = 3 };

struct LtScaleShape {
  int64_t outer;     // scale rows written, padding included (rows, or row blocks for Blk128x128)
  int64_t k_tiles;   // scale columns written, padding included
  int64_t elements;  // of the whole buffer
};

FP8MP_HOST_DEVICE int64_t lt_round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// The buffer for an operand of `rows` rows (as cuBLASLt is told, padding included) and k_tiles K chunks.
FP8MP_HOST_DEVICE LtScaleShape lt_scale_shape(LtScaleLayout layout, int64_t rows, int64_t k_tiles) {
  LtScaleShape s{rows, k_tiles, 0};
  switch (layout) {
    case LtScaleLayout::OuterVec: s.k_tiles = 1; break;
    case LtScaleLayout::Vec128: s.outer = lt_round_up(rows, 4); break;
    case LtScaleLayout::Blk128x128:
      s.outer = (rows + 127) / 128;
      s.k_tiles = lt_round_up(k_tiles, 4);
      break;
    case LtScaleLayout::Vec32Swizzled:
      s.outer = lt_round_up(rows, 128);
      s.k_tiles = lt_round_up(k_tiles, 4);
      break;
  }
  s.elements = s.outer * s.k_tiles;
  return s;
}

// Element offset of scale (o, k) (o < shape.outer, k < shape.k_tiles) in the buffer.
FP8MP_HOST_DEVICE int64_t lt_scale_offset(LtScaleLayout layout, const LtScaleShape& shape, int64_t o, int64_t k) {
  switch (layout) {
    case LtScaleLayout::OuterVec: return o;
    case LtScaleLayout::Vec128: return k * shape.outer + o;
    case LtScaleLayout::Blk128x128: return o * shape.k_tiles + k;
    default: {
      const int64_t tile = (o / 128) * (shape.k_tiles / 4) + k / 4;
      return tile * 512 + (o % 32) * 16 + ((o / 32) % 4) * 4 + (k % 4);
    }
  }
}

}  // namespace fp8mp
