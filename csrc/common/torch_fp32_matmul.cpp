#include "common/torch_fp32_matmul.h"

#include <algorithm>
#include <array>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <vector>

#include "common/cpu_features.h"
#include "common/process_symbols.h"
#include "common/stable.h"

namespace fp8mp {
namespace {

using torch::stable::detail::from;
using torch::stable::detail::to;

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "the sgemm_ call below passes 64-bit integer words");

// MKL's Fortran sgemm (column-major), as torch's libtorch_cpu exports it. Its integers are 32-bit in an
// LP64 build of MKL and 64-bit in an ILP64 one, and nothing in the symbol says which: each integer is
// passed as a zero-extended 64-bit word, which both read as the same number (the LP64 build reads its
// low half) as long as it fits in 31 bits.
using Sgemm = void (*)(const char* transa, const char* transb, const int64_t* m, const int64_t* n, const int64_t* k,
                       const float* alpha, const float* a, const int64_t* lda, const float* b, const int64_t* ldb,
                       const float* beta, float* c, const int64_t* ldc);
constexpr int64_t kMaxInt32 = (int64_t(1) << 31) - 1;

// Row-major c [rows, n] = a [rows, k] @ b [n, k]^T is column-major c^T [n, rows] = b^T' [n, k] @ a^T [k, rows],
// where MKL sees b's memory as the column-major [k, n] matrix (transposed back with 'T') and a's as [k, rows].
void sgemm_nt(Sgemm sgemm, const float* a, const float* b, float* c, int64_t rows, int64_t n, int64_t k) {
  const int64_t m64 = n, n64 = rows, k64 = k;
  const float one = 1.0f, zero = 0.0f;
  sgemm("T", "N", &m64, &n64, &k64, &one, b, &k64, a, &k64, &zero, c, &m64);
}

// A GEMM found by name (MKL's sgemm_, oneDNN's mkldnn::_linear_pointwise) is trusted only after it gives
// the right answer on this product, computed once at first use: a [2, 3] @ b [4, 3]^T. Every entry is
// different (a transposed or misread operand gives other sums), a's entries need 13 significant bits (a
// GEMM that rounds its operands to bf16, 8 bits, gets them wrong) and every product and sum is exact in
// fp32, so the right answer is known bit for bit.
constexpr int64_t kProbeRows = 2, kProbeN = 4, kProbeK = 3;
constexpr std::array<float, kProbeRows * kProbeK> kProbeA{1.0f + 0x1p-12f, 2.0f, 3.0f - 0x1p-11f,
                                                          -4.0f, 5.0f + 0x1p-10f, 6.0f};
constexpr std::array<float, kProbeN * kProbeK> kProbeB{1.0f, 0.0f, 0.0f, 0.0f, 1.0f, 0.0f,
                                                       0.0f, 0.0f, 2.0f, 3.0f, -1.0f, 4.0f};

template <typename Gemm>
bool gives_the_probe_product(Gemm&& gemm) {
  std::array<float, kProbeRows * kProbeN> c;
  c.fill(-1.0f);
  if (!gemm(kProbeA.data(), kProbeB.data(), c.data())) return false;
  for (int64_t r = 0; r < kProbeRows; ++r) {
    for (int64_t j = 0; j < kProbeN; ++j) {
      double want = 0.0;
      for (int64_t i = 0; i < kProbeK; ++i) want += double(kProbeA[r * kProbeK + i]) * double(kProbeB[j * kProbeK + i]);
      if (double(c[r * kProbeN + j]) != want) return false;
    }
  }
  return true;
}

// oneDNN's linear, or nothing when this torch has no mkldnn::_linear_pointwise or its result is not [rows, n]
// float32.
std::optional<Tensor> onednn_linear(const Tensor& a, const Tensor& b) {
  std::array<StableIValue, 6> stack{from(a), from(b), from(std::nullopt), from(std::string("none")),
                                    from(std::vector<int64_t>{}), from(std::nullopt)};
  if (torch_call_dispatcher("mkldnn::_linear_pointwise", "", stack.data(), TORCH_ABI_VERSION) != AOTI_TORCH_SUCCESS) {
    return std::nullopt;
  }
  Tensor product = to<Tensor>(stack[0]);
  if (product.dim() != 2 || product.size(0) != a.size(0) || product.size(1) != b.size(0) ||
      product.scalar_type() != kFloat) {
    return std::nullopt;
  }
  return product;
}

const Device kCpu(torch::headeronly::DeviceType::CPU);

bool onednn_gemm_nt(const float* a, const float* b, float* c, int64_t rows, int64_t n, int64_t k) {
  const Tensor a_t = torch::stable::from_blob(const_cast<float*>(a), {rows, k}, {k, 1}, kCpu, kFloat);
  const Tensor b_t = torch::stable::from_blob(const_cast<float*>(b), {n, k}, {k, 1}, kCpu, kFloat);
  const std::optional<Tensor> product = onednn_linear(a_t, b_t);
  if (!product.has_value()) return false;
  Tensor c_t = torch::stable::from_blob(c, {rows, n}, {n, 1}, kCpu, kFloat);
  torch::stable::copy_(c_t, *product);
  return true;
}

void bmm_out(const float* a, const float* b, float* c, int64_t batch, int64_t rows, int64_t n, int64_t k) {
  const Tensor a_t = torch::stable::from_blob(const_cast<float*>(a), {batch, rows, k}, {rows * k, k, 1}, kCpu, kFloat);
  const Tensor b_t = torch::stable::from_blob(const_cast<float*>(b), {batch, n, k}, {n * k, k, 1}, kCpu, kFloat);
  const Tensor c_t = torch::stable::from_blob(c, {batch, rows, n}, {rows * n, n, 1}, kCpu, kFloat);
  std::array<StableIValue, 3> stack{from(a_t), from(torch::stable::transpose(b_t, 1, 2)), from(c_t)};
  FP8MP_CHECK(torch_call_dispatcher("aten::bmm", "out", stack.data(), TORCH_ABI_VERSION) == AOTI_TORCH_SUCCESS,
              "fp8mp: aten::bmm.out failed in the CPU fp32 GEMM");
}

// fp8mp's own fp32 GEMM: each output element one fp32 sum in k order, 16 columns of c at a time from a packed
// copy of their b rows (16 independent sums the compiler vectorizes, none reassociated). Slower than MKL's;
// the route where neither torch GEMM found by name answers right on a CPU with bf16 units, whose aten GEMMs
// follow the user's torch.backends.mkldnn.matmul.fp32_precision and would round the operands to bf16.
void own_gemm_nt(const float* a, const float* b, float* c, int64_t batch, int64_t rows, int64_t n, int64_t k) {
  constexpr int64_t kCols = 16;
  std::vector<float> packed(size_t(k * kCols));
  for (int64_t i = 0; i < batch; ++i) {
    const float* ai = a + i * rows * k;
    const float* bi = b + i * n * k;
    float* ci = c + i * rows * n;
    for (int64_t j0 = 0; j0 < n; j0 += kCols) {
      const int64_t cols = std::min(kCols, n - j0);
      for (int64_t p = 0; p < k; ++p) {
        for (int64_t j = 0; j < kCols; ++j) packed[size_t(p * kCols + j)] = j < cols ? bi[(j0 + j) * k + p] : 0.0f;
      }
      for (int64_t r = 0; r < rows; ++r) {
        float sums[kCols] = {};
        for (int64_t p = 0; p < k; ++p) {
          const float x = ai[r * k + p];
          for (int64_t j = 0; j < kCols; ++j) sums[j] += x * packed[size_t(p * kCols + j)];
        }
        for (int64_t j = 0; j < cols; ++j) ci[r * n + j0 + j] = sums[j];
      }
    }
  }
}

struct Route {
  Fp32GemmRoute single;   // for one GEMM
  Sgemm sgemm = nullptr;  // MKL's, where `single` is MklSgemm
};

Route choose_route() {
  const char* forced = std::getenv("FP8MP_CPU_FP32_GEMM");
  if (forced != nullptr && std::strcmp(forced, "aten") == 0) return {Fp32GemmRoute::AtenBmm};
  if (forced != nullptr && std::strcmp(forced, "fp8mp") == 0) return {Fp32GemmRoute::Fp8mp};
  const cpu::CpuFeatures& f = cpu::cpu_features();
  if (f.intel || f.avx512_bf16 || f.amx_bf16) {
    const auto sgemm = reinterpret_cast<Sgemm>(find_process_symbol("sgemm_"));
    const auto with_sgemm = [sgemm](const float* a, const float* b, float* c) {
      sgemm_nt(sgemm, a, b, c, kProbeRows, kProbeN, kProbeK);
      return true;
    };
    if (sgemm != nullptr && gives_the_probe_product(with_sgemm)) return {Fp32GemmRoute::MklSgemm, sgemm};
  }
  // With bf16 units, torch's own GEMMs (oneDNN's, aten's) round the operands to bf16 whenever the user sets
  // torch.backends.mkldnn.matmul.fp32_precision = "bf16", at any time after this probe.
  if (f.avx512_bf16 || f.amx_bf16) return {Fp32GemmRoute::Fp8mp};
  const auto with_onednn = [](const float* a, const float* b, float* c) {
    return onednn_gemm_nt(a, b, c, kProbeRows, kProbeN, kProbeK);
  };
  if (gives_the_probe_product(with_onednn)) return {Fp32GemmRoute::OneDnn};
  return {Fp32GemmRoute::AtenBmm};
}

const Route& route() {
  static const Route chosen = choose_route();
  return chosen;
}

}  // namespace

