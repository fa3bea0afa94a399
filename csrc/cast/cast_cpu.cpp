// CPU glue of the cast ops (stable ABI): argument checks, allocation and
// registration around the torch-free kernels of cast_cpu_kernels.cpp.
#include <optional>
#include <string>
#include <tuple>

#include "cast/cast_checks.h"
#include "cast/cast_cpu_kernels.h"
#include "common/stable.h"

namespace fp8mp {
namespace {

Tensor cast_to_fp8_cpu(Tensor x, Tensor scale, Tensor amax, std::string fmt) {
  const Fp8Format format = check_cast_to_fp8_args(x, scale, amax, fmt, "fp8mp::cast_to_fp8");
  const Tensor xc = as_contiguous(x);
  Tensor y = empty_on(sizes_of(x), fp8_dtype(format), x);
  *static_cast<float*>(amax.mutable_data_ptr()) =
      cpu::cast_to_fp8(xc.const_data_ptr(), hp_type(x.scalar_type()), static_cast<uint8_t*>(y.mutable_data_ptr()),
                       xc.numel(), cpu_scalar(scale), format, stable_parallel_for);
  return y;
}

// y, yt and, with dbias, the fp32 column sums of x, all from one read of x.
std::tuple<Tensor, Tensor, std::optional<Tensor>> cast_transpose(const Tensor& x, const Tensor& scale, Tensor& amax,
                                                                 const std::string& fmt, const char* op, bool dbias) {
  const Fp8Format format = check_cast_to_fp8_args(x, scale, amax, fmt, op);
  FP8MP_CHECK_VALUE(x.dim() == 2, op, ": argument 'x' must be 2-D, got shape ", shape_str(x));
  const Tensor xc = as_contiguous(x);
  const int64_t rows = x.size(0), cols = x.size(1);
  Tensor y = empty_on({rows, cols}, fp8_dtype(format), x);
  Tensor yt = empty_on({cols, rows}, fp8_dtype(format), x);
  std::optional<Tensor> sums = dbias ? std::optional<Tensor>(empty_on({cols}, kFloat, x)) : std::nullopt;
  *static_cast<float*>(amax.mutable_data_ptr()) = cpu::cast_to_fp8_transpose(
      xc.const_data_ptr(), hp_type(x.scalar_type()), static_cast<uint8_t*>(y.mutable_data_ptr()),
      static_cast<uint8_t*>(yt.mutable_data_ptr()), rows, cols, cpu_scalar(scale), format, stable_parallel_for,
      sums.has_value() ? static_cast<float*>(sums->mutable_data_ptr()) : nullptr,
      int(torch::stable::get_num_threads()));
  return {y, yt, sums};
}

std::tuple<Tensor, Tensor> cast_to_fp8_transpose_cpu(Tensor x, Tensor scale, Tensor amax, std::string fmt) {
  auto [y, yt, none] = cast_transpose(x, scale, amax, fmt, "fp8mp::cast_to_fp8_transpose", false);
  return {y, yt};
}

std::tuple<Tensor, Tensor, Tensor> cast_to_fp8_transpose_dbias_cpu(Tensor x, Tensor scale, Tensor amax,
                                                                   std::string fmt) {
  auto [y, yt, dbias] = cast_transpose(x, scale, amax, fmt, "fp8mp::cast_to_fp8_transpose_dbias", true);
  return {y, yt, *dbias};
}

Tensor cast_from_fp8_cpu(Tensor y, Tensor scale_inv, ScalarType out_dtype) {
  const Fp8Format format = check_cast_from_fp8_args(y, scale_inv, out_dtype);
  const Tensor yc = as_contiguous(y);
  Tensor out = empty_on(sizes_of(y), out_dtype, y);
  cpu::cast_from_fp8(static_cast<const uint8_t*>(yc.const_data_ptr()), format, out.mutable_data_ptr(),
                     hp_type(out_dtype), yc.numel(), cpu_scalar(scale_inv), stable_parallel_for);
  return out;
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(fp8mp, CPU, m) {
  m.impl("cast_to_fp8", TORCH_BOX(&cast_to_fp8_cpu));
  m.impl("cast_to_fp8_transpose", TORCH_BOX(&cast_to_fp8_transpose_cpu));
  m.impl("cast_to_fp8_transpose_dbias", TORCH_BOX(&cast_to_fp8_transpose_dbias_cpu));
  m.impl("cast_from_fp8", TORCH_BOX(&cast_from_fp8_cpu));
}

}  // namespace fp8mp
