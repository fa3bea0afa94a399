// CUDA implementation of update_amax_history_and_scale: one launch for the
// whole group, one block per tensor (column of the [H, T] history).
//
// The roll is done in place, bottom-up in chunks of blockDim rows: each thread
// loads old row i - 1 into a register, the block syncs, then writes it to row
// i. A chunk reads rows [lo - 1, hi - 1) and writes [lo, hi); the next chunk
// up only reads rows below lo - 1 and writes row lo - 1 after its own sync, so
// every element is read before it is overwritten, for any H, without a
// scratch buffer. The values moved are reduced on the way (NaN-propagating
// max) and thread 0 applies scale_rule.h, the CPU's rule, with IEEE division.
#include "scale_update/scale_update_cuda_kernels.cuh"

#include <stdexcept>
#include <string>
#include <type_traits>

#include "common/cuda_check.cuh"

namespace fp8mp::cuda {
namespace {

constexpr int kThreads = 256;

template <bool kUseMax>
__global__ void update_amax_history_and_scale_kernel(const float* __restrict__ amax, float* __restrict__ history,
                                                     float* __restrict__ scale, float* __restrict__ scale_inv,
                                                     const float* __restrict__ fp8_max, int64_t H, int64_t T,
                                                     float pow2) {
  __shared__ float partial[kThreads];
  const int64_t t = blockIdx.x;
  const float newest = amax[t];
  float local = newest;
  for (int64_t hi = H; hi > 1; hi -= blockDim.x) {
    const int64_t lo = hi - blockDim.x > 1 ? hi - blockDim.x : 1;
    const int64_t row = lo + threadIdx.x;
    float moved = 0.0f;
    if (row < hi) {
      moved = history[(row - 1) * T + t];
      if (kUseMax) local = nan_max(local, moved);
    }
    __syncthreads();  // every read of rows [lo - 1, hi - 1) before any write of rows [lo, hi)
    if (row < hi) history[row * T + t] = moved;
  }
  if (threadIdx.x == 0) history[t] = newest;
  if (kUseMax) {
    partial[threadIdx.x] = local;
    __syncthreads();
    for (int stride = kThreads / 2; stride > 0; stride /= 2) {
      if (threadIdx.x < stride) partial[threadIdx.x] = nan_max(partial[threadIdx.x], partial[threadIdx.x + stride]);
      __syncthreads();
    }
  }
  if (threadIdx.x == 0) {
    const float effective = kUseMax ? partial[0] : newest;
    const float s = updated_scale(fp8_max[t], effective, pow2, scale[t]);
    scale[t] = s;
    scale_inv[t] = reciprocal(s);
  }
}

}  // namespace

void update_amax_history_and_scale(const float* amax, float* history, float* scale, float* scale_inv,
                                   const float* fp8_max, int64_t H, int64_t T, int64_t margin, AmaxComputeAlgo algo,
                                   cudaStream_t stream) {
  if (T == 0) return;
  if (T > int64_t(0x7FFFFFFF)) {
    throw std::invalid_argument("fp8mp::update_amax_history_and_scale: too many tensors for one launch (" +
                                std::to_string(T) + ")");
  }
  const float pow2 = pow2_margin(margin);
  const auto launch = [&](auto use_max) {
    update_amax_history_and_scale_kernel<decltype(use_max)::value><<<unsigned(T), kThreads, 0, stream>>>(
        amax, history, scale, scale_inv, fp8_max, H, T, pow2);
  };
  if (algo == AmaxComputeAlgo::Max) {
    launch(std::true_type{});
  } else {
    launch(std::false_type{});
  }
  FP8MP_CUDA_LAUNCH_CHECK();
}

}  // namespace fp8mp::cuda
