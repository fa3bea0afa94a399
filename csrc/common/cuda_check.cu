#include "common/cuda_check.cuh"

#include <array>
#include <atomic>
#include <mutex>
#include <unordered_map>

// The archs this library was compiled for, one token each ("89_90_100_120"; setup.py passes them from
// TORCH_CUDA_ARCH_LIST), as strings.
#ifndef FP8MP_CUBIN_ARCHS
#define FP8MP_CUBIN_ARCHS
#endif
#ifndef FP8MP_PTX_ARCHS
#define FP8MP_PTX_ARCHS
#endif
#define FP8MP_STRING_OF_(x) #x
#define FP8MP_STRING_OF(x) FP8MP_STRING_OF_(x)

namespace fp8mp {
// Whole arrays in the library's data, which tests/test_build.py compares with cuobjdump's list of its code.
[[gnu::used]] extern const char kCubinArchs[];
[[gnu::used]] extern const char kPtxArchs[];
const char kCubinArchs[] = FP8MP_STRING_OF(FP8MP_CUBIN_ARCHS);
const char kPtxArchs[] = FP8MP_STRING_OF(FP8MP_PTX_ARCHS);
}  // namespace fp8mp

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

DeviceDescription current_device_description() {
  static std::mutex mutex;
  static std::unordered_map<int, DeviceDescription> cached;
  int device = 0;
  FP8MP_CUDA_CHECK(cudaGetDevice(&device));
  const std::lock_guard<std::mutex> lock(mutex);
  const auto found = cached.find(device);
  if (found != cached.end()) return found->second;
  cudaDeviceProp props{};
  FP8MP_CUDA_CHECK(cudaGetDeviceProperties(&props, device));
  return cached.emplace(device, DeviceDescription{device, props.major * 10 + props.minor, props.name}).first->second;
}

void check_device_code(const DeviceDescription& gpu, const char* op) {
  const std::string refusal = device_code_refusal(gpu.compute_capability, kCubinArchs, kPtxArchs);
  if (!refusal.empty()) throw std::runtime_error(std::string(op) + ": " + gpu.text() + "; " + refusal);
}

void check_last_launch(const char* file, int line) {
  const cudaError_t err = cudaGetLastError();
  if (err == cudaSuccess) return;
  if (err == cudaErrorNoKernelImageForDevice) check_device_code(current_device_description(), "fp8mp");
  throw std::runtime_error(std::string("CUDA error: ") + cudaGetErrorString(err) + " (kernel launch) at " + file + ":" +
                           std::to_string(line));
}

}  // namespace fp8mp
