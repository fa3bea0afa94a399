#include "blockwise/blockwise_checks.h"

namespace fp8mp {
namespace {

constexpr ScalarType kFloat8_e8m0fnu = ScalarType::Float8_e8m0fnu;

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

cpu::BlockScaleMode parse_scale_mode(const std::string& s, const char* op) {
  if (s == "fp32") return cpu::BlockScaleMode::Fp32;
  if (s == "pow2") return cpu::BlockScaleMode::Pow2;
  if (s == "e8m0_floor") return cpu::BlockScaleMode::E8m0Floor;
  if (s == "e8m0_rceil") return cpu::BlockScaleMode::E8m0Rceil;
  FP8MP_CHECK_VALUE(false, op, ": argument 'scale_mode' must be 'fp32', 'pow2', 'e8m0_floor' or 'e8m0_rceil', got '",
                    s, "'");
  return cpu::BlockScaleMode::Fp32;  // not reached
}

void check_block_size(int64_t size, const char* op, const char* arg) {
  FP8MP_CHECK_VALUE(size >= 1, op, ": argument '", arg, "' must be >= 1, got ", size);
}

void check_block_scale(const Tensor& scale_inv, const Tensor& data, int64_t block_rows, int64_t block_k,
                       const char* op, const char* arg) {
  FP8MP_CHECK(scale_inv.scalar_type() == kFloat || scale_inv.scalar_type() == kFloat8_e8m0fnu, op, ": argument '",
              arg, "' must be float32 or float8_e8m0fnu, got ", dtype_str(scale_inv.scalar_type()));
  FP8MP_CHECK(same_device(scale_inv, data), op, ": argument '", arg, "' must be on the input's device ",
              device_str(data), ", got ", device_str(scale_inv));
  const int64_t rows = ceil_div(data.size(0), block_rows), cols = ceil_div(data.size(1), block_k);
  FP8MP_CHECK_VALUE(scale_inv.dim() == 2 && scale_inv.size(0) == rows && scale_inv.size(1) == cols, op,
                    ": argument '", arg, "' must have shape [", rows, ", ", cols, "] (one scale per ", block_rows,
                    " x ", block_k, " block), got shape ", shape_str(scale_inv));
}

}  // namespace

namespace {

// The checks every quantize op shares: fmt, scale_mode and x (2-D, high precision).
BlockQuantizeArgs check_quantize_input(const Tensor& x, const std::string& fmt, const std::string& scale_mode,
                                       const char* op) {
  const Fp8Format format = parse_format(fmt, op);
  const cpu::BlockScaleMode mode = parse_scale_mode(scale_mode, op);
  check_high_precision_dtype(x.scalar_type(), op, "x");
  FP8MP_CHECK_VALUE(x.dim() == 2, op, ": argument 'x' must be 2-D, got shape ", shape_str(x));
  return {format, mode};
}

}  // namespace

BlockQuantizeArgs check_block_quantize_args(const Tensor& x, int64_t block_rows, int64_t block_cols,
                                            const std::string& fmt, const std::string& scale_mode) {
  constexpr const char* op = "fp8mp::block_quantize";
  const BlockQuantizeArgs args = check_quantize_input(x, fmt, scale_mode, op);
  check_block_size(block_rows, op, "block_rows");
  check_block_size(block_cols, op, "block_cols");
  return args;
}

BlockQuantizeArgs check_block_quantize_transpose_args(const Tensor& x, int64_t row_block, int64_t col_block,
                                                      const std::string& fmt, const std::string& scale_mode,
                                                      const char* op) {
  const BlockQuantizeArgs args = check_quantize_input(x, fmt, scale_mode, op);
  check_block_size(row_block, op, "row_block");
  check_block_size(col_block, op, "col_block");
  return args;
}

std::tuple<Tensor, Tensor> empty_block_quantized(const Tensor& x, int64_t rows, int64_t cols, int64_t block_rows,
                                                 int64_t block_cols, const BlockQuantizeArgs& args) {
  const ScalarType scale_dtype = cpu::is_e8m0(args.mode) ? kFloat8_e8m0fnu : kFloat;
  return {empty_on({rows, cols}, fp8_dtype(args.format), x),
          empty_on({ceil_div(rows, block_rows), ceil_div(cols, block_cols)}, scale_dtype, x)};
}

BlockGemmFormats check_block_scaled_gemm_args(const Tensor& a, const Tensor& a_scale_inv, const Tensor& b,
                                              const Tensor& b_scale_inv, int64_t a_block_rows, int64_t b_block_rows,
                                              int64_t block_k, const std::optional<Tensor>& bias,
                                              ScalarType out_dtype) {
  constexpr const char* op = "fp8mp::block_scaled_gemm";
  const BlockGemmFormats formats{format_of(a, op, "a"), format_of(b, op, "b")};
  FP8MP_CHECK(!(formats.a == Fp8Format::E5M2 && formats.b == Fp8Format::E5M2), op,
              ": arguments 'a' and 'b' cannot both be float8_e5m2 (FP8 tensor cores have no e5m2 x e5m2 GEMM); "
              "make at least one of them float8_e4m3fn");
  FP8MP_CHECK(same_device(b, a), op, ": argument 'b' must be on the device of 'a' ", device_str(a), ", got ",
              device_str(b));
  check_high_precision_dtype(out_dtype, op, "out_dtype");
  check_gemm_shapes(a, b, op);
  check_block_size(a_block_rows, op, "a_block_rows");
  check_block_size(b_block_rows, op, "b_block_rows");
  check_block_size(block_k, op, "block_k");
  check_block_scale(a_scale_inv, a, a_block_rows, block_k, op, "a_scale_inv");
  check_block_scale(b_scale_inv, b, b_block_rows, block_k, op, "b_scale_inv");
  check_gemm_bias(bias, a, b, out_dtype, op);
  return formats;
}

}  // namespace fp8mp
