// fp8_gemm's own AVX512-BF16 kernel: the FP8 codes are decoded to bf16 (exact)
// while being packed into the pair-interleaved panels vdpbf16ps reads, and a
// 12x32 register micro-kernel accumulates exact products in fp32, applying the
// epilogue (scale, bias, one rounding to out_dtype) as it stores each tile: no
// fp32 copy of the output and no separate decode pass.
//
// vdpbf16ps adds two exact bf16 products to each fp32 lane, each addition rounded
// to nearest even with denormals flushed; products of FP8 values are multiples of
// 2^-32 (E5M2 x E5M2 at the smallest), so neither they nor any partial sum is ever
// an fp32 denormal, and the arithmetic is the fp32 emulation's: exact products,
// fp32 sums, only their order differs. Used where the CPU has AVX512-BF16 but no
// AMX (cpu_gemm_path.h), where it is about twice as fast as MKL's bf16 GEMM
// (benchmarks/RESULTS.md).
#pragma once

#include <cstdint>

#include "common/cpu_features.h"
#include "common/cpu_parallel.h"
#include "common/fp8_format.h"
#include "common/half_types.h"

namespace fp8mp::cpu {

#if FP8MP_AVX512_KERNELS
// out [M, N] = scalar_t((dec(a) @ dec(b)^T) * scale + bias) for row-major FP8 codes a [M, K], b [N, K], bias [N]
// or nullptr; M, N, K > 0. Call only where cpu_features().avx512_bf16.
template <typename scalar_t>
void fp8_gemm_avx512_bf16(const uint8_t* a, Fp8Format a_format, const uint8_t* b, Fp8Format b_format, int64_t M,
                          int64_t N, int64_t K, float scale, const scalar_t* bias, scalar_t* out,
                          ParallelFor parallel_for);
#endif

}  // namespace fp8mp::cpu
