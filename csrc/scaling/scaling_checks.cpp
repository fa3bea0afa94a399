#include "scaling/scaling_checks.h"

#include <ATen/MemoryOverlap.h>
#include <c10/util/Exception.h>

#include <string>

namespace fp8mp {

AmaxComputeAlgo parse_amax_compute_algo(c10::string_view algo, const char* op) {
  const std::string name(algo.begin(), algo.end());
  if (name == "max") return AmaxComputeAlgo::Max;
  if (name == "most_recent") return AmaxComputeAlgo::MostRecent;
  TORCH_CHECK_VALUE(false, op, ": argument 'amax_compute_algo' must be 'max' or 'most_recent', got '", name, "'");
}

AmaxHistoryShape check_update_amax_history_args(const at::Tensor& amax, const at::Tensor& amax_history,
                                                const at::Tensor& scale, const at::Tensor& scale_inv,
                                                const at::Tensor& fp8_max, int64_t margin,
                                                c10::string_view amax_compute_algo, AmaxComputeAlgo* algo) {
  constexpr const char* op = "fp8mp::update_amax_history_and_scale";
  const std::pair<const at::Tensor*, const char*> args[] = {
      {&amax, "amax"}, {&amax_history, "amax_history"}, {&scale, "scale"}, {&scale_inv, "scale_inv"}, {&fp8_max, "fp8_max"}};
  for (const auto& [t, name] : args) {
    TORCH_CHECK(t->scalar_type() == at::kFloat, op, ": argument '", name, "' must be float32, got ", t->scalar_type());
    TORCH_CHECK(t->layout() == at::kStrided, op, ": argument '", name, "' must be a strided tensor, got ", t->layout());
    TORCH_CHECK(t->device() == amax.device(), op, ": argument '", name, "' must be on amax's device ", amax.device(),
                ", got ", t->device());
  }
  TORCH_CHECK_VALUE(amax.dim() == 1, op, ": argument 'amax' must be 1-D [T], got shape ", amax.sizes());
  const int64_t num_tensors = amax.size(0);
  TORCH_CHECK_VALUE(amax_history.dim() == 2 && amax_history.size(0) >= 1 && amax_history.size(1) == num_tensors, op,
                    ": argument 'amax_history' must have shape [H, T] with H >= 1 and T = amax.numel() = ", num_tensors,
                    ", got shape ", amax_history.sizes());
  for (const auto& [t, name] : {args[2], args[3], args[4]}) {
    TORCH_CHECK_VALUE(t->dim() == 1 && t->size(0) == num_tensors, op, ": argument '", name,
                      "' must have shape [T] = [", num_tensors, "] like amax, got shape ", t->sizes());
  }
  for (const auto& [t, name] : args) {
    TORCH_CHECK(t->is_contiguous(), op, ": argument '", name, "' must be contiguous");
  }
  // The kernels read every input before writing, but only within a column:
  // overlapping buffers would make the result depend on the order of columns.
  for (int out = 1; out <= 3; ++out) {
    for (int other = 0; other < 5; ++other) {
      if (other == out || args[other].first->numel() == 0 || args[out].first->numel() == 0) continue;
      TORCH_CHECK(at::get_overlap_status(*args[out].first, *args[other].first) == at::MemOverlapStatus::No, op,
                  ": argument '", args[out].second, "' is written in place and must not share memory with '",
                  args[other].second, "'");
    }
  }
  TORCH_CHECK_VALUE(margin >= 0, op, ": argument 'margin' must be >= 0, got ", margin);
  *algo = parse_amax_compute_algo(amax_compute_algo, op);
  return {amax_history.size(0), num_tensors};
}

}  // namespace fp8mp
