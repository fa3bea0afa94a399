// CUDA glue of the cast ops (stable ABI): argument checks, device guard,
// allocation and registration around the torch-free kernels of cast_cuda_kernels.cu.
#include "cast/cast_cuda.h"

#include "cast/cast_checks.h"
#include "cast/cast_cuda_kernels.cuh"
#include "common/stable_cuda.h"

namespace fp8mp {
namespace cuda_glue {

Tensor cast_to_fp8(Tensor x, Tensor scale, Tensor amax, std::string fmt) {
  const Fp8Format format = check_cast_to_fp8_args(x, scale, amax, fmt, "fp8mp::cast_to_fp8");
  const auto guard = guard_device_of(x);
  const Tensor xc = as_contiguous(x);
  Tensor y = empty_on(sizes_of(x), fp8_dtype(format), x);
  cuda::cast_to_fp8(xc.const_data_ptr(), hp_type(x.scalar_type()), static_cast<uint8_t*>(y.mutable_data_ptr()),
                    xc.numel(), static_cast<const float*>(scale.const_data_ptr()),
                    static_cast<float*>(amax.mutable_data_ptr()), format, current_cuda_stream(x));
  return y;
}

std::tuple<Tensor, Tensor> cast_to_fp8_transpose(Tensor x, Tensor scale, Tensor amax, std::string fmt) {
  constexpr const char* op = "fp8mp::cast_to_fp8_transpose";
  const Fp8Format format = check_cast_to_fp8_args(x, scale, amax, fmt, op);
  FP8MP_CHECK_VALUE(x.dim() == 2, op, ": argument 'x' must be 2-D, got shape ", shape_str(x));
  const auto guard = guard_device_of(x);
  const Tensor xc = as_contiguous(x);
  const int64_t rows = x.size(0), cols = x.size(1);
  Tensor y = empty_on({rows, cols}, fp8_dtype(format), x);
  Tensor yt = empty_on({cols, rows}, fp8_dtype(format), x);
  cuda::cast_to_fp8_transpose(xc.const_data_ptr(), hp_type(x.scalar_type()), static_cast<uint8_t*>(y.mutable_data_ptr()),
                              static_cast<uint8_t*>(yt.mutable_data_ptr()), rows, cols,
                              static_cast<const float*>(scale.const_data_ptr()),
                              static_cast<float*>(amax.mutable_data_ptr()), format, current_cuda_stream(x));
  return {y, yt};
}

// Not fused on CUDA (yet): the cast above, then torch's fp32 column sum (column_sum_fp32), whose order of
// additions is torch's, not the CPU kernel's tile rows.
std::tuple<Tensor, Tensor, Tensor> cast_to_fp8_transpose_dbias(Tensor x, Tensor scale, Tensor amax, std::string fmt) {
  constexpr const char* op = "fp8mp::cast_to_fp8_transpose_dbias";
  check_cast_to_fp8_args(x, scale, amax, fmt, op);
  FP8MP_CHECK_VALUE(x.dim() == 2, op, ": argument 'x' must be 2-D, got shape ", shape_str(x));
  auto [y, yt] = cast_to_fp8_transpose(x, scale, amax, fmt);
  const auto guard = guard_device_of(x);
  return {y, yt, column_sum_fp32(x)};
}

Tensor cast_from_fp8(Tensor y, Tensor scale_inv, ScalarType out_dtype) {
  const Fp8Format format = check_cast_from_fp8_args(y, scale_inv, out_dtype);
  const auto guard = guard_device_of(y);
  const Tensor yc = as_contiguous(y);
  Tensor out = empty_on(sizes_of(y), out_dtype, y);
  cuda::cast_from_fp8(static_cast<const uint8_t*>(yc.const_data_ptr()), format, out.mutable_data_ptr(),
                      hp_type(out_dtype), yc.numel(), static_cast<const float*>(scale_inv.const_data_ptr()),
                      current_cuda_stream(y));
  return out;
}

}  // namespace cuda_glue

STABLE_TORCH_LIBRARY_IMPL(fp8mp, CUDA, m) {
  m.impl("cast_to_fp8", TORCH_BOX(&cuda_glue::cast_to_fp8));
  m.impl("cast_to_fp8_transpose", TORCH_BOX(&cuda_glue::cast_to_fp8_transpose));
  m.impl("cast_to_fp8_transpose_dbias", TORCH_BOX(&cuda_glue::cast_to_fp8_transpose_dbias));
  m.impl("cast_from_fp8", TORCH_BOX(&cuda_glue::cast_from_fp8));
}

}  // namespace fp8mp
