// CPU implementation of update_amax_history_and_scale: one pass over the
// group's history (a memmove rolls every column at once), no per-tensor loop
// outside C++.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <cstring>
#include <vector>

#include "scaling/scaling_checks.h"
#include "scaling/scaling_rule.h"

namespace fp8mp {
namespace {

void update_amax_history_and_scale_cpu(const at::Tensor& amax, at::Tensor& amax_history, at::Tensor& scale,
                                       at::Tensor& scale_inv, const at::Tensor& fp8_max, int64_t margin,
                                       c10::string_view amax_compute_algo) {
  AmaxComputeAlgo algo;
  const auto [H, T] = check_update_amax_history_args(amax, amax_history, scale, scale_inv, fp8_max, margin,
                                                     amax_compute_algo, &algo);
  if (T == 0) return;
  const float* amax_ptr = amax.const_data_ptr<float>();
  const float* fp8_max_ptr = fp8_max.const_data_ptr<float>();
  float* history = amax_history.mutable_data_ptr<float>();
  float* scale_ptr = scale.mutable_data_ptr<float>();
  float* scale_inv_ptr = scale_inv.mutable_data_ptr<float>();

  // Row i -> row i + 1 for every column (the oldest row drops out), then the newest amax into row 0.
  std::memmove(history + T, history, sizeof(float) * size_t((H - 1) * T));
  std::memcpy(history, amax_ptr, sizeof(float) * size_t(T));

  std::vector<float> effective(amax_ptr, amax_ptr + T);
  if (algo == AmaxComputeAlgo::Max) {
    for (int64_t row = 1; row < H; ++row) {
      const float* values = history + row * T;
      for (int64_t t = 0; t < T; ++t) effective[t] = nan_max(effective[t], values[t]);
    }
  }
  const float pow2 = pow2_margin(margin);
  for (int64_t t = 0; t < T; ++t) {
    const float s = updated_scale(fp8_max_ptr[t], effective[t], pow2, scale_ptr[t]);
    scale_ptr[t] = s;
    scale_inv_ptr[t] = reciprocal(s);
  }
}

}  // namespace

TORCH_LIBRARY_IMPL(fp8mp, CPU, m) { m.impl("update_amax_history_and_scale", &update_amax_history_and_scale_cpu); }

}  // namespace fp8mp