Fp32GemmRoute fp32_gemm_route() { return route().single; }

void fp32_gemm_nt(const float* a, const float* b, float* c, int64_t batch, int64_t rows, int64_t n, int64_t k) {
  const Route& chosen = route();
  if (chosen.single == Fp32GemmRoute::MklSgemm && rows <= kMaxInt32 && n <= kMaxInt32 && k <= kMaxInt32) {
    for (int64_t i = 0; i < batch; ++i) sgemm_nt(chosen.sgemm, a + i * rows * k, b + i * n * k, c + i * rows * n, rows, n, k);
    return;
  }
  if (chosen.single == Fp32GemmRoute::OneDnn && batch == 1 && onednn_gemm_nt(a, b, c, rows, n, k)) return;
  if (chosen.single == Fp32GemmRoute::Fp8mp) {
    own_gemm_nt(a, b, c, batch, rows, n, k);
    return;
  }
  bmm_out(a, b, c, batch, rows, n, k);
}

}  // namespace fp8mp

extern "C" const char* fp8mp_cpu_fp32_gemm_route() {
  switch (fp8mp::fp32_gemm_route()) {
    case fp8mp::Fp32GemmRoute::MklSgemm: return "mkl_sgemm";
    case fp8mp::Fp32GemmRoute::OneDnn: return "onednn";
    case fp8mp::Fp32GemmRoute::Fp8mp: return "fp8mp";
    default: return "aten_bmm";
  }
}
