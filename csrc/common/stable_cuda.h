// What the CUDA glue needs beyond stable.h: a guard that makes a tensor's device
// current, and torch's current CUDA stream on it (through the stable C shim),
// on which every fp8mp kernel is launched.
#pragma once

#include <cuda_runtime.h>
#include <torch/csrc/inductor/aoti_torch/c/shim.h>
#include <torch/csrc/stable/accelerator.h>

#include "common/stable.h"

namespace fp8mp {

using CudaDeviceGuard = torch::stable::accelerator::DeviceGuard;

inline CudaDeviceGuard guard_device_of(const Tensor& t) { return CudaDeviceGuard(t.get_device_index()); }

inline cudaStream_t current_cuda_stream(const Tensor& on) {
  void* stream = nullptr;
  TORCH_ERROR_CODE_CHECK(aoti_torch_get_current_cuda_stream(on.get_device_index(), &stream));
  return static_cast<cudaStream_t>(stream);
}

}  // namespace fp8mp
