// The CPU kernels of the fine-grained (block-scaled) ops, torch-free: raw pointers and sizes.
// blockwise_cpu.cpp is their torch glue (argument checks, allocation, registration).
//
// Blocks. A [rows, cols] tensor is cut into tiles of block_rows x block_cols (the last tile of a
// row or column may be smaller: it is scaled from the elements it has, as if zero-padded). Each
// tile has one scale; scale_inv is row-major [ceil(rows / block_rows), ceil(cols / block_cols)].
// The recipes use: rowwise 1 x cols, DeepSeek-V3 activations 1 x 128 and weights 128 x 128,
// MXFP8 1 x 32.
#pragma once

#include <cstdint>

#include "blockwise/block_scale_rule.h"
#include "common/cpu_parallel.h"
#include "common/fp8_format.h"
#include "common/half_types.h"
#include <functional>

namespace fp8mp::cpu {

// The scale modes and their formulas: block_scale_rule.h (shared with the CUDA kernels).
using ::fp8mp::BlockScaleMode;
using ::fp8mp::is_e8m0;

// y [rows, cols] FP8 codes of the row-major x (of x_type) and scale_inv per tile: fp32 values for
// Fp32/Pow2, E8M0 codes (uint8) for the E8M0 modes. block_rows, block_cols >= 1.
void block_quantize(const void* x, HpType x_type, int64_t rows, int64_t cols, int64_t block_rows, int64_t block_cols,
                    Fp8Format format, BlockScaleMode mode, uint8_t* y, void* scale_inv, ParallelFor parallel_for);

// Both 1-row quantizations of the row-major x [rows, cols] from the same reads: y [rows, cols] in
// 1 x row_block tiles along each row (scale_inv [rows, ceil(cols / row_block)]) and y_t [cols, rows],
// x's transpose, in 1 x col_block tiles along each column of x (scale_inv_t [cols, ceil(rows / col_block)]).
// Bit for bit block_quantize(x, 1, row_block) and block_quantize(x^T, 1, col_block); x is read twice
// (all tile amaxes, then both casts) instead of four times plus a transpose copy.
void block_quantize_transpose(const void* x, HpType x_type, int64_t rows, int64_t cols, int64_t row_block,
                              int64_t col_block, Fp8Format format, BlockScaleMode mode, uint8_t* y, void* scale_inv,
                              uint8_t* y_t, void* scale_inv_t, ParallelFor parallel_for);

// The part of block_quantize_transpose's outputs that rows [r0, r0 + strip_rows) of a [rows, cols] x give,
// from those rows alone (strip [strip_rows, cols] row-major, of x_type): their rows of y and scale_inv,
// their columns of y_t, and the column tile r0 / col_block of scale_inv_t. r0 is a multiple of col_block
// and the strip ends at the next one (or at rows), so the strip holds whole column tiles. Single-threaded:
// callers run strips in parallel (the fused norm, norm_fwd_block_fp8).
void block_quantize_transpose_strip(const void* strip, HpType x_type, int64_t r0, int64_t strip_rows, int64_t rows,
                                    int64_t cols, int64_t row_block, int64_t col_block, Fp8Format format,
                                    BlockScaleMode mode, uint8_t* y, void* scale_inv, uint8_t* y_t, void* scale_inv_t);

// c [batch, rows, n] = a [batch, rows, k] @ b [batch, n, k]^T per batch item, IEEE fp32, contiguous.
using BatchedMatmulNtFp32 =
    std::function<void(const float* a, const float* b, float* c, int64_t batch, int64_t rows, int64_t n, int64_t k)>;

// Storage of a GEMM operand's scale_inv: fp32 values or E8M0 codes (2^(code - 127), 255 = NaN).
enum class BlockScaleType : int { Fp32 = 0, E8m0 = 1 };

// One operand of block_scaled_gemm: row-major [rows, K] FP8 codes and its scale_inv,
// [ceil(rows / block_rows), ceil(K / block_k)] row-major.
struct BlockOperand {
  const uint8_t* data;
  Fp8Format format;
  const void* scale_inv;
  BlockScaleType scale_type;
  int64_t block_rows;
};

// out [M, N] = out_type(acc + bias) for a [M, K], b [N, K], where, over the K chunks c of block_k
// elements (the last may be shorter),
//   acc[m, n] = sum_c fp32(sum_{k in c} dec(a[m, k]) * dec(b[n, k])) * (sa[m / a.block_rows, c] * sb[n / b.block_rows, c])
// all in fp32: exact FP8 products summed in fp32 per chunk (the batched fp32 GEMM the glue hands in),
// multiplied by the product of the chunk's two scale_invs, accumulated over chunks in order.
// bias [N] (of out_type) or nullptr.
void block_scaled_gemm(const BlockOperand& a, const BlockOperand& b, int64_t M, int64_t N, int64_t K, int64_t block_k,
                       const void* bias, void* out, HpType out_type, const BatchedMatmulNtFp32& matmul,
                       ParallelFor parallel_for);

}  // namespace fp8mp::cpu
