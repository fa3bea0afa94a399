// Argument checks of the cast ops (cast_to_fp8, cast_to_fp8_transpose, cast_from_fp8), shared by CPU and CUDA.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>

#include <optional>

#include "common/op_checks.h"

namespace fp8mp {

// All checks of cast_to_fp8 / cast_to_fp8_transpose; returns the parsed format.
Fp8Format check_cast_to_fp8_args(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& amax,
                                 c10::string_view fmt, const char* op);

// All checks of cast_from_fp8; returns the format of `y`.
Fp8Format check_cast_from_fp8_args(const at::Tensor& y, const at::Tensor& scale_inv, at::ScalarType out_dtype);

}  // namespace fp8mp
