// cpuid and xgetbv behind cpu_features.h. A function-local static: computed once,
// thread-safe.
#include "common/cpu_features.h"

#include <unistd.h>

#include <algorithm>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace fp8mp::cpu {
namespace {

#if defined(__x86_64__)
// XCR0 bits the OS sets when it saves the state on context switches: SSE, AVX (ymm upper halves),
// and the three AVX-512 parts (opmask, zmm0-15 upper halves, zmm16-31).
constexpr unsigned kXcr0Avx512State = 0x2u | 0x4u | 0x20u | 0x40u | 0x80u;
// XCR0 bits of the AMX tile configuration (17) and tile data (18).
constexpr unsigned long long kXcr0TileState = (1ull << 17) | (1ull << 18);

unsigned long long xcr0() {
  unsigned lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<unsigned long long>(hi) << 32) | lo;
}

CpuFeatures detect() {
  CpuFeatures f{false, false, false, false};
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  __cpuid(0, eax, ebx, ecx, edx);
  f.intel = ebx == 0x756E6547u && edx == 0x49656E69u && ecx == 0x6C65746Eu;  // "Genu" "ineI" "ntel"
  if (__get_cpuid_max(0, nullptr) < 7) return f;
  __cpuid(1, eax, ebx, ecx, edx);
  const bool osxsave = (ecx >> 27) & 1u;
  const bool os_saves_zmm = osxsave && (xcr0() & kXcr0Avx512State) == kXcr0Avx512State;
  __cpuid_count(7, 0, eax, ebx, ecx, edx);
  const bool f_bw_vl_dq = ((ebx >> 16) & 1u) && ((ebx >> 30) & 1u) && ((ebx >> 31) & 1u) && ((ebx >> 17) & 1u);
  f.avx512 = os_saves_zmm && f_bw_vl_dq;
  f.amx_bf16 = osxsave && ((edx >> 22) & 1u) && (xcr0() & kXcr0TileState) == kXcr0TileState;
  __cpuid_count(7, 1, eax, ebx, ecx, edx);
  f.avx512_bf16 = f.avx512 && ((eax >> 5) & 1u);
  return f;
}
#else
CpuFeatures detect() { return CpuFeatures{false, false, false, false}; }
#endif

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect();
  return features;
}

bool larger_than_l2_caches(int64_t bytes, int threads) {
  static const int64_t l2_bytes = [] {
    const long reported = sysconf(_SC_LEVEL2_CACHE_SIZE);
    return reported > 0 ? int64_t(reported) : int64_t(2) << 20;
  }();
  return bytes > l2_bytes * std::max(1, threads);
}

}  // namespace fp8mp::cpu
