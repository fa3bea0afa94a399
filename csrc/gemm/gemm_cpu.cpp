// CPU glue of fp8_gemm (stable ABI): argument checks, allocation and
// registration around the torch-free kernel of gemm_cpu_kernels.cpp, plus the
// fp32 GEMM it runs on.
//
// The fp32 GEMM of the fp32 path is torch_fp32_matmul.h's (IEEE fp32 whatever
// the user set for torch's fp32 matmuls, and outside torch.autocast).
// `use_fast_accum` selects a less precise accumulation
// inside Hopper's tensor cores; there is nothing to emulate on CPU, so it is
// accepted and ignored here.
#include <optional>

#include "common/stable.h"
#include "common/torch_fp32_matmul.h"
#include "gemm/gemm_checks.h"
#include "gemm/gemm_cpu_kernels.h"

namespace fp8mp {
namespace {

// c [rows, n] = a [rows, k] @ b [n, k]^T in IEEE fp32 (torch_fp32_matmul.h).
void matmul_nt_fp32(const float* a, const float* b, float* c, int64_t rows, int64_t n, int64_t k) {
  fp32_gemm_nt(a, b, c, 1, rows, n, k);
}

Tensor fp8_gemm_cpu(Tensor a, Tensor a_scale_inv, Tensor b, Tensor b_scale_inv, std::optional<Tensor> bias,
                    ScalarType out_dtype, bool use_fast_accum) {
  (void)use_fast_accum;  // see the top of the file
  const GemmFormats formats = check_fp8_gemm_args(a, a_scale_inv, b, b_scale_inv, bias, out_dtype);
  const int64_t M = a.size(0), K = a.size(1), N = b.size(0);
  Tensor out = empty_on({M, N}, out_dtype, a);
  const Tensor ac = as_contiguous(a), bc = as_contiguous(b);
  const std::optional<Tensor> bias_c = bias.has_value() ? std::optional<Tensor>(as_contiguous(*bias)) : std::nullopt;
  // One fp32 rounding, as in cuBLASLt's epilogue (alpha = scale_a * scale_b).
  const float scale = cpu_scalar(a_scale_inv) * cpu_scalar(b_scale_inv);
  cpu::fp8_gemm(static_cast<const uint8_t*>(ac.const_data_ptr()), formats.a,
                static_cast<const uint8_t*>(bc.const_data_ptr()), formats.b, M, N, K, scale,
                bias_c.has_value() ? bias_c->const_data_ptr() : nullptr, out.mutable_data_ptr(), hp_type(out_dtype),
                matmul_nt_fp32, stable_parallel_for, int(torch::stable::get_num_threads()));
  return out;
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(fp8mp, CPU, m) { m.impl("fp8_gemm", TORCH_BOX(&fp8_gemm_cpu)); }

}  // namespace fp8mp
