// CUDA glue of fp8_gemm (stable ABI): argument checks, device guard, the output
// and scratch allocations (torch's caching allocator, on the stream the GEMM
// runs on) and registration around gemm_cuda_kernels.cu.
#include "gemm/gemm_cuda.h"

#include "common/stable_cuda.h"
#include "gemm/gemm_checks.h"
#include "gemm/gemm_cuda_kernels.cuh"

namespace fp8mp {
namespace cuda_glue {

Tensor fp8_gemm(Tensor a, Tensor a_scale_inv, Tensor b, Tensor b_scale_inv, std::optional<Tensor> bias,
                ScalarType out_dtype, bool use_fast_accum) {
  const GemmFormats formats = check_fp8_gemm_args(a, a_scale_inv, b, b_scale_inv, bias, out_dtype);
  const auto guard = guard_device_of(a);
  const Tensor ac = as_contiguous(a), bc = as_contiguous(b);
  const std::optional<Tensor> bias_c = bias.has_value() ? std::optional<Tensor>(as_contiguous(*bias)) : std::nullopt;
  Tensor out = empty_on({a.size(0), b.size(0)}, out_dtype, a);
  const cuda::Fp8GemmArgs args{static_cast<const uint8_t*>(ac.const_data_ptr()),
                               formats.a,
                               static_cast<const uint8_t*>(bc.const_data_ptr()),
                               formats.b,
                               a.size(0),
                               b.size(0),
                               a.size(1),
                               static_cast<const float*>(a_scale_inv.const_data_ptr()),
                               static_cast<const float*>(b_scale_inv.const_data_ptr()),
                               bias_c.has_value() ? bias_c->const_data_ptr() : nullptr,
                               out.mutable_data_ptr(),
                               hp_type(out_dtype),
                               use_fast_accum};
  Tensor scratch = empty_on({int64_t(cuda::fp8_gemm_scratch_bytes(args))}, kByte, a);
  cuda::fp8_gemm(cuda::blaslt_handle_for_current_device(), args, scratch.mutable_data_ptr(), current_cuda_stream(a));
  return out;
}

}  // namespace cuda_glue

STABLE_TORCH_LIBRARY_IMPL(fp8mp, CUDA, m) { m.impl("fp8_gemm", TORCH_BOX(&cuda_glue::fp8_gemm)); }

}  // namespace fp8mp
