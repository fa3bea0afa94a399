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
  FP8MP_CHECK_VALUE(a.dim() == 2, op, ": argument 'a' must be 2-D [M, K], got shape ", shape_str(a));
  FP8MP_CHECK_VALUE(b.dim() == 2, op, ": argument 'b' must be 2-D [N, K], got shape ", shape_str(b));
  FP8MP_CHECK_VALUE(b.size(1) == a.size(1), op, ": argument 'b' must be [N, K] with K = a.size(1) = ", a.size(1),
                    " (out = a @ b.T), got shape ", shape_str(b));
  if (bias.has_value()) {
    const Tensor& t = *bias;
    FP8MP_CHECK(t.scalar_type() == out_dtype, op, ": argument 'bias' must have dtype out_dtype = ", dtype_str(out_dtype),
                ", got ", dtype_str(t.scalar_type()));
    FP8MP_CHECK(same_device(t, a), op, ": argument 'bias' must be on the input's device ", device_str(a), ", got ",
                device_str(t));
    FP8MP_CHECK_VALUE(t.dim() == 1 && t.size(0) == b.size(0), op, ": argument 'bias' must have shape [N] = [",
                      b.size(0), "], got shape ", shape_str(t));
  }
  return formats;
}

}  // namespace fp8mp
