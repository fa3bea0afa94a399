// CUDA glue of fp8_grouped_gemm, fp8_grouped_gemm_wgrad, block_scaled_grouped_gemm and its wgrad (stable ABI): argument
// checks (offs read on the host, where a caller that has the group sizes there may pass it: no device sync),
// device guard, output and scratch allocations on the current stream, registration.
#include "grouped_gemm/grouped_gemm_cuda.h"

#include <vector>

#include "common/stable_cuda.h"
#include "gemm/gemm_cuda_kernels.cuh"
#include "grouped_gemm/grouped_gemm_checks.h"
#include "grouped_gemm/grouped_gemm_cuda_kernels.cuh"

namespace fp8mp {
namespace {

const uint8_t* codes(const Tensor& t) { return static_cast<const uint8_t*>(t.const_data_ptr()); }
const float* floats(const Tensor& t) { return static_cast<const float*>(t.const_data_ptr()); }

// offs on the host (the per-group launches need the group sizes there), checked against `total`: read where it
// lies when the caller passed it on the CPU, else copied back from the device, which waits for the stream.
std::vector<int32_t> checked_host_offsets(const Tensor& offs, int64_t total, const char* total_name, const char* op,
                                          cudaStream_t stream) {
  const Tensor offs_c = as_contiguous(offs);
  const int32_t* p = static_cast<const int32_t*>(offs_c.const_data_ptr());
  std::vector<int32_t> host =
      offs.is_cpu() ? std::vector<int32_t>(p, p + offs.size(0)) : cuda::read_group_offsets(p, offs.size(0), stream);
  check_group_offsets(host.data(), offs.size(0), total, total_name, op);
  return host;
}

}  // namespace

namespace cuda_glue {

Tensor fp8_grouped_gemm(Tensor a, Tensor a_scale_inv, Tensor b, Tensor b_scale_inv, Tensor offs,
                             std::optional<Tensor> bias, ScalarType out_dtype, bool use_fast_accum) {
  constexpr const char* op = "fp8mp::fp8_grouped_gemm";
  const GroupedGemmFormats formats =
      check_fp8_grouped_gemm_args(a, a_scale_inv, b, b_scale_inv, offs, bias, out_dtype);
  const auto guard = guard_device_of(a);
  const cudaStream_t stream = current_cuda_stream(a);
  const int64_t M = a.size(0), K = a.size(1), G = b.size(0), N = b.size(1);
  const std::vector<int32_t> host_offs = checked_host_offsets(offs, M, "a.size(0)", op, stream);
  const Tensor ac = as_contiguous(a), bc = as_contiguous(b), sb = as_contiguous(b_scale_inv);
  const std::optional<Tensor> bias_c = bias.has_value() ? std::optional<Tensor>(as_contiguous(*bias)) : std::nullopt;
  Tensor out = empty_on({M, N}, out_dtype, a);
  const cuda::Fp8GroupedGemmArgs args{codes(ac),
                                      formats.a,
                                      codes(bc),
                                      formats.b,
                                      host_offs.data(),
                                      G,
                                      N,
                                      K,
                                      floats(a_scale_inv),
                                      floats(sb),
                                      bias_c.has_value() ? bias_c->const_data_ptr() : nullptr,
                                      out.mutable_data_ptr(),
                                      hp_type(out_dtype),
                                      use_fast_accum};
  Tensor scratch = empty_on({int64_t(cuda::fp8_grouped_gemm_scratch_bytes(args))}, kByte, a);
  cuda::fp8_grouped_gemm(cuda::blaslt_handle_for_current_device(), args, scratch.mutable_data_ptr(), stream);
  return out;
}

Tensor fp8_grouped_gemm_wgrad(Tensor a, Tensor a_scale_inv, Tensor b, Tensor b_scale_inv, Tensor offs,
                                   ScalarType out_dtype, bool use_fast_accum) {
  constexpr const char* op = "fp8mp::fp8_grouped_gemm_wgrad";
  const GroupedGemmFormats formats = check_fp8_grouped_gemm_wgrad_args(a, a_scale_inv, b, b_scale_inv, offs, out_dtype);
  const auto guard = guard_device_of(a);
  const cudaStream_t stream = current_cuda_stream(a);
  const int64_t N = a.size(0), T = a.size(1), K = b.size(0), G = offs.size(0);
  const std::vector<int32_t> host_offs = checked_host_offsets(offs, T, "a.size(1)", op, stream);
  const Tensor ac = as_contiguous(a), bc = as_contiguous(b);
  Tensor out = empty_on({G, N, K}, out_dtype, a);
  const cuda::Fp8GroupedGemmWgradArgs args{codes(ac), formats.a, codes(bc), formats.b, host_offs.data(),
                                           G, N, K, T, floats(a_scale_inv), floats(b_scale_inv),
                                           out.mutable_data_ptr(), hp_type(out_dtype), use_fast_accum};
  Tensor scratch = empty_on({int64_t(cuda::fp8_grouped_gemm_wgrad_scratch_bytes(args))}, kByte, a);
  cuda::fp8_grouped_gemm_wgrad(cuda::blaslt_handle_for_current_device(), args, scratch.mutable_data_ptr(), stream);
  return out;
}

Tensor block_scaled_grouped_gemm(Tensor a, Tensor a_scale_inv, Tensor b, Tensor b_scale_inv, Tensor offs,
                                      int64_t a_block_rows, int64_t b_block_rows, int64_t block_k,
                                      std::optional<Tensor> bias, ScalarType out_dtype) {
  constexpr const char* op = "fp8mp::block_scaled_grouped_gemm";
  const GroupedGemmFormats formats = check_block_scaled_grouped_gemm_args(
      a, a_scale_inv, b, b_scale_inv, offs, a_block_rows, b_block_rows, block_k, bias, out_dtype);
  const bool a_e8m0 = a_scale_inv.scalar_type() != kFloat, b_e8m0 = b_scale_inv.scalar_type() != kFloat;
  const cuda::BlockGemmPlanChoice choice =
      cuda::block_gemm_recipe(a.size(1), a_block_rows, b_block_rows, block_k, a_e8m0, b_e8m0);
  FP8MP_CHECK(choice.why_not.empty(), choice.why_not);
  const auto guard = guard_device_of(a);
  const cudaStream_t stream = current_cuda_stream(a);
  const int64_t M = a.size(0), K = a.size(1), G = b.size(0), N = b.size(1);
  const std::vector<int32_t> host_offs = checked_host_offsets(offs, M, "a.size(0)", op, stream);
  const Tensor ac = as_contiguous(a), bc = as_contiguous(b);
  const Tensor sa = as_contiguous(a_scale_inv), sb = as_contiguous(b_scale_inv);
  const std::optional<Tensor> bias_c = bias.has_value() ? std::optional<Tensor>(as_contiguous(*bias)) : std::nullopt;
  Tensor out = empty_on({M, N}, out_dtype, a);
  const cuda::BlockScaledGroupedGemmArgs args{
      choice.recipe,
      cuda::BlockGemmOperand{codes(ac), formats.a, sa.const_data_ptr(), M, a_block_rows, choice.a_layout},
      cuda::BlockGemmOperand{codes(bc), formats.b, sb.const_data_ptr(), N, b_block_rows, choice.b_layout},
      host_offs.data(),
      G,
      N,
      K,
      block_k,
      bias_c.has_value() ? bias_c->const_data_ptr() : nullptr,
      out.mutable_data_ptr(),
      hp_type(out_dtype)};
  Tensor scratch = empty_on({int64_t(cuda::block_scaled_grouped_gemm_scratch_bytes(args))}, kByte, a);
  cuda::block_scaled_grouped_gemm(cuda::blaslt_handle_for_current_device(), args, scratch.mutable_data_ptr(), stream);
  return out;
}

Tensor block_scaled_grouped_gemm_wgrad(Tensor a, Tensor a_scale_inv, Tensor b, Tensor b_scale_inv, Tensor offs,
                                            int64_t block_k, ScalarType out_dtype) {
  constexpr const char* op = "fp8mp::block_scaled_grouped_gemm_wgrad";
  const BlockWgradShape s =
      check_block_scaled_grouped_gemm_wgrad_args(a, a_scale_inv, b, b_scale_inv, offs, block_k, out_dtype);
  // Every group's reduction is at most T long: the recipe of block_k over K = T is each group's.
  const cuda::BlockGemmPlanChoice choice = cuda::block_gemm_recipe(
      s.T, 1, 1, block_k, a_scale_inv.scalar_type() != kFloat, b_scale_inv.scalar_type() != kFloat);
  FP8MP_CHECK(choice.why_not.empty(), choice.why_not);
  const auto guard = guard_device_of(a);
  const cudaStream_t stream = current_cuda_stream(a);
  const std::vector<int32_t> host_offs = checked_host_offsets(offs, s.T, "a.size(1)", op, stream);
  check_group_chunks(host_offs.data(), s.G, block_k, s.C, op);
  const Tensor ac = as_contiguous(a), bc = as_contiguous(b);
  const Tensor sa = as_contiguous(a_scale_inv), sb = as_contiguous(b_scale_inv);
  Tensor out = empty_on({s.G, s.N, s.K}, out_dtype, a);
  const cuda::BlockScaledGroupedGemmWgradArgs args{
      choice.recipe,
      cuda::BlockGemmOperand{codes(ac), s.formats.a, sa.const_data_ptr(), s.N, 1, choice.a_layout},
      cuda::BlockGemmOperand{codes(bc), s.formats.b, sb.const_data_ptr(), s.K, 1, choice.b_layout},
      host_offs.data(),
      s.G,
      s.N,
      s.K,
      s.T,
      s.C,
      block_k,
      out.mutable_data_ptr(),
      hp_type(out_dtype)};
  Tensor scratch = empty_on({int64_t(cuda::block_scaled_grouped_gemm_wgrad_scratch_bytes(args))}, kByte, a);
  cuda::block_scaled_grouped_gemm_wgrad(cuda::blaslt_handle_for_current_device(), args, scratch.mutable_data_ptr(),
                                        stream);
  return out;
}

}  // namespace cuda_glue

STABLE_TORCH_LIBRARY_IMPL(fp8mp, CUDA, m) {
  m.impl("fp8_grouped_gemm", TORCH_BOX(&cuda_glue::fp8_grouped_gemm));
  m.impl("fp8_grouped_gemm_wgrad", TORCH_BOX(&cuda_glue::fp8_grouped_gemm_wgrad));
  m.impl("block_scaled_grouped_gemm", TORCH_BOX(&cuda_glue::block_scaled_grouped_gemm));
  m.impl("block_scaled_grouped_gemm_wgrad", TORCH_BOX(&cuda_glue::block_scaled_grouped_gemm_wgrad));
}

}  // namespace fp8mp
