// CUDA glue of fp8_gemm: argument checks, device guard, the output and scratch
// allocations (torch's caching allocator, on the stream the GEMM runs on), the
// cuBLASLt handle, and registration around gemm_cuda_kernels.cu.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <optional>

#include "common/torch_glue.h"
#include "gemm/gemm_checks.h"
#include "gemm/gemm_cuda_kernels.cuh"

namespace fp8mp {
namespace {

at::Tensor fp8_gemm_cuda(const at::Tensor& a, const at::Tensor& a_scale_inv, const at::Tensor& b,
                         const at::Tensor& b_scale_inv, const std::optional<at::Tensor>& bias,
                         at::ScalarType out_dtype, bool use_fast_accum) {
  const GemmFormats formats = check_fp8_gemm_args(a, a_scale_inv, b, b_scale_inv, bias, out_dtype);
  const c10::cuda::CUDAGuard guard(a.device());
  const at::Tensor ac = a.contiguous(), bc = b.contiguous();
  const at::Tensor bias_c = bias.has_value() ? bias->contiguous() : at::Tensor();
  at::Tensor out = at::empty({a.size(0), b.size(0)}, a.options().dtype(out_dtype));
  const cuda::Fp8GemmArgs args{reinterpret_cast<const uint8_t*>(ac.const_data_ptr()),
                               formats.a,
                               reinterpret_cast<const uint8_t*>(bc.const_data_ptr()),
                               formats.b,
                               a.size(0),
                               b.size(0),
                               a.size(1),
                               a_scale_inv.const_data_ptr<float>(),
                               b_scale_inv.const_data_ptr<float>(),
                               bias_c.defined() ? bias_c.const_data_ptr() : nullptr,
                               out.mutable_data_ptr(),
                               hp_type(out_dtype),
                               use_fast_accum};
  const at::Tensor scratch = at::empty({int64_t(cuda::fp8_gemm_scratch_bytes(args))}, a.options().dtype(at::kByte));
  cuda::fp8_gemm(at::cuda::getCurrentCUDABlasLtHandle(), args, scratch.data_ptr(), at::cuda::getCurrentCUDAStream());
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(fp8mp, CUDA, m) { m.impl("fp8_gemm", &fp8_gemm_cuda); }

}  // namespace fp8mp
