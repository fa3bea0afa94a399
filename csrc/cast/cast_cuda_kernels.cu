// CUDA implementations of the cast kernels.
//
// Rounding is fp8_format.h's encode<F>, the same function the CPU path runs,
// so both devices produce identical bits (the hardware cvt instruction maps
// E5M2 Inf to the largest finite value under SATFINITE, which torch does not).
// Scaling goes through scale_keep_nan (a NaN input keeps its sign, a NaN the
// product makes is the canonical one, the CPU's bits) with checked_scale's scale.
//
// The kernels are memory bound, so each thread issues all its loads before any
// store, as 8- or 16-byte vectors wherever alignment allows (LDG.E.128 /
// LDG.E.64, packed stores; checked on the built library's SASS by
// tests/ops/test_kernel_sass.py), and amax costs one atomic per block after a
// warp-shuffle and shared-memory reduction.
#include "cast/cast_cuda_kernels.cuh"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "common/cuda_check.cuh"
#include "cast/transpose_tiling.h"
#include "common/cuda_reduce.cuh"
#include "common/nan_keeping_scale.h"

namespace fp8mp::cuda {
namespace {

constexpr int kThreads = 256;
constexpr int kBlocksPerSm = 8;  // 8 x 256 threads: a full SM

template <typename scalar_t, int kVec>
struct alignas(sizeof(scalar_t) * kVec) VecOf {
  scalar_t v[kVec];
};

template <int kVec>
struct alignas(kVec) BytesOf {
  uint8_t v[kVec];
};

// Each thread converts kVec consecutive elements per step (16 bytes of input)
// and stores their codes packed. With kAlignedX the input comes as one vector
// load; otherwise (x at an odd offset, e.g. x[1:]) as kVec element loads, still
// all issued before the store. A scalar tail loop covers what does not fill a vector.
template <Fp8Format F, typename scalar_t, int kVec, bool kAlignedX>
__global__ void cast_kernel(const scalar_t* __restrict__ x, uint8_t* __restrict__ y, int64_t n,
                            const float* __restrict__ scale, uint32_t* __restrict__ amax_bits) {
  const float s = checked_scale(*scale);
  uint32_t local = 0;
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t vec_count = n / kVec;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < vec_count; i += stride) {
    VecOf<scalar_t, kVec> in;
    if constexpr (kAlignedX) {
      in = reinterpret_cast<const VecOf<scalar_t, kVec>*>(x)[i];
    } else {
#pragma unroll
      for (int k = 0; k < kVec; ++k) in.v[k] = x[i * kVec + k];
    }
    BytesOf<kVec> out;
#pragma unroll
    for (int k = 0; k < kVec; ++k) {
      const float v = static_cast<float>(in.v[k]);
      local = max_u32(local, float_to_bits(v) & 0x7FFFFFFFu);
      out.v[k] = encode<F>(scale_keep_nan(v, s));
    }
    reinterpret_cast<BytesOf<kVec>*>(y)[i] = out;
  }
  for (int64_t i = vec_count * kVec + int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float v = static_cast<float>(x[i]);
    local = max_u32(local, float_to_bits(v) & 0x7FFFFFFFu);
    y[i] = encode<F>(scale_keep_nan(v, s));
  }
  block_amax_to_global(local, amax_bits);
}

// The cast-transpose: 64x64 tiles (transpose_tiling.h), walked grid-stride
// by 256-thread blocks. Per tile each thread
//   1. loads kLoads vectors of kVec elements (16 bytes each) of x,
//   2. encodes them, stores the kVec codes of each to y packed, and stages them
//      in shared memory,
//   3. after a barrier, reads 16 codes down one column of the tile and stores
//      them to yt as one 16-byte vector (a warp writes 8 rows of yt x 64 bytes).
// `vector_ok` (x, y, yt 16-byte aligned, cols % kVec == 0, rows % 16 == 0)
// lets full tiles use the vector accesses; edge tiles and unaligned shapes
// take per-element accesses with bounds checks, still all loads first.
template <typename scalar_t>
struct TransposeShape {
  static constexpr int kVec = 16 / int(sizeof(scalar_t));       // elements per 16-byte load
  static constexpr int kVecsPerRow = kTransposeTile / kVec;      // 8 (16-bit x) or 16 (fp32 x)
  static constexpr int kLoads = kTransposeTile * kVecsPerRow / kThreads;  // per thread: 2 or 4
  static constexpr int kOutBytes = 16;                           // codes per yt store
  static constexpr int kSegments = kTransposeTile / kOutBytes;   // threads per tile column
  static_assert(kTransposeTile * kVecsPerRow % kThreads == 0, "loads divide among the threads");
  static_assert(kTransposeTile * kSegments == kThreads, "one yt store per thread per tile");
  static_assert(kVec % 4 == 0, "codes are staged in shared memory as 4-byte words");
};

template <Fp8Format F, typename scalar_t>
__global__ void __launch_bounds__(kThreads)
    cast_transpose_kernel(const scalar_t* __restrict__ x, uint8_t* __restrict__ y, uint8_t* __restrict__ yt,
                          int64_t rows, int64_t cols, const float* __restrict__ scale,
                          uint32_t* __restrict__ amax_bits, bool vector_ok) {
  using Shape = TransposeShape<scalar_t>;
  constexpr int kVec = Shape::kVec;
  __shared__ alignas(16) uint8_t tile[kTransposeTile][kTransposeTile + 4];  // +4: column reads hit 2 banks, not 1
  const TransposeTiling tiling(rows, cols);
  const float s = checked_scale(*scale);
  uint32_t local = 0;
  for (int64_t t = blockIdx.x; t < tiling.tiles; t += gridDim.x) {
    const int64_t r0 = tiling.row0(t), c0 = tiling.col0(t);
    const int h = int(tiling.height(t)), w = int(tiling.width(t));
    const bool full = vector_ok && h == kTransposeTile && w == kTransposeTile;  // uniform across the block

    VecOf<scalar_t, kVec> in[Shape::kLoads];
#pragma unroll
    for (int j = 0; j < Shape::kLoads; ++j) {
      const int l = threadIdx.x + j * kThreads;
      const int r = l / Shape::kVecsPerRow, c = (l % Shape::kVecsPerRow) * kVec;
      const scalar_t* src = x + (r0 + r) * cols + c0 + c;
      if (full) {
        in[j] = *reinterpret_cast<const VecOf<scalar_t, kVec>*>(src);
      } else {
#pragma unroll
        for (int k = 0; k < kVec; ++k) in[j].v[k] = (r < h && c + k < w) ? src[k] : scalar_t(0.0f);
      }
    }
#pragma unroll
    for (int j = 0; j < Shape::kLoads; ++j) {
      const int l = threadIdx.x + j * kThreads;
      const int r = l / Shape::kVecsPerRow, c = (l % Shape::kVecsPerRow) * kVec;
      BytesOf<kVec> out;
#pragma unroll
      for (int k = 0; k < kVec; ++k) {
        const float v = static_cast<float>(in[j].v[k]);
        local = max_u32(local, float_to_bits(v) & 0x7FFFFFFFu);  // padding zeros add nothing
        out.v[k] = encode<F>(scale_keep_nan(v, s));
      }
#pragma unroll
      for (int k = 0; k < kVec; k += 4) {  // staged as 4-byte words: rows are 68 bytes, c and k multiples of 4
        *reinterpret_cast<uint32_t*>(&tile[r][c + k]) = *reinterpret_cast<const uint32_t*>(&out.v[k]);
      }
      uint8_t* dst = y + (r0 + r) * cols + c0 + c;
      if (full) {
        *reinterpret_cast<BytesOf<kVec>*>(dst) = out;
      } else {
#pragma unroll
        for (int k = 0; k < kVec; ++k) {
          if (r < h && c + k < w) dst[k] = out.v[k];
        }
      }
    }
    __syncthreads();
    const int tc = threadIdx.x / Shape::kSegments, tr = (threadIdx.x % Shape::kSegments) * Shape::kOutBytes;
    BytesOf<Shape::kOutBytes> column;
#pragma unroll
    for (int k = 0; k < Shape::kOutBytes; ++k) column.v[k] = tile[tr + k][tc];
    uint8_t* dst = yt + (c0 + tc) * rows + r0 + tr;
    if (full) {
      *reinterpret_cast<BytesOf<Shape::kOutBytes>*>(dst) = column;
    } else if (tc < w) {
#pragma unroll
      for (int k = 0; k < Shape::kOutBytes; ++k) {
        if (tr + k < h) dst[k] = column.v[k];
      }
    }
    __syncthreads();  // the next tile overwrites `tile`
  }
  block_amax_to_global(local, amax_bits);
}

// Decode: each thread reads 16 codes as one vector and writes 16 outputs as 16-byte
// vectors (two for 16-bit outputs, four for fp32); a scalar loop covers the tail
// and unaligned buffers.
template <Fp8Format F, typename scalar_t, bool kVector>
__global__ void cast_from_fp8_kernel(const uint8_t* __restrict__ y, scalar_t* __restrict__ out, int64_t n,
                                     const float* __restrict__ scale_inv) {
  constexpr int kCodes = 16;
  constexpr int kOutVec = 16 / int(sizeof(scalar_t));
  const float s = checked_scale(*scale_inv);
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t first = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  int64_t done = 0;
  if constexpr (kVector) {
    const int64_t vectors = n / kCodes;
    for (int64_t i = first; i < vectors; i += stride) {
      const BytesOf<kCodes> codes = reinterpret_cast<const BytesOf<kCodes>*>(y)[i];
#pragma unroll
      for (int part = 0; part < kCodes / kOutVec; ++part) {
        VecOf<scalar_t, kOutVec> values;
#pragma unroll
        for (int k = 0; k < kOutVec; ++k) {
          values.v[k] = static_cast<scalar_t>(scale_keep_nan(decode<F>(codes.v[part * kOutVec + k]), s));
        }
        reinterpret_cast<VecOf<scalar_t, kOutVec>*>(out)[i * (kCodes / kOutVec) + part] = values;
      }
    }
    done = vectors * kCodes;
  }
  for (int64_t i = done + first; i < n; i += stride) {
    out[i] = static_cast<scalar_t>(scale_keep_nan(decode<F>(y[i]), s));
  }
}

int blocks_for(int64_t work_items) {
  const int64_t max_blocks = int64_t(current_device_sm_count()) * kBlocksPerSm;
  return int(std::max<int64_t>(1, std::min<int64_t>((work_items + kThreads - 1) / kThreads, max_blocks)));
}

bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

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
    const bool x_aligned = aligned16(x_ptr);
    const bool y_aligned = reinterpret_cast<uintptr_t>(y) % kVec == 0;
    FP8MP_DISPATCH_FORMAT(format, [&] {
      if (x_aligned && y_aligned) {
        cast_kernel<kFormat, scalar_t, kVec, true><<<blocks_for(n / kVec + 1), kThreads, 0, stream>>>(
            x_ptr, y, n, scale, amax_bits);
      } else if (y_aligned) {
        cast_kernel<kFormat, scalar_t, kVec, false><<<blocks_for(n / kVec + 1), kThreads, 0, stream>>>(
            x_ptr, y, n, scale, amax_bits);
      } else {
        cast_kernel<kFormat, scalar_t, 1, false><<<blocks_for(n), kThreads, 0, stream>>>(x_ptr, y, n, scale,
                                                                                       amax_bits);
      }
      FP8MP_CUDA_LAUNCH_CHECK();
    });
  });
}

