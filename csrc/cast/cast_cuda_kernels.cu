// CUDA implementations of the cast kernels.
//
// Rounding is fp8_format.h's encode<F>, the same function the CPU path runs,
// so both devices produce identical bits (the hardware cvt instruction maps
// E5M2 Inf to the largest finite value under SATFINITE, which torch does not).
// The kernels are memory bound: 16-byte vector loads, one atomic per block
// for amax after a warp-shuffle and shared-memory reduction.
#include "cast/cast_cuda_kernels.cuh"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "common/cuda_check.cuh"
#include "common/cuda_reduce.cuh"

namespace fp8mp::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kTransposeTile = 32;
constexpr int kTransposeRowsPerPass = 8;  // block is 32 x 8 threads, each thread handles 4 rows of a tile

template <typename scalar_t, int kVec>
struct alignas(sizeof(scalar_t) * kVec) VecOf {
  scalar_t v[kVec];
};

template <int kVec>
struct alignas(kVec) BytesOf {
  uint8_t v[kVec];
};

// Each thread converts kVec consecutive elements per step (16 bytes of input);
// a scalar tail loop covers what does not fill a vector.
template <Fp8Format F, typename scalar_t, int kVec>
__global__ void cast_kernel(const scalar_t* __restrict__ x, uint8_t* __restrict__ y, int64_t n,
                            const float* __restrict__ scale, uint32_t* __restrict__ amax_bits) {
  const float s = *scale;
  uint32_t local = 0;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t vec_count = n / kVec;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < vec_count; i += stride) {
    const VecOf<scalar_t, kVec> in = reinterpret_cast<const VecOf<scalar_t, kVec>*>(x)[i];
    BytesOf<kVec> out;
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const float v = static_cast<float>(in.v[k]);
      local = max_u32(local, float_to_bits(v) & 0x7FFFFFFFu);
      out.v[k] = encode<F>(__fmul_rn(v, s));
    }
    reinterpret_cast<BytesOf<kVec>*>(y)[i] = out;
  }
  for (int64_t i = vec_count * kVec + int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float v = static_cast<float>(x[i]);
    local = max_u32(local, float_to_bits(v) & 0x7FFFFFFFu);
    y[i] = encode<F>(__fmul_rn(v, s));
  }
  block_amax_to_global(local, amax_bits);
}

// One 32x32 tile per block: coalesced reads of x and writes of y, the codes
// staged in shared memory so the writes of the transpose are coalesced too.
template <Fp8Format F, typename scalar_t>
__global__ void cast_transpose_kernel(const scalar_t* __restrict__ x, uint8_t* __restrict__ y, uint8_t* __restrict__ yt,
                                      int64_t rows, int64_t cols, const float* __restrict__ scale,
                                      uint32_t* __restrict__ amax_bits) {
  __shared__ uint8_t tile[kTransposeTile][kTransposeTile + 4];
  const float s = *scale;
  const int64_t r0 = int64_t(blockIdx.y) * kTransposeTile;
  const int64_t c0 = int64_t(blockIdx.x) * kTransposeTile;
  uint32_t local = 0;
  for (int dr = threadIdx.y; dr < kTransposeTile; dr += kTransposeRowsPerPass) {
    const int64_t r = r0 + dr, c = c0 + threadIdx.x;
    if (r < rows && c < cols) {
      const float v = static_cast<float>(x[r * cols + c]);
      local = max_u32(local, float_to_bits(v) & 0x7FFFFFFFu);
      const uint8_t code = encode<F>(__fmul_rn(v, s));
      y[r * cols + c] = code;
      tile[dr][threadIdx.x] = code;
    }
  }
  __syncthreads();
  for (int dc = threadIdx.y; dc < kTransposeTile; dc += kTransposeRowsPerPass) {
    const int64_t c = c0 + dc, r = r0 + threadIdx.x;
    if (r < rows && c < cols) yt[c * rows + r] = tile[threadIdx.x][dc];
  }
  block_amax_to_global(local, amax_bits);
}

