// Argument checks of fp8_grouped_gemm and fp8_grouped_gemm_wgrad, shared by CPU and CUDA.
#pragma once

#include <cstdint>
#include <optional>

#include "common/op_checks.h"

namespace fp8mp {

struct GroupedGemmFormats {
  Fp8Format a;
  Fp8Format b;
};

// fp8_grouped_gemm: a [M, K] and b [G, N, K] FP8 on one device, not both E5M2; a_scale_inv 1-element and
// b_scale_inv [G] fp32; offs [G] int32 on that device; bias, when given, [G, N] of out_dtype; K and N multiples
// of 16 (cuBLASLt's FP8 alignment, required on every device so that both accept the same shapes).
GroupedGemmFormats check_fp8_grouped_gemm_args(const Tensor& a, const Tensor& a_scale_inv, const Tensor& b,
                                               const Tensor& b_scale_inv, const Tensor& offs,
                                               const std::optional<Tensor>& bias, ScalarType out_dtype);

// fp8_grouped_gemm_wgrad: a [N, T] and b [K, T] FP8 on one device, not both E5M2; both scale_invs 1-element
// fp32; offs [G] int32 (G >= 1) on that device; N and K multiples of 16.
GroupedGemmFormats check_fp8_grouped_gemm_wgrad_args(const Tensor& a, const Tensor& a_scale_inv, const Tensor& b,
                                                     const Tensor& b_scale_inv, const Tensor& offs,
                                                     ScalarType out_dtype);

// block_scaled_grouped_gemm: as fp8_grouped_gemm's, with block scales instead of tensorwise ones: a_block_rows
// must be 1 (a 1 x block_k block never spans two groups), b_block_rows and block_k >= 1; a_scale_inv
// [M, ceil(K / block_k)] and b_scale_inv [G, ceil(N / b_block_rows), ceil(K / block_k)], each float32 or
// float8_e8m0fnu, on a's device.
GroupedGemmFormats check_block_scaled_grouped_gemm_args(const Tensor& a, const Tensor& a_scale_inv, const Tensor& b,
                                                        const Tensor& b_scale_inv, const Tensor& offs,
                                                        int64_t a_block_rows, int64_t b_block_rows, int64_t block_k,
                                                        const std::optional<Tensor>& bias, ScalarType out_dtype);

// block_scaled_grouped_gemm_wgrad: as fp8_grouped_gemm_wgrad's operands, with block scales: block_k >= 1,
// a_scale_inv [N, C] and b_scale_inv [K, C] (the same C, the groups' chunks; checked against offs by
// check_group_chunks), each float32 or float8_e8m0fnu, on a's device.
// Returns the formats and sizes: N = a.size(0), K = b.size(0), T = a.size(1), G = offs.size(0), C.
struct BlockWgradShape {
  GroupedGemmFormats formats;
  int64_t N, K, T, G, C;
};
BlockWgradShape check_block_scaled_grouped_gemm_wgrad_args(const Tensor& a, const Tensor& a_scale_inv, const Tensor& b,
                                                           const Tensor& b_scale_inv, const Tensor& offs,
                                                           int64_t block_k, ScalarType out_dtype);

// The scale columns of block_scaled_grouped_gemm_wgrad: `chunks` == sum over the groups of ceil(T_g / block_k)
// (offs on the host, already checked). ValueError naming 'a_scale_inv' otherwise.
void check_group_chunks(const int32_t* offs, int64_t groups, int64_t block_k, int64_t chunks, const char* op);

// The values of offs (host memory, `groups` of them): non-decreasing, >= 0, the last equal to `total` (the rows of
// a for fp8_grouped_gemm, its columns for the wgrad). ValueError naming 'offs' otherwise.
void check_group_offsets(const int32_t* offs, int64_t groups, int64_t total, const char* total_name, const char* op);

}  // namespace fp8mp
