// Warp and block reductions shared by the CUDA kernels.
#pragma once

#include <cstdint>

namespace fp8mp {

__device__ __forceinline__ uint32_t max_u32(uint32_t a, uint32_t b) { return a > b ? a : b; }

// Butterfly (xor) sum over the 32 lanes of a warp. a + b == b + a exactly, so
// every lane ends with the same bits.
__device__ __forceinline__ float warp_sum(float value) {
  for (int offset = 16; offset > 0; offset /= 2) value += __shfl_xor_sync(0xFFFFFFFFu, value, offset);
  return value;
}

// Max of |x| bits over the block, then one atomicMax into amax (read as uint32:
// non-negative floats order like their bits and NaN sorts above Inf).
// Every thread of the block must call it.
__device__ __forceinline__ void block_amax_to_global(uint32_t value, uint32_t* amax_bits) {
  __shared__ uint32_t warp_max[32];
  for (int offset = 16; offset > 0; offset /= 2) value = max_u32(value, __shfl_xor_sync(0xFFFFFFFFu, value, offset));
  // Warps are runs of 32 consecutive linear thread ids, for 1-D and 2-D blocks alike.
  const int linear = threadIdx.y * blockDim.x + threadIdx.x;
  const int threads = blockDim.x * blockDim.y;
  if (linear % 32 == 0) warp_max[linear / 32] = value;
  __syncthreads();
  if (linear < 32) {
    value = linear < threads / 32 ? warp_max[linear] : 0u;
    for (int offset = 16; offset > 0; offset /= 2) value = max_u32(value, __shfl_xor_sync(0xFFFFFFFFu, value, offset));
    if (linear == 0 && value != 0u) atomicMax(amax_bits, value);
  }
}

}  // namespace fp8mp
