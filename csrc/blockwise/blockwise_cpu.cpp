// CPU glue of the block-scaled ops: argument checks, allocation and registration around the
// torch-free kernels of blockwise_cpu_kernels.cpp, plus the batched fp32 GEMM they run the K chunks on.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <optional>

#include "blockwise/blockwise_checks.h"
#include "blockwise/blockwise_cpu_kernels.h"
#include "common/torch_glue.h"

namespace fp8mp {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// c [batch, rows, n] = a [batch, rows, k] @ b [batch, n, k]^T in fp32 (at::bmm: IEEE fp32 unless the
// user lowered torch's fp32 matmul precision).
void torch_bmm_nt_fp32(const float* a, const float* b, float* c, int64_t batch, int64_t rows, int64_t n, int64_t k) {
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  const at::Tensor a_t = at::from_blob(const_cast<float*>(a), {batch, rows, k}, f32);
  const at::Tensor b_t = at::from_blob(const_cast<float*>(b), {batch, n, k}, f32);
  at::Tensor c_t = at::from_blob(c, {batch, rows, n}, f32);
  at::bmm_out(c_t, a_t, b_t.transpose(1, 2));
}

std::tuple<at::Tensor, at::Tensor> block_quantize_cpu(const at::Tensor& x, int64_t block_rows, int64_t block_cols,
                                                      c10::string_view fmt, c10::string_view scale_mode) {
  const BlockQuantizeArgs args = check_block_quantize_args(x, block_rows, block_cols, fmt, scale_mode);
  const at::Tensor xc = x.contiguous();
  const int64_t rows = x.size(0), cols = x.size(1);
  at::Tensor y = at::empty({rows, cols}, x.options().dtype(fp8_dtype(args.format)));
  const auto scale_dtype = cpu::is_e8m0(args.mode) ? at::kFloat8_e8m0fnu : at::kFloat;
  at::Tensor scale_inv = at::empty({ceil_div(rows, block_rows), ceil_div(cols, block_cols)}, x.options().dtype(scale_dtype));
  cpu::block_quantize(xc.const_data_ptr(), hp_type(x.scalar_type()), rows, cols, block_rows, block_cols, args.format,
                      args.mode, reinterpret_cast<uint8_t*>(y.data_ptr()), scale_inv.data_ptr(), torch_parallel_for);
  return {y, scale_inv};
}

cpu::BlockOperand operand(const at::Tensor& data, Fp8Format format, const at::Tensor& scale_inv, int64_t block_rows) {
  const auto type = scale_inv.scalar_type() == at::kFloat ? cpu::BlockScaleType::Fp32 : cpu::BlockScaleType::E8m0;
  return {reinterpret_cast<const uint8_t*>(data.const_data_ptr()), format, scale_inv.const_data_ptr(), type, block_rows};
}

at::Tensor block_scaled_gemm_cpu(const at::Tensor& a, const at::Tensor& a_scale_inv, const at::Tensor& b,
                                 const at::Tensor& b_scale_inv, int64_t a_block_rows, int64_t b_block_rows,
                                 int64_t block_k, const std::optional<at::Tensor>& bias, at::ScalarType out_dtype) {
  const BlockGemmFormats formats = check_block_scaled_gemm_args(a, a_scale_inv, b, b_scale_inv, a_block_rows,
                                                                b_block_rows, block_k, bias, out_dtype);
  const at::Tensor ac = a.contiguous(), bc = b.contiguous();
  const at::Tensor sa = a_scale_inv.contiguous(), sb = b_scale_inv.contiguous();
  const at::Tensor bias_c = bias.has_value() ? bias->contiguous() : at::Tensor();
  at::Tensor out = at::empty({a.size(0), b.size(0)}, a.options().dtype(out_dtype));
  cpu::block_scaled_gemm(operand(ac, formats.a, sa, a_block_rows), operand(bc, formats.b, sb, b_block_rows), a.size(0),
                         b.size(0), a.size(1), block_k, bias_c.defined() ? bias_c.const_data_ptr() : nullptr,
                         out.mutable_data_ptr(), hp_type(out_dtype), torch_bmm_nt_fp32, torch_parallel_for);
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(fp8mp, CPU, m) {
  m.impl("block_quantize", &block_quantize_cpu);
  m.impl("block_scaled_gemm", &block_scaled_gemm_cpu);
}

}  // namespace fp8mp
