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

// Same for a row-major rows x cols x, also writing yt, the cols x rows transpose of y; and, where dbias is not
// nullptr, dbias[c] = the fp32 sum of column c of x: each tile row of kDbiasRows rows summed row by row in
// fp32, then the tile rows' sums added in order (the same bits for any number of threads). threads: how many
// run parallel_for's tasks (y and yt are written with non-temporal stores where they outgrow their L2s).
float cast_to_fp8_transpose(const void* x, HpType x_type, uint8_t* y, uint8_t* yt, int64_t rows, int64_t cols,
                            float scale, Fp8Format format, ParallelFor parallel_for, float* dbias = nullptr,
                            int threads = 1);

constexpr int64_t kDbiasRows = 64;  // rows of x summed together before their sums are added to dbias

// out[i] = out_type(decode<format>(y[i]) * scale_inv) for n codes.
void cast_from_fp8(const uint8_t* y, Fp8Format format, void* out, HpType out_type, int64_t n, float scale_inv,
                   ParallelFor parallel_for);

}  // namespace fp8mp::cpu
