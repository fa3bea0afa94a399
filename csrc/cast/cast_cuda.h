// The CUDA glue of the cast ops (cast_cuda.cpp), declared so that the CPU test suite runs it on CPU tensors
// with the kernel launches stubbed (tests/cpp/test_cuda_glue.cpp): everything but the kernels is device-generic.
#pragma once

#include <string>
#include <tuple>

#include "common/stable.h"

namespace fp8mp::cuda_glue {

Tensor cast_to_fp8(Tensor x, Tensor scale, Tensor amax, std::string fmt);
std::tuple<Tensor, Tensor> cast_to_fp8_transpose(Tensor x, Tensor scale, Tensor amax, std::string fmt);
std::tuple<Tensor, Tensor, Tensor> cast_to_fp8_transpose_dbias(Tensor x, Tensor scale, Tensor amax, std::string fmt);
Tensor cast_from_fp8(Tensor y, Tensor scale_inv, ScalarType out_dtype);

}  // namespace fp8mp::cuda_glue
