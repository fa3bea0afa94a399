// The CPU LayerNorm / RMSNorm kernels, torch-free. norm_cpu.cpp is their glue.
#pragma once

#include "blockwise/blockwise_cpu_kernels.h"
#include "common/cpu_parallel.h"
#include "norm/norm_common.h"

namespace fp8mp::cpu {

// out, mean (LayerNorm) and rstd of one forward, and amax when args.fp8 (norm_common.h: NormFwdArgs).
void norm_fwd(const NormFwdArgs& args, ParallelFor parallel_for);

// The norm writing block-scaled FP8 directly: norm_fwd's output (rounded to x_type, never stored whole;
// args.out and args.fp8 are ignored, args.format is the FP8 format) quantized as
// block_quantize_transpose(out, row_block, col_block, mode) quantizes it, bit for bit, strip by strip
// of col_block rows (each strip normalized into a buffer that stays in cache, then quantized both ways).
// mean (LayerNorm) and rstd as norm_fwd's.
void norm_fwd_block_fp8(const NormFwdArgs& args, int64_t row_block, int64_t col_block, BlockScaleMode mode,
                        uint8_t* y, void* scale_inv, uint8_t* y_t, void* scale_inv_t, ParallelFor parallel_for);

// grad_x, and with a weight grad_weight / grad_bias, of one backward (norm_common.h: NormBwdArgs).
void norm_bwd(const NormBwdArgs& args, ParallelFor parallel_for);

}  // namespace fp8mp::cpu
