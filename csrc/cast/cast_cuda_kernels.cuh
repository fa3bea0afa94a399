// The CUDA cast kernels, torch-free: contiguous device buffers, launched on `stream`
// on the current device. cast_cuda.cpp is their torch glue.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/fp8_format.h"
#include "common/half_types.h"

namespace fp8mp::cuda {

// y[i] = encode<format>(float(x[i]) * *scale); *amax = max |x| (zeroed first, so n == 0 gives 0).
void cast_to_fp8(const void* x, HpType x_type, uint8_t* y, int64_t n, const float* scale, float* amax,
                 Fp8Format format, cudaStream_t stream);

// Same for a row-major rows x cols x, also writing yt, the cols x rows transpose of y.
// Any rows x cols: the tiles are walked grid-stride over a 1-D grid (transpose_tiling.h).
void cast_to_fp8_transpose(const void* x, HpType x_type, uint8_t* y, uint8_t* yt, int64_t rows, int64_t cols,
                           const float* scale, float* amax, Fp8Format format, cudaStream_t stream);

// out[i] = out_type(decode<format>(y[i]) * *scale_inv) for n codes.
void cast_from_fp8(const uint8_t* y, Fp8Format format, void* out, HpType out_type, int64_t n,
                   const float* scale_inv, cudaStream_t stream);

}  // namespace fp8mp::cuda
