// CUDA implementations of block_quantize and block_quantize_transpose.
//
// Three steps, each a grid-stride kernel:
//   1. tile amaxes into a scratch word per tile (|x| bits, max; a tile spanning several rows gets one
//      atomicMax per row segment, a 1-row tile exactly one),
//   2. each tile's scale from its amax (block_tile_scale, the CPU's function), written to scale_inv,
//      and its multiplier, written over the amax word,
//   3. the cast of every element with its tile's multiplier (block_encode, the CPU's function);
//      block_quantize_transpose casts both layouts from one read of x, staging the transposed codes
//      of a 64 x 64 tile in shared memory so that both stores are row-contiguous.
// Row tiles are reduced one warp per (row, tile column) segment: every lane reads strided elements of
// the segment, so a warp's loads are contiguous. That suits the recipes' tile widths (32, 128 and the
// whole row); a tile narrower than 32 columns leaves lanes idle, still correct. The column tiles of
// block_quantize_transpose (col_block rows of one column) are reduced one thread per column and piece
// of at most kPieceRows rows, so consecutive threads read consecutive columns.
#include "blockwise/blockwise_cuda_kernels.cuh"

#include <algorithm>

#include "cast/transpose_tiling.h"
#include "common/cuda_check.cuh"
#include "common/cuda_reduce.cuh"

namespace fp8mp::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kWarpsPerBlock = kThreads / 32;
constexpr int kBlocksPerSm = 8;
constexpr int64_t kPieceRows = 32;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

unsigned blocks_for(int64_t threads_wanted) {
  const int64_t max_blocks = int64_t(current_device_sm_count()) * kBlocksPerSm;
  return unsigned(std::max<int64_t>(1, std::min<int64_t>(ceil_div(threads_wanted, kThreads), max_blocks)));
}

__device__ __forceinline__ int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }

template <typename scalar_t>
__device__ __forceinline__ uint32_t abs_bits(scalar_t v) {
  return float_to_bits(static_cast<float>(v)) & 0x7FFFFFFFu;
}

// Step 1 for tiles of block_rows x block_cols: amax_bits[(r / block_rows) * tile_cols + tc] = max |x| bits.
template <typename scalar_t>
__global__ void __launch_bounds__(kThreads)
    row_segment_amax_kernel(const scalar_t* __restrict__ x, int64_t rows, int64_t cols, int64_t block_rows,
                            int64_t block_cols, int64_t tile_cols, uint32_t* __restrict__ amax_bits) {
  const int lane = threadIdx.x % 32;
  const int64_t segments = rows * tile_cols;
  const int64_t warps = int64_t(gridDim.x) * kWarpsPerBlock;
  for (int64_t s = int64_t(blockIdx.x) * kWarpsPerBlock + threadIdx.x / 32; s < segments; s += warps) {
    const int64_t r = s / tile_cols, tc = s - r * tile_cols;  // the same for all lanes: shuffles stay converged
    const int64_t c0 = tc * block_cols, c1 = min64(cols, c0 + block_cols);
    const scalar_t* row = x + r * cols;
    uint32_t m = 0;
    for (int64_t c = c0 + lane; c < c1; c += 32) m = max_u32(m, abs_bits(row[c]));
    for (int offset = 16; offset > 0; offset /= 2) m = max_u32(m, __shfl_xor_sync(0xFFFFFFFFu, m, offset));
    if (lane == 0 && m != 0u) atomicMax(amax_bits + (r / block_rows) * tile_cols + tc, m);
  }
}

// Step 1 for the column tiles of block_quantize_transpose (col_block rows of one column of x):
// col_amax_bits[(r / col_block) * cols + c], from pieces of at most kPieceRows rows.
template <typename scalar_t>
__global__ void __launch_bounds__(kThreads)
    column_tile_amax_kernel(const scalar_t* __restrict__ x, int64_t rows, int64_t cols, int64_t col_block,
                            int64_t col_tiles, int64_t pieces_per_tile, uint32_t* __restrict__ col_amax_bits) {
  const int64_t items = col_tiles * pieces_per_tile * cols;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < items; i += stride) {
    const int64_t p = i / cols, c = i - p * cols;
    const int64_t tr = p / pieces_per_tile, piece = p - tr * pieces_per_tile;
    const int64_t r0 = tr * col_block + piece * kPieceRows;
    const int64_t r1 = min64(min64(rows, (tr + 1) * col_block), r0 + kPieceRows);
    uint32_t m = 0;
    for (int64_t r = r0; r < r1; ++r) m = max_u32(m, abs_bits(x[r * cols + c]));
    if (m != 0u) atomicMax(col_amax_bits + tr * cols + c, m);
  }
}

