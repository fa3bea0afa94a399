// The CUDA device of the shared norm entry points (norm_entry_points.h), declared so that the CPU test suite
// runs NormEntryPoints<CudaNorm> on CPU tensors with the kernel launches stubbed (tests/cpp/test_cuda_glue.cpp).
#pragma once

#include "common/stable.h"
#include "norm/norm_common.h"

namespace fp8mp::cuda_glue {

// Scratch from torch's caching allocator, a device guard and the current stream around cuda::norm_fwd / norm_bwd.
struct CudaNorm {
  static void fwd(const NormFwdArgs& args, const Tensor& x);
  static void bwd(const NormBwdArgs& args, const Tensor& x);
};

}  // namespace fp8mp::cuda_glue
