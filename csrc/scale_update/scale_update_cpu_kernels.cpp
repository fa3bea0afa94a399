// CPU implementation of update_amax_history_and_scale: one pass over the
// group's history (a memmove rolls every column at once), no per-tensor loop
// outside C++.
#include "scale_update/scale_update_cpu_kernels.h"

#include <cstring>
#include <vector>

namespace fp8mp::cpu {

void update_amax_history_and_scale(const float* amax, float* history, float* scale, float* scale_inv,
                                   const float* fp8_max, int64_t H, int64_t T, int64_t margin, AmaxComputeAlgo algo) {
  if (T == 0) return;
  // Row i -> row i + 1 for every column (the oldest row drops out), then the newest amax into row 0.
  std::memmove(history + T, history, sizeof(float) * size_t((H - 1) * T));
  std::memcpy(history, amax, sizeof(float) * size_t(T));

  std::vector<float> effective(amax, amax + T);
  if (algo == AmaxComputeAlgo::Max) {
    for (int64_t row = 1; row < H; ++row) {
      const float* values = history + row * T;
      for (int64_t t = 0; t < T; ++t) effective[t] = nan_max(effective[t], values[t]);
    }
  }
  const float pow2 = pow2_margin(margin);
  for (int64_t t = 0; t < T; ++t) {
    const float s = updated_scale(fp8_max[t], effective[t], pow2, scale[t]);
    scale[t] = s;
    scale_inv[t] = reciprocal(s);
  }
}

}  // namespace fp8mp::cpu
