#include "gemm/gemm_checks.h"

namespace fp8mp {

GemmFormats check_fp8_gemm_args(const Tensor& a, const Tensor& a_scale_inv, const Tensor& b, const Tensor& b_scale_inv,
                                const std::optional<Tensor>& bias, ScalarType out_dtype) {
  constexpr const char* op = "fp8mp::fp8_gemm";
  const GemmFormats formats{format_of(a, op, "a"), format_of(b, op, "b")};
  FP8MP_CHECK(!(formats.a == Fp8Format::E5M2 && formats.b == Fp8Format::E5M2), op,
              ": arguments 'a' and 'b' cannot both be float8_e5m2 (cuBLASLt has no e5m2 x e5m2 FP8 GEMM); "
              "make at least one of them float8_e4m3fn");
  FP8MP_CHECK(same_device(b, a), op, ": argument 'b' must be on the device of 'a' ", device_str(a), ", got ",
              device_str(b));
  check_scalar_tensor(a_scale_inv, a, op, "a_scale_inv");
  check_scalar_tensor(b_scale_inv, a, op, "b_scale_inv");
  check_high_precision_dtype(out_dtype, op, "out_dtype");
  check_gemm_shapes(a, b, op);
  check_gemm_bias(bias, a, b, out_dtype, op);
  return formats;
}

}  // namespace fp8mp
