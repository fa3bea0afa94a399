// Error checks and launch sizing for the torch-free CUDA kernels: a failed CUDA
// call throws std::runtime_error naming the call, which the torch glue turns
// into a Python RuntimeError like any other C++ exception. CUDA runtime only.
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#define FP8MP_CUDA_CHECK(EXPR)                                                                                  \
  do {                                                                                                          \
    const cudaError_t fp8mp_err_ = (EXPR);                                                                      \
    if (fp8mp_err_ != cudaSuccess) {                                                                            \
      throw std::runtime_error(std::string("CUDA error: ") + cudaGetErrorString(fp8mp_err_) + " (" #EXPR ") at " + \
                               __FILE__ + ":" + std::to_string(__LINE__));                                     \
    }                                                                                                           \
  } while (0)

// After a kernel launch: a bad configuration is reported at once, not at the next sync.
#define FP8MP_CUDA_LAUNCH_CHECK() FP8MP_CUDA_CHECK(cudaGetLastError())

namespace fp8mp {

// Multiprocessor count of the current device (the grid size of the grid-stride kernels scales with it).
int current_device_sm_count();

}  // namespace fp8mp
