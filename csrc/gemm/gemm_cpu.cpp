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
// however large M is. The fp32 GEMM is oneDNN's inner product (torch's
// mkldnn::_linear_pointwise, which takes b as [N, K] as it is), about twice as
// fast as at::mm's MKL sgemm on AMD CPUs; at::mm where torch lacks oneDNN.
// Both are IEEE fp32 unless the user lowered torch's fp32 matmul precision.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/library.h>

#include <algorithm>
#include <cstdint>
#include <optional>

#include "common/fp8_decode_table.h"
#include "gemm/gemm_checks.h"

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

// a [M, K] @ b [N, K]^T in fp32.
at::Tensor matmul_nt_fp32(const at::Tensor& a, const at::Tensor& b) {
  using LinearFn = at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&, c10::string_view,
                              c10::List<std::optional<at::Scalar>>, std::optional<c10::string_view>);
  static const std::optional<c10::TypedOperatorHandle<LinearFn>> onednn_linear =
      []() -> std::optional<c10::TypedOperatorHandle<LinearFn>> {
    const auto handle = c10::Dispatcher::singleton().findOp({"mkldnn::_linear_pointwise", ""});
    if (!handle.has_value() || !at::hasMKLDNN()) return std::nullopt;
    return handle->typed<LinearFn>();
  }();
  if (onednn_linear.has_value() && at::globalContext().userEnabledMkldnn()) {
    return onednn_linear->call(a, b, std::nullopt, "none", c10::List<std::optional<at::Scalar>>(), std::nullopt);
  }
  return at::mm(a, b.t());
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

  const int64_t block_rows = std::min(M, std::max<int64_t>(1, kBlockElements / K));
  at::Tensor a_buffer = at::empty({block_rows, K}, f32);
  for (int64_t row0 = 0; row0 < M; row0 += block_rows) {
    const int64_t rows = std::min(block_rows, M - row0);
    const at::Tensor a_block = decode_rows(ac, row0, rows, formats.a, a_buffer);
    at::Tensor out_block = out.narrow(0, row0, rows);
    at::Tensor acc = matmul_nt_fp32(a_block, b_f32);
    acc.mul_(scale);
    if (bias_f32.has_value()) acc.add_(*bias_f32);
    out_block.copy_(acc);  // the one rounding to out_dtype
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(fp8mp, CPU, m) { m.impl("fp8_gemm", &fp8_gemm_cpu); }

}  // namespace fp8mp
