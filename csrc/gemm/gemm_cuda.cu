// CUDA implementation of fp8_gemm with cuBLASLt (Ada sm_89 / Hopper sm_90 and later).
//
// out [M, N] = a [M, K] @ b [N, K]^T, both row-major. cuBLASLt is column-major,
// so the row-major out is a column-major out^T [N, M], computed as
//   out^T = op(A) * op(B) with A = b (stored K x N column-major, ld = K, op = T)
//                          and B = a (stored K x M column-major, ld = K, op = N),
// the "TN" layout, the only one cuBLASLt supports for FP8 (both operands
// K-major). A's scale is therefore b_scale_inv and B's is a_scale_inv.
//
// cuBLASLt multiplies the FP8 values exactly, accumulates in fp32 (periodically
// promoted unless use_fast_accum), applies alpha = scale_a * scale_b and the
// bias in an fp32 epilogue and rounds once to the output type: the arithmetic
// gemm_cpu.cpp emulates. The bias epilogue takes a bias of the output type for
// bf16/fp16 outputs; for fp32 outputs it wants a bf16 bias, which would round
// ours, so an fp32 bias is added after the GEMM instead (same fp32 arithmetic).
//
// FP8 cuBLASLt needs the leading dimensions K (of a and b) and N (of out) to be
// multiples of 16. Other shapes are zero-padded: extra K columns of zero codes
// add exact zeros to every dot product, and extra rows of b (N) produce output
// columns that are sliced off. So every shape works; aligned shapes pay nothing.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <cublasLt.h>
#include <torch/library.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <type_traits>

#include "gemm/gemm_checks.h"

namespace fp8mp {
namespace {

constexpr const char* kOp = "fp8mp::fp8_gemm";
constexpr int64_t kAlign = 16;                             // cuBLASLt FP8: K and N multiples of 16
constexpr size_t kWorkspaceBytes = size_t(32) << 20;       // what cuBLASLt's Hopper kernels like

#define FP8MP_CUBLASLT_CHECK(EXPR)                                                                              \
  do {                                                                                                          \
    const cublasStatus_t fp8mp_status_ = (EXPR);                                                                \
    TORCH_CHECK(fp8mp_status_ == CUBLAS_STATUS_SUCCESS, kOp, ": ", #EXPR, " failed with ",                      \
                cublasLtGetStatusName(fp8mp_status_), " (", int(fp8mp_status_), "): ",                          \
                cublasLtGetStatusString(fp8mp_status_));                                                        \
  } while (0)

// Owning wrappers, so that a failed check does not leak cuBLASLt descriptors.
struct MatmulDescDeleter {
  void operator()(cublasLtMatmulDesc_t d) const { cublasLtMatmulDescDestroy(d); }
};
struct LayoutDeleter {
  void operator()(cublasLtMatrixLayout_t d) const { cublasLtMatrixLayoutDestroy(d); }
};
struct PreferenceDeleter {
  void operator()(cublasLtMatmulPreference_t d) const { cublasLtMatmulPreferenceDestroy(d); }
};
using MatmulDesc = std::unique_ptr<std::remove_pointer_t<cublasLtMatmulDesc_t>, MatmulDescDeleter>;
using Layout = std::unique_ptr<std::remove_pointer_t<cublasLtMatrixLayout_t>, LayoutDeleter>;
using Preference = std::unique_ptr<std::remove_pointer_t<cublasLtMatmulPreference_t>, PreferenceDeleter>;

template <typename V>
void set_attribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const V& value) {
  FP8MP_CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value)));
}

Layout make_layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld) {
  cublasLtMatrixLayout_t raw = nullptr;
  FP8MP_CUBLASLT_CHECK(cublasLtMatrixLayoutCreate(&raw, type, uint64_t(rows), uint64_t(cols), ld));
  return Layout(raw);
}

cudaDataType_t cuda_type(at::ScalarType t) {
  switch (t) {
    case at::kFloat8_e4m3fn: return CUDA_R_8F_E4M3;
    case at::kFloat8_e5m2: return CUDA_R_8F_E5M2;
    case at::kFloat: return CUDA_R_32F;
    case at::kBFloat16: return CUDA_R_16BF;
    case at::kHalf: return CUDA_R_16F;
    default: TORCH_CHECK(false, kOp, ": no cuBLASLt type for ", t);
  }
}

int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

bool aligned16(const at::Tensor& t) { return reinterpret_cast<uintptr_t>(t.const_data_ptr()) % 16 == 0; }

// A contiguous, 16-byte aligned FP8 matrix of shape [rows, cols] holding `t` in its
// top-left corner and zero codes elsewhere (t itself when nothing needs to change).
at::Tensor padded_fp8(const at::Tensor& t, int64_t rows, int64_t cols) {
  at::Tensor c = t.contiguous();
  if (c.size(0) == rows && c.size(1) == cols) return aligned16(c) ? c : c.clone();
  at::Tensor p = at::zeros({rows, cols}, c.options().dtype(at::kByte));
  p.narrow(0, 0, c.size(0)).narrow(1, 0, c.size(1)).copy_(c.view(at::kByte));
  return p.view(c.scalar_type());
}

