// CUDA glue of the norm ops: the shared entry points (norm_entry_points.h) run
// on the torch-free kernels of norm_cuda_kernels.cu, with a device guard and
// scratch from torch's caching allocator.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "norm/norm_cuda_kernels.cuh"
#include "norm/norm_entry_points.h"

namespace fp8mp {
namespace {

at::Tensor float_scratch(size_t floats, const at::Tensor& like) {
  return at::empty({int64_t(floats)}, like.options().dtype(at::kFloat));
}

struct CudaNorm {
  static void fwd(const NormFwdArgs& args, const at::Tensor& x) {
    const c10::cuda::CUDAGuard guard(x.device());
    at::Tensor scratch = float_scratch(cuda::norm_fwd_scratch_floats(args), x);
    cuda::norm_fwd(args, scratch.mutable_data_ptr<float>(), at::cuda::getCurrentCUDAStream());
  }
  static void bwd(const NormBwdArgs& args, const at::Tensor& x) {
    const c10::cuda::CUDAGuard guard(x.device());
    at::Tensor scratch = float_scratch(cuda::norm_bwd_scratch_floats(args), x);
    cuda::norm_bwd(args, scratch.mutable_data_ptr<float>(), at::cuda::getCurrentCUDAStream());
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(fp8mp, CUDA, m) { register_norm_ops<CudaNorm>(m); }

}  // namespace fp8mp
