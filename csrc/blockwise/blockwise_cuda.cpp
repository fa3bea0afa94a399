// CUDA glue of the block-scaled ops (stable ABI): the argument checks the CPU runs (blockwise_checks.cpp),
// device guard, allocation (outputs and scratch from torch's caching allocator, on the stream the kernels
// run on) and registration around the torch-free kernels of blockwise_cuda_kernels.cu.
#include "blockwise/blockwise_cuda.h"

#include "blockwise/block_gemm_cuda_kernels.cuh"
#include "blockwise/blockwise_checks.h"
#include "blockwise/blockwise_cuda_kernels.cuh"
#include "common/stable_cuda.h"
#include "gemm/gemm_cuda_kernels.cuh"

namespace fp8mp {
namespace {

Tensor scratch_bytes_on(size_t bytes, const Tensor& like) { return empty_on({int64_t(bytes)}, kByte, like); }

}  // namespace

namespace cuda_glue {

std::tuple<Tensor, Tensor> block_quantize(Tensor x, int64_t block_rows, int64_t block_cols, std::string fmt,
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

std::tuple<Tensor, Tensor, Tensor, Tensor> block_quantize_transpose(Tensor x, int64_t row_block, int64_t col_block,
                                                                    std::string fmt, std::string scale_mode) {
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

Tensor block_scaled_gemm(Tensor a, Tensor a_scale_inv, Tensor b, Tensor b_scale_inv, int64_t a_block_rows,
                         int64_t b_block_rows, int64_t block_k, std::optional<Tensor> bias, ScalarType out_dtype) {
  const BlockGemmFormats formats = check_block_scaled_gemm_args(a, a_scale_inv, b, b_scale_inv, a_block_rows,
                                                                b_block_rows, block_k, bias, out_dtype);
  const bool a_e8m0 = a_scale_inv.scalar_type() != kFloat, b_e8m0 = b_scale_inv.scalar_type() != kFloat;
  const cuda::BlockGemmPlanChoice choice =
      cuda::block_gemm_recipe(a.size(1), a_block_rows, b_block_rows, block_k, a_e8m0, b_e8m0);
  FP8MP_CHECK(choice.why_not.empty(), choice.why_not);
  const auto guard = guard_device_of(a);
  const Tensor ac = as_contiguous(a), bc = as_contiguous(b);
  const Tensor sa = as_contiguous(a_scale_inv), sb = as_contiguous(b_scale_inv);
  const std::optional<Tensor> bias_c = bias.has_value() ? std::optional<Tensor>(as_contiguous(*bias)) : std::nullopt;
  Tensor out = empty_on({a.size(0), b.size(0)}, out_dtype, a);
  const auto operand = [](const Tensor& data, Fp8Format format, const Tensor& scale_inv, int64_t block_rows,
                          LtScaleLayout layout) {
    return cuda::BlockGemmOperand{static_cast<const uint8_t*>(data.const_data_ptr()), format,
                                  scale_inv.const_data_ptr(), data.size(0), block_rows, layout};
  };
  const cuda::BlockGemmArgs args{choice.recipe,
                                 operand(ac, formats.a, sa, a_block_rows, choice.a_layout),
                                 operand(bc, formats.b, sb, b_block_rows, choice.b_layout),
                                 a.size(1),
                                 block_k,
                                 bias_c.has_value() ? bias_c->const_data_ptr() : nullptr,
                                 out.mutable_data_ptr(),
                                 hp_type(out_dtype)};
  Tensor scratch = scratch_bytes_on(cuda::block_scaled_gemm_scratch_bytes(args), a);
  cuda::block_scaled_gemm(cuda::blaslt_handle_for_current_device(), args, scratch.mutable_data_ptr(),
                          current_cuda_stream(a));
  return out;
}

}  // namespace cuda_glue

STABLE_TORCH_LIBRARY_IMPL(fp8mp, CUDA, m) {
  m.impl("block_quantize", TORCH_BOX(&cuda_glue::block_quantize));
  m.impl("block_quantize_transpose", TORCH_BOX(&cuda_glue::block_quantize_transpose));
  m.impl("block_scaled_gemm", TORCH_BOX(&cuda_glue::block_scaled_gemm));
}

}  // namespace fp8mp
