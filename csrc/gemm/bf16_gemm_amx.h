// fp8_gemm's AMX kernel: FP8 codes decoded to bf16 (exact) while being packed
// into the layouts AMX tiles load (a: rows of 32 k; b: pairs of k interleaved
// per column, the "VNNI" layout), and TDPBF16PS on a 2 x 2 block of 16 x 16
// accumulator tiles; the epilogue (scale, bias, one rounding to out_dtype) runs
// on each 32 x 32 block as it leaves the tiles: no fp32 copy of the output and
// no separate decode pass.
//
// TDPBF16PS adds two exact bf16 products to each fp32 accumulator, rounding to
// nearest even with denormals flushed; products of FP8 values are multiples of
// 2^-32, so neither they nor any partial sum is an fp32 denormal, and the
// arithmetic is the fp32 emulation's: exact products, fp32 sums, only their
// order differs. Used where the CPU has AMX-BF16 and the OS lets this process
// use the tiles (cpu_gemm_path.h).
#pragma once

#include <cstdint>

#include "common/cpu_features.h"
#include "common/cpu_parallel.h"
#include "common/fp8_format.h"
#include "common/half_types.h"

namespace fp8mp::cpu {

#if FP8MP_AVX512_KERNELS
// out [M, N] = scalar_t((dec(a) @ dec(b)^T) * scale + bias) for row-major FP8 codes a [M, K], b [N, K], bias [N]
// or nullptr; M, N, K > 0; `threads`: how many threads parallel_for runs on. Call only where
// amx_bf16_usable().
template <typename scalar_t>
void fp8_gemm_amx_bf16(const uint8_t* a, Fp8Format a_format, const uint8_t* b, Fp8Format b_format, int64_t M,
                       int64_t N, int64_t K, float scale, const scalar_t* bias, scalar_t* out,
                       ParallelFor parallel_for, int threads);
#endif

// Whether this process may run AMX-BF16 tile instructions: the CPU has them, the OS saves the tile
// state (XCR0 bits 17 and 18) and has granted the process the tile data (Linux's
// arch_prctl(ARCH_REQ_XCOMP_PERM), asked once here; oneDNN asks the same for torch). False off x86-64.
bool amx_bf16_usable();

}  // namespace fp8mp::cpu
