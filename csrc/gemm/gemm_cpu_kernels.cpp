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
// Where the CPU has bf16 matrix units (cpu_gemm_path.h decides, once), fp8mp's
// own AMX (bf16_gemm_amx.h) or AVX512-BF16 (bf16_gemm_avx512.h) kernel runs
// instead: the codes decoded to bf16 - exact too - while packing, the same exact
// products and fp32 sums.
//
// On the fp32 path b (the weight, [N, K]) is decoded once per call; a is decoded
// in row blocks of about kBlockElements values, so the decoded copy of a never
// exceeds that however large M is. These buffers come from the scratch pool
// (scratch_pool.h): fresh pages for them cost more than the decode (measured on
// a Xeon, 2 threads, 4096 x 1024 x 1024: 30.0 ms a call with new[] buffers, of
// which about 9,000 page faults, against 20 ms for the fp32 GEMM alone).
#include "gemm/gemm_cpu_kernels.h"

#include <algorithm>
#include <optional>
#include <type_traits>

#include "common/fp8_decode_table.h"
#include "common/scratch_pool.h"
#include "gemm/bf16_gemm_amx.h"
#include "gemm/bf16_gemm_avx512.h"
#include "gemm/cpu_gemm_path.h"

namespace fp8mp::cpu {
namespace {

constexpr int64_t kGrain = 1 << 15;                   // codes per parallel decode task
constexpr int64_t kBlockElements = int64_t(1) << 22;  // values of a decoded at once (16 MiB as fp32)

// Decode n contiguous FP8 codes to fp32.
void decode_into(const uint8_t* codes, float* out, int64_t n, Fp8Format format, ParallelFor parallel_for) {
  const float* table = decode_table_for(format);
  parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) out[i] = table[codes[i]];
  });
}

// out[r, n] = scalar_t(acc[r, n] * scale + bias[n]) for rows x N values: the one rounding to out_dtype. acc may
// be out itself (fp32 out): each value is read before it is written.
template <typename scalar_t>
void epilogue(const float* acc, float scale, const scalar_t* bias, scalar_t* out, int64_t rows, int64_t N,
              ParallelFor parallel_for) {
  parallel_for(0, rows, std::max<int64_t>(1, kGrain / N), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float* acc_row = acc + r * N;
      scalar_t* out_row = out + r * N;
      if (bias == nullptr) {
        for (int64_t n = 0; n < N; ++n) out_row[n] = static_cast<scalar_t>(acc_row[n] * scale);
      } else {
        for (int64_t n = 0; n < N; ++n) out_row[n] = static_cast<scalar_t>(acc_row[n] * scale + static_cast<float>(bias[n]));
      }
    }
  });
}

// The fp32 path: decode b once and a by row blocks to fp32, multiply into fp32, epilogue.
template <typename scalar_t>
void fp32_gemm(const uint8_t* a, Fp8Format a_format, const uint8_t* b, Fp8Format b_format, int64_t M, int64_t N,
               int64_t K, float scale, const scalar_t* bias, scalar_t* out, const MatmulNtFp32& matmul,
               ParallelFor parallel_for) {
  const ScratchBuffer b_storage(size_t(N * K) * sizeof(float));
  float* const b_dec = b_storage.as<float>();
  decode_into(b, b_dec, N * K, b_format, parallel_for);
  const int64_t block_rows = std::min(M, std::max<int64_t>(1, kBlockElements / K));
  // An fp32 out holds the sums itself and takes the epilogue in place (one buffer less to pass through the caches).
  constexpr bool kSumsInOut = std::is_same_v<scalar_t, float>;
  const ScratchBuffer a_storage(size_t(block_rows * K) * sizeof(float));
  std::optional<ScratchBuffer> acc_storage;  // taken from the pool only where out cannot hold the sums
  if (!kSumsInOut) acc_storage.emplace(size_t(block_rows * N) * sizeof(float));
  float* const a_block = a_storage.as<float>();
  for (int64_t row0 = 0; row0 < M; row0 += block_rows) {
    const int64_t rows = std::min(block_rows, M - row0);
    float* const acc = kSumsInOut ? reinterpret_cast<float*>(out + row0 * N) : acc_storage->as<float>();
    decode_into(a + row0 * K, a_block, rows * K, a_format, parallel_for);
    matmul(a_block, b_dec, acc, rows, N, K);
    epilogue(acc, scale, bias, out + row0 * N, rows, N, parallel_for);
  }
}

}  // namespace

void fp8_gemm(const uint8_t* a, Fp8Format a_format, const uint8_t* b, Fp8Format b_format, int64_t M, int64_t N,
              int64_t K, float scale, const void* bias, void* out, HpType out_type, const MatmulNtFp32& matmul,
              ParallelFor parallel_for, int threads) {
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
#if FP8MP_AVX512_KERNELS
    if (gemm_path() == GemmPath::Amx) {
      fp8_gemm_amx_bf16(a, a_format, b, b_format, M, N, K, scale, bias_ptr, out_ptr, parallel_for, threads);
      return;
    }
    if (gemm_path() == GemmPath::Avx512Bf16) {
      fp8_gemm_avx512_bf16(a, a_format, b, b_format, M, N, K, scale, bias_ptr, out_ptr, parallel_for);
      return;
    }
#endif
    fp32_gemm(a, a_format, b, b_format, M, N, K, scale, bias_ptr, out_ptr, matmul, parallel_for);
  });
}

}  // namespace fp8mp::cpu
