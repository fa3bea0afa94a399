// Argument checks of the cast ops (cast_to_fp8, cast_to_fp8_transpose, cast_from_fp8), shared by CPU and CUDA.
#pragma once

#include <string>

#include "common/op_checks.h"

namespace fp8mp {

// All checks of cast_to_fp8 / cast_to_fp8_transpose (amax, written in place, overlaps neither x nor scale);
// returns the parsed format.
Fp8Format check_cast_to_fp8_args(const Tensor& x, const Tensor& scale, const Tensor& amax, const std::string& fmt,
                                 const char* op);

// All checks of cast_from_fp8; returns the format of `y`.
Fp8Format check_cast_from_fp8_args(const Tensor& y, const Tensor& scale_inv, ScalarType out_dtype);

}  // namespace fp8mp
