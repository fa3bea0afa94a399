#include "blockwise/blockwise_checks.h"

#include <c10/util/Exception.h>

#include <string>

namespace fp8mp {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

cpu::BlockScaleMode parse_scale_mode(c10::string_view mode, const char* op) {
  const std::string s(mode.begin(), mode.end());
  if (s == "fp32") return cpu::BlockScaleMode::Fp32;
  if (s == "pow2") return cpu::BlockScaleMode::Pow2;
  if (s == "e8m0_floor") return cpu::BlockScaleMode::E8m0Floor;
  if (s == "e8m0_rceil") return cpu::BlockScaleMode::E8m0Rceil;
  TORCH_CHECK_VALUE(false, op, ": argument 'scale_mode' must be 'fp32', 'pow2', 'e8m0_floor' or 'e8m0_rceil', got '",
                    s, "'");
}

void check_block_size(int64_t size, const char* op, const char* arg) {
  TORCH_CHECK_VALUE(size >= 1, op, ": argument '", arg, "' must be >= 1, got ", size);
}

void check_block_scale(const at::Tensor& scale_inv, const at::Tensor& data, int64_t block_rows, int64_t block_k,
                       const char* op, const char* arg) {
  TORCH_CHECK(scale_inv.scalar_type() == at::kFloat || scale_inv.scalar_type() == at::kFloat8_e8m0fnu, op,
              ": argument '", arg, "' must be float32 or float8_e8m0fnu, got ", scale_inv.scalar_type());
  TORCH_CHECK(scale_inv.device() == data.device(), op, ": argument '", arg, "' must be on the input's device ",
              data.device(), ", got ", scale_inv.device());
  const int64_t rows = ceil_div(data.size(0), block_rows), cols = ceil_div(data.size(1), block_k);
  TORCH_CHECK_VALUE(scale_inv.dim() == 2 && scale_inv.size(0) == rows && scale_inv.size(1) == cols, op, ": argument '",
                    arg, "' must have shape [", rows, ", ", cols, "] (one scale per ", block_rows, " x ", block_k,
                    " block), got shape ", scale_inv.sizes());
}

}  // namespace

BlockQuantizeArgs check_block_quantize_args(const at::Tensor& x, int64_t block_rows, int64_t block_cols,
                                            c10::string_view fmt, c10::string_view scale_mode) {
  constexpr const char* op = "fp8mp::block_quantize";
  const Fp8Format format = parse_format(fmt, op);
  const cpu::BlockScaleMode mode = parse_scale_mode(scale_mode, op);
  check_high_precision_dtype(x.scalar_type(), op, "x");
  TORCH_CHECK_VALUE(x.dim() == 2, op, ": argument 'x' must be 2-D, got shape ", x.sizes());
  check_block_size(block_rows, op, "block_rows");
  check_block_size(block_cols, op, "block_cols");
  return {format, mode};
}

BlockGemmFormats check_block_scaled_gemm_args(const at::Tensor& a, const at::Tensor& a_scale_inv, const at::Tensor& b,
                                              const at::Tensor& b_scale_inv, int64_t a_block_rows,
                                              int64_t b_block_rows, int64_t block_k,
                                              const std::optional<at::Tensor>& bias, at::ScalarType out_dtype) {
  constexpr const char* op = "fp8mp::block_scaled_gemm";
  const BlockGemmFormats formats{format_of(a, op, "a"), format_of(b, op, "b")};
  TORCH_CHECK(!(formats.a == Fp8Format::E5M2 && formats.b == Fp8Format::E5M2), op,
              ": arguments 'a' and 'b' cannot both be float8_e5m2 (FP8 tensor cores have no e5m2 x e5m2 GEMM); "
              "make at least one of them float8_e4m3fn");
  TORCH_CHECK(b.device() == a.device(), op, ": argument 'b' must be on the device of 'a' ", a.device(), ", got ",
              b.device());
  check_high_precision_dtype(out_dtype, op, "out_dtype");
  TORCH_CHECK_VALUE(a.dim() == 2, op, ": argument 'a' must be 2-D [M, K], got shape ", a.sizes());
  TORCH_CHECK_VALUE(b.dim() == 2, op, ": argument 'b' must be 2-D [N, K], got shape ", b.sizes());
  TORCH_CHECK_VALUE(b.size(1) == a.size(1), op, ": argument 'b' must be [N, K] with K = a.size(1) = ", a.size(1),
                    " (out = a @ b.T), got shape ", b.sizes());
  check_block_size(a_block_rows, op, "a_block_rows");
  check_block_size(b_block_rows, op, "b_block_rows");
  check_block_size(block_k, op, "block_k");
  check_block_scale(a_scale_inv, a, a_block_rows, block_k, op, "a_scale_inv");
  check_block_scale(b_scale_inv, b, b_block_rows, block_k, op, "b_scale_inv");
  if (bias.has_value()) {
    const at::Tensor& t = *bias;
    TORCH_CHECK(t.scalar_type() == out_dtype, op, ": argument 'bias' must have dtype out_dtype = ", out_dtype,
                ", got ", t.scalar_type());
    TORCH_CHECK(t.device() == a.device(), op, ": argument 'bias' must be on the input's device ", a.device(), ", got ",
                t.device());
    TORCH_CHECK_VALUE(t.dim() == 1 && t.size(0) == b.size(0), op, ": argument 'bias' must have shape [N] = [",
                      b.size(0), "], got shape ", t.sizes());
  }
  return formats;
}

}  // namespace fp8mp
