// What the torch glue of every op family hands its torch-free kernels: the
// HpType of a tensor's dtype and a ParallelFor over torch's thread pool.
#pragma once

#include <ATen/Parallel.h>
#include <c10/core/ScalarType.h>
#include <c10/util/Exception.h>

#include "common/cpu_parallel.h"
#include "common/half_types.h"

namespace fp8mp {

inline HpType hp_type(at::ScalarType dtype) {
  switch (dtype) {
    case at::kFloat: return HpType::Float32;
    case at::kBFloat16: return HpType::BFloat16;
    case at::kHalf: return HpType::Float16;
    default: TORCH_CHECK(false, "fp8mp: no kernel for dtype ", dtype);
  }
}

inline void torch_parallel_for(int64_t begin, int64_t end, int64_t grain, const RangeBody& body) {
  at::parallel_for(begin, end, grain, body);
}

}  // namespace fp8mp
