#include "norm/norm_checks.h"

#include <cmath>
#include <vector>

#include "cast/cast_checks.h"

namespace fp8mp {

namespace {

void check_norm_param(const Tensor& p, const Tensor& x, const char* op, const char* arg) {
  const int64_t hidden = x.size(-1);
  FP8MP_CHECK_VALUE(p.dim() == 1 && p.size(0) == hidden, op, ": argument '", arg,
                    "' must have shape [H] where H is x's last dimension: normalized_shape ", shape_str(p),
                    " vs x's last dimension ", hidden, " (x has shape ", shape_str(x), ")");
  check_high_precision_dtype(p.scalar_type(), op, arg);
  FP8MP_CHECK(same_device(p, x), op, ": argument '", arg, "' must be on the input's device ", device_str(x), ", got ",
              device_str(p));
}

void check_norm_input(const Tensor& x, const std::optional<Tensor>& weight, const char* op) {
  check_high_precision_dtype(x.scalar_type(), op, "x");
  FP8MP_CHECK_VALUE(x.dim() >= 1 && x.size(-1) > 0, op,
                    ": argument 'x' must have at least one dimension and a non-empty last dimension, got shape ",
                    shape_str(x));
  if (weight.has_value()) check_norm_param(*weight, x, op, "weight");
}

}  // namespace

void check_norm_fwd_args(const Tensor& x, const std::optional<Tensor>& weight, const std::optional<Tensor>& bias,
                         double eps, const char* op) {
  check_norm_input(x, weight, op);
  if (bias.has_value()) {
    check_norm_param(*bias, x, op, "bias");
    if (weight.has_value()) {
      FP8MP_CHECK(bias->scalar_type() == weight->scalar_type(), op,
                  ": arguments 'weight' and 'bias' must have the same dtype, got ", dtype_str(weight->scalar_type()),
                  " and ", dtype_str(bias->scalar_type()));
    }
  }
  const float eps_f = static_cast<float>(eps);
  FP8MP_CHECK_VALUE(std::isfinite(eps_f) && eps_f > 0.0f, op,
                    ": argument 'eps' must be > 0 and finite (as a float32), got ", eps);
}

Fp8Format check_norm_fwd_fp8_args(const Tensor& x, const std::optional<Tensor>& weight,
                                  const std::optional<Tensor>& bias, double eps, const Tensor& scale,
                                  const Tensor& amax, const std::string& fmt, const char* op) {
  check_norm_fwd_args(x, weight, bias, eps, op);
  const Fp8Format format = check_cast_to_fp8_args(x, scale, amax, fmt, op);
  check_no_overlap({&amax, "amax"}, {{weight ? &*weight : nullptr, "weight"}, {bias ? &*bias : nullptr, "bias"}}, op);
  return format;
}

void check_norm_bwd_args(const Tensor& grad_out, const Tensor& x, const Tensor* mean, const Tensor& rstd,
                         const std::optional<Tensor>& weight, const char* op) {
  check_norm_input(x, weight, op);
  FP8MP_CHECK_VALUE(shape_str(grad_out) == shape_str(x), op, ": argument 'grad_out' must have x's shape ",
                    shape_str(x), ", got ", shape_str(grad_out));
  FP8MP_CHECK(grad_out.scalar_type() == x.scalar_type(), op, ": argument 'grad_out' must have x's dtype ",
              dtype_str(x.scalar_type()), ", got ", dtype_str(grad_out.scalar_type()));
  FP8MP_CHECK(same_device(grad_out, x), op, ": argument 'grad_out' must be on the input's device ", device_str(x),
              ", got ", device_str(grad_out));
  const std::vector<int64_t> x_sizes = sizes_of(x);
  const std::vector<int64_t> stats_shape(x_sizes.begin(), x_sizes.end() - 1);
  const std::pair<const Tensor*, const char*> stats[] = {{mean, "mean"}, {&rstd, "rstd"}};
  for (const auto& [t, arg] : stats) {
    if (t == nullptr) continue;
    FP8MP_CHECK(t->scalar_type() == kFloat, op, ": argument '", arg, "' must be float32, got ",
                dtype_str(t->scalar_type()));
    FP8MP_CHECK_VALUE(sizes_of(*t) == stats_shape, op, ": argument '", arg, "' must have shape x.shape[:-1] = ",
                      shape_str(stats_shape), ", got ", shape_str(*t));
    FP8MP_CHECK(same_device(*t, x), op, ": argument '", arg, "' must be on the input's device ", device_str(x),
                ", got ", device_str(*t));
  }
}

}  // namespace fp8mp
