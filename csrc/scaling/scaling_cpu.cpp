// CPU glue of update_amax_history_and_scale: argument checks and registration
// around the torch-free kernel of scaling_cpu_kernels.cpp.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "scaling/scaling_checks.h"
#include "scaling/scaling_cpu_kernels.h"

namespace fp8mp {
namespace {

void update_amax_history_and_scale_cpu(const at::Tensor& amax, at::Tensor& amax_history, at::Tensor& scale,
                                       at::Tensor& scale_inv, const at::Tensor& fp8_max, int64_t margin,
                                       c10::string_view amax_compute_algo) {
  AmaxComputeAlgo algo;
  const auto [H, T] = check_update_amax_history_args(amax, amax_history, scale, scale_inv, fp8_max, margin,
                                                     amax_compute_algo, &algo);
  if (T == 0) return;
  cpu::update_amax_history_and_scale(amax.const_data_ptr<float>(), amax_history.mutable_data_ptr<float>(),
                                     scale.mutable_data_ptr<float>(), scale_inv.mutable_data_ptr<float>(),
                                     fp8_max.const_data_ptr<float>(), H, T, margin, algo);
}

}  // namespace

TORCH_LIBRARY_IMPL(fp8mp, CPU, m) { m.impl("update_amax_history_and_scale", &update_amax_history_and_scale_cpu); }

}  // namespace fp8mp