void cast_to_fp8_transpose(const void* x, HpType x_type, uint8_t* y, uint8_t* yt, int64_t rows, int64_t cols,
                           const float* scale, float* amax, Fp8Format format, cudaStream_t stream) {
  uint32_t* amax_bits = zeroed_amax_bits(amax, stream);
  if (rows == 0 || cols == 0) return;
  const TransposeTiling tiling(rows, cols);
  const unsigned blocks = transpose_blocks(tiling.tiles, int64_t(current_device_sm_count()) * kBlocksPerSm);
  FP8MP_DISPATCH_HP(x_type, [&] {
    const bool vector_ok = aligned16(x) && aligned16(y) && aligned16(yt) &&
                           cols % TransposeShape<scalar_t>::kVec == 0 && rows % 16 == 0;
    FP8MP_DISPATCH_FORMAT(format, [&] {
      cast_transpose_kernel<kFormat, scalar_t><<<blocks, kThreads, 0, stream>>>(
          static_cast<const scalar_t*>(x), y, yt, rows, cols, scale, amax_bits, vector_ok);
      FP8MP_CUDA_LAUNCH_CHECK();
    });
  });
}

void cast_from_fp8(const uint8_t* y, Fp8Format format, void* out, HpType out_type, int64_t n,
                   const float* scale_inv, cudaStream_t stream) {
  if (n == 0) return;
  const bool vector = aligned16(y) && aligned16(out);
  FP8MP_DISPATCH_HP(out_type, [&] {
    scalar_t* out_ptr = static_cast<scalar_t*>(out);
    FP8MP_DISPATCH_FORMAT(format, [&] {
      if (vector) {
        cast_from_fp8_kernel<kFormat, scalar_t, true><<<blocks_for(n / 16 + 1), kThreads, 0, stream>>>(
            y, out_ptr, n, scale_inv);
      } else {
        cast_from_fp8_kernel<kFormat, scalar_t, false><<<blocks_for(n), kThreads, 0, stream>>>(y, out_ptr, n,
                                                                                             scale_inv);
      }
      FP8MP_CUDA_LAUNCH_CHECK();
    });
  });
}

}  // namespace fp8mp::cuda
