// Which CPU kernel fp8_gemm runs in this process. All three form every product of
// FP8 values exactly (every E4M3 and E5M2 value is exact in bf16 and fp32, and so
// is the product of two) and sum in fp32: only the order of the additions differs.
// Torch-free; nothing here reads or writes torch's settings.
#pragma once

namespace fp8mp::cpu {

// Fp32: FP8 decoded to fp32, the glue's fp32 GEMM (torch_fp32_matmul.h). Avx512Bf16: fp8mp's AVX512-BF16
// kernel (bf16_gemm_avx512.h). Amx: fp8mp's AMX kernel (bf16_gemm_amx.h). Both decode FP8 to bf16 while
// they pack.
enum class GemmPath : int { Fp32 = 0, Avx512Bf16 = 2, Amx = 3 };

// The path fp8_gemm takes in this process, decided once at first use (thread-safe):
//   FP8MP_CPU_GEMM=fp32, =avx512bf16 or =amx forces one (avx512bf16 only where the CPU has AVX512-BF16,
//   amx only where this process may use AMX-BF16 tiles; fp32 otherwise);
//   otherwise amx where AMX-BF16 tiles are usable, avx512bf16 where the CPU has AVX512-BF16 without AMX and
//   is not an Intel one (whose cores run vdpbf16ps at half the fp32 FMAs' rate: cpu_gemm_path.cpp), fp32
//   elsewhere. Measured against MKL's bf16 x bf16 -> fp32 GEMM fed decoded operands (the choice of
//   an earlier version): 2.5-3x faster on a Xeon with AMX, about 2x on Zen 4, where MKL does not use the
//   bf16 units; see benchmarks/RESULTS.md.
GemmPath gemm_path();

const char* gemm_path_name(GemmPath path);

}  // namespace fp8mp::cpu

// For Python (fp8mp.ops.cpu_gemm_path) through ctypes, without a torch op: "fp32", "avx512bf16" or "amx".
extern "C" __attribute__((visibility("default"))) const char* fp8mp_cpu_gemm_path();
