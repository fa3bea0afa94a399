#include "cast/cast_checks.h"

namespace fp8mp {

Fp8Format check_cast_to_fp8_args(const Tensor& x, const Tensor& scale, const Tensor& amax, const std::string& fmt,
                                 const char* op) {
  const Fp8Format format = parse_format(fmt, op);
  check_high_precision_dtype(x.scalar_type(), op, "x");
  check_scalar_tensor(scale, x, op, "scale");
  check_scalar_tensor(amax, x, op, "amax");
  check_no_overlap({&amax, "amax"}, {{&x, "x"}, {&scale, "scale"}}, op);
  check_host_cast_scale(scale, op, "scale");
  return format;
}

Fp8Format check_cast_from_fp8_args(const Tensor& y, const Tensor& scale_inv, ScalarType out_dtype) {
  constexpr const char* op = "fp8mp::cast_from_fp8";
  const Fp8Format format = format_of(y, op, "y");
  check_scalar_tensor(scale_inv, y, op, "scale_inv");
  check_high_precision_dtype(out_dtype, op, "out_dtype");
  check_host_cast_scale(scale_inv, op, "scale_inv");
  return format;
}

}  // namespace fp8mp
