// The CUDA LayerNorm / RMSNorm kernels, torch-free: device buffers, launched on
// `stream` on the current device, with a float scratch buffer from the caller.
// norm_cuda.cpp is their glue.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>

#include "norm/norm_common.h"

namespace fp8mp::cuda {

// Floats of device scratch norm_fwd / norm_bwd need for these arguments.
size_t norm_fwd_scratch_floats(const NormFwdArgs& args);
size_t norm_bwd_scratch_floats(const NormBwdArgs& args);

// As fp8mp::cpu::norm_fwd / norm_bwd (norm_cpu_kernels.h), with the same fp32 formulas.
void norm_fwd(const NormFwdArgs& args, float* scratch, cudaStream_t stream);
void norm_bwd(const NormBwdArgs& args, float* scratch, cudaStream_t stream);

}  // namespace fp8mp::cuda
