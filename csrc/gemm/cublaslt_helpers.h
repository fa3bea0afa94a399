// The cuBLASLt calls every fp8mp GEMM makes (fp8_gemm, block_scaled_gemm): a status check that throws
// std::runtime_error naming the op (the `kOp` in scope at the use), the call and cuBLASLt's status, and
// small typed wrappers. cuBLASLt and the standard library only.
#pragma once

#include <cublasLt.h>

#include <stdexcept>
#include <string>

#include "common/fp8_format.h"
#include "common/half_types.h"
#include "gemm/gemm_plan_cache.h"

#define FP8MP_CUBLASLT_CHECK(EXPR)                                                                              \
  do {                                                                                                          \
    const cublasStatus_t fp8mp_status_ = (EXPR);                                                                \
    if (fp8mp_status_ != CUBLAS_STATUS_SUCCESS) {                                                               \
      throw std::runtime_error(std::string(kOp) + ": " #EXPR " failed with " +                                  \
                               cublasLtGetStatusName(fp8mp_status_) + " (" + std::to_string(int(fp8mp_status_)) + \
                               "): " + cublasLtGetStatusString(fp8mp_status_));                                 \
    }                                                                                                           \
  } while (0)

namespace fp8mp::cuda {

template <const char* kOp, typename V>
void set_matmul_attribute(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const V& value) {
  FP8MP_CUBLASLT_CHECK(cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value)));
}

template <const char* kOp>
Layout make_matrix_layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld) {
  cublasLtMatrixLayout_t raw = nullptr;
  FP8MP_CUBLASLT_CHECK(cublasLtMatrixLayoutCreate(&raw, type, uint64_t(rows), uint64_t(cols), ld));
  return Layout(raw);
}

// A heuristic preference allowing `workspace_bytes` and told the real alignment (bytes) of cuBLASLt's
// A, B and C = D, which it otherwise assumes to be 256 (and may pick a kernel that faults on less).
template <const char* kOp>
Preference make_preference(uint64_t workspace_bytes, uint32_t align_a, uint32_t align_b, uint32_t align_cd) {
  cublasLtMatmulPreference_t raw = nullptr;
  FP8MP_CUBLASLT_CHECK(cublasLtMatmulPreferenceCreate(&raw));
  Preference pref(raw);
  const auto set = [&](cublasLtMatmulPreferenceAttributes_t attr, auto value) {
    FP8MP_CUBLASLT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref.get(), attr, &value, sizeof(value)));
  };
  set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, workspace_bytes);
  set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align_a);
  set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align_b);
  set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align_cd);
  set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align_cd);
  return pref;
}

inline cudaDataType_t fp8_cuda_type(Fp8Format format) {
  return format == Fp8Format::E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_8F_E5M2;
}

// "13.1.1" from cublasLtGetVersion()'s major * 10000 + minor * 100 + patch.
// Whether cuBLASLt accepts `algo` (found for another problem size) for these exact layouts within
// `workspace_bytes`: cuBLASLt promises an algorithm only for the problem it was found or checked for.
inline bool algo_accepted(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a,
                          cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t d, const cublasLtMatmulAlgo_t& algo,
                          size_t workspace_bytes) {
  cublasLtMatmulHeuristicResult_t checked{};
  return cublasLtMatmulAlgoCheck(handle, desc, a, b, d, d, &algo, &checked) == CUBLAS_STATUS_SUCCESS &&
         checked.workspaceSize <= workspace_bytes;
}

inline std::string cublaslt_version_string(size_t version) {
  return std::to_string(version / 10000) + "." + std::to_string(version / 100 % 100) + "." +
         std::to_string(version % 100);
}

}  // namespace fp8mp::cuda
