// AVX-512 versions of the CPU cast's inner pieces: the FP8 encode of a run of
// values with its amax, the cast and transpose of a row of 64x64 blocks, and the
// transpose of 64x64 bytes they use. They give exactly
// the bits of the scalar code (fp8_format.h's encode<F>, a byte-by-byte
// transpose); tests/cpp/test_encode_avx512.cpp checks the encode on every
// fp32, bf16 and fp16 bit pattern. Call them only where cpu_isa() is CpuIsa::Avx512 (cpu_isa.h).
#pragma once

#include <cstdint>

#include "common/cpu_features.h"
#include "common/fp8_format.h"
#include "common/half_types.h"

namespace fp8mp::cpu {

#if FP8MP_AVX512_KERNELS
// y[i] = encode<F>(float(x[i]) * scale) for n values; returns the max over i of float(x[i])'s bits
// without the sign (the amax as bits: NaN above Inf above every finite value).
template <Fp8Format F, typename scalar_t>
FP8MP_TARGET_AVX512 uint32_t encode_span_avx512(const scalar_t* x, uint8_t* y, int64_t n, float scale);

// `blocks` 64x64 blocks of cast_to_fp8_transpose side by side, 64 rows by 64 * blocks columns:
// y[r * y_stride + c] = yt[c * yt_stride + r] = encode<F>(float(x[r * x_stride + c]) * scale) for
// r < 64, c < 64 * blocks; returns the amax's bits. Prefetches each block's data a block or two ahead,
// within the run only (never another thread's lines). streaming: y's and yt's 64-byte aligned rows are
// written with non-temporal stores (then fenced), for outputs larger than the caches (cpu_features.h).
// col_sums (nullptr: none): col_sums[c] = float(x[0 * x_stride + c]) + ... + float(x[63 * x_stride + c]), added
// in row order in fp32, for c < 64 * blocks (a bias gradient's tile-row sums, from the rows while in L1).
template <Fp8Format F, typename scalar_t>
FP8MP_TARGET_AVX512 uint32_t cast_transpose_rows64_avx512(const scalar_t* x, int64_t x_stride, uint8_t* y,
                                                          int64_t y_stride, uint8_t* yt, int64_t yt_stride,
                                                          int64_t blocks, float scale, bool streaming = false,
                                                          float* col_sums = nullptr);

// dst[j * dst_stride + i] = src[i * src_stride + j] for i, j < 64.
FP8MP_TARGET_AVX512 void transpose64x64_avx512(const uint8_t* src, int64_t src_stride, uint8_t* dst,
                                               int64_t dst_stride);
#endif

}  // namespace fp8mp::cpu
