// Detection and lookup behind cpu_bf16_gemm.h. All of it runs once per process
// (function-local statics, thread-safe), so two threads calling fp8_gemm at once
// see the same path, and nothing here reads or writes torch's settings.
#include "gemm/cpu_bf16_gemm.h"

#include <dlfcn.h>

#include <cstdlib>
#include <cstring>

#include "common/cpu_features.h"

namespace fp8mp::cpu {
namespace {

// MKL's CBLAS enum values (mkl_cblas.h), spelled out so no MKL header is needed.
constexpr int kCblasRowMajor = 101, kCblasNoTrans = 111, kCblasTrans = 112;
// torch links MKL's LP64 interface (libmkl_intel_lp64): MKL_INT is a 32-bit int. The kernel keeps every
// dimension it passes below 2^31 (kMaxBf16Dim).
using CblasGemmBf16Lp64 = void (*)(int layout, int transa, int transb, int m, int n, int k, float alpha,
                                   const uint16_t* a, int lda, const uint16_t* b, int ldb, float beta, float* c,
                                   int ldc);

CblasGemmBf16Lp64 cblas_bf16 = nullptr;

void* find_symbol(const char* name) {
  if (void* sym = dlsym(RTLD_DEFAULT, name)) return sym;
  // torch loads libtorch_cpu with RTLD_LOCAL under some launchers: ask for it by name, never loading it anew.
  if (void* lib = dlopen("libtorch_cpu.so", RTLD_LAZY | RTLD_NOLOAD)) return dlsym(lib, name);
  return nullptr;
}

void mkl_matmul_nt_bf16(const uint16_t* a, const uint16_t* b, float* c, int64_t rows, int64_t n, int64_t k) {
  cblas_bf16(kCblasRowMajor, kCblasNoTrans, kCblasTrans, int(rows), int(n), int(k), 1.0f, a, int(k), b, int(k), 0.0f,
             c, int(n));
}

}  // namespace

MatmulNtBf16 find_bf16_matmul() {
  static const MatmulNtBf16 found = []() -> MatmulNtBf16 {
    cblas_bf16 = reinterpret_cast<CblasGemmBf16Lp64>(find_symbol("cblas_gemm_bf16bf16f32"));
    return cblas_bf16 != nullptr ? &mkl_matmul_nt_bf16 : nullptr;
  }();
  return found;
}

GemmPath gemm_path() {
  static const GemmPath path = [] {
    const bool have_mkl = find_bf16_matmul() != nullptr;
    const CpuFeatures& f = cpu_features();
    const bool have_kernel = FP8MP_AVX512_KERNELS && f.avx512_bf16;
    const char* forced = std::getenv("FP8MP_CPU_GEMM");
    if (forced != nullptr && std::strcmp(forced, "fp32") == 0) return GemmPath::Fp32;
    if (forced != nullptr && std::strcmp(forced, "bf16") == 0) return have_mkl ? GemmPath::Bf16 : GemmPath::Fp32;
    if (forced != nullptr && std::strcmp(forced, "avx512bf16") == 0) {
      return have_kernel ? GemmPath::Avx512Bf16 : GemmPath::Fp32;
    }
    if (f.amx_bf16 && have_mkl) return GemmPath::Bf16;
    if (have_kernel) return GemmPath::Avx512Bf16;
    return GemmPath::Fp32;
  }();
  return path;
}

const char* gemm_path_name(GemmPath path) {
  switch (path) {
    case GemmPath::Bf16: return "bf16";
    case GemmPath::Avx512Bf16: return "avx512bf16";
    default: return "fp32";
  }
}

}  // namespace fp8mp::cpu

extern "C" const char* fp8mp_cpu_gemm_path() { return fp8mp::cpu::gemm_path_name(fp8mp::cpu::gemm_path()); }
