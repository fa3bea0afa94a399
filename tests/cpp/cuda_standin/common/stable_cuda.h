// CPU stand-in for csrc/common/stable_cuda.h, found first on the include path of the CUDA glue that the Catch2
// binary compiles (tests/cpp/test_cuda_glue.cpp): the device guard records the device it was asked for and
// changes nothing, the stream is null, and the glue's STABLE_TORCH_LIBRARY_IMPL(fp8mp, CUDA, m) blocks are
// compiled but register nothing, so that no stubbed kernel sits beside the CPU kernels of fp8mp_core in the
// dispatcher of the test process.
#pragma once

#include <cuda_runtime.h>  // the stand-in beside this folder

#include "common/stable.h"

namespace fp8mp {

namespace standin {
// Device index of the last guard the glue took (-2: none since the last reset).
inline int& last_guarded_device() {
  static int device = -2;
  return device;
}
}  // namespace standin

struct CudaDeviceGuard {};

inline CudaDeviceGuard guard_device_of(const Tensor& t) {
  standin::last_guarded_device() = t.get_device_index();
  return {};
}

inline cudaStream_t current_cuda_stream(const Tensor&) { return nullptr; }

}  // namespace fp8mp

#define FP8MP_STANDIN_CONCAT_(a, b) a##b
#define FP8MP_STANDIN_CONCAT(a, b) FP8MP_STANDIN_CONCAT_(a, b)
#undef STABLE_TORCH_LIBRARY_IMPL
#define STABLE_TORCH_LIBRARY_IMPL(ns, k, m)                                                          \
  [[maybe_unused]] static void FP8MP_STANDIN_CONCAT(fp8mp_unregistered_impls_, __LINE__)( \
      torch::stable::detail::StableLibrary & m)
