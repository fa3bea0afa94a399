// CUDA glue of the block-scaled ops (stable ABI): the argument checks the CPU runs (blockwise_checks.cpp),
// device guard, allocation (outputs and scratch from torch's caching allocator, on the stream the kernels
// run on) and registration around the torch-free kernels of blockwise_cuda_kernels.cu.
#include <string>
#include <tuple>

#include "blockwise/blockwise_checks.h"
#include "blockwise/blockwise_cuda_kernels.cuh"
#include "common/stable_cuda.h"

namespace fp8mp {
namespace {

Tensor scratch_bytes_on(size_t bytes, const Tensor& like) { return empty_on({int64_t(bytes)}, kByte, like); }

std::tuple<Tensor, Tensor> block_quantize_cuda(Tensor x, int64_t block_rows, int64_t block_cols, std::string fmt,
                                               std::string scale_mode) {
  const BlockQuantizeArgs args = check_block_quantize_args(x, block_rows, block_cols, fmt, scale_mode);
  const auto guard = guard_device_of(x);
  const Tensor xc = as_contiguous(x);
  const int64_t rows = x.size(0), cols = x.size(1);
  auto [y, scale_inv] = empty_block_quantized(x, rows, cols, block_rows, block_cols, args);
  Tensor scratch = scratch_bytes_on(cuda::block_quantize_scratch_bytes(rows, cols, block_rows, block_cols), x);
  cuda::block_quantize(xc.const_data_ptr(), hp_type(x.scalar_type()), rows, cols, block_rows, block_cols, args.format,
                       args.mode, static_cast<uint8_t*>(y.mutable_data_ptr()), scale_inv.mutable_data_ptr(),
                       scratch.mutable_data_ptr(), current_cuda_stream(x));
  return {y, scale_inv};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> block_quantize_transpose_cuda(Tensor x, int64_t row_block,
                                                                         int64_t col_block, std::string fmt,
                                                                         std::string scale_mode) {
  const BlockQuantizeArgs args = check_block_quantize_transpose_args(x, row_block, col_block, fmt, scale_mode);
  const auto guard = guard_device_of(x);
  const Tensor xc = as_contiguous(x);
  const int64_t rows = x.size(0), cols = x.size(1);
  auto [y, scale_inv] = empty_block_quantized(x, rows, cols, 1, row_block, args);
  auto [y_t, scale_inv_t] = empty_block_quantized(x, cols, rows, 1, col_block, args);
  Tensor scratch =
      scratch_bytes_on(cuda::block_quantize_transpose_scratch_bytes(rows, cols, row_block, col_block), x);
  cuda::block_quantize_transpose(xc.const_data_ptr(), hp_type(x.scalar_type()), rows, cols, row_block, col_block,
                                 args.format, args.mode, static_cast<uint8_t*>(y.mutable_data_ptr()),
                                 scale_inv.mutable_data_ptr(), static_cast<uint8_t*>(y_t.mutable_data_ptr()),
                                 scale_inv_t.mutable_data_ptr(), scratch.mutable_data_ptr(), current_cuda_stream(x));
  return {y, scale_inv, y_t, scale_inv_t};
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(fp8mp, CUDA, m) {
  m.impl("block_quantize", TORCH_BOX(&block_quantize_cuda));
  m.impl("block_quantize_transpose", TORCH_BOX(&block_quantize_transpose_cuda));
}

}  // namespace fp8mp
