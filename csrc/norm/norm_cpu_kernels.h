// The CPU LayerNorm / RMSNorm kernels, torch-free. norm_cpu.cpp is their glue.
#pragma once

#include "common/cpu_parallel.h"
#include "norm/norm_common.h"

namespace fp8mp::cpu {

// out, mean (LayerNorm) and rstd of one forward, and amax when args.fp8 (norm_common.h: NormFwdArgs).
void norm_fwd(const NormFwdArgs& args, ParallelFor parallel_for);

// grad_x, and with a weight grad_weight / grad_bias, of one backward (norm_common.h: NormBwdArgs).
void norm_bwd(const NormBwdArgs& args, ParallelFor parallel_for);

}  // namespace fp8mp::cpu
