// The CUDA glue of update_amax_history_and_scale (scale_update_cuda.cpp), declared so that the CPU test suite
// runs it on CPU tensors with the kernel launch stubbed (tests/cpp/test_cuda_glue.cpp).
#pragma once

#include <string>

#include "common/stable.h"

namespace fp8mp::cuda_glue {

void update_amax_history_and_scale(Tensor amax, Tensor amax_history, Tensor scale, Tensor scale_inv, Tensor fp8_max,
                                   int64_t margin, std::string amax_compute_algo);

}  // namespace fp8mp::cuda_glue
