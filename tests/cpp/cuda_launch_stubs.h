// What the CUDA glue (csrc/*/*_cuda.cpp), run on CPU tensors in this binary, handed to each kernel launch and
// cuBLASLt call: cuda_launch_stubs.cpp defines every fp8mp::cuda:: entry point the glue calls to record its
// arguments here and run nothing. The scratch sizes the stubs report are kStubScratchBytes / kStubScratchFloats.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "blockwise/block_gemm_cuda_kernels.cuh"
#include "blockwise/blockwise_cuda_kernels.cuh"
#include "cast/cast_cuda_kernels.cuh"
#include "gemm/gemm_cuda_kernels.cuh"
#include "grouped_gemm/grouped_gemm_cuda_kernels.cuh"
#include "norm/norm_cuda_kernels.cuh"
#include "optim/optim_cuda_kernels.cuh"
#include "scale_update/scale_update_cuda_kernels.cuh"

namespace fp8mp_test::stub {

constexpr size_t kStubScratchBytes = 4096;
constexpr size_t kStubScratchFloats = 96;

struct CastToFp8 {
  const void* x;
  fp8mp::HpType x_type;
  uint8_t* y;
  int64_t n;
  const float* scale;
  float* amax;
  fp8mp::Fp8Format format;
  std::vector<uint8_t> x_bytes;  // what x held at the launch (a contiguous copy the glue made dies with the call)
};

struct CastToFp8Transpose {
  const void* x;
  fp8mp::HpType x_type;
  uint8_t *y, *yt;
  int64_t rows, cols;
  const float* scale;
  float* amax;
  fp8mp::Fp8Format format;
  std::vector<uint8_t> x_bytes;
};

struct CastFromFp8 {
  const uint8_t* y;
  fp8mp::Fp8Format format;
  void* out;
  fp8mp::HpType out_type;
  int64_t n;
  const float* scale_inv;
};

struct BlockQuantize {
  const void* x;
  fp8mp::HpType x_type;
  int64_t rows, cols, block_rows, block_cols;  // row_block / col_block for the transposing one
  fp8mp::Fp8Format format;
  fp8mp::BlockScaleMode mode;
  uint8_t* y;
  void* scale_inv;
  uint8_t* y_t;         // transposing one only
  void* scale_inv_t;    // transposing one only
  void* scratch;
};

// A grouped launch's arguments, with a copy of the host offsets it was handed (the glue's vector dies with the call).
template <typename Args>
struct Grouped {
  Args args;
  std::vector<int32_t> offs;
  void* scratch;
};

template <typename Args>
struct WithScratch {
  Args args;
  void* scratch;
};

struct OptimStep {
  fp8mp::optim::StepBuffers buffers;
  double lr, beta1, beta2, eps, weight_decay;  // eps unused by Lion
};

struct UpdateScale {
  const float* amax;
  float *history, *scale, *scale_inv;
  const float* fp8_max;
  int64_t H, T, margin;
  fp8mp::AmaxComputeAlgo algo;
};

struct Recorded {
  std::vector<CastToFp8> cast_to_fp8;
  std::vector<CastToFp8Transpose> cast_to_fp8_transpose;
  std::vector<CastFromFp8> cast_from_fp8;
  std::vector<BlockQuantize> block_quantize, block_quantize_transpose;
  std::vector<WithScratch<fp8mp::cuda::BlockGemmArgs>> block_scaled_gemm;
  std::vector<WithScratch<fp8mp::cuda::Fp8GemmArgs>> fp8_gemm;
  std::vector<Grouped<fp8mp::cuda::Fp8GroupedGemmArgs>> fp8_grouped_gemm;
  std::vector<Grouped<fp8mp::cuda::Fp8GroupedGemmWgradArgs>> fp8_grouped_gemm_wgrad;
  std::vector<Grouped<fp8mp::cuda::BlockScaledGroupedGemmArgs>> block_scaled_grouped_gemm;
  std::vector<Grouped<fp8mp::cuda::BlockScaledGroupedGemmWgradArgs>> block_scaled_grouped_gemm_wgrad;
  std::vector<WithScratch<fp8mp::NormFwdArgs>> norm_fwd;
  std::vector<WithScratch<fp8mp::NormBwdArgs>> norm_bwd;
  std::vector<OptimStep> adamw_step, lion_step;
  std::vector<UpdateScale> update_amax_history_and_scale;
  int group_offset_reads = 0;  // read_group_offsets calls (each a device-to-host copy and a sync on a GPU)
};

// The launches since the last reset(), which also forgets the stand-in guard's device.
Recorded& recorded();
void reset();

}  // namespace fp8mp_test::stub
