// The CUDA kernel of update_amax_history_and_scale, torch-free: device buffers,
// launched on `stream` on the current device. scale_update_cuda.cpp is its glue.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "scale_update/scale_rule.h"

namespace fp8mp::cuda {

// As fp8mp::cpu::update_amax_history_and_scale (scale_update_cpu_kernels.h), bit for bit.
void update_amax_history_and_scale(const float* amax, float* history, float* scale, float* scale_inv,
                                   const float* fp8_max, int64_t H, int64_t T, int64_t margin, AmaxComputeAlgo algo,
                                   cudaStream_t stream);

}  // namespace fp8mp::cuda
