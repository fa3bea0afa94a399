// CUDA implementations of the cast ops.
//
// Rounding is fp8_format.h's encode<F>, the same function the CPU path runs,
// so both devices produce identical bits (the hardware cvt instruction maps
// E5M2 Inf to the largest finite value under SATFINITE, which torch does not).
// The kernels are memory bound: 16-byte vector loads, one atomic per block
// for amax after a warp-shuffle and shared-memory reduction.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include "common/cuda_reduce.cuh"
#include "common/fp8_format.h"
#include "cast/cast_checks.h"

namespace fp8mp {
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
  const int64_t max_blocks = int64_t(at::cuda::getCurrentDeviceProperties()->multiProcessorCount) * 8;
  return int(std::max<int64_t>(1, std::min<int64_t>((work_items + kThreads - 1) / kThreads, max_blocks)));
}

uint32_t* zeroed_amax_bits(at::Tensor& amax, cudaStream_t stream) {
  C10_CUDA_CHECK(cudaMemsetAsync(amax.data_ptr(), 0, sizeof(float), stream));
  return reinterpret_cast<uint32_t*>(amax.data_ptr());
}

at::Tensor cast_to_fp8_cuda(const at::Tensor& x, const at::Tensor& scale, at::Tensor& amax, c10::string_view fmt) {
  const Fp8Format format = check_cast_to_fp8_args(x, scale, amax, fmt, "fp8mp::cast_to_fp8");
  const c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor xc = x.contiguous();
  at::Tensor y = at::empty(x.sizes(), x.options().dtype(fp8_dtype(format)));
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  uint32_t* amax_bits = zeroed_amax_bits(amax, stream);
  const int64_t n = xc.numel();
  if (n == 0) return y;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "fp8mp::cast_to_fp8", [&] {
    constexpr int kVec = 16 / sizeof(scalar_t);
    const scalar_t* x_ptr = xc.const_data_ptr<scalar_t>();
    uint8_t* y_ptr = reinterpret_cast<uint8_t*>(y.data_ptr());
    const bool aligned = reinterpret_cast<uintptr_t>(x_ptr) % 16 == 0 && reinterpret_cast<uintptr_t>(y_ptr) % kVec == 0;
    FP8MP_DISPATCH_FORMAT(format, [&] {
      if (aligned) {
        cast_kernel<kFormat, scalar_t, kVec><<<blocks_for(n / kVec + 1), kThreads, 0, stream>>>(
            x_ptr, y_ptr, n, scale.const_data_ptr<float>(), amax_bits);
      } else {
        cast_kernel<kFormat, scalar_t, 1><<<blocks_for(n), kThreads, 0, stream>>>(
            x_ptr, y_ptr, n, scale.const_data_ptr<float>(), amax_bits);
      }
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
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
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  uint32_t* amax_bits = zeroed_amax_bits(amax, stream);
  if (rows == 0 || cols == 0) return {y, yt};
  const dim3 grid(unsigned((cols + kTransposeTile - 1) / kTransposeTile),
                  unsigned((rows + kTransposeTile - 1) / kTransposeTile));
  TORCH_CHECK(grid.y <= 65535u, op, ": x has too many rows for one launch (", rows, ")");
  const dim3 block(kTransposeTile, kTransposeRowsPerPass);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), op, [&] {
    FP8MP_DISPATCH_FORMAT(format, [&] {
      cast_transpose_kernel<kFormat, scalar_t><<<grid, block, 0, stream>>>(
          xc.const_data_ptr<scalar_t>(), reinterpret_cast<uint8_t*>(y.data_ptr()),
          reinterpret_cast<uint8_t*>(yt.data_ptr()), rows, cols, scale.const_data_ptr<float>(), amax_bits);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
  return {y, yt};
}

at::Tensor cast_from_fp8_cuda(const at::Tensor& y, const at::Tensor& scale_inv, at::ScalarType out_dtype) {
  const Fp8Format format = check_cast_from_fp8_args(y, scale_inv, out_dtype);
  const c10::cuda::CUDAGuard guard(y.device());
  const at::Tensor yc = y.contiguous();
  at::Tensor out = at::empty(y.sizes(), y.options().dtype(out_dtype));
  const int64_t n = yc.numel();
  if (n == 0) return out;
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, out_dtype, "fp8mp::cast_from_fp8", [&] {
    FP8MP_DISPATCH_FORMAT(format, [&] {
      cast_from_fp8_kernel<kFormat, scalar_t><<<blocks_for(n), kThreads, 0, stream>>>(
          reinterpret_cast<const uint8_t*>(yc.const_data_ptr()), out.mutable_data_ptr<scalar_t>(), n,
          scale_inv.const_data_ptr<float>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    });
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(fp8mp, CUDA, m) {
  m.impl("cast_to_fp8", &cast_to_fp8_cuda);
  m.impl("cast_to_fp8_transpose", &cast_to_fp8_transpose_cuda);
  m.impl("cast_from_fp8", &cast_from_fp8_cuda);
}

}  // namespace fp8mp
