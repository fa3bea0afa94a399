// The decision behind cpu_gemm_path.h: a function-local static, computed once.
#include "gemm/cpu_gemm_path.h"

#include <cstdlib>
#include <cstring>

#include "common/cpu_features.h"
#include "common/cpu_isa.h"
#include "gemm/bf16_gemm_amx.h"

namespace fp8mp::cpu {

GemmPath gemm_path() {
  static const GemmPath path = [] {
    const char* forced = std::getenv("FP8MP_CPU_GEMM");
    const auto is = [forced](const char* name) { return forced != nullptr && std::strcmp(forced, name) == 0; };
    // FP8MP_CPU_ISA below avx512 keeps both bf16 kernels off, as on a CPU without AVX-512.
    const bool have_avx512_kernel = FP8MP_AVX512_KERNELS && cpu_features().avx512_bf16 && cpu_isa() == CpuIsa::Avx512;
    if (is("fp32")) return GemmPath::Fp32;
    if (is("avx512bf16")) return have_avx512_kernel ? GemmPath::Avx512Bf16 : GemmPath::Fp32;
    const bool amx = have_avx512_kernel && amx_bf16_usable();
    if (is("amx")) return amx ? GemmPath::Amx : GemmPath::Fp32;
    if (amx) return GemmPath::Amx;
    // The AVX512-BF16 kernel only where vdpbf16ps outruns the fp32 FMAs: AMD's cores (Zen 4: 0.91-0.99x of
    // torch's bf16 mm, RESULTS.md). An Intel core runs it at half their FLOP rate (a Xeon with AMX, AMX
    // unused: 118 GFLOP/s of vdpbf16ps against 237 of vfmadd231ps per core; the forced kernel 0.56-0.62x of
    // fp32 mm where the fp32 path gives 0.90-0.92x), so an Intel CPU without usable AMX (Cooper Lake, or a
    // newer Xeon whose OS does not grant the tiles) takes the fp32 path.
    if (have_avx512_kernel && !cpu_features().intel) return GemmPath::Avx512Bf16;
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
