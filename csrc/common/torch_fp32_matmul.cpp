#include "common/torch_fp32_matmul.h"

#include <array>

#include "common/stable.h"

namespace fp8mp {

void torch_bmm_nt_fp32(const float* a, const float* b, float* c, int64_t batch, int64_t rows, int64_t n, int64_t k) {
  using torch::stable::detail::from;
  const Device cpu(torch::headeronly::DeviceType::CPU);
  const Tensor a_t = torch::stable::from_blob(const_cast<float*>(a), {batch, rows, k}, {rows * k, k, 1}, cpu, kFloat);
  const Tensor b_t = torch::stable::from_blob(const_cast<float*>(b), {batch, n, k}, {n * k, k, 1}, cpu, kFloat);
  const Tensor c_t = torch::stable::from_blob(c, {batch, rows, n}, {rows * n, n, 1}, cpu, kFloat);
  std::array<StableIValue, 3> stack{from(a_t), from(torch::stable::transpose(b_t, 1, 2)), from(c_t)};
  FP8MP_CHECK(torch_call_dispatcher("aten::bmm", "out", stack.data(), TORCH_ABI_VERSION) == AOTI_TORCH_SUCCESS,
              "fp8mp: aten::bmm.out failed in the CPU fp32 GEMM");
}

}  // namespace fp8mp
