#include "norm/norm_checks.h"

#include <c10/util/Exception.h>

#include <cmath>

#include "cast/cast_checks.h"

namespace fp8mp {

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
