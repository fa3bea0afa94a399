// CPU glue of fp8_grouped_gemm, fp8_grouped_gemm_wgrad, block_scaled_grouped_gemm and its wgrad (stable ABI): argument
// checks (offs read on the host), allocation and registration around grouped_gemm_cpu_kernels.cpp, with the fp32
// GEMM fp8_gemm's fp32 path runs on (torch_fp32_matmul.h).
#include <optional>

#include "common/stable.h"
#include "common/torch_fp32_matmul.h"
#include "grouped_gemm/grouped_gemm_checks.h"
#include "grouped_gemm/grouped_gemm_cpu_kernels.h"

namespace fp8mp {
namespace {

void matmul_nt_fp32(const float* a, const float* b, float* c, int64_t rows, int64_t n, int64_t k) {
  fp32_gemm_nt(a, b, c, 1, rows, n, k);
}

const uint8_t* codes(const Tensor& t) { return static_cast<const uint8_t*>(t.const_data_ptr()); }

// offs contiguous, its values checked against `total`; the tensor returned keeps them alive for the kernel.
Tensor checked_offsets(const Tensor& offs, int64_t total, const char* total_name, const char* op) {
  Tensor offs_c = as_contiguous(offs);
  check_group_offsets(static_cast<const int32_t*>(offs_c.const_data_ptr()), offs.size(0), total, total_name, op);
  return offs_c;
}

Tensor fp8_grouped_gemm_cpu(Tensor a, Tensor a_scale_inv, Tensor b, Tensor b_scale_inv, Tensor offs,
                            std::optional<Tensor> bias, ScalarType out_dtype, bool use_fast_accum) {
  (void)use_fast_accum;  // a Hopper tensor-core setting; nothing to emulate on CPU (as fp8_gemm)
  constexpr const char* op = "fp8mp::fp8_grouped_gemm";
  const GroupedGemmFormats formats =
      check_fp8_grouped_gemm_args(a, a_scale_inv, b, b_scale_inv, offs, bias, out_dtype);
  const int64_t M = a.size(0), K = a.size(1), G = b.size(0), N = b.size(1);
  const Tensor offs_c = checked_offsets(offs, M, "a.size(0)", op);
  const int32_t* offs_p = static_cast<const int32_t*>(offs_c.const_data_ptr());
  Tensor out = empty_on({M, N}, out_dtype, a);
  const Tensor ac = as_contiguous(a), bc = as_contiguous(b), sb = as_contiguous(b_scale_inv);
  const std::optional<Tensor> bias_c = bias.has_value() ? std::optional<Tensor>(as_contiguous(*bias)) : std::nullopt;
  cpu::fp8_grouped_gemm(codes(ac), formats.a, codes(bc), formats.b, offs_p, G, N, K, cpu_scalar(a_scale_inv),
                        static_cast<const float*>(sb.const_data_ptr()),
                        bias_c.has_value() ? bias_c->const_data_ptr() : nullptr, out.mutable_data_ptr(),
                        hp_type(out_dtype), matmul_nt_fp32, stable_parallel_for,
                        int(torch::stable::get_num_threads()));
  return out;
}

Tensor fp8_grouped_gemm_wgrad_cpu(Tensor a, Tensor a_scale_inv, Tensor b, Tensor b_scale_inv, Tensor offs,
                                  ScalarType out_dtype, bool use_fast_accum) {
  (void)use_fast_accum;
  constexpr const char* op = "fp8mp::fp8_grouped_gemm_wgrad";
  const GroupedGemmFormats formats = check_fp8_grouped_gemm_wgrad_args(a, a_scale_inv, b, b_scale_inv, offs, out_dtype);
  const int64_t N = a.size(0), T = a.size(1), K = b.size(0), G = offs.size(0);
  const Tensor offs_c = checked_offsets(offs, T, "a.size(1)", op);
  const int32_t* offs_p = static_cast<const int32_t*>(offs_c.const_data_ptr());
  Tensor out = empty_on({G, N, K}, out_dtype, a);
  const Tensor ac = as_contiguous(a), bc = as_contiguous(b);
  const float scale = cpu_scalar(a_scale_inv) * cpu_scalar(b_scale_inv);
  cpu::fp8_grouped_gemm_wgrad(codes(ac), formats.a, codes(bc), formats.b, offs_p, G, N, K, T, scale,
                              out.mutable_data_ptr(), hp_type(out_dtype), matmul_nt_fp32, stable_parallel_for,
                              int(torch::stable::get_num_threads()));
  return out;
}

cpu::BlockOperand block_operand(const Tensor& data, Fp8Format format, const Tensor& scale_inv, int64_t block_rows) {
  const auto type = scale_inv.scalar_type() == kFloat ? cpu::BlockScaleType::Fp32 : cpu::BlockScaleType::E8m0;
  return {codes(data), format, scale_inv.const_data_ptr(), type, block_rows};
}

Tensor block_scaled_grouped_gemm_cpu(Tensor a, Tensor a_scale_inv, Tensor b, Tensor b_scale_inv, Tensor offs,
                                     int64_t a_block_rows, int64_t b_block_rows, int64_t block_k,
                                     std::optional<Tensor> bias, ScalarType out_dtype) {
  constexpr const char* op = "fp8mp::block_scaled_grouped_gemm";
  const GroupedGemmFormats formats = check_block_scaled_grouped_gemm_args(
      a, a_scale_inv, b, b_scale_inv, offs, a_block_rows, b_block_rows, block_k, bias, out_dtype);
  const int64_t M = a.size(0), K = a.size(1), G = b.size(0), N = b.size(1);
  const Tensor offs_c = checked_offsets(offs, M, "a.size(0)", op);
  const int32_t* offs_p = static_cast<const int32_t*>(offs_c.const_data_ptr());
  Tensor out = empty_on({M, N}, out_dtype, a);
  const Tensor ac = as_contiguous(a), bc = as_contiguous(b);
  const Tensor sa = as_contiguous(a_scale_inv), sb = as_contiguous(b_scale_inv);
  const std::optional<Tensor> bias_c = bias.has_value() ? std::optional<Tensor>(as_contiguous(*bias)) : std::nullopt;
  cpu::block_scaled_grouped_gemm(block_operand(ac, formats.a, sa, a_block_rows),
                                 block_operand(bc, formats.b, sb, b_block_rows), offs_p, G, N, K, block_k,
                                 bias_c.has_value() ? bias_c->const_data_ptr() : nullptr, out.mutable_data_ptr(),
                                 hp_type(out_dtype), fp32_gemm_nt, stable_parallel_for);
  return out;
}

Tensor block_scaled_grouped_gemm_wgrad_cpu(Tensor a, Tensor a_scale_inv, Tensor b, Tensor b_scale_inv, Tensor offs,
                                           int64_t block_k, ScalarType out_dtype) {
  constexpr const char* op = "fp8mp::block_scaled_grouped_gemm_wgrad";
  const BlockWgradShape s =
      check_block_scaled_grouped_gemm_wgrad_args(a, a_scale_inv, b, b_scale_inv, offs, block_k, out_dtype);
  const Tensor offs_c = checked_offsets(offs, s.T, "a.size(1)", op);
  const int32_t* offs_p = static_cast<const int32_t*>(offs_c.const_data_ptr());
  check_group_chunks(offs_p, s.G, block_k, s.C, op);
  Tensor out = empty_on({s.G, s.N, s.K}, out_dtype, a);
  const Tensor ac = as_contiguous(a), bc = as_contiguous(b);
  const Tensor sa = as_contiguous(a_scale_inv), sb = as_contiguous(b_scale_inv);
  cpu::block_scaled_grouped_gemm_wgrad(block_operand(ac, s.formats.a, sa, 1), block_operand(bc, s.formats.b, sb, 1),
                                       offs_p, s.G, s.N, s.K, s.T, s.C, block_k, out.mutable_data_ptr(),
                                       hp_type(out_dtype), fp32_gemm_nt, stable_parallel_for);
  return out;
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(fp8mp, CPU, m) {
  m.impl("fp8_grouped_gemm", TORCH_BOX(&fp8_grouped_gemm_cpu));
  m.impl("fp8_grouped_gemm_wgrad", TORCH_BOX(&fp8_grouped_gemm_wgrad_cpu));
  m.impl("block_scaled_grouped_gemm", TORCH_BOX(&block_scaled_grouped_gemm_cpu));
  m.impl("block_scaled_grouped_gemm_wgrad", TORCH_BOX(&block_scaled_grouped_gemm_wgrad_cpu));
}

}  // namespace fp8mp