template <Fp8Format F, typename scalar_t>
__global__ void cast_from_fp8_kernel(const uint8_t* __restrict__ y, scalar_t* __restrict__ out, int64_t n,
                                     const float* __restrict__ scale_inv) {
  const float s = *scale_inv;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    out[i] = static_cast<scalar_t>(__fmul_rn(decode<F>(y[i]), s));
  }
}

int blocks_for(int64_t work_items) {
  const int64_t max_blocks = int64_t(current_device_sm_count()) * 8;
  return int(std::max<int64_t>(1, std::min<int64_t>((work_items + kThreads - 1) / kThreads, max_blocks)));
}

uint32_t* zeroed_amax_bits(float* amax, cudaStream_t stream) {
  FP8MP_CUDA_CHECK(cudaMemsetAsync(amax, 0, sizeof(float), stream));
  return reinterpret_cast<uint32_t*>(amax);
}

}  // namespace

void cast_to_fp8(const void* x, HpType x_type, uint8_t* y, int64_t n, const float* scale, float* amax,
                 Fp8Format format, cudaStream_t stream) {
  uint32_t* amax_bits = zeroed_amax_bits(amax, stream);
  if (n == 0) return;
  FP8MP_DISPATCH_HP(x_type, [&] {
    constexpr int kVec = 16 / sizeof(scalar_t);
    const scalar_t* x_ptr = static_cast<const scalar_t*>(x);
    const bool aligned = reinterpret_cast<uintptr_t>(x_ptr) % 16 == 0 && reinterpret_cast<uintptr_t>(y) % kVec == 0;
    FP8MP_DISPATCH_FORMAT(format, [&] {
      if (aligned) {
        cast_kernel<kFormat, scalar_t, kVec><<<blocks_for(n / kVec + 1), kThreads, 0, stream>>>(x_ptr, y, n, scale,
                                                                                               amax_bits);
      } else {
        cast_kernel<kFormat, scalar_t, 1><<<blocks_for(n), kThreads, 0, stream>>>(x_ptr, y, n, scale, amax_bits);
      }
      FP8MP_CUDA_LAUNCH_CHECK();
    });
  });
}

void cast_to_fp8_transpose(const void* x, HpType x_type, uint8_t* y, uint8_t* yt, int64_t rows, int64_t cols,
                           const float* scale, float* amax, Fp8Format format, cudaStream_t stream) {
  uint32_t* amax_bits = zeroed_amax_bits(amax, stream);
  if (rows == 0 || cols == 0) return;
  const dim3 grid(unsigned((cols + kTransposeTile - 1) / kTransposeTile),
                  unsigned((rows + kTransposeTile - 1) / kTransposeTile));
  if ((rows + kTransposeTile - 1) / kTransposeTile > 65535) {
    throw std::invalid_argument("fp8mp::cast_to_fp8_transpose: x has too many rows for one launch (" +
                                std::to_string(rows) + ")");
  }
  const dim3 block(kTransposeTile, kTransposeRowsPerPass);
  FP8MP_DISPATCH_HP(x_type, [&] {
    FP8MP_DISPATCH_FORMAT(format, [&] {
      cast_transpose_kernel<kFormat, scalar_t><<<grid, block, 0, stream>>>(static_cast<const scalar_t*>(x), y, yt,
                                                                           rows, cols, scale, amax_bits);
      FP8MP_CUDA_LAUNCH_CHECK();
    });
  });
}

void cast_from_fp8(const uint8_t* y, Fp8Format format, void* out, HpType out_type, int64_t n,
                   const float* scale_inv, cudaStream_t stream) {
  if (n == 0) return;
  FP8MP_DISPATCH_HP(out_type, [&] {
    FP8MP_DISPATCH_FORMAT(format, [&] {
      cast_from_fp8_kernel<kFormat, scalar_t><<<blocks_for(n), kThreads, 0, stream>>>(
          y, static_cast<scalar_t*>(out), n, scale_inv);
      FP8MP_CUDA_LAUNCH_CHECK();
    });
  });
}

}  // namespace fp8mp::cuda
