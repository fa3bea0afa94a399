#include "gemm/gemm_checks.h"

#include <c10/util/Exception.h>

namespace fp8mp {

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
