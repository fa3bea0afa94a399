// CUDA glue of update_amax_history_and_scale: argument checks, device guard and
// registration around the torch-free kernel of scaling_cuda_kernels.cu.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "scaling/scaling_checks.h"
#include "scaling/scaling_cuda_kernels.cuh"

namespace fp8mp {
namespace {

void update_amax_history_and_scale_cuda(const at::Tensor& amax, at::Tensor& amax_history, at::Tensor& scale,
                                        at::Tensor& scale_inv, const at::Tensor& fp8_max, int64_t margin,
                                        c10::string_view amax_compute_algo) {
  AmaxComputeAlgo algo;
  const auto [H, T] = check_update_amax_history_args(amax, amax_history, scale, scale_inv, fp8_max, margin,
                                                     amax_compute_algo, &algo);
  if (T == 0) return;
  const c10::cuda::CUDAGuard guard(amax.device());
  cuda::update_amax_history_and_scale(amax.const_data_ptr<float>(), amax_history.mutable_data_ptr<float>(),
                                      scale.mutable_data_ptr<float>(), scale_inv.mutable_data_ptr<float>(),
                                      fp8_max.const_data_ptr<float>(), H, T, margin, algo,
                                      at::cuda::getCurrentCUDAStream());
}

}  // namespace

TORCH_LIBRARY_IMPL(fp8mp, CUDA, m) { m.impl("update_amax_history_and_scale", &update_amax_history_and_scale_cuda); }

}  // namespace fp8mp
