// Grouped FP8 GEMMs on CPU: a loop over the groups in C++, each group one fp8_gemm call (which parallelizes
// inside and takes the AMX / AVX512-BF16 / fp32 path cpu_gemm_path.h chose). Empty groups cost nothing in the
// M-grouped GEMM; in the K-grouped one they are fp8_gemm's K == 0 case (zeros).
#include "grouped_gemm/grouped_gemm_cpu_kernels.h"

#include <algorithm>
#include <cstring>
#include <memory>

namespace fp8mp::cpu {
namespace {

size_t element_size(HpType type) { return type == HpType::Float32 ? 4 : 2; }

// dst [rows, cols] (contiguous) = src[:, col0 : col0 + cols] of a row-major [rows, src_cols] code matrix.
void copy_columns(const uint8_t* src, int64_t src_cols, int64_t col0, int64_t rows, int64_t cols, uint8_t* dst,
                  ParallelFor parallel_for) {
  parallel_for(0, rows, std::max<int64_t>(1, (int64_t(1) << 16) / std::max<int64_t>(cols, 1)),
               [&](int64_t begin, int64_t end) {
                 for (int64_t r = begin; r < end; ++r) std::memcpy(dst + r * cols, src + r * src_cols + col0, cols);
               });
}

}  // namespace

void fp8_grouped_gemm(const uint8_t* a, Fp8Format a_format, const uint8_t* b, Fp8Format b_format,
                      const int32_t* offs, int64_t groups, int64_t N, int64_t K, float a_scale_inv,
                      const float* b_scale_inv, const void* bias, void* out, HpType out_type,
                      const MatmulNtFp32& matmul, ParallelFor parallel_for, int threads) {
  const size_t out_row_bytes = size_t(N) * element_size(out_type);
  int64_t start = 0;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t end = offs[g], rows = end - start;
    if (rows > 0) {
      // The scale as fp8_gemm's glue forms it: one fp32 product of the two scale_invs.
      const float scale = a_scale_inv * b_scale_inv[g];
      const void* group_bias = bias == nullptr ? nullptr : static_cast<const uint8_t*>(bias) + g * out_row_bytes;
      fp8_gemm(a + start * K, a_format, b + g * N * K, b_format, rows, N, K, scale, group_bias,
               static_cast<uint8_t*>(out) + start * out_row_bytes, out_type, matmul, parallel_for, threads);
    }
    start = end;
  }
}

void fp8_grouped_gemm_wgrad(const uint8_t* a, Fp8Format a_format, const uint8_t* b, Fp8Format b_format,
                            const int32_t* offs, int64_t groups, int64_t N, int64_t K, int64_t T, float scale,
                            void* out, HpType out_type, const MatmulNtFp32& matmul, ParallelFor parallel_for,
                            int threads) {
  int64_t widest = 0, start = 0;
  for (int64_t g = 0; g < groups; ++g) {
    widest = std::max<int64_t>(widest, offs[g] - start);
    start = offs[g];
  }
  // One group's columns of a and of b, contiguous, reused by every group.
  const std::unique_ptr<uint8_t[]> a_group(new uint8_t[size_t(std::max<int64_t>(N * widest, 1))]);
  const std::unique_ptr<uint8_t[]> b_group(new uint8_t[size_t(std::max<int64_t>(K * widest, 1))]);
  const size_t out_group_bytes = size_t(N * K) * element_size(out_type);
  start = 0;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t cols = offs[g] - start;
    copy_columns(a, T, start, N, cols, a_group.get(), parallel_for);
    copy_columns(b, T, start, K, cols, b_group.get(), parallel_for);
    fp8_gemm(a_group.get(), a_format, b_group.get(), b_format, N, K, cols, scale, nullptr,
             static_cast<uint8_t*>(out) + g * out_group_bytes, out_type, matmul, parallel_for, threads);
    start = offs[g];
  }
}

