// The cuBLASLt objects of one FP8 GEMM configuration, built once and reused:
// the matmul descriptor, the three matrix layouts and the heuristic's chosen
// algorithm depend only on GemmPlanKey (shapes after padding, dtypes,
// epilogue, accumulation mode, operand alignments, device), so rebuilding them
// per call only costs host time (several microseconds of descriptor calls plus
// a heuristic query, per GEMM, three GEMMs per Linear per step). fp8_gemm asks the
// heuristic once per power-of-two bucket of M and K (heuristic_shape.h) and checks
// the bucket's algorithm against each exact key's layouts.
//
// The cache is thread-local: the pointers that change per call (scales, bias)
// are set on the cached descriptor just before cublasLtMatmul, which reads it
// at enqueue time, so no two threads may share one descriptor, and a per-thread
// cache needs no lock. Torch-free: cuBLASLt and the CUDA runtime only.
#pragma once

#include <cublasLt.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <type_traits>

namespace fp8mp::cuda {

struct GemmPlanKey {
  int device;
  int64_t M, N_pad, K_pad;
  int a_type, b_type, out_type;  // cudaDataType_t of a, b (FP8) and out
  bool epilogue_bias, fast_accum;
  uint32_t align_a, align_b, align_out;  // bytes (a power of two, at most 256) of the real pointers

  bool operator==(const GemmPlanKey& o) const {
    return device == o.device && M == o.M && N_pad == o.N_pad && K_pad == o.K_pad && a_type == o.a_type &&
           b_type == o.b_type && out_type == o.out_type && epilogue_bias == o.epilogue_bias &&
           fast_accum == o.fast_accum && align_a == o.align_a && align_b == o.align_b && align_out == o.align_out;
  }
};

struct GemmPlanKeyHash {
  size_t operator()(const GemmPlanKey& k) const {
    size_t h = std::hash<int64_t>()(k.M);
    const auto mix = [&h](uint64_t v) { h ^= std::hash<uint64_t>()(v) + 0x9E3779B97F4A7C15ull + (h << 6) + (h >> 2); };
    mix(uint64_t(k.N_pad));
    mix(uint64_t(k.K_pad));
    mix((uint64_t(uint32_t(k.device)) << 32) | (uint64_t(k.a_type) << 20) | (uint64_t(k.b_type) << 8) |
        uint64_t(k.out_type));
    mix((uint64_t(k.align_a) << 40) | (uint64_t(k.align_b) << 24) | (uint64_t(k.align_out) << 8) |
        (uint64_t(k.epilogue_bias) << 1) | uint64_t(k.fast_accum));
    return h;
  }
};

// Largest power of two (at most 256) dividing the address: what
// CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_*_BYTES must be told, since cuBLASLt
// otherwise assumes 256-byte aligned operands.
inline uint32_t pointer_alignment(const void* p) {
  const uintptr_t address = reinterpret_cast<uintptr_t>(p);
  uint32_t alignment = 1;
  while (alignment < 256 && address % (2 * alignment) == 0) alignment *= 2;
  return alignment;
}

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

struct GemmPlan {
  MatmulDesc desc;
  Layout a_layout, b_layout, d_layout;  // cuBLASLt's A (our b), B (our a), C = D (out^T)
  cublasLtMatmulAlgo_t algo;
};

}  // namespace fp8mp::cuda
