// Argument checks of the fused optimizer steps (adamw_step, lion_step), shared by CPU and CUDA.
#pragma once

#include <initializer_list>
#include <optional>

#include "common/op_checks.h"
#include "optim/optim_rule.h"

namespace fp8mp {

// A state of the step and its optional per-block FP8 scale, with their argument names.
struct StateArg {
  const Tensor* state;
  const char* name;
  const std::optional<Tensor>* scale;
  const char* scale_name;
};

// The buffers of one step after every check: param float32 or bfloat16, contiguous; grad float32 or
// bfloat16 of param's shape; the states of param's shape, all float32, all bfloat16 or all float8_e4m3fn
// (then each with a float32 scale of [ceil(numel / kStateBlock)], else no scale); step a 1-element int64
// tensor; found_inf absent or a 1-element float32 tensor; all contiguous, on param's device; the written
// tensors (param, states, scales, step) share no memory with any other argument; element_offset >= 0, a
// multiple of kStateBlock when the states are float8_e4m3fn, and element_offset + numel fits int64. dtype, layout, device
// and aliasing errors are RuntimeError, shape and value errors ValueError, each naming the argument.
optim::StepBuffers check_optimizer_step_args(const char* op, const Tensor& param, const Tensor& grad,
                                             std::initializer_list<StateArg> states, const Tensor& step,
                                             const std::optional<Tensor>& found_inf, int64_t seed,
                                             int64_t element_offset);

template <typename Rule>
struct OptimizerStep {
  optim::StepBuffers buffers;
  typename Rule::Hyper hyper;
};

// All checks of adamw_step: the buffers' above, then lr >= 0, betas in [0, 1), eps > 0,
// weight_decay >= 0, all finite (ValueError naming the argument).
OptimizerStep<optim::AdamW> check_adamw_step_args(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                                                  const std::optional<Tensor>& exp_avg_scale, const Tensor& exp_avg_sq,
                                                  const std::optional<Tensor>& exp_avg_sq_scale, const Tensor& step,
                                                  const std::optional<Tensor>& found_inf, double lr, double beta1,
                                                  double beta2, double eps, double weight_decay, int64_t seed,
                                                  int64_t element_offset);

// All checks of lion_step: the buffers' above, then lr >= 0, betas in [0, 1], weight_decay >= 0, all finite.
OptimizerStep<optim::Lion> check_lion_step_args(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                                                const std::optional<Tensor>& exp_avg_scale, const Tensor& step,
                                                const std::optional<Tensor>& found_inf, double lr, double beta1,
                                                double beta2, double weight_decay, int64_t seed,
                                                int64_t element_offset);

}  // namespace fp8mp
