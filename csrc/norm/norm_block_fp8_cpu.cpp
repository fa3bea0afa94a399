// CPU glue of norm_fwd_block_fp8 (stable ABI): LayerNorm / RMSNorm writing block-scaled FP8 in both
// layouts (the fused norm of fp8mp.nn.LayerNormLinear under BlockScaling and MXFP8Scaling).
#include <optional>
#include <string>
#include <tuple>

#include "blockwise/blockwise_checks.h"
#include "norm/norm_checks.h"
#include "norm/norm_cpu_kernels.h"
#include "norm/norm_entry_points.h"

namespace fp8mp {
namespace {

using BlockNormResult = std::tuple<Tensor, Tensor, Tensor, Tensor, Tensor, Tensor>;

BlockNormResult norm_fwd_block_fp8_cpu(Tensor x, OptionalTensor weight, OptionalTensor bias, double eps,
                                       bool is_layernorm, bool zero_centered_gamma, int64_t row_block,
                                       int64_t col_block, std::string fmt, std::string scale_mode) {
  constexpr const char* op = "fp8mp::norm_fwd_block_fp8";
  FP8MP_CHECK_VALUE(is_layernorm || !bias.has_value(), op, ": argument 'bias' must be None for RMSNorm "
                    "(is_layernorm=False)");
  check_norm_fwd_args(x, weight, bias, eps, op);
  const BlockQuantizeArgs args = check_block_quantize_transpose_args(x, row_block, col_block, fmt, scale_mode, op);
  const Tensor xc = as_contiguous(x);
  const OptionalTensor w = contiguous_or_none(weight), b = contiguous_or_none(bias);
  const int64_t rows = x.size(0), cols = x.size(1);
  auto [y, scale_inv] = empty_block_quantized(x, rows, cols, 1, row_block, args);
  auto [y_t, scale_inv_t] = empty_block_quantized(x, cols, rows, 1, col_block, args);
  Tensor mean = empty_on({is_layernorm ? rows : 0}, kFloat, x);
  Tensor rstd = empty_on({rows}, kFloat, x);
  const NormFwdArgs norm{is_layernorm,
                         xc.const_data_ptr(),
                         hp_type(x.scalar_type()),
                         rows,
                         cols,
                         data_or_null(w),
                         hp_type_or_f32(w),
                         data_or_null(b),
                         hp_type_or_f32(b),
                         zero_centered_gamma,
                         static_cast<float>(eps),
                         is_layernorm ? static_cast<float*>(mean.mutable_data_ptr()) : nullptr,
                         static_cast<float*>(rstd.mutable_data_ptr()),
                         nullptr,
                         true,
                         args.format,
                         nullptr,
                         nullptr};
  cpu::norm_fwd_block_fp8(norm, row_block, col_block, args.mode, static_cast<uint8_t*>(y.mutable_data_ptr()),
                          scale_inv.mutable_data_ptr(), static_cast<uint8_t*>(y_t.mutable_data_ptr()),
                          scale_inv_t.mutable_data_ptr(), stable_parallel_for);
  return {y, scale_inv, y_t, scale_inv_t, mean, rstd};
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(fp8mp, CPU, m) { m.impl("norm_fwd_block_fp8", TORCH_BOX(&norm_fwd_block_fp8_cpu)); }

}  // namespace fp8mp
