#include "common/cuda_check.cuh"

#include <array>
#include <atomic>

namespace fp8mp {

int current_device_sm_count() {
  constexpr int kMaxDevices = 64;
  static std::array<std::atomic<int>, kMaxDevices> cached{};  // 0 = not queried yet
  int device = 0;
  FP8MP_CUDA_CHECK(cudaGetDevice(&device));
  if (device >= kMaxDevices) {
    int count = 0;
    FP8MP_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
    return count;
  }
  int count = cached[device].load(std::memory_order_relaxed);
  if (count == 0) {
    FP8MP_CUDA_CHECK(cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device));
    cached[device].store(count, std::memory_order_relaxed);
  }
  return count;
}

}  // namespace fp8mp
