// cpu_isa.h's choice: a function-local static, decided at the first vector loop.
#include "common/cpu_isa.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <initializer_list>

#include "common/cpu_features.h"

namespace fp8mp::cpu {
namespace {

// The best level this CPU runs: x86-64-v4's vector part (AVX-512 F/BW/VL/DQ with the OS saving zmm), else
// x86-64-v3's (AVX2, FMA, BMI1/2, F16C, LZCNT, MOVBE with the OS saving ymm), else baseline.
CpuIsa best_isa() {
#if FP8MP_ISA_DISPATCH
  if (cpu_features().avx512) return CpuIsa::Avx512;
  __builtin_cpu_init();
  if (__builtin_cpu_supports("x86-64-v3")) return CpuIsa::Avx2;
#endif
  return CpuIsa::Baseline;
}

CpuIsa choose() {
  const CpuIsa best = best_isa();
  const char* asked = std::getenv("FP8MP_CPU_ISA");
  if (asked == nullptr || *asked == '\0') return best;
  for (CpuIsa isa : {CpuIsa::Baseline, CpuIsa::Avx2, CpuIsa::Avx512}) {
    if (std::strcmp(asked, cpu_isa_name(isa)) != 0) continue;
    if (isa <= best) return isa;
    std::fprintf(stderr, "fp8mp: FP8MP_CPU_ISA=%s: this CPU's best is %s; running that\n", asked,
                 cpu_isa_name(best));
    return best;
  }
  std::fprintf(stderr, "fp8mp: FP8MP_CPU_ISA=%s is not one of avx512, avx2, baseline; running %s\n", asked,
               cpu_isa_name(best));
  return best;
}

}  // namespace

CpuIsa cpu_isa() {
  static const CpuIsa isa = choose();
  return isa;
}

const char* cpu_isa_name(CpuIsa isa) {
  switch (isa) {
    case CpuIsa::Avx512: return "avx512";
    case CpuIsa::Avx2: return "avx2";
    default: return "baseline";
  }
}

}  // namespace fp8mp::cpu

extern "C" const char* fp8mp_cpu_isa() { return fp8mp::cpu::cpu_isa_name(fp8mp::cpu::cpu_isa()); }
