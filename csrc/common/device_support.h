// Whether fp8mp's CUDA library holds code a GPU can run, as pure host functions (standard library only),
// so that Catch2 checks the rule on the CPU (tests/cpp/test_cross_device_rules.cpp).
//
// CUDA's compatibility rule: a cubin built for X.y runs on X.z with z >= y (same major only); PTX built for
// compute_XY is compiled at load time for any GPU of compute capability XY or newer. So the default build
// (cubins 8.9, 9.0, 10.0, 12.0, PTX 12.0) runs on 8.9, 9.x, 10.x, 12.x and 13.0+, but not on 11.0 (Jetson
// Thor: 10.0's cubins need major 10, 12.0's PTX cannot be compiled down), nor below 8.9. The build records
// its lists (setup.py: FP8MP_CUBIN_ARCHS, FP8MP_PTX_ARCHS, from TORCH_CUDA_ARCH_LIST; cuda_check.cu).
#pragma once

#include <string>
#include <vector>

namespace fp8mp {

// One GPU as the errors name it.
struct DeviceDescription {
  int device;
  int compute_capability;  // major * 10 + minor
  std::string name;

  std::string text() const;
};

inline std::string capability_string(int cc) { return std::to_string(cc / 10) + "." + std::to_string(cc % 10); }

inline std::string DeviceDescription::text() const {
  return "cuda:" + std::to_string(device) + " (" + name + ") has compute capability " +
         capability_string(compute_capability);
}

// "89_90_100_120" -> {89, 90, 100, 120}; anything but digits separates.
inline std::vector<int> parse_arch_list(const std::string& list) {
  std::vector<int> archs;
  int value = -1;
  for (const char c : list + ",") {
    if (c >= '0' && c <= '9') {
      value = (value < 0 ? 0 : value * 10) + (c - '0');
    } else if (value >= 0) {
      archs.push_back(value);
      value = -1;
    }
  }
  return archs;
}

// Empty when a GPU of compute capability `cc` runs a library holding cubins for `cubin_archs` and PTX for
// `ptx_archs` (parse_arch_list's form); otherwise what is missing and how to get it.
inline std::string device_code_refusal(int cc, const std::string& cubin_archs, const std::string& ptx_archs) {
  const std::vector<int> cubins = parse_arch_list(cubin_archs), ptx = parse_arch_list(ptx_archs);
  for (const int arch : cubins) {
    if (arch / 10 == cc / 10 && arch <= cc) return "";
  }
  for (const int arch : ptx) {
    if (arch <= cc) return "";
  }
  std::string held;
  for (const int arch : cubins) held += (held.empty() ? "" : ", ") + capability_string(arch);
  std::string ptx_held;
  for (const int arch : ptx) ptx_held += (ptx_held.empty() ? "" : ", ") + capability_string(arch);
  return "this fp8mp holds GPU code for compute capability " + (held.empty() ? std::string("none") : held) +
         " (each runs on its own major version only) and PTX for " +
         (ptx_held.empty() ? std::string("none") : ptx_held) +
         " (compiled at load for that capability or newer), none of which runs on compute capability " +
         capability_string(cc) + ": build fp8mp from source with TORCH_CUDA_ARCH_LIST=\"" + capability_string(cc) +
         "\" (a CUDA toolkit that knows sm_" + std::to_string(cc) + ")" +
         (cc < 89 ? ", though FP8 GEMMs need compute capability 8.9 or newer" : "");
}

}  // namespace fp8mp
