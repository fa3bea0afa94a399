// CPU implementation of fp8_gemm: an honest emulation of the cuBLASLt FP8 GEMM.
//
//   out[m, n] = round_to_out_dtype( (sum_k dec(a[m, k]) * dec(b[n, k])) * (a_scale_inv * b_scale_inv) + bias[n] )
//
// The FP8 codes are decoded exactly to fp32 (fp8_decode_table.h, the same
// decode the CUDA kernels use), multiplied and accumulated in fp32 by torch's
// CPU GEMM, then scaled by the fp32 product of the two scale_invs, the bias
// added in fp32, and the result rounded once to out_dtype. This is the
// arithmetic of cuBLASLt's FP8 path (exact products, fp32 accumulation, fp32
// epilogue); only the order of the fp32 additions differs, so CPU and GPU agree
// to fp32 rounding of the accumulation (a few ulps of fp32 before the final
// rounding), not bit for bit. `use_fast_accum` selects a less precise
// accumulation inside Hopper's tensor cores; there is nothing to emulate on
// CPU, so it is accepted and ignored here.
//
// b (the weight, [N, K]) is decoded once per call; a is decoded in row blocks
// of about kBlockElements values, so the fp32 copy of a never exceeds that
// however large M is. The fp32 GEMM is torch's at::mm (IEEE fp32 unless the
// user lowered torch.backends.mkldnn's matmul precision).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <optional>

#include "fp8_decode_table.h"
#include "op_checks.h"

namespace fp8mp {
namespace {

constexpr int64_t kGrain = 1 << 15;             // codes per parallel decode task
constexpr int64_t kBlockElements = int64_t(1) << 22;  // fp32 values of a decoded at once (16 MiB)

// Decode n contiguous FP8 codes to fp32.
void decode_into(const uint8_t* codes, float* out, int64_t n, Fp8Format format) {
  const float* table = decode_table_for(format);
  at::parallel_for(0, n, kGrain, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) out[i] = table[codes[i]];
  });
}

at::Tensor decode_rows(const at::Tensor& fp8, int64_t row0, int64_t rows, Fp8Format format, at::Tensor buffer) {
  const int64_t cols = fp8.size(1);
  at::Tensor out = buffer.narrow(0, 0, rows);
  decode_into(reinterpret_cast<const uint8_t*>(fp8.const_data_ptr()) + row0 * cols, out.mutable_data_ptr<float>(),
              rows * cols, format);
  return out;
}

at::Tensor fp8_gemm_cpu(const at::Tensor& a, const at::Tensor& a_scale_inv, const at::Tensor& b,
                        const at::Tensor& b_scale_inv, const std::optional<at::Tensor>& bias, at::ScalarType out_dtype,
                        bool use_fast_accum) {
  (void)use_fast_accum;  // see the top of the file
  const GemmFormats formats = check_fp8_gemm_args(a, a_scale_inv, b, b_scale_inv, bias, out_dtype);
  const int64_t M = a.size(0), K = a.size(1), N = b.size(0);
  const auto f32 = a.options().dtype(at::kFloat);
  at::Tensor out = at::empty({M, N}, a.options().dtype(out_dtype));
  if (M == 0 || N == 0) return out;
  const std::optional<at::Tensor> bias_f32 =
      bias.has_value() ? std::optional<at::Tensor>(bias->to(at::kFloat)) : std::nullopt;
  if (K == 0) {  // an empty sum: the result is the bias (or zeros), whatever the scales
    if (bias_f32.has_value()) {
      out.copy_(bias_f32->unsqueeze(0).expand({M, N}));
    } else {
      out.zero_();
    }
    return out;
  }

  const at::Tensor ac = a.contiguous();
  const at::Tensor bc = b.contiguous();
  // One fp32 rounding, as in cuBLASLt's epilogue (alpha = scale_a * scale_b).
  const float scale = a_scale_inv.item<float>() * b_scale_inv.item<float>();

  at::Tensor b_f32 = at::empty({N, K}, f32);
  decode_into(reinterpret_cast<const uint8_t*>(bc.const_data_ptr()), b_f32.mutable_data_ptr<float>(), N * K,
              formats.b);
  const at::Tensor b_t = b_f32.t();

  const int64_t block_rows = std::min(M, std::max<int64_t>(1, kBlockElements / K));
  at::Tensor a_buffer = at::empty({block_rows, K}, f32);
  // fp32 output is written in place; bf16/fp16 go through an fp32 block and are rounded once at the end.
  at::Tensor acc_buffer = out_dtype == at::kFloat ? at::Tensor() : at::empty({block_rows, N}, f32);
  for (int64_t row0 = 0; row0 < M; row0 += block_rows) {
    const int64_t rows = std::min(block_rows, M - row0);
    const at::Tensor a_block = decode_rows(ac, row0, rows, formats.a, a_buffer);
    at::Tensor out_block = out.narrow(0, row0, rows);
    at::Tensor acc = out_dtype == at::kFloat ? out_block : acc_buffer.narrow(0, 0, rows);
    at::mm_out(acc, a_block, b_t);
    acc.mul_(scale);
    if (bias_f32.has_value()) acc.add_(*bias_f32);
    if (out_dtype != at::kFloat) out_block.copy_(acc);
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(fp8mp, CPU, m) { m.impl("fp8_gemm", &fp8_gemm_cpu); }

}  // namespace fp8mp
