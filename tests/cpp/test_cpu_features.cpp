// cpu_features() (cpuid, xgetbv) against what Linux reports in /proc/cpuinfo: the vendor, and the
// flags Linux lists only where the CPU has the feature and the kernel enables its state.
#define CATCH_CONFIG_PREFIX_ALL
#include <catch2/catch.hpp>

#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "common/cpu_features.h"

namespace {

// The value after the colon on the first line of /proc/cpuinfo that starts with key ("" where none).
std::string cpuinfo_field(const std::string& key) {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);) {
    const auto colon = line.find(':');
    if (line.rfind(key, 0) == 0 && colon != std::string::npos) {
      std::string value = line.substr(colon + 1);
      return value.erase(0, value.find_first_not_of(" \t"));
    }
  }
  return "";
}

}  // namespace

CATCH_TEST_CASE("cpu_features agrees with /proc/cpuinfo", "[cpu_features]") {
#if defined(__x86_64__) && defined(__linux__)
  const std::string vendor = cpuinfo_field("vendor_id");
  CATCH_REQUIRE_FALSE(vendor.empty());
  std::set<std::string> flags;
  std::istringstream words(cpuinfo_field("flags"));
  for (std::string w; words >> w;) flags.insert(w);
  const fp8mp::cpu::CpuFeatures& f = fp8mp::cpu::cpu_features();
  CATCH_CHECK(f.intel == (vendor == "GenuineIntel"));
  CATCH_CHECK(f.avx512_bf16 == (flags.count("avx512_bf16") == 1 && flags.count("avx512bw") == 1));
  CATCH_CHECK(f.amx_bf16 == (flags.count("amx_bf16") == 1));
  CATCH_CHECK(f.avx512 == (flags.count("avx512f") && flags.count("avx512bw") && flags.count("avx512vl") &&
                           flags.count("avx512dq")));
#elif !defined(__x86_64__)
  CATCH_CHECK_FALSE(fp8mp::cpu::cpu_features().avx512);  // no x86-64 kernels elsewhere
#else
  CATCH_WARN("x86-64 without /proc/cpuinfo: nothing to compare cpu_features with");
#endif
}
