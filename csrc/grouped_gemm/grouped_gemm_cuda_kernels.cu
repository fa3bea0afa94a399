// Grouped FP8 GEMMs on CUDA: a host loop of cuBLASLt FP8 GEMMs, one per non-empty group, all on the caller's
// stream, sharing one scratch buffer (stream order keeps their uses apart). cuBLASLt's grouped GEMM API does
// not take FP8 operands with per-group scale pointers in the CUDA versions fp8mp builds against, so each group is
// the ordinary fp8_gemm, with its zero padding, alignment handling and plan cache.
//
// The K-grouped GEMM first copies each group's columns of a [N, T] and b [K, T] into contiguous [N, T_g] and
// [K, T_g] operands (one cudaMemcpy2DAsync each), the layout cuBLASLt's FP8 path needs (both operands K-major).
// Each group's arguments are grouped_gemm_group_args.h's. Offsets on the device are read back to the host once
// per call, which synchronizes with the stream (the glue reads offsets on the CPU without it).
#include "grouped_gemm/grouped_gemm_cuda_kernels.cuh"

#include <algorithm>

#include "common/cuda_check.cuh"
#include "gemm/gemm_cuda_kernels.cuh"
#include "grouped_gemm/grouped_gemm_group_args.h"

namespace fp8mp::cuda {

using namespace grouped;

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
