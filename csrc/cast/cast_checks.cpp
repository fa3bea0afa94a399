#include "cast/cast_checks.h"

namespace fp8mp {

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

}  // namespace fp8mp
