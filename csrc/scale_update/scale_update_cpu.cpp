// CPU glue of update_amax_history_and_scale (stable ABI): argument checks and
// registration around the torch-free kernel of scale_update_cpu_kernels.cpp.
#include <limits>

#include "common/stable.h"
#include "scale_update/scale_update_checks.h"
#include "scale_update/scale_update_cpu_kernels.h"

namespace fp8mp {
namespace {

void update_amax_history_and_scale_cpu(Tensor amax, Tensor amax_history, Tensor scale, Tensor scale_inv,
                                       Tensor fp8_max, int64_t margin, std::string amax_compute_algo) {
  AmaxComputeAlgo algo;
  const auto [H, T] = check_update_amax_history_args(amax, amax_history, scale, scale_inv, fp8_max, margin,
                                                     amax_compute_algo, &algo);
  if (T == 0) return;
  // fp8_max's values are on the host here: refused when unusable (on a GPU they make the scale NaN).
  const float* max_values = static_cast<const float*>(fp8_max.const_data_ptr());
  for (int64_t t = 0; t < T; ++t) {
    FP8MP_CHECK_VALUE(max_values[t] > 0.0f && max_values[t] <= std::numeric_limits<float>::max(),
                      "fp8mp::update_amax_history_and_scale: argument 'fp8_max' must be finite and > 0, got ",
                      max_values[t], " at index ", t);
  }
  cpu::update_amax_history_and_scale(
      static_cast<const float*>(amax.const_data_ptr()), static_cast<float*>(amax_history.mutable_data_ptr()),
      static_cast<float*>(scale.mutable_data_ptr()), static_cast<float*>(scale_inv.mutable_data_ptr()),
      static_cast<const float*>(fp8_max.const_data_ptr()), H, T, margin, algo);
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(fp8mp, CPU, m) {
  m.impl("update_amax_history_and_scale", TORCH_BOX(&update_amax_history_and_scale_cpu));
}

}  // namespace fp8mp
