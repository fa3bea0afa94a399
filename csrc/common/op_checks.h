// Argument checks every op family shares (formats, scale tensors, dtypes, aliasing), so that the CPU and
// CUDA kernels of all ops reject bad input with the same message naming the argument.
#pragma once

#include <initializer_list>
#include <optional>
#include <string>
#include <utility>

#include "common/fp8_format.h"
#include "common/stable.h"

namespace fp8mp {

// "e4m3" / "e5m2" (any case). Anything else raises ValueError naming `fmt`.
Fp8Format parse_format(const std::string& fmt, const char* op);

ScalarType fp8_dtype(Fp8Format format);

// Format of a float8 tensor; raises naming `arg` when `t` is not float8_e4m3fn/float8_e5m2.
Fp8Format format_of(const Tensor& t, const char* op, const char* arg);

// A 1-element fp32 tensor on the same device as `like` (scales and amaxes).
void check_scalar_tensor(const Tensor& t, const Tensor& like, const char* op, const char* arg);

// A cast's scale (a checked 1-element float32 tensor) must be finite and > 0. Checked where its value is on
// the host (a CPU tensor); on a GPU, reading it would cost a host sync, so the kernels make every value cast
// with such a scale NaN instead (nan_keeping_scale.h: checked_scale), which the loss scaler sees.
void check_host_cast_scale(const Tensor& scale, const char* op, const char* arg);

// fp32, bf16 or fp16 (the high-precision dtypes fp8mp converts from and to).
void check_high_precision_dtype(ScalarType dtype, const char* op, const char* arg);

// out = a @ b.T, the layout of every fp8mp GEMM: a [M, K] and b [N, K], 2-D, with the same K.
void check_gemm_shapes(const Tensor& a, const Tensor& b, const char* op);

// A GEMM's bias (of any shape): of the output's dtype, on a's device.
void check_bias_dtype_and_device(const Tensor& bias, const Tensor& a, ScalarType out_dtype, const char* op);

// The GEMM's optional bias: [N] (N = b.size(0)), of the output's dtype, on a's device.
void check_gemm_bias(const std::optional<Tensor>& bias, const Tensor& a, const Tensor& b, ScalarType out_dtype,
                     const char* op);

using NamedTensor = std::pair<const Tensor*, const char*>;

// `out`, a tensor the op writes in place, shares no byte with any of `inputs` (empty tensors share nothing).
// Raises RuntimeError naming both arguments.
void check_no_overlap(NamedTensor out, std::initializer_list<NamedTensor> inputs, const char* op);

}  // namespace fp8mp
