#include "optim/optim_checks.h"

#include <cstdint>
#include <cmath>
#include <vector>

namespace fp8mp {

namespace {

void check_on_param_device(const Tensor& t, const Tensor& param, const char* op, const char* name) {
  FP8MP_CHECK(t.layout() == torch::headeronly::Layout::Strided, op, ": argument '", name, "' must be a strided tensor");
  FP8MP_CHECK(same_device(t, param), op, ": argument '", name, "' must be on param's device ", device_str(param),
              ", got ", device_str(t));
}

void check_contiguous(const Tensor& t, const char* op, const char* name) {
  FP8MP_CHECK(t.is_contiguous(), op, ": argument '", name, "' must be contiguous");
}

optim::StateType state_type_of(ScalarType dtype) {
  return dtype == kFloat ? optim::StateType::Float32
                         : (dtype == kBFloat16 ? optim::StateType::BFloat16 : optim::StateType::E4M3);
}

void check_range(bool ok, const char* op, const char* name, const char* range, double value) {
  FP8MP_CHECK_VALUE(ok, op, ": argument '", name, "' must be ", range, ", got ", value);
}

}  // namespace

optim::StepBuffers check_optimizer_step_args(const char* op, const Tensor& param, const Tensor& grad,
                                             std::initializer_list<StateArg> states, const Tensor& step,
                                             const std::optional<Tensor>& found_inf, int64_t seed,
                                             int64_t element_offset) {
  FP8MP_CHECK(param.scalar_type() == kFloat || param.scalar_type() == kBFloat16, op,
              ": argument 'param' must be float32 or bfloat16, got ", dtype_str(param.scalar_type()));
  FP8MP_CHECK(param.layout() == torch::headeronly::Layout::Strided, op, ": argument 'param' must be a strided tensor");
  check_contiguous(param, op, "param");
  FP8MP_CHECK(grad.scalar_type() == kFloat || grad.scalar_type() == kBFloat16, op,
              ": argument 'grad' must be float32 or bfloat16, got ", dtype_str(grad.scalar_type()));
  check_on_param_device(grad, param, op, "grad");
  FP8MP_CHECK_VALUE(grad.sizes().equals(param.sizes()), op, ": argument 'grad' must have param's shape ",
                    shape_str(param), ", got ", shape_str(grad));
  check_contiguous(grad, op, "grad");

  const int64_t numel = param.numel();
  const int64_t blocks = (numel + optim::kStateBlock - 1) / optim::kStateBlock;
  const ScalarType state_dtype = states.begin()->state->scalar_type();
  optim::StepBuffers buffers{};
  int k = 0;
  for (const StateArg& arg : states) {
    const Tensor& state = *arg.state;
    const ScalarType dtype = state.scalar_type();
    FP8MP_CHECK(dtype == kFloat || dtype == kBFloat16 || dtype == kFloat8_e4m3fn, op, ": argument '", arg.name,
                "' must be float32, bfloat16 or float8_e4m3fn, got ", dtype_str(dtype));
    FP8MP_CHECK(dtype == state_dtype, op, ": argument '", arg.name, "' must have the dtype of '",
                states.begin()->name, "' (", dtype_str(state_dtype), "), got ", dtype_str(dtype));
    check_on_param_device(state, param, op, arg.name);
    FP8MP_CHECK_VALUE(state.sizes().equals(param.sizes()), op, ": argument '", arg.name, "' must have param's shape ",
                      shape_str(param), ", got ", shape_str(state));
    check_contiguous(state, op, arg.name);
    const std::optional<Tensor>& scale = *arg.scale;
    if (dtype == kFloat8_e4m3fn) {
      FP8MP_CHECK_VALUE(scale.has_value(), op, ": argument '", arg.scale_name, "' is required when '", arg.name,
                        "' is float8_e4m3fn");
      FP8MP_CHECK(scale->scalar_type() == kFloat, op, ": argument '", arg.scale_name, "' must be float32, got ",
                  dtype_str(scale->scalar_type()));
      check_on_param_device(*scale, param, op, arg.scale_name);
      FP8MP_CHECK_VALUE(scale->dim() == 1 && scale->size(0) == blocks, op, ": argument '", arg.scale_name,
                        "' must have shape [", blocks, "] (one scale per ", optim::kStateBlock,
                        " elements of param), got ", shape_str(*scale));
      check_contiguous(*scale, op, arg.scale_name);
      buffers.state_scale[k] = static_cast<float*>(scale->data_ptr());
    } else {
      FP8MP_CHECK_VALUE(!scale.has_value(), op, ": argument '", arg.scale_name, "' must be None when '", arg.name,
                        "' is ", dtype_str(dtype));
    }
    buffers.state[k] = state.data_ptr();
    ++k;
  }
  FP8MP_CHECK_VALUE(element_offset >= 0 && element_offset <= INT64_MAX - numel, op,
                    ": argument 'element_offset' must be >= 0 with element_offset + numel within int64, got ",
                    element_offset);
  FP8MP_CHECK_VALUE(state_dtype != kFloat8_e4m3fn || element_offset % optim::kStateBlock == 0, op,
                    ": argument 'element_offset' must be a multiple of ", optim::kStateBlock,
                    " when the states are float8_e4m3fn (their blocks are the whole tensor's), got ", element_offset);
  FP8MP_CHECK(step.scalar_type() == ScalarType::Long, op, ": argument 'step' must be a 1-element int64 tensor, got dtype ",
              dtype_str(step.scalar_type()));
  FP8MP_CHECK_VALUE(step.numel() == 1, op, ": argument 'step' must be a 1-element int64 tensor, got shape ",
                    shape_str(step));
  check_on_param_device(step, param, op, "step");
  if (found_inf.has_value()) {
    FP8MP_CHECK(found_inf->scalar_type() == kFloat, op,
                ": argument 'found_inf' must be a 1-element float32 tensor, got dtype ",
                dtype_str(found_inf->scalar_type()));
    FP8MP_CHECK_VALUE(found_inf->numel() == 1, op, ": argument 'found_inf' must be a 1-element float32 tensor, got shape ",
                      shape_str(*found_inf));
    check_on_param_device(*found_inf, param, op, "found_inf");
  }

  std::vector<NamedTensor> written{{&param, "param"}, {&step, "step"}};
  std::vector<NamedTensor> all{{&param, "param"}, {&grad, "grad"}, {&step, "step"}};
  if (found_inf.has_value()) all.push_back({&*found_inf, "found_inf"});
  for (const StateArg& arg : states) {
    written.push_back({arg.state, arg.name});
    all.push_back({arg.state, arg.name});
    if (arg.scale->has_value()) {
      written.push_back({&**arg.scale, arg.scale_name});
      all.push_back({&**arg.scale, arg.scale_name});
    }
  }
  for (const NamedTensor& out : written) {
    for (const NamedTensor& other : all) {
      if (other.first != out.first) check_no_overlap(out, {other}, op);
    }
  }

  buffers.param = param.data_ptr();
  buffers.param_is_bf16 = param.scalar_type() == kBFloat16;
  buffers.grad = grad.const_data_ptr();
  buffers.grad_is_bf16 = grad.scalar_type() == kBFloat16;
  buffers.state_type = state_type_of(state_dtype);
  buffers.step = static_cast<int64_t*>(step.data_ptr());
  buffers.found_inf = found_inf.has_value() ? static_cast<const float*>(found_inf->const_data_ptr()) : nullptr;
  buffers.numel = numel;
  buffers.seed = uint64_t(seed);
  buffers.element_offset = element_offset;
  return buffers;
}

OptimizerStep<optim::AdamW> check_adamw_step_args(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                                                  const std::optional<Tensor>& exp_avg_scale, const Tensor& exp_avg_sq,
                                                  const std::optional<Tensor>& exp_avg_sq_scale, const Tensor& step,
                                                  const std::optional<Tensor>& found_inf, double lr, double beta1,
                                                  double beta2, double eps, double weight_decay, int64_t seed,
                                                  int64_t element_offset) {
  constexpr const char* op = "fp8mp::adamw_step";
  const optim::StepBuffers buffers = check_optimizer_step_args(
      op, param, grad,
      {{&exp_avg, "exp_avg", &exp_avg_scale, "exp_avg_scale"},
       {&exp_avg_sq, "exp_avg_sq", &exp_avg_sq_scale, "exp_avg_sq_scale"}},
      step, found_inf, seed, element_offset);
  check_range(std::isfinite(lr) && lr >= 0.0, op, "lr", "finite and >= 0", lr);
  check_range(beta1 >= 0.0 && beta1 < 1.0, op, "beta1", "in [0, 1)", beta1);
  check_range(beta2 >= 0.0 && beta2 < 1.0, op, "beta2", "in [0, 1)", beta2);
  check_range(std::isfinite(eps) && eps > 0.0, op, "eps", "finite and > 0", eps);
  check_range(std::isfinite(weight_decay) && weight_decay >= 0.0, op, "weight_decay", "finite and >= 0", weight_decay);
  return {buffers, {lr, beta1, beta2, eps, weight_decay}};
}

OptimizerStep<optim::Lion> check_lion_step_args(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                                                const std::optional<Tensor>& exp_avg_scale, const Tensor& step,
                                                const std::optional<Tensor>& found_inf, double lr, double beta1,
                                                double beta2, double weight_decay, int64_t seed,
                                                int64_t element_offset) {
  constexpr const char* op = "fp8mp::lion_step";
  const optim::StepBuffers buffers = check_optimizer_step_args(
      op, param, grad, {{&exp_avg, "exp_avg", &exp_avg_scale, "exp_avg_scale"}}, step, found_inf, seed,
      element_offset);
  check_range(std::isfinite(lr) && lr >= 0.0, op, "lr", "finite and >= 0", lr);
  check_range(beta1 >= 0.0 && beta1 <= 1.0, op, "beta1", "in [0, 1]", beta1);
  check_range(beta2 >= 0.0 && beta2 <= 1.0, op, "beta2", "in [0, 1]", beta2);
  check_range(std::isfinite(weight_decay) && weight_decay >= 0.0, op, "weight_decay", "finite and >= 0", weight_decay);
  return {buffers, {lr, beta1, beta2, weight_decay}};
}

}  // namespace fp8mp
