// Each group's GEMM arguments in the CUDA grouped GEMMs (grouped_gemm_cuda_kernels.cu): where group g's rows or
// columns, scales, bias and output sit in the whole operands, and the scratch layout of the K-grouped ones. Pure
// host arithmetic on the torch-free argument structs, so that the Catch2 suite checks it on the CPU
// (tests/cpp/test_cuda_glue.cpp), where no GPU runs the per-group launches it feeds.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "blockwise/block_gemm_cuda_kernels.cuh"
#include "gemm/gemm_cuda_kernels.cuh"
#include "grouped_gemm/grouped_gemm_cuda_kernels.cuh"

namespace fp8mp::cuda::grouped {

inline size_t element_size(HpType type) { return type == HpType::Float32 ? 4 : 2; }

inline size_t round_up_256(size_t bytes) { return (bytes + 255) / 256 * 256; }

// Group g's fp8_gemm (M-grouped), rows [start, end).
inline Fp8GemmArgs group_args(const Fp8GroupedGemmArgs& g, int64_t group, int64_t start, int64_t end) {
  const size_t out_row_bytes = size_t(g.N) * element_size(g.out_type);
  return Fp8GemmArgs{g.a + start * g.K,
                     g.a_format,
                     g.b + group * g.N * g.K,
                     g.b_format,
                     end - start,
                     g.N,
                     g.K,
                     g.a_scale_inv,
                     g.b_scale_inv + group,
                     g.bias == nullptr ? nullptr : static_cast<const uint8_t*>(g.bias) + group * out_row_bytes,
                     static_cast<uint8_t*>(g.out) + start * out_row_bytes,
                     g.out_type,
                     g.use_fast_accum};
}

inline int64_t widest_group(const int32_t* offs, int64_t groups) {
  int64_t widest = 0, start = 0;
  for (int64_t g = 0; g < groups; ++g) {
    widest = std::max<int64_t>(widest, offs[g] - start);
    start = offs[g];
  }
  return widest;
}

// Group g's fp8_gemm (K-grouped) on the packed copies a_group [N, cols], b_group [K, cols].
inline Fp8GemmArgs wgrad_group_args(const Fp8GroupedGemmWgradArgs& g, int64_t group, int64_t cols,
                                    const uint8_t* a_group, const uint8_t* b_group) {
  return Fp8GemmArgs{a_group,
                     g.a_format,
                     b_group,
                     g.b_format,
                     g.N,
                     g.K,
                     cols,
                     g.a_scale_inv,
                     g.b_scale_inv,
                     nullptr,
                     static_cast<uint8_t*>(g.out) + size_t(group * g.N * g.K) * element_size(g.out_type),
                     g.out_type,
                     g.use_fast_accum};
}

// Group g's block_scaled_gemm, rows [start, end).
inline BlockGemmArgs block_group_args(const BlockScaledGroupedGemmArgs& g, int64_t group, int64_t start,
                                      int64_t end) {
  const int64_t chunks = (g.K + g.block_k - 1) / g.block_k, b_row_blocks = (g.N + g.b.block_rows - 1) / g.b.block_rows;
  // Every recipe has fp32 scales on both operands but MXFP8's, E8M0 bytes on both (block_gemm_recipe).
  const size_t scale_bytes = g.recipe == BlockGemmRecipe::Mxfp8 ? 1 : 4;
  const size_t out_row_bytes = size_t(g.N) * element_size(g.out_type);
  BlockGemmOperand a = g.a, b = g.b;
  a.data = g.a.data + start * g.K;
  a.scale_inv = static_cast<const uint8_t*>(g.a.scale_inv) + size_t(start * chunks) * scale_bytes;
  a.rows = end - start;
  b.data = g.b.data + group * g.N * g.K;
  b.scale_inv = static_cast<const uint8_t*>(g.b.scale_inv) + size_t(group * b_row_blocks * chunks) * scale_bytes;
  b.rows = g.N;
  return BlockGemmArgs{g.recipe, a, b, g.K, g.block_k,
                       g.bias == nullptr ? nullptr : static_cast<const uint8_t*>(g.bias) + group * out_row_bytes,
                       static_cast<uint8_t*>(g.out) + start * out_row_bytes, g.out_type};
}

inline size_t block_scale_bytes(BlockGemmRecipe recipe) { return recipe == BlockGemmRecipe::Mxfp8 ? 1 : 4; }

// Group g's block_scaled_gemm (K-grouped, `cols` columns) on the packed copies of its columns and scale columns.
inline BlockGemmArgs block_wgrad_group_args(const BlockScaledGroupedGemmWgradArgs& g, int64_t group, int64_t cols,
                                            const uint8_t* a_group, const void* a_scales, const uint8_t* b_group,
                                            const void* b_scales) {
  BlockGemmOperand a = g.a, b = g.b;
  a.data = a_group;
  a.scale_inv = a_scales;
  b.data = b_group;
  b.scale_inv = b_scales;
  return BlockGemmArgs{g.recipe, a, b, cols, g.block_k, nullptr,
                       static_cast<uint8_t*>(g.out) + size_t(group * g.N * g.K) * element_size(g.out_type),
                       g.out_type};
}

// Layout of the wgrad scratch: [a_group | b_group | a_scales | b_scales | block_scaled_gemm's scratch].
struct BlockWgradScratch {
  uint8_t *a_group, *b_group, *a_scales, *b_scales;
  void* gemm;
  size_t bytes;
};

inline BlockWgradScratch block_wgrad_scratch(const BlockScaledGroupedGemmWgradArgs& args, void* base) {
  const int64_t widest = widest_group(args.offs, args.groups);
  const size_t widest_chunk_bytes = size_t((widest + args.block_k - 1) / args.block_k) * block_scale_bytes(args.recipe);
  const size_t sizes[4] = {round_up_256(size_t(args.N * widest)), round_up_256(size_t(args.K * widest)),
                           round_up_256(size_t(args.N) * widest_chunk_bytes),
                           round_up_256(size_t(args.K) * widest_chunk_bytes)};
  uint8_t* p = static_cast<uint8_t*>(base);
  BlockWgradScratch s{p, p + sizes[0], p + sizes[0] + sizes[1], p + sizes[0] + sizes[1] + sizes[2], nullptr, 0};
  s.bytes = sizes[0] + sizes[1] + sizes[2] + sizes[3];
  s.gemm = p == nullptr ? nullptr : p + s.bytes;
  return s;
}

}  // namespace fp8mp::cuda::grouped
