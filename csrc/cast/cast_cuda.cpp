// CUDA glue of the cast ops: argument checks, device guard, allocation and
// registration around the torch-free kernels of cast_cuda_kernels.cu.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "cast/cast_checks.h"
#include "cast/cast_cuda_kernels.cuh"
#include "common/torch_glue.h"

namespace fp8mp {
namespace {

at::Tensor cast_to_fp8_cuda(const at::Tensor& x, const at::Tensor& scale, at::Tensor& amax, c10::string_view fmt) {
  const Fp8Format format = check_cast_to_fp8_args(x, scale, amax, fmt, "fp8mp::cast_to_fp8");
  const c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor xc = x.contiguous();
  at::Tensor y = at::empty(x.sizes(), x.options().dtype(fp8_dtype(format)));
  cuda::cast_to_fp8(xc.const_data_ptr(), hp_type(x.scalar_type()), reinterpret_cast<uint8_t*>(y.data_ptr()),
                    xc.numel(), scale.const_data_ptr<float>(), amax.mutable_data_ptr<float>(), format,
                    at::cuda::getCurrentCUDAStream());
  return y;
}

std::tuple<at::Tensor, at::Tensor> cast_to_fp8_transpose_cuda(const at::Tensor& x, const at::Tensor& scale,
                                                              at::Tensor& amax, c10::string_view fmt) {
  constexpr const char* op = "fp8mp::cast_to_fp8_transpose";
  const Fp8Format format = check_cast_to_fp8_args(x, scale, amax, fmt, op);
  TORCH_CHECK_VALUE(x.dim() == 2, op, ": argument 'x' must be 2-D, got shape ", x.sizes());
  const c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor xc = x.contiguous();
  const int64_t rows = x.size(0), cols = x.size(1);
  const auto fp8_options = x.options().dtype(fp8_dtype(format));
  at::Tensor y = at::empty({rows, cols}, fp8_options);
  at::Tensor yt = at::empty({cols, rows}, fp8_options);
  cuda::cast_to_fp8_transpose(xc.const_data_ptr(), hp_type(x.scalar_type()), reinterpret_cast<uint8_t*>(y.data_ptr()),
                              reinterpret_cast<uint8_t*>(yt.data_ptr()), rows, cols, scale.const_data_ptr<float>(),
                              amax.mutable_data_ptr<float>(), format, at::cuda::getCurrentCUDAStream());
  return {y, yt};
}

at::Tensor cast_from_fp8_cuda(const at::Tensor& y, const at::Tensor& scale_inv, at::ScalarType out_dtype) {
  const Fp8Format format = check_cast_from_fp8_args(y, scale_inv, out_dtype);
  const c10::cuda::CUDAGuard guard(y.device());
  const at::Tensor yc = y.contiguous();
  at::Tensor out = at::empty(y.sizes(), y.options().dtype(out_dtype));
  cuda::cast_from_fp8(reinterpret_cast<const uint8_t*>(yc.const_data_ptr()), format, out.mutable_data_ptr(),
                      hp_type(out_dtype), yc.numel(), scale_inv.const_data_ptr<float>(),
                      at::cuda::getCurrentCUDAStream());
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(fp8mp, CUDA, m) {
  m.impl("cast_to_fp8", &cast_to_fp8_cuda);
  m.impl("cast_to_fp8_transpose", &cast_to_fp8_transpose_cuda);
  m.impl("cast_from_fp8", &cast_from_fp8_cuda);
}

}  // namespace fp8mp
