// Every fp8mp::cuda:: entry point the CUDA glue calls, defined to record its arguments (cuda_launch_stubs.h)
// and launch nothing: the Catch2 binary runs the glue on CPU tensors with these in place of the kernels and
// cuBLASLt. block_gemm_recipe is the real one (a pure host function, blockwise/block_gemm_recipe.h).
#include "cuda_launch_stubs.h"

#include "common/stable_cuda.h"  // the stand-in's guard record

namespace fp8mp_test::stub {

Recorded& recorded() {
  static Recorded r;
  return r;
}

void reset() {
  recorded() = Recorded{};
  fp8mp::standin::last_guarded_device() = -2;
}

}  // namespace fp8mp_test::stub

namespace {

std::vector<uint8_t> bytes_of(const void* x, fp8mp::HpType type, int64_t n) {
  const uint8_t* p = static_cast<const uint8_t*>(x);
  return std::vector<uint8_t>(p, p + n * (type == fp8mp::HpType::Float32 ? 4 : 2));
}

}  // namespace

namespace fp8mp::cuda {

using fp8mp_test::stub::kStubScratchBytes;
using fp8mp_test::stub::kStubScratchFloats;
using fp8mp_test::stub::recorded;

void cast_to_fp8(const void* x, HpType x_type, uint8_t* y, int64_t n, const float* scale, float* amax,
                 Fp8Format format, cudaStream_t) {
  recorded().cast_to_fp8.push_back({x, x_type, y, n, scale, amax, format, bytes_of(x, x_type, n)});
}

void cast_to_fp8_transpose(const void* x, HpType x_type, uint8_t* y, uint8_t* yt, int64_t rows, int64_t cols,
                           const float* scale, float* amax, Fp8Format format, cudaStream_t) {
  recorded().cast_to_fp8_transpose.push_back(
      {x, x_type, y, yt, rows, cols, scale, amax, format, bytes_of(x, x_type, rows * cols)});
}

void cast_from_fp8(const uint8_t* y, Fp8Format format, void* out, HpType out_type, int64_t n,
                   const float* scale_inv, cudaStream_t) {
  recorded().cast_from_fp8.push_back({y, format, out, out_type, n, scale_inv});
}

size_t block_quantize_scratch_bytes(int64_t, int64_t, int64_t, int64_t) { return kStubScratchBytes; }

void block_quantize(const void* x, HpType x_type, int64_t rows, int64_t cols, int64_t block_rows, int64_t block_cols,
                    Fp8Format format, BlockScaleMode mode, uint8_t* y, void* scale_inv, void* scratch, cudaStream_t) {
  recorded().block_quantize.push_back(
      {x, x_type, rows, cols, block_rows, block_cols, format, mode, y, scale_inv, nullptr, nullptr, scratch});
}

size_t block_quantize_transpose_scratch_bytes(int64_t, int64_t, int64_t, int64_t) { return kStubScratchBytes; }

void block_quantize_transpose(const void* x, HpType x_type, int64_t rows, int64_t cols, int64_t row_block,
                              int64_t col_block, Fp8Format format, BlockScaleMode mode, uint8_t* y, void* scale_inv,
                              uint8_t* y_t, void* scale_inv_t, void* scratch, cudaStream_t) {
  recorded().block_quantize_transpose.push_back(
      {x, x_type, rows, cols, row_block, col_block, format, mode, y, scale_inv, y_t, scale_inv_t, scratch});
}

size_t block_scaled_gemm_scratch_bytes(const BlockGemmArgs&) { return kStubScratchBytes; }

void block_scaled_gemm(cublasLtHandle_t, const BlockGemmArgs& args, void* scratch, cudaStream_t) {
  recorded().block_scaled_gemm.push_back({args, scratch});
}

size_t fp8_gemm_scratch_bytes(const Fp8GemmArgs&) { return kStubScratchBytes; }

cublasLtHandle_t blaslt_handle_for_current_device() { return nullptr; }

void fp8_gemm(cublasLtHandle_t, const Fp8GemmArgs& args, void* scratch, cudaStream_t) {
  recorded().fp8_gemm.push_back({args, scratch});
}

std::vector<int32_t> read_group_offsets(const int32_t* offs, int64_t groups, cudaStream_t) {
  ++recorded().group_offset_reads;
  return std::vector<int32_t>(offs, offs + groups);  // a CPU tensor's data is host memory already
}

size_t fp8_grouped_gemm_scratch_bytes(const Fp8GroupedGemmArgs&) { return kStubScratchBytes; }

void fp8_grouped_gemm(cublasLtHandle_t, const Fp8GroupedGemmArgs& args, void* scratch, cudaStream_t) {
  recorded().fp8_grouped_gemm.push_back({args, std::vector<int32_t>(args.offs, args.offs + args.groups), scratch});
}

size_t fp8_grouped_gemm_wgrad_scratch_bytes(const Fp8GroupedGemmWgradArgs&) { return kStubScratchBytes; }

void fp8_grouped_gemm_wgrad(cublasLtHandle_t, const Fp8GroupedGemmWgradArgs& args, void* scratch, cudaStream_t) {
  recorded().fp8_grouped_gemm_wgrad.push_back(
      {args, std::vector<int32_t>(args.offs, args.offs + args.groups), scratch});
}

size_t block_scaled_grouped_gemm_scratch_bytes(const BlockScaledGroupedGemmArgs&) { return kStubScratchBytes; }

void block_scaled_grouped_gemm(cublasLtHandle_t, const BlockScaledGroupedGemmArgs& args, void* scratch,
                               cudaStream_t) {
  recorded().block_scaled_grouped_gemm.push_back(
      {args, std::vector<int32_t>(args.offs, args.offs + args.groups), scratch});
}

size_t block_scaled_grouped_gemm_wgrad_scratch_bytes(const BlockScaledGroupedGemmWgradArgs&) {
  return kStubScratchBytes;
}

void block_scaled_grouped_gemm_wgrad(cublasLtHandle_t, const BlockScaledGroupedGemmWgradArgs& args, void* scratch,
                                     cudaStream_t) {
  recorded().block_scaled_grouped_gemm_wgrad.push_back(
      {args, std::vector<int32_t>(args.offs, args.offs + args.groups), scratch});
}

size_t norm_fwd_scratch_floats(const NormFwdArgs&) { return kStubScratchFloats; }
size_t norm_bwd_scratch_floats(const NormBwdArgs&) { return kStubScratchFloats; }

void norm_fwd(const NormFwdArgs& args, float* scratch, cudaStream_t) { recorded().norm_fwd.push_back({args, scratch}); }
void norm_bwd(const NormBwdArgs& args, float* scratch, cudaStream_t) { recorded().norm_bwd.push_back({args, scratch}); }

void adamw_step(const optim::StepBuffers& buffers, const optim::AdamW::Hyper& h, cudaStream_t) {
  recorded().adamw_step.push_back({buffers, h.lr, h.beta1, h.beta2, h.eps, h.weight_decay});
}

void lion_step(const optim::StepBuffers& buffers, const optim::Lion::Hyper& h, cudaStream_t) {
  recorded().lion_step.push_back({buffers, h.lr, h.beta1, h.beta2, 0.0, h.weight_decay});
}

void update_amax_history_and_scale(const float* amax, float* history, float* scale, float* scale_inv,
                                   const float* fp8_max, int64_t H, int64_t T, int64_t margin, AmaxComputeAlgo algo,
                                   cudaStream_t) {
  recorded().update_amax_history_and_scale.push_back({amax, history, scale, scale_inv, fp8_max, H, T, margin, algo});
}

}  // namespace fp8mp::cuda
