// CPU implementation of fp8_gemm: an honest emulation of the cuBLASLt FP8 GEMM.
//
//   out[m, n] = round_to_out_dtype( (sum_k dec(a[m, k]) * dec(b[n, k])) * (a_scale_inv * b_scale_inv) + bias[n] )
//
// The FP8 codes are decoded exactly to fp32 (fp8_decode_table.h, the same
// decode the CUDA kernels use), multiplied and accumulated in fp32 by the fp32
// GEMM the glue hands in (torch's), then scaled by the fp32 product of the two
// scale_invs, the bias added in fp32, and the result rounded once to out_dtype.
// This is the arithmetic of cuBLASLt's FP8 path (exact products, fp32
// accumulation, fp32 epilogue); only the order of the fp32 additions differs,
// so CPU and GPU agree to fp32 rounding of the accumulation (a few ulps of fp32
// before the final rounding), not bit for bit.
//
// b (the weight, [N, K]) is decoded once per call; a is decoded in row blocks
// of about kBlockElements values, so the fp32 copy of a never exceeds that
// however large M is.
#include "gemm/gemm_cpu_kernels.h"

#include <algorithm>
#include <memory>

#include "common/fp8_decode_table.h"

namespace fp8mp::cpu {
namespace {

constexpr int64_t kGrain = 1 << 15;                   // codes per parallel decode task
constexpr int64_t kBlockElements = int64_t(1) << 22;  // fp32 values of a decoded at once (16 MiB)

// Decode n contiguous FP8 codes to fp32.
void decode_into(const uint8_t* codes, float* out, int64_t n, Fp8Format format, ParallelFor parallel_for) {
  const float* table = decode_table_for(format);
  parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) out[i] = table[codes[i]];
  });
}

std::unique_ptr<float[]> uninitialized_floats(int64_t n) { return std::unique_ptr<float[]>(new float[size_t(n)]); }

// out[r, n] = scalar_t(acc[r, n] * scale + bias[n]) for rows x N values: the one rounding to out_dtype.
template <typename scalar_t>
void epilogue(const float* acc, float scale, const scalar_t* bias, scalar_t* out, int64_t rows, int64_t N,
              ParallelFor parallel_for) {
  parallel_for(0, rows * N, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      float v = acc[i] * scale;
      if (bias != nullptr) v = v + static_cast<float>(bias[i % N]);
      out[i] = static_cast<scalar_t>(v);
    }
  });
}

}  // namespace

void fp8_gemm(const uint8_t* a, Fp8Format a_format, const uint8_t* b, Fp8Format b_format, int64_t M, int64_t N,
              int64_t K, float scale, const void* bias, void* out, HpType out_type, const MatmulNtFp32& matmul,
              ParallelFor parallel_for) {
  if (M == 0 || N == 0) return;
  FP8MP_DISPATCH_HP(out_type, [&] {
    const scalar_t* bias_ptr = static_cast<const scalar_t*>(bias);
    scalar_t* out_ptr = static_cast<scalar_t*>(out);
    if (K == 0) {  // an empty sum: the result is the bias (or zeros), whatever the scales
      for (int64_t m = 0; m < M; ++m) {
        for (int64_t n = 0; n < N; ++n) out_ptr[m * N + n] = bias_ptr != nullptr ? bias_ptr[n] : scalar_t(0.0f);
      }
      return;
    }
    const auto b_f32 = uninitialized_floats(N * K);
    decode_into(b, b_f32.get(), N * K, b_format, parallel_for);
    const int64_t block_rows = std::min(M, std::max<int64_t>(1, kBlockElements / K));
    const auto a_block = uninitialized_floats(block_rows * K);
    const auto acc = uninitialized_floats(block_rows * N);
    for (int64_t row0 = 0; row0 < M; row0 += block_rows) {
      const int64_t rows = std::min(block_rows, M - row0);
      decode_into(a + row0 * K, a_block.get(), rows * K, a_format, parallel_for);
      matmul(a_block.get(), b_f32.get(), acc.get(), rows, N, K);
      epilogue(acc.get(), scale, bias_ptr, out_ptr + row0 * N, rows, N, parallel_for);
    }
  });
}

}  // namespace fp8mp::cpu
