// The CPU kernel of fp8_gemm, torch-free. gemm_cpu.cpp is its glue, which also
// hands in the fp32 GEMM (torch's) that does the multiply-accumulate.
#pragma once

#include <cstdint>
#include <functional>

#include "common/cpu_parallel.h"
#include "common/fp8_format.h"
#include "common/half_types.h"

namespace fp8mp::cpu {

// c [rows, n] = a [rows, k] @ b [n, k]^T in IEEE fp32, all row-major and contiguous.
using MatmulNtFp32 = std::function<void(const float* a, const float* b, float* c, int64_t rows, int64_t n, int64_t k)>;

// out [M, N] (row-major, of out_type) = out_type((dec(a) @ dec(b)^T) * scale + bias) for a [M, K] and b [N, K]
// row-major FP8 codes, with scale = a_scale_inv * b_scale_inv in fp32 and bias [N] (of out_type) or nullptr.
// `threads`: how many threads parallel_for runs on (the AMX kernel shares its work out by it).
void fp8_gemm(const uint8_t* a, Fp8Format a_format, const uint8_t* b, Fp8Format b_format, int64_t M, int64_t N,
              int64_t K, float scale, const void* bias, void* out, HpType out_type, const MatmulNtFp32& matmul,
              ParallelFor parallel_for, int threads);

}  // namespace fp8mp::cpu
