#include "op_checks.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cctype>
#include <string>

namespace fp8mp {

Fp8Format parse_format(c10::string_view fmt, const char* op) {
  std::string lower(fmt.begin(), fmt.end());
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  if (lower == "e4m3") return Fp8Format::E4M3;
  if (lower == "e5m2") return Fp8Format::E5M2;
  TORCH_CHECK_VALUE(false, op, ": argument 'fmt' must be 'e4m3' or 'e5m2', got '", std::string(fmt.begin(), fmt.end()), "'");
}

at::ScalarType fp8_dtype(Fp8Format format) {
  return format == Fp8Format::E4M3 ? at::kFloat8_e4m3fn : at::kFloat8_e5m2;
}

Fp8Format format_of(const at::Tensor& t, const char* op, const char* arg) {
  if (t.scalar_type() == at::kFloat8_e4m3fn) return Fp8Format::E4M3;
  if (t.scalar_type() == at::kFloat8_e5m2) return Fp8Format::E5M2;
  TORCH_CHECK(false, op, ": argument '", arg, "' must be float8_e4m3fn or float8_e5m2, got ", t.scalar_type());
}

void check_scalar_tensor(const at::Tensor& t, const at::Tensor& like, const char* op, const char* arg) {
  TORCH_CHECK(t.scalar_type() == at::kFloat, op, ": argument '", arg,
                   "' must be a 1-element float32 tensor, got dtype ", t.scalar_type());
  TORCH_CHECK_VALUE(t.numel() == 1, op, ": argument '", arg, "' must be a 1-element float32 tensor, got shape ",
                    t.sizes());
  TORCH_CHECK(t.device() == like.device(), op, ": argument '", arg, "' must be on the input's device ", like.device(),
              ", got ", t.device());
}

void check_high_precision_dtype(at::ScalarType dtype, const char* op, const char* arg) {
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf, op, ": argument '", arg,
                   "' must be float32, bfloat16 or float16, got ", dtype);
}

Fp8Format check_cast_to_fp8_args(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& amax,
                                 c10::string_view fmt, const char* op) {
  const Fp8Format format = parse_format(fmt, op);
  check_high_precision_dtype(x.scalar_type(), op, "x");
  check_scalar_tensor(scale, x, op, "scale");
  check_scalar_tensor(amax, x, op, "amax");
  return format;
}

Fp8Format check_cast_from_fp8_args(const at::Tensor& y, const at::Tensor& scale_inv, at::ScalarType out_dtype) {
  constexpr const char* op = "fp8mp::cast_from_fp8";
  const Fp8Format format = format_of(y, op, "y");
  check_scalar_tensor(scale_inv, y, op, "scale_inv");
  check_high_precision_dtype(out_dtype, op, "out_dtype");
  return format;
}

GemmFormats check_fp8_gemm_args(const at::Tensor& a, const at::Tensor& a_scale_inv, const at::Tensor& b,
                                const at::Tensor& b_scale_inv, const std::optional<at::Tensor>& bias,
                                at::ScalarType out_dtype) {
  constexpr const char* op = "fp8mp::fp8_gemm";
  const GemmFormats formats{format_of(a, op, "a"), format_of(b, op, "b")};
  TORCH_CHECK(!(formats.a == Fp8Format::E5M2 && formats.b == Fp8Format::E5M2), op,
              ": arguments 'a' and 'b' cannot both be float8_e5m2 (cuBLASLt has no e5m2 x e5m2 FP8 GEMM); "
              "make at least one of them float8_e4m3fn");
  TORCH_CHECK(b.device() == a.device(), op, ": argument 'b' must be on the device of 'a' ", a.device(), ", got ",
              b.device());
  check_scalar_tensor(a_scale_inv, a, op, "a_scale_inv");
  check_scalar_tensor(b_scale_inv, a, op, "b_scale_inv");
  check_high_precision_dtype(out_dtype, op, "out_dtype");
  TORCH_CHECK_VALUE(a.dim() == 2, op, ": argument 'a' must be 2-D [M, K], got shape ", a.sizes());
  TORCH_CHECK_VALUE(b.dim() == 2, op, ": argument 'b' must be 2-D [N, K], got shape ", b.sizes());
  TORCH_CHECK_VALUE(b.size(1) == a.size(1), op, ": argument 'b' must be [N, K] with K = a.size(1) = ", a.size(1),
                    " (out = a @ b.T), got shape ", b.sizes());
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
