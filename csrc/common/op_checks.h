// Argument checks every op family shares (formats, scale tensors, dtypes), so that the CPU and
// CUDA kernels of all ops reject bad input with the same message naming the argument.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>

#include <optional>

#include "common/fp8_format.h"

namespace fp8mp {

// "e4m3" / "e5m2" (any case). Anything else raises ValueError naming `fmt`.
Fp8Format parse_format(c10::string_view fmt, const char* op);

at::ScalarType fp8_dtype(Fp8Format format);

// Format of a float8 tensor; raises naming `arg` when `t` is not float8_e4m3fn/float8_e5m2.
Fp8Format format_of(const at::Tensor& t, const char* op, const char* arg);

// A 1-element fp32 tensor on the same device as `like` (scales and amaxes).
void check_scalar_tensor(const at::Tensor& t, const at::Tensor& like, const char* op, const char* arg);

// fp32, bf16 or fp16 (the high-precision dtypes fp8mp converts from and to).
void check_high_precision_dtype(at::ScalarType dtype, const char* op, const char* arg);

}  // namespace fp8mp
