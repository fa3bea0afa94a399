// What the CPU this process runs on can do, from cpuid (and xgetbv: whether the
// OS saves the AVX-512 registers), read once. The extension is one binary for
// every x86-64 CPU: the vector kernels are compiled for their ISA with target
// attributes, never with global -m flags, and called only where these say so.
#pragma once

#include <cstdint>

namespace fp8mp::cpu {

struct CpuFeatures {
  bool avx512;       // AVX-512 F, BW, VL and DQ, with the OS saving the zmm state (x86-64-v4's vector part)
  bool avx512_bf16;  // CPUID.(7,1):EAX[5]: vdpbf16ps, a bf16 dot product with fp32 sums
  bool amx_bf16;     // CPUID.(7,0):EDX[22]: AMX tiles with bf16 inputs, with the OS saving the tile state
                     // (a process must still ask Linux for the tile data: bf16_gemm_amx.h's amx_bf16_usable)
  bool intel;        // CPUID.0 vendor "GenuineIntel": its cores run vdpbf16ps at half the fp32 FMAs' FLOP rate
                     // (cpu_gemm_path.cpp), and its fp32 GEMM is MKL's (torch_fp32_matmul.h)
};

// The features of this CPU (all false off x86-64), computed on first use.
const CpuFeatures& cpu_features();

// Whether `bytes` of output are more than the L2 caches of `threads` cores hold (sysconf's L2 size, 2 MiB
// where unknown): its lines then leave the caches before anyone reads them, and the kernels writing it use
// non-temporal stores, which skip the read of each line an ordinary store makes first.
bool larger_than_l2_caches(int64_t bytes, int threads);

}  // namespace fp8mp::cpu

// FP8MP_AVX512_KERNELS: this compiler builds the AVX-512 kernels (GCC or Clang on x86-64); each is marked
// FP8MP_TARGET_AVX512 and called only where cpu_features().avx512 is true.
#if defined(__x86_64__) && defined(__GNUC__)
#define FP8MP_AVX512_KERNELS 1
#define FP8MP_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))
#else
#define FP8MP_AVX512_KERNELS 0
#endif