void block_scaled_grouped_gemm(const BlockOperand& a, const BlockOperand& b, const int32_t* offs, int64_t groups,
                               int64_t N, int64_t K, int64_t block_k, const void* bias, void* out, HpType out_type,
                               const BatchedMatmulNtFp32& matmul, ParallelFor parallel_for) {
  const size_t scale_bytes_a = a.scale_type == BlockScaleType::Fp32 ? 4 : 1;
  const size_t scale_bytes_b = b.scale_type == BlockScaleType::Fp32 ? 4 : 1;
  const int64_t chunks = (K + block_k - 1) / block_k, b_row_blocks = (N + b.block_rows - 1) / b.block_rows;
  const size_t out_row_bytes = size_t(N) * element_size(out_type);
  int64_t start = 0;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t end = offs[g];
    if (end > start) {
      BlockOperand a_group = a, b_group = b;
      a_group.data = a.data + start * K;
      a_group.scale_inv = static_cast<const uint8_t*>(a.scale_inv) + size_t(start * chunks) * scale_bytes_a;
      b_group.data = b.data + g * N * K;
      b_group.scale_inv = static_cast<const uint8_t*>(b.scale_inv) + size_t(g * b_row_blocks * chunks) * scale_bytes_b;
      const void* group_bias = bias == nullptr ? nullptr : static_cast<const uint8_t*>(bias) + g * out_row_bytes;
      block_scaled_gemm(a_group, b_group, end - start, N, K, block_k, group_bias,
                        static_cast<uint8_t*>(out) + start * out_row_bytes, out_type, matmul, parallel_for);
    }
    start = end;
  }
}

void block_scaled_grouped_gemm_wgrad(const BlockOperand& a, const BlockOperand& b, const int32_t* offs,
                                     int64_t groups, int64_t N, int64_t K, int64_t T, int64_t chunks, int64_t block_k,
                                     void* out, HpType out_type, const BatchedMatmulNtFp32& matmul,
                                     ParallelFor parallel_for) {
  const int64_t scale_bytes_a = a.scale_type == BlockScaleType::Fp32 ? 4 : 1;
  const int64_t scale_bytes_b = b.scale_type == BlockScaleType::Fp32 ? 4 : 1;
  int64_t widest = 0, start = 0;
  for (int64_t g = 0; g < groups; ++g) {
    widest = std::max<int64_t>(widest, offs[g] - start);
    start = offs[g];
  }
  const int64_t widest_chunks = (widest + block_k - 1) / block_k;
  // One group's columns of a and b and of their scales, contiguous, reused by every group.
  const std::unique_ptr<uint8_t[]> a_group(new uint8_t[size_t(std::max<int64_t>(N * widest, 1))]);
  const std::unique_ptr<uint8_t[]> b_group(new uint8_t[size_t(std::max<int64_t>(K * widest, 1))]);
  const std::unique_ptr<uint8_t[]> a_scales(new uint8_t[size_t(std::max<int64_t>(N * widest_chunks * 4, 1))]);
  const std::unique_ptr<uint8_t[]> b_scales(new uint8_t[size_t(std::max<int64_t>(K * widest_chunks * 4, 1))]);
  const size_t out_group_bytes = size_t(N * K) * element_size(out_type);
  const auto* a_scale_bytes = static_cast<const uint8_t*>(a.scale_inv);
  const auto* b_scale_bytes = static_cast<const uint8_t*>(b.scale_inv);
  int64_t chunk0 = 0;
  start = 0;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t cols = offs[g] - start, group_chunks = (cols + block_k - 1) / block_k;
    copy_columns(a.data, T, start, N, cols, a_group.get(), parallel_for);
    copy_columns(b.data, T, start, K, cols, b_group.get(), parallel_for);
    copy_columns(a_scale_bytes, chunks * scale_bytes_a, chunk0 * scale_bytes_a, N, group_chunks * scale_bytes_a,
                 a_scales.get(), parallel_for);
    copy_columns(b_scale_bytes, chunks * scale_bytes_b, chunk0 * scale_bytes_b, K, group_chunks * scale_bytes_b,
                 b_scales.get(), parallel_for);
    const BlockOperand a_g{a_group.get(), a.format, a_scales.get(), a.scale_type, 1};
    const BlockOperand b_g{b_group.get(), b.format, b_scales.get(), b.scale_type, 1};
    // An empty group is block_scaled_gemm's K == 0 case: zeros.
    block_scaled_gemm(a_g, b_g, N, K, cols, block_k, nullptr, static_cast<uint8_t*>(out) + g * out_group_bytes,
                      out_type, matmul, parallel_for);
    chunk0 += group_chunks;
    start = offs[g];
  }
}

}  // namespace fp8mp::cpu
