// The CPU kernel of update_amax_history_and_scale, torch-free. scale_update_cpu.cpp is its glue.
#pragma once

#include <cstdint>

#include "scale_update/scale_rule.h"

namespace fp8mp::cpu {

// For T tensors with a row-major [H, T] history: roll every column down one row, put amax [T]
// in row 0, then set scale [T] and scale_inv [T] by scale_rule.h from fp8_max [T] and margin.
void update_amax_history_and_scale(const float* amax, float* history, float* scale, float* scale_inv,
                                   const float* fp8_max, int64_t H, int64_t T, int64_t margin, AmaxComputeAlgo algo);

}  // namespace fp8mp::cpu
