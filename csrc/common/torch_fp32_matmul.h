// The fp32 GEMM of the CPU glue (fp8_gemm's fp32 path, block_scaled_gemm's K chunks): IEEE fp32 whatever
// the user set for torch's own fp32 matmuls.
//
// Which GEMM, decided once per process:
//   * MKL's sgemm (exported by libtorch_cpu), where the CPU has bf16 matrix units (AVX512-BF16 or AMX):
//     there oneDNN honours torch.backends.mkldnn.matmul.fp32_precision = "bf16" and would round the
//     operands to bf16, so an fp8mp op's result would depend on the user's setting; and on every Intel
//     CPU, where MKL's sgemm is torch's own fp32 `mm` and oneDNN's inner product plus the copy of its
//     result ran at 0.95x / 0.90x / 0.87x of it (a Xeon, 2 threads, 512x1024x1024 / 2048^3 /
//     4096x1024x1024);
//   * elsewhere (AMD CPUs without bf16 units) oneDNN's inner product (torch's mkldnn::_linear_pointwise,
//     which takes b as [N, K] as it is; about twice as fast as MKL's sgemm there, and without bf16 units
//     it has nothing to lower);
//   * aten::bmm.out (through the stable ABI's dispatcher call) where neither is there, or for a batch. The
//     out= overload because torch.autocast has no kernel for it: a functional matmul called from inside an
//     fp8mp op under torch.autocast(cpu) would run in bf16 and round every sum to bf16, silently.
// MKL's sgemm_ (found with dlsym) and mkldnn::_linear_pointwise (called by name) are no part of torch's
// stable ABI: each is used only after it gives the right answer, bit for bit, on a small product at first
// use (torch_fp32_matmul.cpp), so a torch whose MKL takes other integers, or whose oneDNN op changed or
// rounds its operands, falls back instead of computing wrong sums: to aten::bmm.out, or where the CPU has
// bf16 units (whose aten GEMMs follow the user's torch.backends.mkldnn.matmul.fp32_precision) to fp8mp's
// own fp32 GEMM (slower; IEEE fp32 sums in k order).
// FP8MP_CPU_FP32_GEMM=aten or =fp8mp forces one of the two (read once per process).
#pragma once

#include <cstdint>

namespace fp8mp {

enum class Fp32GemmRoute : int { MklSgemm, OneDnn, AtenBmm, Fp8mp };

// The route fp32_gemm_nt takes for one GEMM (batch 1) in this process, decided at first use.
Fp32GemmRoute fp32_gemm_route();

// c [batch, rows, n] = a [batch, rows, k] @ b [batch, n, k]^T in fp32, all row-major and contiguous.
void fp32_gemm_nt(const float* a, const float* b, float* c, int64_t batch, int64_t rows, int64_t n, int64_t k);

}  // namespace fp8mp

// For the tests (through ctypes, without a torch op): "mkl_sgemm", "onednn", "aten_bmm" or "fp8mp".
extern "C" __attribute__((visibility("default"))) const char* fp8mp_cpu_fp32_gemm_route();
