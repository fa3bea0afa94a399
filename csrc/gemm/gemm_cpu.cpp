// CPU glue of fp8_gemm: argument checks, allocation and registration around the
// torch-free kernel of gemm_cpu_kernels.cpp, plus the fp32 GEMM it runs on.
//
// The fp32 GEMM is oneDNN's inner product (torch's mkldnn::_linear_pointwise,
// which takes b as [N, K] as it is), about twice as fast as at::mm's MKL sgemm
// on AMD CPUs; at::mm where torch lacks oneDNN. Both are IEEE fp32 unless the
// user lowered torch's fp32 matmul precision. `use_fast_accum` selects a less
// precise accumulation inside Hopper's tensor cores; there is nothing to
// emulate on CPU, so it is accepted and ignored here.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <optional>

#include "common/torch_glue.h"
#include "gemm/gemm_checks.h"
#include "gemm/gemm_cpu_kernels.h"

namespace fp8mp {
namespace {

// a [M, K] @ b [N, K]^T in fp32.
at::Tensor matmul_nt_fp32(const at::Tensor& a, const at::Tensor& b) {
  using LinearFn = at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, c10::string_view,
                              c10::List<std::optional<at::Scalar>>, std::optional<c10::string_view>);
  static const std::optional<c10::TypedOperatorHandle<LinearFn>> onednn_linear =
      []() -> std::optional<c10::TypedOperatorHandle<LinearFn>> {
    const auto handle = c10::Dispatcher::singleton().findOp({"mkldnn::_linear_pointwise", ""});
    if (!handle.has_value() || !at::hasMKLDNN()) return std::nullopt;
    return handle->typed<LinearFn>();
  }();
  if (onednn_linear.has_value() && at::globalContext().userEnabledMkldnn()) {
    return onednn_linear->call(a, b, std::nullopt, "none", c10::List<std::optional<at::Scalar>>(), std::nullopt);
  }
  return at::mm(a, b.t());
}

void torch_matmul_nt_fp32(const float* a, const float* b, float* c, int64_t rows, int64_t n, int64_t k) {
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  const at::Tensor a_t = at::from_blob(const_cast<float*>(a), {rows, k}, f32);
  const at::Tensor b_t = at::from_blob(const_cast<float*>(b), {n, k}, f32);
  at::from_blob(c, {rows, n}, f32).copy_(matmul_nt_fp32(a_t, b_t));
}

at::Tensor fp8_gemm_cpu(const at::Tensor& a, const at::Tensor& a_scale_inv, const at::Tensor& b,
                        const at::Tensor& b_scale_inv, const std::optional<at::Tensor>& bias, at::ScalarType out_dtype,
                        bool use_fast_accum) {
  (void)use_fast_accum;  // see the top of the file
  const GemmFormats formats = check_fp8_gemm_args(a, a_scale_inv, b, b_scale_inv, bias, out_dtype);
  const int64_t M = a.size(0), K = a.size(1), N = b.size(0);
  at::Tensor out = at::empty({M, N}, a.options().dtype(out_dtype));
  const at::Tensor ac = a.contiguous(), bc = b.contiguous();
  const at::Tensor bias_c = bias.has_value() ? bias->contiguous() : at::Tensor();
  // One fp32 rounding, as in cuBLASLt's epilogue (alpha = scale_a * scale_b).
  const float scale = a_scale_inv.item<float>() * b_scale_inv.item<float>();
  cpu::fp8_gemm(reinterpret_cast<const uint8_t*>(ac.const_data_ptr()), formats.a,
                reinterpret_cast<const uint8_t*>(bc.const_data_ptr()), formats.b, M, N, K, scale,
                bias_c.defined() ? bias_c.const_data_ptr() : nullptr, out.mutable_data_ptr(), hp_type(out_dtype),
                torch_matmul_nt_fp32, torch_parallel_for);
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(fp8mp, CPU, m) { m.impl("fp8_gemm", &fp8_gemm_cpu); }

}  // namespace fp8mp
