// CUDA glue of the norm ops (stable ABI): the shared entry points
// (norm_entry_points.h) run on the torch-free kernels of norm_cuda_kernels.cu,
// with a device guard and scratch from torch's caching allocator.
#include "norm/norm_cuda.h"

#include "common/stable_cuda.h"
#include "norm/norm_cuda_kernels.cuh"
#include "norm/norm_entry_points.h"

namespace fp8mp {
namespace {

Tensor float_scratch(size_t floats, const Tensor& like) { return empty_on({int64_t(floats)}, kFloat, like); }

}  // namespace

namespace cuda_glue {

void CudaNorm::fwd(const NormFwdArgs& args, const Tensor& x) {
  const auto guard = guard_device_of(x);
  Tensor scratch = float_scratch(cuda::norm_fwd_scratch_floats(args), x);
  cuda::norm_fwd(args, static_cast<float*>(scratch.mutable_data_ptr()), current_cuda_stream(x));
}

void CudaNorm::bwd(const NormBwdArgs& args, const Tensor& x) {
  const auto guard = guard_device_of(x);
  Tensor scratch = float_scratch(cuda::norm_bwd_scratch_floats(args), x);
  cuda::norm_bwd(args, static_cast<float*>(scratch.mutable_data_ptr()), current_cuda_stream(x));
}

}  // namespace cuda_glue

STABLE_TORCH_LIBRARY_IMPL(fp8mp, CUDA, m) { register_norm_ops<cuda_glue::CudaNorm>(m); }

}  // namespace fp8mp
