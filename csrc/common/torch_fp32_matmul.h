// The fp32 GEMM of the CPU glue (fp8_gemm's fallback, block_scaled_gemm's K chunks), through torch.
#pragma once

#include <cstdint>

namespace fp8mp {

// c [batch, rows, n] = a [batch, rows, k] @ b [batch, n, k]^T in fp32 (all row-major, contiguous), written
// into c by torch's aten::bmm.out. The out= overload because torch.autocast has no kernel for it: a
// functional matmul called from inside an fp8mp op under torch.autocast(cpu) would run in bf16 and round
// every sum to bf16, silently. IEEE fp32 unless the user lowered torch's fp32 matmul precision.
void torch_bmm_nt_fp32(const float* a, const float* b, float* c, int64_t batch, int64_t rows, int64_t n, int64_t k);

}  // namespace fp8mp
