// The CPU cast kernels, torch-free: contiguous buffers in, contiguous buffers out.
// cast_cpu.cpp is their torch glue (argument checks, allocation, registration).
#pragma once

#include <cstdint>

#include "common/cpu_parallel.h"
#include "common/fp8_format.h"
#include "common/half_types.h"

namespace fp8mp::cpu {

// y[i] = encode<format>(float(x[i]) * scale) for n elements of x (of type x_type);
// returns max |x| (NaN if x holds a NaN, 0 for n == 0).
float cast_to_fp8(const void* x, HpType x_type, uint8_t* y, int64_t n, float scale, Fp8Format format,
                  ParallelFor parallel_for);

// Same for a row-major rows x cols x, also writing yt, the cols x rows transpose of y.
float cast_to_fp8_transpose(const void* x, HpType x_type, uint8_t* y, uint8_t* yt, int64_t rows, int64_t cols,
                            float scale, Fp8Format format, ParallelFor parallel_for);

// out[i] = out_type(decode<format>(y[i]) * scale_inv) for n codes.
void cast_from_fp8(const uint8_t* y, Fp8Format format, void* out, HpType out_type, int64_t n, float scale_inv,
                   ParallelFor parallel_for);

}  // namespace fp8mp::cpu
