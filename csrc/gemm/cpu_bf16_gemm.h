// The fast exact CPU path of fp8_gemm: FP8 codes decoded to bfloat16 (every E4M3
// and E5M2 value is exact in bf16) and multiplied by MKL's cblas_gemm_bf16bf16f32,
// which forms each product exactly and accumulates in fp32 - the arithmetic of
// the fp32 emulation, with half the bytes per operand and the CPU's bf16 matrix
// units (AVX512-BF16, AMX) where it has them. Torch-free: the MKL entry point is
// looked up at run time in the process (torch's libtorch_cpu exports it), so the
// extension links against no torch-internal symbol; where it is absent the fp32
// path is used.
#pragma once

#include <cstdint>

namespace fp8mp::cpu {

// Fp32: decode to fp32, torch's fp32 GEMM. Bf16: decode to bf16, MKL's bf16 GEMM. Avx512Bf16: fp8mp's
// AVX512-BF16 kernel (bf16_gemm_avx512.h), decoding while it packs.
enum class GemmPath : int { Fp32 = 0, Bf16 = 1, Avx512Bf16 = 2 };

// MKL's LP64 interface takes 32-bit dimensions: larger N or K take the fp32 path.
constexpr int64_t kMaxBf16Dim = (int64_t(1) << 31) - 1;

// c [rows, n] = a [rows, k] @ b [n, k]^T, bf16 bits in, fp32 out, row-major and contiguous.
using MatmulNtBf16 = void (*)(const uint16_t* a, const uint16_t* b, float* c, int64_t rows, int64_t n, int64_t k);

// The bf16 GEMM of the process (MKL's, through torch), or nullptr where there is none.
MatmulNtBf16 find_bf16_matmul();

// The path fp8_gemm takes in this process, decided once at first use:
//   FP8MP_CPU_GEMM=fp32, =bf16 or =avx512bf16 forces one (bf16 only if MKL's GEMM was found,
//   avx512bf16 only where the CPU has AVX512-BF16; fp32 otherwise);
//   otherwise, where the CPU has AMX-BF16, bf16 (MKL drives the AMX tiles, which a vdpbf16ps kernel
//   cannot match); where it has AVX512-BF16 without AMX, avx512bf16 (measured on Zen 4: about twice
//   MKL's bf16 GEMM, which there does not use the bf16 units, see benchmarks/RESULTS.md); fp32 elsewhere.
GemmPath gemm_path();

const char* gemm_path_name(GemmPath path);

}  // namespace fp8mp::cpu

// For Python (fp8mp.ops.cpu_gemm_path) through ctypes, without a torch op: "fp32", "bf16" or "avx512bf16".
extern "C" __attribute__((visibility("default"))) const char* fp8mp_cpu_gemm_path();
