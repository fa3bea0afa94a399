// Grouped FP8 GEMMs on CUDA: a host loop of cuBLASLt FP8 GEMMs, one per non-empty group, all on the caller's
// stream, sharing one scratch buffer (stream order keeps their uses apart). cuBLASLt's grouped GEMM API does
// not take FP8 operands with per-group scale pointers in the CUDA versions fp8mp builds against, so each group is
// the ordinary fp8_gemm, with its zero padding, alignment handling and plan cache.
//
// The K-grouped GEMM first copies each group's columns of a [N, T] and b [K, T] into contiguous [N, T_g] and
// [K, T_g] operands (one cudaMemcpy2DAsync each), the layout cuBLASLt's FP8 path needs (both operands K-major).
// The group offsets are read back to the host once per call, which synchronizes with the stream.
#include "grouped_gemm/grouped_gemm_cuda_kernels.cuh"

#include <algorithm>

#include "common/cuda_check.cuh"
#include "gemm/gemm_cuda_kernels.cuh"

namespace fp8mp::cuda {
namespace {

size_t element_size(HpType type) { return type == HpType::Float32 ? 4 : 2; }

size_t round_up_256(size_t bytes) { return (bytes + 255) / 256 * 256; }

// Group g's fp8_gemm (M-grouped), rows [start, end).
Fp8GemmArgs group_args(const Fp8GroupedGemmArgs& g, int64_t group, int64_t start, int64_t end) {
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

int64_t widest_group(const int32_t* offs, int64_t groups) {
  int64_t widest = 0, start = 0;
  for (int64_t g = 0; g < groups; ++g) {
    widest = std::max<int64_t>(widest, offs[g] - start);
    start = offs[g];
  }
  return widest;
}

// Group g's fp8_gemm (K-grouped) on the packed copies a_group [N, cols], b_group [K, cols].
Fp8GemmArgs wgrad_group_args(const Fp8GroupedGemmWgradArgs& g, int64_t group, int64_t cols, const uint8_t* a_group,
                             const uint8_t* b_group) {
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
BlockGemmArgs block_group_args(const BlockScaledGroupedGemmArgs& g, int64_t group, int64_t start, int64_t end) {
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

size_t block_scale_bytes(BlockGemmRecipe recipe) { return recipe == BlockGemmRecipe::Mxfp8 ? 1 : 4; }

// Group g's block_scaled_gemm (K-grouped, `cols` columns) on the packed copies of its columns and scale columns.
BlockGemmArgs block_wgrad_group_args(const BlockScaledGroupedGemmWgradArgs& g, int64_t group, int64_t cols,
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

BlockWgradScratch block_wgrad_scratch(const BlockScaledGroupedGemmWgradArgs& args, void* base) {
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

}  // namespace

std::vector<int32_t> read_group_offsets(const int32_t* offs, int64_t groups, cudaStream_t stream) {
  std::vector<int32_t> host(static_cast<size_t>(groups), 0);
  FP8MP_CUDA_CHECK(cudaMemcpyAsync(host.data(), offs, size_t(groups) * sizeof(int32_t), cudaMemcpyDeviceToHost, stream));
  FP8MP_CUDA_CHECK(cudaStreamSynchronize(stream));
  return host;
}

size_t fp8_grouped_gemm_scratch_bytes(const Fp8GroupedGemmArgs& args) {
  size_t bytes = 0;
  int64_t start = 0;
  for (int64_t g = 0; g < args.groups; ++g) {
    bytes = std::max(bytes, fp8_gemm_scratch_bytes(group_args(args, g, start, args.offs[g])));
    start = args.offs[g];
  }
  return bytes;
}

void fp8_grouped_gemm(cublasLtHandle_t handle, const Fp8GroupedGemmArgs& args, void* scratch, cudaStream_t stream) {
  int64_t start = 0;
  for (int64_t g = 0; g < args.groups; ++g) {
    if (args.offs[g] > start) fp8_gemm(handle, group_args(args, g, start, args.offs[g]), scratch, stream);
    start = args.offs[g];
  }
}

// Layout of the scratch: [packed a_group | packed b_group | fp8_gemm's scratch].
size_t fp8_grouped_gemm_wgrad_scratch_bytes(const Fp8GroupedGemmWgradArgs& args) {
  const int64_t widest = widest_group(args.offs, args.groups);
  size_t gemm_bytes = 0;
  int64_t start = 0;
  for (int64_t g = 0; g < args.groups; ++g) {
    gemm_bytes = std::max(gemm_bytes, fp8_gemm_scratch_bytes(wgrad_group_args(args, g, args.offs[g] - start,
                                                                              nullptr, nullptr)));
    start = args.offs[g];
  }
  return round_up_256(size_t(args.N * widest)) + round_up_256(size_t(args.K * widest)) + gemm_bytes;
}

void fp8_grouped_gemm_wgrad(cublasLtHandle_t handle, const Fp8GroupedGemmWgradArgs& args, void* scratch,
                            cudaStream_t stream) {
  const int64_t widest = widest_group(args.offs, args.groups);
  uint8_t* const a_group = static_cast<uint8_t*>(scratch);
  uint8_t* const b_group = a_group + round_up_256(size_t(args.N * widest));
  void* const gemm_scratch = b_group + round_up_256(size_t(args.K * widest));
  int64_t start = 0;
  for (int64_t g = 0; g < args.groups; ++g) {
    const int64_t cols = args.offs[g] - start;
    if (cols > 0) {
      FP8MP_CUDA_CHECK(cudaMemcpy2DAsync(a_group, size_t(cols), args.a + start, size_t(args.T), size_t(cols),
                                         size_t(args.N), cudaMemcpyDeviceToDevice, stream));
      FP8MP_CUDA_CHECK(cudaMemcpy2DAsync(b_group, size_t(cols), args.b + start, size_t(args.T), size_t(cols),
                                         size_t(args.K), cudaMemcpyDeviceToDevice, stream));
    }
    // An empty group is fp8_gemm's K == 0 case: zeros.
    fp8_gemm(handle, wgrad_group_args(args, g, cols, a_group, b_group), gemm_scratch, stream);
    start = args.offs[g];
  }
}

size_t block_scaled_grouped_gemm_scratch_bytes(const BlockScaledGroupedGemmArgs& args) {
  size_t bytes = 0;
  int64_t start = 0;
  for (int64_t g = 0; g < args.groups; ++g) {
    if (args.offs[g] > start) {
      bytes = std::max(bytes, block_scaled_gemm_scratch_bytes(block_group_args(args, g, start, args.offs[g])));
    }
    start = args.offs[g];
  }
  return bytes;
}

void block_scaled_grouped_gemm(cublasLtHandle_t handle, const BlockScaledGroupedGemmArgs& args, void* scratch,
                               cudaStream_t stream) {
  int64_t start = 0;
  for (int64_t g = 0; g < args.groups; ++g) {
    if (args.offs[g] > start) block_scaled_gemm(handle, block_group_args(args, g, start, args.offs[g]), scratch, stream);
    start = args.offs[g];
  }
}

size_t block_scaled_grouped_gemm_wgrad_scratch_bytes(const BlockScaledGroupedGemmWgradArgs& args) {
  size_t gemm_bytes = 0;
  int64_t start = 0;
  for (int64_t g = 0; g < args.groups; ++g) {
    const int64_t cols = args.offs[g] - start;
    if (cols > 0) {
      gemm_bytes = std::max(gemm_bytes, block_scaled_gemm_scratch_bytes(
                                            block_wgrad_group_args(args, g, cols, nullptr, nullptr, nullptr, nullptr)));
    }
    start = args.offs[g];
  }
  return block_wgrad_scratch(args, nullptr).bytes + gemm_bytes;
}

void block_scaled_grouped_gemm_wgrad(cublasLtHandle_t handle, const BlockScaledGroupedGemmWgradArgs& args,
                                     void* scratch, cudaStream_t stream) {
  const BlockWgradScratch s = block_wgrad_scratch(args, scratch);
  const size_t scale_bytes = block_scale_bytes(args.recipe);
  const size_t out_group_bytes = size_t(args.N * args.K) * element_size(args.out_type);
  int64_t start = 0, chunk0 = 0;
  for (int64_t g = 0; g < args.groups; ++g) {
    const int64_t cols = args.offs[g] - start, group_chunks = (cols + args.block_k - 1) / args.block_k;
    if (cols == 0) {  // an empty sum: zeros (all-zero bytes in every output dtype)
      FP8MP_CUDA_CHECK(cudaMemsetAsync(static_cast<uint8_t*>(args.out) + g * out_group_bytes, 0, out_group_bytes,
                                       stream));
    } else {
      const size_t chunk_bytes = size_t(group_chunks) * scale_bytes, row_chunk_bytes = size_t(args.chunks) * scale_bytes;
      const auto* a_scale_src = static_cast<const uint8_t*>(args.a.scale_inv) + size_t(chunk0) * scale_bytes;
      const auto* b_scale_src = static_cast<const uint8_t*>(args.b.scale_inv) + size_t(chunk0) * scale_bytes;
      FP8MP_CUDA_CHECK(cudaMemcpy2DAsync(s.a_group, size_t(cols), args.a.data + start, size_t(args.T), size_t(cols),
                                         size_t(args.N), cudaMemcpyDeviceToDevice, stream));
      FP8MP_CUDA_CHECK(cudaMemcpy2DAsync(s.b_group, size_t(cols), args.b.data + start, size_t(args.T), size_t(cols),
                                         size_t(args.K), cudaMemcpyDeviceToDevice, stream));
      FP8MP_CUDA_CHECK(cudaMemcpy2DAsync(s.a_scales, chunk_bytes, a_scale_src, row_chunk_bytes, chunk_bytes,
                                         size_t(args.N), cudaMemcpyDeviceToDevice, stream));
      FP8MP_CUDA_CHECK(cudaMemcpy2DAsync(s.b_scales, chunk_bytes, b_scale_src, row_chunk_bytes, chunk_bytes,
                                         size_t(args.K), cudaMemcpyDeviceToDevice, stream));
      block_scaled_gemm(handle, block_wgrad_group_args(args, g, cols, s.a_group, s.a_scales, s.b_group, s.b_scales),
                        s.gemm, stream);
    }
    chunk0 += group_chunks;
    start = args.offs[g];
  }
}

}  // namespace fp8mp::cuda