// Step 2: tile i's scale. scale_inv index i, or, with transposed_index, (i % index_cols) * index_rows +
// i / index_cols (the [cols, col_tiles] scale_inv_t of tiles numbered [col_tiles, cols]). The word of
// the amax becomes the bits of the multiplier.
template <Fp8Format F>
__global__ void __launch_bounds__(kThreads)
    tile_scale_kernel(uint32_t* __restrict__ amax_then_multiplier, int64_t tiles, bool transposed_index,
                      int64_t index_cols, int64_t index_rows, BlockScaleMode mode, void* __restrict__ scale_inv) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const bool e8m0 = is_e8m0(mode);
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < tiles; i += stride) {
    const BlockTileScale s = block_tile_scale<F>(bits_to_float(amax_then_multiplier[i]), mode);
    amax_then_multiplier[i] = float_to_bits(s.multiplier);
    const int64_t out = transposed_index ? (i % index_cols) * index_rows + i / index_cols : i;
    if (e8m0) {
      static_cast<uint8_t*>(scale_inv)[out] = s.e8m0_code;
    } else {
      static_cast<float*>(scale_inv)[out] = s.scale_inv;
    }
  }
}

// Step 3 of block_quantize: y[r, c] = block_encode(x[r, c], multiplier of its tile).
template <Fp8Format F, typename scalar_t>
__global__ void __launch_bounds__(kThreads)
    block_cast_kernel(const scalar_t* __restrict__ x, int64_t rows, int64_t cols, int64_t block_rows,
                      int64_t block_cols, int64_t tile_cols, const uint32_t* __restrict__ multiplier_bits,
                      bool clamp_first, uint8_t* __restrict__ y) {
  const int64_t n = rows * cols;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const int64_t r = i / cols, c = i - r * cols;
    const float mul = bits_to_float(multiplier_bits[(r / block_rows) * tile_cols + c / block_cols]);
    y[i] = block_encode<F>(static_cast<float>(x[i]), mul, clamp_first);
  }
}

// Step 3 of block_quantize_transpose, 64 x 64 tiles of x (transpose_tiling.h) walked grid-stride by
// 256 threads (64 columns x 4 rows per pass): y from the row multipliers [rows, row_tiles], and y_t from
// the column multipliers [col_tiles, cols], staged in shared memory and stored along rows of y_t.
template <Fp8Format F, typename scalar_t>
__global__ void __launch_bounds__(kThreads)
    block_cast_transpose_kernel(const scalar_t* __restrict__ x, int64_t rows, int64_t cols, int64_t row_block,
                                int64_t row_tiles, int64_t col_block, const uint32_t* __restrict__ row_mul_bits,
                                const uint32_t* __restrict__ col_mul_bits, bool clamp_first, uint8_t* __restrict__ y,
                                uint8_t* __restrict__ y_t) {
  constexpr int kRowsPerPass = kThreads / kTransposeTile;
  __shared__ uint8_t staged[kTransposeTile][kTransposeTile + 1];  // +1: column reads spread over the banks
  const TransposeTiling tiling(rows, cols);
  const int tx = threadIdx.x % kTransposeTile, ty = threadIdx.x / kTransposeTile;
  for (int64_t t = blockIdx.x; t < tiling.tiles; t += gridDim.x) {
    const int64_t r0 = tiling.row0(t), c0 = tiling.col0(t);
    const int h = int(tiling.height(t)), w = int(tiling.width(t));
    if (tx < w) {
      const int64_t c = c0 + tx;
      for (int i = ty; i < h; i += kRowsPerPass) {
        const int64_t r = r0 + i;
        const float v = static_cast<float>(x[r * cols + c]);
        y[r * cols + c] = block_encode<F>(v, bits_to_float(row_mul_bits[r * row_tiles + c / row_block]), clamp_first);
        staged[i][tx] = block_encode<F>(v, bits_to_float(col_mul_bits[(r / col_block) * cols + c]), clamp_first);
      }
    }
    __syncthreads();
    if (tx < h) {
      for (int j = ty; j < w; j += kRowsPerPass) y_t[(c0 + j) * rows + r0 + tx] = staged[tx][j];
    }
    __syncthreads();  // the next tile overwrites `staged`
  }
}

size_t words(int64_t n) { return size_t(n) * sizeof(uint32_t); }

}  // namespace

size_t block_quantize_scratch_bytes(int64_t rows, int64_t cols, int64_t block_rows, int64_t block_cols) {
  return words(ceil_div(rows, block_rows) * ceil_div(cols, block_cols));
}

