// CPU glue of fp8_gemm (stable ABI): argument checks, allocation and
// registration around the torch-free kernel of gemm_cpu_kernels.cpp, plus the
// fp32 GEMM it runs on.
//
// The fp32 GEMM is oneDNN's inner product (torch's mkldnn::_linear_pointwise,
// which takes b as [N, K] as it is, called through the stable dispatcher
// shim), about twice as fast as aten::mm's MKL sgemm on AMD CPUs; aten::bmm.out
// where torch lacks oneDNN (torch_fp32_matmul.h; torch.autocast has a kernel for
// neither op, so an FP8 GEMM under autocast stays fp32). Both are IEEE fp32 unless the user lowered torch's
// fp32 matmul precision. `use_fast_accum` selects a less precise accumulation
// inside Hopper's tensor cores; there is nothing to emulate on CPU, so it is
// accepted and ignored here.
#include <array>
#include <atomic>
#include <optional>

#include "common/stable.h"
#include "common/torch_fp32_matmul.h"
#include "gemm/gemm_checks.h"
#include "gemm/gemm_cpu_kernels.h"

namespace fp8mp {
namespace {

using torch::stable::detail::from;
using torch::stable::detail::to;

// oneDNN's linear, or nothing when this torch has no mkldnn::_linear_pointwise.
std::optional<Tensor> onednn_linear(const Tensor& a, const Tensor& b) {
  std::array<StableIValue, 6> stack{from(a), from(b), from(std::nullopt), from(std::string("none")),
                                    from(std::vector<int64_t>{}), from(std::nullopt)};
  if (torch_call_dispatcher("mkldnn::_linear_pointwise", "", stack.data(), TORCH_ABI_VERSION) != AOTI_TORCH_SUCCESS) {
    return std::nullopt;
  }
  return to<Tensor>(stack[0]);
}

// c [rows, n] = a [rows, k] @ b [n, k]^T in fp32, through torch.
void torch_matmul_nt_fp32(const float* a, const float* b, float* c, int64_t rows, int64_t n, int64_t k) {
  static std::atomic<bool> use_onednn{true};  // until this torch says it has no mkldnn::_linear_pointwise
  const Device cpu(torch::headeronly::DeviceType::CPU);
  const Tensor a_t = torch::stable::from_blob(const_cast<float*>(a), {rows, k}, {k, 1}, cpu, kFloat);
  const Tensor b_t = torch::stable::from_blob(const_cast<float*>(b), {n, k}, {k, 1}, cpu, kFloat);
  Tensor c_t = torch::stable::from_blob(c, {rows, n}, {n, 1}, cpu, kFloat);
  std::optional<Tensor> product = use_onednn.load() ? onednn_linear(a_t, b_t) : std::nullopt;
  if (!product.has_value()) {
    use_onednn.store(false);
    torch_bmm_nt_fp32(a, b, c, 1, rows, n, k);
    return;
  }
  torch::stable::copy_(c_t, *product);
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
                torch_matmul_nt_fp32, stable_parallel_for);
  return out;
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(fp8mp, CPU, m) { m.impl("fp8_gemm", TORCH_BOX(&fp8_gemm_cpu)); }

}  // namespace fp8mp
