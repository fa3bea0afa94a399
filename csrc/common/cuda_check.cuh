// Error checks and launch sizing for the torch-free CUDA kernels: a failed CUDA
// call throws std::runtime_error naming the call, which the torch glue turns
// into a Python RuntimeError like any other C++ exception. CUDA runtime only.
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "common/device_support.h"

#define FP8MP_CUDA_CHECK(EXPR)                                                                                  \
  do {                                                                                                          \
    const cudaError_t fp8mp_err_ = (EXPR);                                                                      \
    if (fp8mp_err_ != cudaSuccess) {                                                                            \
      throw std::runtime_error(std::string("CUDA error: ") + cudaGetErrorString(fp8mp_err_) + " (" #EXPR ") at " + \
                               __FILE__ + ":" + std::to_string(__LINE__));                                     \
    }                                                                                                           \
  } while (0)

// After a kernel launch: a bad configuration is reported at once, not at the next sync, and a GPU this
// build holds no code for is named with what it needs (device_support.h).
#define FP8MP_CUDA_LAUNCH_CHECK() ::fp8mp::check_last_launch(__FILE__, __LINE__)

namespace fp8mp {

void check_last_launch(const char* file, int line);

// The current device: index, compute capability and name (queried once per device).
DeviceDescription current_device_description();

// Throws std::runtime_error, `op` first, when this build holds no code `gpu` can run (device_code_refusal).
void check_device_code(const DeviceDescription& gpu, const char* op);

// Multiprocessor count of the current device (the grid size of the grid-stride kernels scales with it).
int current_device_sm_count();

}  // namespace fp8mp