void block_quantize(const void* x, HpType x_type, int64_t rows, int64_t cols, int64_t block_rows, int64_t block_cols,
                    Fp8Format format, BlockScaleMode mode, uint8_t* y, void* scale_inv, void* scratch,
                    cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  const int64_t tile_cols = ceil_div(cols, block_cols), tiles = ceil_div(rows, block_rows) * tile_cols;
  uint32_t* tile_words = static_cast<uint32_t*>(scratch);
  FP8MP_CUDA_CHECK(cudaMemsetAsync(tile_words, 0, words(tiles), stream));
  FP8MP_DISPATCH_HP(x_type, [&] {
    const scalar_t* x_ptr = static_cast<const scalar_t*>(x);
    row_segment_amax_kernel<scalar_t><<<blocks_for(rows * tile_cols * 32), kThreads, 0, stream>>>(
        x_ptr, rows, cols, block_rows, block_cols, tile_cols, tile_words);
    FP8MP_CUDA_LAUNCH_CHECK();
    FP8MP_DISPATCH_FORMAT(format, [&] {
      tile_scale_kernel<kFormat><<<blocks_for(tiles), kThreads, 0, stream>>>(tile_words, tiles, false, 1, 1, mode,
                                                                             scale_inv);
      FP8MP_CUDA_LAUNCH_CHECK();
      block_cast_kernel<kFormat, scalar_t><<<blocks_for(rows * cols), kThreads, 0, stream>>>(
          x_ptr, rows, cols, block_rows, block_cols, tile_cols, tile_words, is_e8m0(mode), y);
      FP8MP_CUDA_LAUNCH_CHECK();
    });
  });
}

size_t block_quantize_transpose_scratch_bytes(int64_t rows, int64_t cols, int64_t row_block, int64_t col_block) {
  return words(rows * ceil_div(cols, row_block) + ceil_div(rows, col_block) * cols);
}

void block_quantize_transpose(const void* x, HpType x_type, int64_t rows, int64_t cols, int64_t row_block,
                              int64_t col_block, Fp8Format format, BlockScaleMode mode, uint8_t* y, void* scale_inv,
                              uint8_t* y_t, void* scale_inv_t, void* scratch, cudaStream_t stream) {
  if (rows == 0 || cols == 0) return;
  const int64_t row_tiles = ceil_div(cols, row_block), col_tiles = ceil_div(rows, col_block);
  const int64_t pieces_per_tile = ceil_div(std::min(col_block, rows), kPieceRows);
  uint32_t* row_words = static_cast<uint32_t*>(scratch);       // [rows, row_tiles]
  uint32_t* col_words = row_words + rows * row_tiles;          // [col_tiles, cols]
  FP8MP_CUDA_CHECK(cudaMemsetAsync(scratch, 0, block_quantize_transpose_scratch_bytes(rows, cols, row_block, col_block),
                                   stream));
  const TransposeTiling tiling(rows, cols);
  const unsigned cast_blocks = transpose_blocks(tiling.tiles, int64_t(current_device_sm_count()) * kBlocksPerSm);
  FP8MP_DISPATCH_HP(x_type, [&] {
    const scalar_t* x_ptr = static_cast<const scalar_t*>(x);
    row_segment_amax_kernel<scalar_t><<<blocks_for(rows * row_tiles * 32), kThreads, 0, stream>>>(
        x_ptr, rows, cols, 1, row_block, row_tiles, row_words);
    FP8MP_CUDA_LAUNCH_CHECK();
    column_tile_amax_kernel<scalar_t><<<blocks_for(col_tiles * pieces_per_tile * cols), kThreads, 0, stream>>>(
        x_ptr, rows, cols, col_block, col_tiles, pieces_per_tile, col_words);
    FP8MP_CUDA_LAUNCH_CHECK();
    FP8MP_DISPATCH_FORMAT(format, [&] {
      tile_scale_kernel<kFormat><<<blocks_for(rows * row_tiles), kThreads, 0, stream>>>(
          row_words, rows * row_tiles, false, 1, 1, mode, scale_inv);
      FP8MP_CUDA_LAUNCH_CHECK();
      tile_scale_kernel<kFormat><<<blocks_for(col_tiles * cols), kThreads, 0, stream>>>(
          col_words, col_tiles * cols, true, cols, col_tiles, mode, scale_inv_t);
      FP8MP_CUDA_LAUNCH_CHECK();
      block_cast_transpose_kernel<kFormat, scalar_t><<<cast_blocks, kThreads, 0, stream>>>(
          x_ptr, rows, cols, row_block, row_tiles, col_block, row_words, col_words, is_e8m0(mode), y, y_t);
      FP8MP_CUDA_LAUNCH_CHECK();
    });
  });
}

}  // namespace fp8mp::cuda
