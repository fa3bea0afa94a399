// CPU glue of the block-scaled ops (stable ABI): argument checks, allocation and registration around the
// torch-free kernels of blockwise_cpu_kernels.cpp, plus the batched fp32 GEMM they run the K chunks on.
#include <optional>
#include <string>
#include <tuple>

#include "blockwise/blockwise_checks.h"
#include "blockwise/blockwise_cpu_kernels.h"
#include "common/stable.h"
#include "common/torch_fp32_matmul.h"

namespace fp8mp {
namespace {

std::tuple<Tensor, Tensor> block_quantize_cpu(Tensor x, int64_t block_rows, int64_t block_cols, std::string fmt,
                                              std::string scale_mode) {
  const BlockQuantizeArgs args = check_block_quantize_args(x, block_rows, block_cols, fmt, scale_mode);
  const Tensor xc = as_contiguous(x);
  const int64_t rows = x.size(0), cols = x.size(1);
  auto [y, scale_inv] = empty_block_quantized(x, rows, cols, block_rows, block_cols, args);
  cpu::block_quantize(xc.const_data_ptr(), hp_type(x.scalar_type()), rows, cols, block_rows, block_cols, args.format,
                      args.mode, static_cast<uint8_t*>(y.mutable_data_ptr()), scale_inv.mutable_data_ptr(),
                      stable_parallel_for);
  return {y, scale_inv};
}

std::tuple<Tensor, Tensor, Tensor, Tensor> block_quantize_transpose_cpu(Tensor x, int64_t row_block, int64_t col_block,
                                                                        std::string fmt, std::string scale_mode) {
  const BlockQuantizeArgs args = check_block_quantize_transpose_args(x, row_block, col_block, fmt, scale_mode);
  const Tensor xc = as_contiguous(x);
  const int64_t rows = x.size(0), cols = x.size(1);
  auto [y, scale_inv] = empty_block_quantized(x, rows, cols, 1, row_block, args);
  auto [y_t, scale_inv_t] = empty_block_quantized(x, cols, rows, 1, col_block, args);
  cpu::block_quantize_transpose(xc.const_data_ptr(), hp_type(x.scalar_type()), rows, cols, row_block, col_block,
                                args.format, args.mode, static_cast<uint8_t*>(y.mutable_data_ptr()),
                                scale_inv.mutable_data_ptr(), static_cast<uint8_t*>(y_t.mutable_data_ptr()),
                                scale_inv_t.mutable_data_ptr(), stable_parallel_for);
  return {y, scale_inv, y_t, scale_inv_t};
}

cpu::BlockOperand operand(const Tensor& data, Fp8Format format, const Tensor& scale_inv, int64_t block_rows) {
  const auto type = scale_inv.scalar_type() == kFloat ? cpu::BlockScaleType::Fp32 : cpu::BlockScaleType::E8m0;
  return {static_cast<const uint8_t*>(data.const_data_ptr()), format, scale_inv.const_data_ptr(), type, block_rows};
}

Tensor block_scaled_gemm_cpu(Tensor a, Tensor a_scale_inv, Tensor b, Tensor b_scale_inv, int64_t a_block_rows,
                             int64_t b_block_rows, int64_t block_k, std::optional<Tensor> bias, ScalarType out_dtype) {
  const BlockGemmFormats formats = check_block_scaled_gemm_args(a, a_scale_inv, b, b_scale_inv, a_block_rows,
                                                                b_block_rows, block_k, bias, out_dtype);
  const Tensor ac = as_contiguous(a), bc = as_contiguous(b);
  const Tensor sa = as_contiguous(a_scale_inv), sb = as_contiguous(b_scale_inv);
  const std::optional<Tensor> bias_c = bias.has_value() ? std::optional<Tensor>(as_contiguous(*bias)) : std::nullopt;
  Tensor out = empty_on({a.size(0), b.size(0)}, out_dtype, a);
  cpu::block_scaled_gemm(operand(ac, formats.a, sa, a_block_rows), operand(bc, formats.b, sb, b_block_rows), a.size(0),
                         b.size(0), a.size(1), block_k, bias_c.has_value() ? bias_c->const_data_ptr() : nullptr,
                         out.mutable_data_ptr(), hp_type(out_dtype), fp32_gemm_nt, stable_parallel_for);
  return out;
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(fp8mp, CPU, m) {
  m.impl("block_quantize", TORCH_BOX(&block_quantize_cpu));
  m.impl("block_quantize_transpose", TORCH_BOX(&block_quantize_transpose_cpu));
  m.impl("block_scaled_gemm", TORCH_BOX(&block_scaled_gemm_cpu));
}

}  // namespace fp8mp
