#include "op_checks.h"

#include <ATen/MemoryOverlap.h>
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

AmaxComputeAlgo parse_amax_compute_algo(c10::string_view algo, const char* op) {
  const std::string name(algo.begin(), algo.end());
  if (name == "max") return AmaxComputeAlgo::Max;
  if (name == "most_recent") return AmaxComputeAlgo::MostRecent;
  TORCH_CHECK_VALUE(false, op, ": argument 'amax_compute_algo' must be 'max' or 'most_recent', got '", name, "'");
}

AmaxHistoryShape check_update_amax_history_args(const at::Tensor& amax, const at::Tensor& amax_history,
                                                const at::Tensor& scale, const at::Tensor& scale_inv,
                                                const at::Tensor& fp8_max, int64_t margin,
                                                c10::string_view amax_compute_algo, AmaxComputeAlgo* algo) {
  constexpr const char* op = "fp8mp::update_amax_history_and_scale";
  const std::pair<const at::Tensor*, const char*> args[] = {
      {&amax, "amax"}, {&amax_history, "amax_history"}, {&scale, "scale"}, {&scale_inv, "scale_inv"}, {&fp8_max, "fp8_max"}};
  for (const auto& [t, name] : args) {
    TORCH_CHECK(t->scalar_type() == at::kFloat, op, ": argument '", name, "' must be float32, got ", t->scalar_type());
    TORCH_CHECK(t->layout() == at::kStrided, op, ": argument '", name, "' must be a strided tensor, got ", t->layout());
    TORCH_CHECK(t->device() == amax.device(), op, ": argument '", name, "' must be on amax's device ", amax.device(),
                ", got ", t->device());
  }
  TORCH_CHECK_VALUE(amax.dim() == 1, op, ": argument 'amax' must be 1-D [T], got shape ", amax.sizes());
  const int64_t num_tensors = amax.size(0);
  TORCH_CHECK_VALUE(amax_history.dim() == 2 && amax_history.size(0) >= 1 && amax_history.size(1) == num_tensors, op,
                    ": argument 'amax_history' must have shape [H, T] with H >= 1 and T = amax.numel() = ", num_tensors,
                    ", got shape ", amax_history.sizes());
  for (const auto& [t, name] : {args[2], args[3], args[4]}) {
    TORCH_CHECK_VALUE(t->dim() == 1 && t->size(0) == num_tensors, op, ": argument '", name,
                      "' must have shape [T] = [", num_tensors, "] like amax, got shape ", t->sizes());
  }
  for (const auto& [t, name] : args) {
    TORCH_CHECK(t->is_contiguous(), op, ": argument '", name, "' must be contiguous");
  }
  // The kernels read every input before writing, but only within a column:
  // overlapping buffers would make the result depend on the order of columns.
  for (int out = 1; out <= 3; ++out) {
    for (int other = 0; other < 5; ++other) {
      if (other == out || args[other].first->numel() == 0 || args[out].first->numel() == 0) continue;
      TORCH_CHECK(at::get_overlap_status(*args[out].first, *args[other].first) == at::MemOverlapStatus::No, op,
                  ": argument '", args[out].second, "' is written in place and must not share memory with '",
                  args[other].second, "'");
    }
  }
  TORCH_CHECK_VALUE(margin >= 0, op, ": argument 'margin' must be >= 0, got ", margin);
  *algo = parse_amax_compute_algo(amax_compute_algo, op);
  return {amax_history.size(0), num_tensors};
}

GemmFormats check_fp8_gemm_args(const at::Tensor& a, const at::Tensor& a_scale_inv, const at::Tensor& b,
                                const at::Tensor& b_scale_inv, const std::optional<at::Tensor>& bias,
                                at::ScalarType out_dtype) {
  constexpr const char* op = "fp8mp::fp8_gemm";
  const GemmFormats formats{format_of(a, op, "a"), format_of(b, op, "b")};
  TORCH_CHECK(!(formats.a == Fp8Format::E5M2 && formats.b == Fp8Format::E5M2), op,
              ": arguments 'a' and 'b' cannot both be float8_e5m2 (cuBLASLt has no e5m2 x e5m2 FP8 GEMM); "
              "make at least one of them float8_e4m3fn");
  TORCH_CHECK(b.device() == a.device(), op, ": argument 'b' must be on the device of 'a' ", a.device(), ", got ",
              b.device());
  check_scalar_tensor(a_scale_inv, a, op, "a_scale_inv");
  check_scalar_tensor(b_scale_inv, a, op, "b_scale_inv");
  check_high_precision_dtype(out_dtype, op, "out_dtype");
  TORCH_CHECK_VALUE(a.dim() == 2, op, ": argument 'a' must be 2-D [M, K], got shape ", a.sizes());
  TORCH_CHECK_VALUE(b.dim() == 2, op, ": argument 'b' must be 2-D [N, K], got shape ", b.sizes());
  TORCH_CHECK_VALUE(b.size(1) == a.size(1), op, ": argument 'b' must be [N, K] with K = a.size(1) = ", a.size(1),
                    " (out = a @ b.T), got shape ", b.sizes());
  if (bias.has_value()) {
    const at::Tensor& t = *bias;
    TORCH_CHECK(t.scalar_type() == out_dtype, op, ": argument 'bias' must have dtype out_dtype = ", out_dtype,
                ", got ", t.scalar_type());
    TORCH_CHECK(t.device() == a.device(), op, ": argument 'bias' must be on the input's device ", a.device(), ", got ",
                t.device());
    TORCH_CHECK_VALUE(t.dim() == 1 && t.size(0) == b.size(0), op, ": argument 'bias' must have shape [N] = [",
                      b.size(0), "], got shape ", t.sizes());
  }
  return formats;
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
