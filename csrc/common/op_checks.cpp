#include "common/op_checks.h"

#include <limits>

#include <algorithm>
#include <cctype>
#include <cstdint>

namespace fp8mp {

namespace {

// [first, last) bytes a strided tensor can touch: its data pointer plus the most
// negative and most positive element offsets its strides reach.
std::pair<uintptr_t, uintptr_t> byte_span(const Tensor& t) {
  int64_t low = 0, high = 0;
  for (int64_t d = 0; d < t.dim(); ++d) {
    const int64_t reach = (t.size(d) - 1) * t.stride(d);
    (reach < 0 ? low : high) += reach;
  }
  const auto base = reinterpret_cast<uintptr_t>(t.data_ptr());
  const auto element = int64_t(t.element_size());
  return {base + uintptr_t(low * element), base + uintptr_t((high + 1) * element)};
}

}  // namespace

Fp8Format parse_format(const std::string& fmt, const char* op) {
  std::string lower = fmt;
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  if (lower == "e4m3") return Fp8Format::E4M3;
  FP8MP_CHECK_VALUE(lower == "e5m2", op, ": argument 'fmt' must be 'e4m3' or 'e5m2', got '", fmt, "'");
  return Fp8Format::E5M2;
}

ScalarType fp8_dtype(Fp8Format format) { return format == Fp8Format::E4M3 ? kFloat8_e4m3fn : kFloat8_e5m2; }

Fp8Format format_of(const Tensor& t, const char* op, const char* arg) {
  if (t.scalar_type() == kFloat8_e4m3fn) return Fp8Format::E4M3;
  FP8MP_CHECK(t.scalar_type() == kFloat8_e5m2, op, ": argument '", arg, "' must be float8_e4m3fn or float8_e5m2, got ",
              dtype_str(t.scalar_type()));
  return Fp8Format::E5M2;
}

void check_host_cast_scale(const Tensor& scale, const char* op, const char* arg) {
  if (scale.device().type() != torch::headeronly::DeviceType::CPU) return;
  const float value = cpu_scalar(scale);
  FP8MP_CHECK_VALUE(value > 0.0f && value <= std::numeric_limits<float>::max(), op, ": argument '", arg,
                    "' must be finite and > 0, got ", value,
                    " (on a GPU, where checking it would cost a host sync, such a scale makes every output NaN)");
}

void check_scalar_tensor(const Tensor& t, const Tensor& like, const char* op, const char* arg) {
  FP8MP_CHECK(t.scalar_type() == kFloat, op, ": argument '", arg, "' must be a 1-element float32 tensor, got dtype ",
              dtype_str(t.scalar_type()));
  FP8MP_CHECK_VALUE(t.numel() == 1, op, ": argument '", arg, "' must be a 1-element float32 tensor, got shape ",
                    shape_str(t));
  FP8MP_CHECK(same_device(t, like), op, ": argument '", arg, "' must be on the input's device ", device_str(like),
              ", got ", device_str(t));
}

void check_high_precision_dtype(ScalarType dtype, const char* op, const char* arg) {
  FP8MP_CHECK(dtype == kFloat || dtype == kBFloat16 || dtype == kHalf, op, ": argument '", arg,
              "' must be float32, bfloat16 or float16, got ", dtype_str(dtype));
}

void check_no_overlap(NamedTensor out, std::initializer_list<NamedTensor> inputs, const char* op) {
  if (out.first->numel() == 0) return;
  const auto [out_first, out_last] = byte_span(*out.first);
  for (const auto& [input, name] : inputs) {
    if (input == nullptr || !input->defined() || input->numel() == 0 || !same_device(*input, *out.first)) continue;
    const auto [first, last] = byte_span(*input);
    FP8MP_CHECK(last <= out_first || out_last <= first, op, ": argument '", out.second,
                "' is written in place and must not share memory with '", name, "'");
  }
}

void check_gemm_shapes(const Tensor& a, const Tensor& b, const char* op) {
  FP8MP_CHECK_VALUE(a.dim() == 2, op, ": argument 'a' must be 2-D [M, K], got shape ", shape_str(a));
  FP8MP_CHECK_VALUE(b.dim() == 2, op, ": argument 'b' must be 2-D [N, K], got shape ", shape_str(b));
  FP8MP_CHECK_VALUE(b.size(1) == a.size(1), op, ": argument 'b' must be [N, K] with K = a.size(1) = ", a.size(1),
                    " (out = a @ b.T), got shape ", shape_str(b));
}

void check_bias_dtype_and_device(const Tensor& t, const Tensor& a, ScalarType out_dtype, const char* op) {
  FP8MP_CHECK(t.scalar_type() == out_dtype, op, ": argument 'bias' must have dtype out_dtype = ", dtype_str(out_dtype),
              ", got ", dtype_str(t.scalar_type()));
  FP8MP_CHECK(same_device(t, a), op, ": argument 'bias' must be on the input's device ", device_str(a), ", got ",
              device_str(t));
}

void check_gemm_bias(const std::optional<Tensor>& bias, const Tensor& a, const Tensor& b, ScalarType out_dtype,
                     const char* op) {
  if (!bias.has_value()) return;
  const Tensor& t = *bias;
  check_bias_dtype_and_device(t, a, out_dtype, op);
  FP8MP_CHECK_VALUE(t.dim() == 1 && t.size(0) == b.size(0), op, ": argument 'bias' must have shape [N] = [",
                    b.size(0), "], got shape ", shape_str(t));
}

}  // namespace fp8mp
