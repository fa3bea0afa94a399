// The decision behind cpu_gemm_path.h: a function-local static, computed once.
#include "gemm/cpu_gemm_path.h"

#include <cstdlib>
#include <cstring>

#include "common/cpu_features.h"
#include "gemm/bf16_gemm_amx.h"

namespace fp8mp::cpu {

GemmPath gemm_path() {
  static const GemmPath path = [] {
    const char* forced = std::getenv("FP8MP_CPU_GEMM");
    const auto is = [forced](const char* name) { return forced != nullptr && std::strcmp(forced, name) == 0; };
    const bool have_avx512_kernel = FP8MP_AVX512_KERNELS && cpu_features().avx512_bf16;
    if (is("fp32")) return GemmPath::Fp32;
    if (is("avx512bf16")) return have_avx512_kernel ? GemmPath::Avx512Bf16 : GemmPath::Fp32;
    if (is("amx")) return amx_bf16_usable() ? GemmPath::Amx : GemmPath::Fp32;
    if (amx_bf16_usable()) return GemmPath::Amx;
    if (have_avx512_kernel) return GemmPath::Avx512Bf16;
    return GemmPath::Fp32;
  }();
  return path;
}

const char* gemm_path_name(GemmPath path) {
  switch (path) {
    case GemmPath::Avx512Bf16: return "avx512bf16";
    case GemmPath::Amx: return "amx";
    default: return "fp32";
  }
}

}  // namespace fp8mp::cpu

extern "C" const char* fp8mp_cpu_gemm_path() { return fp8mp::cpu::gemm_path_name(fp8mp::cpu::gemm_path()); }
