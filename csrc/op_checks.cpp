#include "op_checks.h"

#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <cctype>
#include <string>

namespace fp8mp {

Fp8Format parse_format(c10::string_view fmt, const char* op) {
  std::string lower(fmt.begin(), fmt.end());
  std::transform(lower.begin(), lower.end(), lower.begin(), [](unsigned char c) { return std::tolower(c); });
  if (lower == "e4m3") return Fp8Format::E4M3;
  if (lower == "e5m2") return Fp8Format::E5M2;
  TORCH_CHECK_VALUE(false, op, ": argument 'fmt' must be 'e4m3' or 'e5m2', got '", std::string(fmt.begin(), fmt.end()), "'");
}

at::ScalarType fp8_dtype(Fp8Format format) {
  return format == Fp8Format::E4M3 ? at::kFloat8_e4m3fn : at::kFloat8_e5m2;
}

Fp8Format format_of(const at::Tensor& t, const char* op, const char* arg) {
  if (t.scalar_type() == at::kFloat8_e4m3fn) return Fp8Format::E4M3;
  if (t.scalar_type() == at::kFloat8_e5m2) return Fp8Format::E5M2;
  TORCH_CHECK(false, op, ": argument '", arg, "' must be float8_e4m3fn or float8_e5m2, got ", t.scalar_type());
}

void check_scalar_tensor(const at::Tensor& t, const at::Tensor& like, const char* op, const char* arg) {
  TORCH_CHECK(t.scalar_type() == at::kFloat, op, ": argument '", arg,
                   "' must be a 1-element float32 tensor, got dtype ", t.scalar_type());
  TORCH_CHECK_VALUE(t.numel() == 1, op, ": argument '", arg, "' must be a 1-element float32 tensor, got shape ",
                    t.sizes());
  TORCH_CHECK(t.device() == like.device(), op, ": argument '", arg, "' must be on the input's device ", like.device(),
              ", got ", t.device());
}

void check_high_precision_dtype(at::ScalarType dtype, const char* op, const char* arg) {
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16 || dtype == at::kHalf, op, ": argument '", arg,
                   "' must be float32, bfloat16 or float16, got ", dtype);
}

Fp8Format check_cast_to_fp8_args(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& amax,
                                 c10::string_view fmt, const char* op) {
  const Fp8Format format = parse_format(fmt, op);
  check_high_precision_dtype(x.scalar_type(), op, "x");
  check_scalar_tensor(scale, x, op, "scale");
  check_scalar_tensor(amax, x, op, "amax");
  return format;
}

Fp8Format check_cast_from_fp8_args(const at::Tensor& y, const at::Tensor& scale_inv, at::ScalarType out_dtype) {
  constexpr const char* op = "fp8mp::cast_from_fp8";
  const Fp8Format format = format_of(y, op, "y");
  check_scalar_tensor(scale_inv, y, op, "scale_inv");
  check_high_precision_dtype(out_dtype, op, "out_dtype");
  return format;
}

namespace {

void check_norm_param(const at::Tensor& p, const at::Tensor& x, const char* op, const char* arg) {
  const int64_t hidden = x.size(-1);
  TORCH_CHECK_VALUE(p.dim() == 1 && p.size(0) == hidden, op, ": argument '", arg,
                    "' must have shape [H] where H is x's last dimension: normalized_shape ", p.sizes(),
                    " vs x's last dimension ", hidden, " (x has shape ", x.sizes(), ")");
  check_high_precision_dtype(p.scalar_type(), op, arg);
  TORCH_CHECK(p.device() == x.device(), op, ": argument '", arg, "' must be on the input's device ", x.device(),
              ", got ", p.device());
}

void check_norm_input(const at::Tensor& x, const std::optional<at::Tensor>& weight, const char* op) {
  check_high_precision_dtype(x.scalar_type(), op, "x");
  TORCH_CHECK_VALUE(x.dim() >= 1 && x.size(-1) > 0, op,
                    ": argument 'x' must have at least one dimension and a non-empty last dimension, got shape ",
                    x.sizes());
  if (weight.has_value()) check_norm_param(*weight, x, op, "weight");
}

}  // namespace

void check_norm_fwd_args(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                         const std::optional<at::Tensor>& bias, double eps, const char* op) {
  check_norm_input(x, weight, op);
  if (bias.has_value()) {
    check_norm_param(*bias, x, op, "bias");
    if (weight.has_value()) {
      TORCH_CHECK(bias->scalar_type() == weight->scalar_type(), op,
                  ": arguments 'weight' and 'bias' must have the same dtype, got ", weight->scalar_type(), " and ",
                  bias->scalar_type());
    }
  }
  const float eps_f = static_cast<float>(eps);
  TORCH_CHECK_VALUE(std::isfinite(eps_f) && eps_f > 0.0f, op,
                    ": argument 'eps' must be > 0 and finite (as a float32), got ", eps);
}

Fp8Format check_norm_fwd_fp8_args(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                                  const std::optional<at::Tensor>& bias, double eps, const at::Tensor& scale,
                                  const at::Tensor& amax, c10::string_view fmt, const char* op) {
  check_norm_fwd_args(x, weight, bias, eps, op);
  return check_cast_to_fp8_args(x, scale, amax, fmt, op);
}

void check_norm_bwd_args(const at::Tensor& grad_out, const at::Tensor& x, const at::Tensor* mean,
                         const at::Tensor& rstd, const std::optional<at::Tensor>& weight, const char* op) {
  check_norm_input(x, weight, op);
  TORCH_CHECK_VALUE(grad_out.sizes() == x.sizes(), op, ": argument 'grad_out' must have x's shape ", x.sizes(),
                    ", got ", grad_out.sizes());
  TORCH_CHECK(grad_out.scalar_type() == x.scalar_type(), op, ": argument 'grad_out' must have x's dtype ",
              x.scalar_type(), ", got ", grad_out.scalar_type());
  TORCH_CHECK(grad_out.device() == x.device(), op, ": argument 'grad_out' must be on the input's device ",
              x.device(), ", got ", grad_out.device());
  const auto stats_shape = x.sizes().slice(0, x.dim() - 1);
  const std::pair<const at::Tensor*, const char*> stats[] = {{mean, "mean"}, {&rstd, "rstd"}};
  for (const auto& [t, arg] : stats) {
    if (t == nullptr) continue;
    TORCH_CHECK(t->scalar_type() == at::kFloat, op, ": argument '", arg, "' must be float32, got ",
                t->scalar_type());
    TORCH_CHECK_VALUE(t->sizes() == stats_shape, op, ": argument '", arg, "' must have shape x.shape[:-1] = ",
                      stats_shape, ", got ", t->sizes());
    TORCH_CHECK(t->device() == x.device(), op, ": argument '", arg, "' must be on the input's device ", x.device(),
                ", got ", t->device());
  }
}

}  // namespace fp8mp
