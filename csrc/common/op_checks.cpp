#include "common/op_checks.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
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

}  // namespace fp8mp
