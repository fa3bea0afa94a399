// The CUDA kernels of the fused optimizer steps, torch-free: device buffers, launched on `stream` on the
// current device. optim_cuda.cpp is their glue.
#pragma once

#include <cuda_runtime.h>

#include "optim/optim_rule.h"

namespace fp8mp::cuda {

// As fp8mp::cpu::adamw_step / lion_step (optim_cpu_kernels.h), bit for bit; step and found_inf are read
// on the device (no host sync).
void adamw_step(const optim::StepBuffers& buffers, const optim::AdamW::Hyper& hyper, cudaStream_t stream);
void lion_step(const optim::StepBuffers& buffers, const optim::Lion::Hyper& hyper, cudaStream_t stream);

}  // namespace fp8mp::cuda
