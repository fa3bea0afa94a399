// The CUDA kernels of the block-scaled ops, torch-free: contiguous device buffers, launched on `stream`
// on the current device. blockwise_cuda.cpp is their torch glue (checks, allocation, registration).
//
// The outputs are bit for bit those of the CPU kernels (blockwise_cpu_kernels.h): both devices turn a
// tile's amax into its scale and encode each element through block_scale_rule.h, and an amax is a max,
// exact in any order (taken here over |x|'s bits, which order like the values, NaN above Inf).
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "blockwise/block_scale_rule.h"
#include "common/fp8_format.h"
#include "common/half_types.h"

namespace fp8mp::cuda {

// Device scratch (bytes) block_quantize needs: one 32-bit word per tile.
size_t block_quantize_scratch_bytes(int64_t rows, int64_t cols, int64_t block_rows, int64_t block_cols);

// block_quantize of the CPU (same arguments, same outputs); scratch of block_quantize_scratch_bytes.
void block_quantize(const void* x, HpType x_type, int64_t rows, int64_t cols, int64_t block_rows, int64_t block_cols,
                    Fp8Format format, BlockScaleMode mode, uint8_t* y, void* scale_inv, void* scratch,
                    cudaStream_t stream);

// Device scratch (bytes) block_quantize_transpose needs: one 32-bit word per tile of either layout.
size_t block_quantize_transpose_scratch_bytes(int64_t rows, int64_t cols, int64_t row_block, int64_t col_block);

// block_quantize_transpose of the CPU; scratch of block_quantize_transpose_scratch_bytes.
void block_quantize_transpose(const void* x, HpType x_type, int64_t rows, int64_t cols, int64_t row_block,
                              int64_t col_block, Fp8Format format, BlockScaleMode mode, uint8_t* y, void* scale_inv,
                              uint8_t* y_t, void* scale_inv_t, void* scratch, cudaStream_t stream);

}  // namespace fp8mp::cuda
