#include "scale_update/scale_update_checks.h"

namespace fp8mp {

AmaxComputeAlgo parse_amax_compute_algo(const std::string& algo, const char* op) {
  if (algo == "max") return AmaxComputeAlgo::Max;
  FP8MP_CHECK_VALUE(algo == "most_recent", op, ": argument 'amax_compute_algo' must be 'max' or 'most_recent', got '",
                    algo, "'");
  return AmaxComputeAlgo::MostRecent;
}

AmaxHistoryShape check_update_amax_history_args(const Tensor& amax, const Tensor& amax_history, const Tensor& scale,
                                                const Tensor& scale_inv, const Tensor& fp8_max, int64_t margin,
                                                const std::string& amax_compute_algo, AmaxComputeAlgo* algo) {
  constexpr const char* op = "fp8mp::update_amax_history_and_scale";
  const NamedTensor args[] = {
      {&amax, "amax"}, {&amax_history, "amax_history"}, {&scale, "scale"}, {&scale_inv, "scale_inv"}, {&fp8_max, "fp8_max"}};
  for (const auto& [t, name] : args) {
    FP8MP_CHECK(t->scalar_type() == kFloat, op, ": argument '", name, "' must be float32, got ",
                dtype_str(t->scalar_type()));
    FP8MP_CHECK(t->layout() == torch::headeronly::Layout::Strided, op, ": argument '", name,
                "' must be a strided tensor");
    FP8MP_CHECK(same_device(*t, amax), op, ": argument '", name, "' must be on amax's device ", device_str(amax),
                ", got ", device_str(*t));
  }
  FP8MP_CHECK_VALUE(amax.dim() == 1, op, ": argument 'amax' must be 1-D [T], got shape ", shape_str(amax));
  const int64_t num_tensors = amax.size(0);
  FP8MP_CHECK_VALUE(amax_history.dim() == 2 && amax_history.size(0) >= 1 && amax_history.size(1) == num_tensors, op,
                    ": argument 'amax_history' must have shape [H, T] with H >= 1 and T = amax.numel() = ", num_tensors,
                    ", got shape ", shape_str(amax_history));
  for (const auto& [t, name] : {args[2], args[3], args[4]}) {
    FP8MP_CHECK_VALUE(t->dim() == 1 && t->size(0) == num_tensors, op, ": argument '", name,
                      "' must have shape [T] = [", num_tensors, "] like amax, got shape ", shape_str(*t));
  }
  for (const auto& [t, name] : args) {
    FP8MP_CHECK(t->is_contiguous(), op, ": argument '", name, "' must be contiguous");
  }
  // The kernels read every input before writing, but only within a column:
  // overlapping buffers would make the result depend on the order of columns.
  for (int out = 1; out <= 3; ++out) {
    for (int other = 0; other < 5; ++other) {
      if (other != out) check_no_overlap(args[out], {args[other]}, op);
    }
  }
  FP8MP_CHECK_VALUE(margin >= 0, op, ": argument 'margin' must be >= 0, got ", margin);
  *algo = parse_amax_compute_algo(amax_compute_algo, op);
  return {amax_history.size(0), num_tensors};
}

}  // namespace fp8mp
