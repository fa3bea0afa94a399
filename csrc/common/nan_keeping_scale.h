// v * s in fp32 with a NaN v passed through unchanged, so its sign survives the
// scaling as it does on the CPU: x86 returns the NaN operand of a multiply
// (quieted, sign kept), while NVIDIA fp32 arithmetic returns the one canonical
// NaN 0x7FFFFFFF, which would turn every -NaN into +NaN before encode<F> and
// break the documented "NaN becomes sign|0x7F" contract. Host and device.
#pragma once

#include "common/fp8_format.h"

namespace fp8mp {

FP8MP_HOST_DEVICE float scale_keep_nan(float v, float s) {
#if defined(__CUDA_ARCH__)
  const float product = __fmul_rn(v, s);
  return v != v ? v : product;
#else
  return v * s;  // the CPU already keeps the NaN operand; a branch here would stop vectorization
#endif
}

}  // namespace fp8mp
