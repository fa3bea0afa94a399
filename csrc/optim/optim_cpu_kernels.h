// The CPU kernels of the fused optimizer steps, torch-free. optim_cpu.cpp is their glue.
#pragma once

#include "common/cpu_parallel.h"
#include "optim/optim_rule.h"

namespace fp8mp::cpu {

// One step of `Rule` on one parameter, in place (optim_rule.h): nothing is written when found_inf is
// given and nonzero; otherwise every element is updated, the FP8 states re-scaled per block, and *step
// incremented. Blocks of optim::kStateBlock elements run in parallel on `parallel_for`.
void adamw_step(const optim::StepBuffers& buffers, const optim::AdamW::Hyper& hyper, ParallelFor parallel_for);
void lion_step(const optim::StepBuffers& buffers, const optim::Lion::Hyper& hyper, ParallelFor parallel_for);

}  // namespace fp8mp::cpu
