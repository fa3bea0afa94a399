// CUDA glue of update_amax_history_and_scale (stable ABI): argument checks,
// device guard and registration around the torch-free kernel of scale_update_cuda_kernels.cu.
#include "scale_update/scale_update_cuda.h"

#include "common/stable_cuda.h"
#include "scale_update/scale_update_checks.h"
#include "scale_update/scale_update_cuda_kernels.cuh"

namespace fp8mp {
namespace cuda_glue {

void update_amax_history_and_scale(Tensor amax, Tensor amax_history, Tensor scale, Tensor scale_inv, Tensor fp8_max,
                                   int64_t margin, std::string amax_compute_algo) {
  AmaxComputeAlgo algo;
  const auto [H, T] = check_update_amax_history_args(amax, amax_history, scale, scale_inv, fp8_max, margin,
                                                     amax_compute_algo, &algo);
  if (T == 0) return;
  const auto guard = guard_device_of(amax);
  cuda::update_amax_history_and_scale(
      static_cast<const float*>(amax.const_data_ptr()), static_cast<float*>(amax_history.mutable_data_ptr()),
      static_cast<float*>(scale.mutable_data_ptr()), static_cast<float*>(scale_inv.mutable_data_ptr()),
      static_cast<const float*>(fp8_max.const_data_ptr()), H, T, margin, algo, current_cuda_stream(amax));
}

}  // namespace cuda_glue

STABLE_TORCH_LIBRARY_IMPL(fp8mp, CUDA, m) {
  m.impl("update_amax_history_and_scale", TORCH_BOX(&cuda_glue::update_amax_history_and_scale));
}

}  // namespace fp8mp
