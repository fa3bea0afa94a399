// Argument checks of update_amax_history_and_scale, shared by CPU and CUDA.
#pragma once

#include <string>

#include "common/op_checks.h"
#include "scale_update/scale_rule.h"

namespace fp8mp {

// "max" / "most_recent". Anything else raises ValueError naming `amax_compute_algo`.
AmaxComputeAlgo parse_amax_compute_algo(const std::string& algo, const char* op);

// Sizes of one group of T tensors whose amax history is H rows long.
struct AmaxHistoryShape {
  int64_t history_len;  // H >= 1
  int64_t num_tensors;  // T >= 0
};

// All checks of update_amax_history_and_scale: contiguous float32 tensors on
// one device with shapes amax [T], amax_history [H, T], scale / scale_inv /
// fp8_max [T]; the three mutated tensors overlap neither each other nor the
// inputs; margin >= 0; a known algo. dtype, layout, device and aliasing errors
// are RuntimeError, shape and value errors ValueError, each naming the argument.
AmaxHistoryShape check_update_amax_history_args(const Tensor& amax, const Tensor& amax_history, const Tensor& scale,
                                                const Tensor& scale_inv, const Tensor& fp8_max, int64_t margin,
                                                const std::string& amax_compute_algo, AmaxComputeAlgo* algo);

}  // namespace fp8mp