at::Tensor fp8_gemm_cuda(const at::Tensor& a, const at::Tensor& a_scale_inv, const at::Tensor& b,
                         const at::Tensor& b_scale_inv, const std::optional<at::Tensor>& bias,
                         at::ScalarType out_dtype, bool use_fast_accum) {
  check_fp8_gemm_args(a, a_scale_inv, b, b_scale_inv, bias, out_dtype);
  const c10::cuda::CUDAGuard guard(a.device());
  const int64_t M = a.size(0), K = a.size(1), N = b.size(0);
  const auto out_options = a.options().dtype(out_dtype);
  if (M == 0 || N == 0) return at::empty({M, N}, out_options);
  if (K == 0) {  // an empty sum: the result is the bias (or zeros), whatever the scales
    return bias.has_value() ? bias->unsqueeze(0).expand({M, N}).contiguous() : at::zeros({M, N}, out_options);
  }
  const cudaDeviceProp* prop = at::cuda::getCurrentDeviceProperties();
  TORCH_CHECK(prop->major * 10 + prop->minor >= 89, kOp, ": FP8 GEMM needs a GPU of compute capability 8.9 or newer, ",
              a.device(), " is ", prop->major, ".", prop->minor);

  const int64_t K_pad = round_up(K, kAlign), N_pad = round_up(N, kAlign);
  const at::Tensor a_p = padded_fp8(a, M, K_pad);
  const at::Tensor b_p = padded_fp8(b, N_pad, K_pad);
  at::Tensor out_p = at::empty({M, N_pad}, out_options);

  // Bias in the epilogue for bf16/fp16 outputs (the type cuBLASLt wants there);
  // an fp32 bias is added after the GEMM (see the top of the file).
  const bool epilogue_bias = bias.has_value() && out_dtype != at::kFloat;
  at::Tensor bias_p;
  if (epilogue_bias) {
    bias_p = bias->contiguous();
    if (N_pad != N || !aligned16(bias_p)) {
      at::Tensor padded = at::zeros({N_pad}, bias_p.options());
      padded.narrow(0, 0, N).copy_(bias_p);
      bias_p = padded;
    }
  }

  cublasLtMatmulDesc_t raw_desc = nullptr;
  FP8MP_CUBLASLT_CHECK(cublasLtMatmulDescCreate(&raw_desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  const MatmulDesc desc(raw_desc);
  set_attribute(desc.get(), CUBLASLT_MATMUL_DESC_TRANSA, cublasOperation_t(CUBLAS_OP_T));
  set_attribute(desc.get(), CUBLASLT_MATMUL_DESC_TRANSB, cublasOperation_t(CUBLAS_OP_N));
  set_attribute(desc.get(), CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, b_scale_inv.const_data_ptr());
  set_attribute(desc.get(), CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, a_scale_inv.const_data_ptr());
  set_attribute(desc.get(), CUBLASLT_MATMUL_DESC_FAST_ACCUM, int8_t(use_fast_accum ? 1 : 0));
  if (epilogue_bias) {
    set_attribute(desc.get(), CUBLASLT_MATMUL_DESC_EPILOGUE, cublasLtEpilogue_t(CUBLASLT_EPILOGUE_BIAS));
    set_attribute(desc.get(), CUBLASLT_MATMUL_DESC_BIAS_POINTER, bias_p.const_data_ptr());
    set_attribute(desc.get(), CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, int32_t(cuda_type(out_dtype)));
  }

  // Column-major view: A = b (K x N_pad), B = a (K x M), C = D = out^T (N_pad x M).
  const Layout a_layout = make_layout(cuda_type(b.scalar_type()), K_pad, N_pad, K_pad);
  const Layout b_layout = make_layout(cuda_type(a.scalar_type()), K_pad, M, K_pad);
  const Layout d_layout = make_layout(cuda_type(out_dtype), N_pad, M, N_pad);

  cublasLtMatmulPreference_t raw_pref = nullptr;
  FP8MP_CUBLASLT_CHECK(cublasLtMatmulPreferenceCreate(&raw_pref));
  const Preference pref(raw_pref);
  const uint64_t workspace_bytes = kWorkspaceBytes;
  FP8MP_CUBLASLT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.get(), CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                            &workspace_bytes, sizeof(workspace_bytes)));

  cublasLtHandle_t handle = at::cuda::getCurrentCUDABlasLtHandle();
  cublasLtMatmulHeuristicResult_t heuristic{};
  int returned = 0;
  FP8MP_CUBLASLT_CHECK(cublasLtMatmulAlgoGetHeuristic(handle, desc.get(), a_layout.get(), b_layout.get(),
                                                      d_layout.get(), d_layout.get(), pref.get(), 1, &heuristic,
                                                      &returned));
  TORCH_CHECK(returned > 0, kOp, ": cuBLASLt found no algorithm for a ", a.scalar_type(), " [", M, ", ", K,
              "] x ", b.scalar_type(), " [", N, ", ", K, "]^T GEMM to ", out_dtype, " (padded to K=", K_pad,
              ", N=", N_pad, ", bias epilogue ", epilogue_bias, ")");

  // Through torch's caching allocator, on the stream the GEMM runs on.
  at::Tensor workspace = at::empty({int64_t(kWorkspaceBytes)}, a.options().dtype(at::kByte));
  const float alpha = 1.0f, beta = 0.0f;
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  FP8MP_CUBLASLT_CHECK(cublasLtMatmul(handle, desc.get(), &alpha, b_p.const_data_ptr(), a_layout.get(),
                                      a_p.const_data_ptr(), b_layout.get(), &beta, out_p.data_ptr(), d_layout.get(),
                                      out_p.data_ptr(), d_layout.get(), &heuristic.algo, workspace.data_ptr(),
                                      kWorkspaceBytes, stream));

  at::Tensor out = N_pad == N ? out_p : out_p.narrow(1, 0, N).contiguous();
  if (bias.has_value() && !epilogue_bias) out.add_(*bias);
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(fp8mp, CUDA, m) { m.impl("fp8_gemm", &fp8_gemm_cuda); }

}  // namespace fp8mp
