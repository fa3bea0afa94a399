#include "common/torch_fp32_matmul.h"

#include <array>
#include <atomic>
#include <optional>

#include "common/cpu_features.h"
#include "common/process_symbols.h"
#include "common/stable.h"

namespace fp8mp {
namespace {

using torch::stable::detail::from;
using torch::stable::detail::to;

// MKL's Fortran sgemm (column-major; LP64: 32-bit integers), as torch's libtorch_cpu exports it.
using SgemmLp64 = void (*)(const char* transa, const char* transb, const int* m, const int* n, const int* k,
                           const float* alpha, const float* a, const int* lda, const float* b, const int* ldb,
                           const float* beta, float* c, const int* ldc);
constexpr int64_t kMaxLp64 = (int64_t(1) << 31) - 1;

// MKL's sgemm on Intel CPUs and where the CPU has bf16 matrix units (see the header), else nullptr.
SgemmLp64 mkl_sgemm() {
  static const SgemmLp64 sgemm = []() -> SgemmLp64 {
    const cpu::CpuFeatures& f = cpu::cpu_features();
    if (!f.intel && !f.avx512_bf16 && !f.amx_bf16) return nullptr;
    return reinterpret_cast<SgemmLp64>(find_process_symbol("sgemm_"));
  }();
  return sgemm;
}

// Row-major c [rows, n] = a [rows, k] @ b [n, k]^T is column-major c^T [n, rows] = b^T' [n, k] @ a^T [k, rows],
// where MKL sees b's memory as the column-major [k, n] matrix (transposed back with 'T') and a's as [k, rows].
void sgemm_nt(SgemmLp64 sgemm, const float* a, const float* b, float* c, int64_t rows, int64_t n, int64_t k) {
  const int m32 = int(n), n32 = int(rows), k32 = int(k);
  const float one = 1.0f, zero = 0.0f;
  sgemm("T", "N", &m32, &n32, &k32, &one, b, &k32, a, &k32, &zero, c, &m32);
}

// oneDNN's linear, or nothing when this torch has no mkldnn::_linear_pointwise.
std::optional<Tensor> onednn_linear(const Tensor& a, const Tensor& b) {
  std::array<StableIValue, 6> stack{from(a), from(b), from(std::nullopt), from(std::string("none")),
                                    from(std::vector<int64_t>{}), from(std::nullopt)};
  if (torch_call_dispatcher("mkldnn::_linear_pointwise", "", stack.data(), TORCH_ABI_VERSION) != AOTI_TORCH_SUCCESS) {
    return std::nullopt;
  }
  return to<Tensor>(stack[0]);
}

void bmm_out(const float* a, const float* b, float* c, int64_t batch, int64_t rows, int64_t n, int64_t k) {
  const Device cpu(torch::headeronly::DeviceType::CPU);
  const Tensor a_t = torch::stable::from_blob(const_cast<float*>(a), {batch, rows, k}, {rows * k, k, 1}, cpu, kFloat);
  const Tensor b_t = torch::stable::from_blob(const_cast<float*>(b), {batch, n, k}, {n * k, k, 1}, cpu, kFloat);
  const Tensor c_t = torch::stable::from_blob(c, {batch, rows, n}, {rows * n, n, 1}, cpu, kFloat);
  std::array<StableIValue, 3> stack{from(a_t), from(torch::stable::transpose(b_t, 1, 2)), from(c_t)};
  FP8MP_CHECK(torch_call_dispatcher("aten::bmm", "out", stack.data(), TORCH_ABI_VERSION) == AOTI_TORCH_SUCCESS,
              "fp8mp: aten::bmm.out failed in the CPU fp32 GEMM");
}

}  // namespace

void fp32_gemm_nt(const float* a, const float* b, float* c, int64_t batch, int64_t rows, int64_t n, int64_t k) {
  if (const SgemmLp64 sgemm = mkl_sgemm(); sgemm != nullptr && rows <= kMaxLp64 && n <= kMaxLp64 && k <= kMaxLp64) {
    for (int64_t i = 0; i < batch; ++i) sgemm_nt(sgemm, a + i * rows * k, b + i * n * k, c + i * rows * n, rows, n, k);
    return;
  }
  static std::atomic<bool> use_onednn{true};  // until this torch says it has no mkldnn::_linear_pointwise
  if (batch == 1 && use_onednn.load()) {
    const Device cpu(torch::headeronly::DeviceType::CPU);
    const Tensor a_t = torch::stable::from_blob(const_cast<float*>(a), {rows, k}, {k, 1}, cpu, kFloat);
    const Tensor b_t = torch::stable::from_blob(const_cast<float*>(b), {n, k}, {k, 1}, cpu, kFloat);
    if (const std::optional<Tensor> product = onednn_linear(a_t, b_t); product.has_value()) {
      Tensor c_t = torch::stable::from_blob(c, {rows, n}, {n, 1}, cpu, kFloat);
      torch::stable::copy_(c_t, *product);
      return;
    }
    use_onednn.store(false);
  }
  bmm_out(a, b, c, batch, rows, n, k);
}

}  // namespace fp8mp
