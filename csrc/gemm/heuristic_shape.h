// Which problem size an FP8 GEMM's cuBLASLt heuristic is asked about: a pure host function (no CUDA), so that
// Catch2 checks it on the CPU (tests/cpp/test_cross_device_rules.cpp).
//
// A mixture-of-experts layer's per-expert token counts (M of each group's GEMM, K of each group's weight
// gradient) change every step. Keyed on the exact sizes, the plan cache (gemm_plan_cache.h) would query the
// heuristic again for almost every call. The heuristic is asked about the sizes rounded up to a power of two
// instead, once per such bucket, and its algorithm is reused for every exact size in the bucket after
// cublasLtMatmulAlgoCheck has accepted it for that size's own layouts (cuBLASLt promises an algorithm only
// for the problem it was found or checked for); where the check refuses it, the exact size is asked about.
// The algorithm is then a function of the bucket, whatever order the sizes come in.
#pragma once

#include <cstdint>

namespace fp8mp {

// n rounded up to a power of two, at least 16 (the FP8 GEMM's smallest padded K and N).
inline int64_t heuristic_extent(int64_t n) {
  int64_t e = 16;
  while (e < n) e *= 2;
  return e;
}

}  // namespace fp8mp
