// The CPU kernels of fp8_grouped_gemm and fp8_grouped_gemm_wgrad, torch-free: one call of the CPU fp8_gemm
// (gemm/gemm_cpu_kernels.h) per group, on the group's part of the operands, so that every group's result is
// bit for bit fp8_gemm's on that group alone, on whichever CPU path fp8_gemm takes.
#pragma once

#include <cstdint>

#include "common/cpu_parallel.h"
#include "common/fp8_format.h"
#include "common/half_types.h"
#include "blockwise/blockwise_cpu_kernels.h"
#include "gemm/gemm_cpu_kernels.h"

namespace fp8mp::cpu {

// Grouped along M. a [M, K] row-major FP8 codes, its rows sorted by group: group g holds rows
// [offs[g - 1], offs[g]) (offs[-1] = 0), offs checked (grouped_gemm_checks.h) and ending at M; b [G, N, K];
// out [M, N] of out_type, rows of group g = fp8_gemm(a rows of g, b[g], scale a_scale_inv * b_scale_inv[g],
// bias + g * N) (bias [G, N] of out_type, or nullptr).
void fp8_grouped_gemm(const uint8_t* a, Fp8Format a_format, const uint8_t* b, Fp8Format b_format,
                      const int32_t* offs, int64_t groups, int64_t N, int64_t K, float a_scale_inv,
                      const float* b_scale_inv, const void* bias, void* out, HpType out_type,
                      const MatmulNtFp32& matmul, ParallelFor parallel_for, int threads);

// Grouped along K (the weight gradient of a grouped linear). a [N, T] and b [K, T] row-major FP8 codes, their
// columns sorted by group (group g: columns [offs[g - 1], offs[g])); out [G, N, K] of out_type,
// out[g] = fp8_gemm(a[:, group g], b[:, group g], scale a_scale_inv * b_scale_inv), each group's columns copied
// to contiguous [N, T_g] / [K, T_g] operands first. An empty group gives zeros (fp8_gemm's empty sum).
void fp8_grouped_gemm_wgrad(const uint8_t* a, Fp8Format a_format, const uint8_t* b, Fp8Format b_format,
                            const int32_t* offs, int64_t groups, int64_t N, int64_t K, int64_t T, float scale,
                            void* out, HpType out_type, const MatmulNtFp32& matmul, ParallelFor parallel_for,
                            int threads);

// Grouped along M with block scales: group g's rows of out = block_scaled_gemm(a's rows of g with their rows of
// a's scale_inv, b[g] with its [ceil(N / b.block_rows), ceil(K / block_k)] scale_inv, bias + g * N), bit for bit
// (blockwise_cpu_kernels.h). a.block_rows is 1; `a` and `b` describe the whole a [M, K] and the first group's b.
void block_scaled_grouped_gemm(const BlockOperand& a, const BlockOperand& b, const int32_t* offs, int64_t groups,
                               int64_t N, int64_t K, int64_t block_k, const void* bias, void* out, HpType out_type,
                               const BatchedMatmulNtFp32& matmul, ParallelFor parallel_for);

// Grouped along K with block scales (the weight gradient under the fine-grained recipes). a [N, T] and b [K, T]
// row-major FP8 codes, columns sorted by group as in fp8_grouped_gemm_wgrad; their scale_inv [N, C] / [K, C]
// (a.block_rows = b.block_rows = 1) hold group g's ceil(T_g / block_k) chunks after the earlier groups' (offs
// checked, check_group_chunks). out[g] = block_scaled_gemm(a[:, group g], b[:, group g], their chunks, block_k),
// bit for bit: each group's columns and scale columns copied to contiguous operands first; zeros for an empty group.
void block_scaled_grouped_gemm_wgrad(const BlockOperand& a, const BlockOperand& b, const int32_t* offs,
                                     int64_t groups, int64_t N, int64_t K, int64_t T, int64_t chunks, int64_t block_k,
                                     void* out, HpType out_type, const BatchedMatmulNtFp32& matmul,
                                     ParallelFor parallel_for);

}  // namespace fp8mp::cpu
