// CPU glue of the fused optimizer steps (stable ABI): argument checks and registration around the
// torch-free kernels of optim_cpu_kernels.cpp.
#include <optional>

#include "common/stable.h"
#include "optim/optim_checks.h"
#include "optim/optim_cpu_kernels.h"

namespace fp8mp {
namespace {

void adamw_step_cpu(Tensor param, Tensor grad, Tensor exp_avg, std::optional<Tensor> exp_avg_scale, Tensor exp_avg_sq,
                    std::optional<Tensor> exp_avg_sq_scale, Tensor step, std::optional<Tensor> found_inf, double lr,
                    double beta1, double beta2, double eps, double weight_decay, int64_t seed,
                    int64_t element_offset) {
  const auto args = check_adamw_step_args(param, grad, exp_avg, exp_avg_scale, exp_avg_sq, exp_avg_sq_scale, step,
                                          found_inf, lr, beta1, beta2, eps, weight_decay, seed, element_offset);
  cpu::adamw_step(args.buffers, args.hyper, stable_parallel_for);
}

void lion_step_cpu(Tensor param, Tensor grad, Tensor exp_avg, std::optional<Tensor> exp_avg_scale, Tensor step,
                   std::optional<Tensor> found_inf, double lr, double beta1, double beta2, double weight_decay,
                   int64_t seed, int64_t element_offset) {
  const auto args =
      check_lion_step_args(param, grad, exp_avg, exp_avg_scale, step, found_inf, lr, beta1, beta2, weight_decay, seed,
                           element_offset);
  cpu::lion_step(args.buffers, args.hyper, stable_parallel_for);
}

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(fp8mp, CPU, m) {
  m.impl("adamw_step", TORCH_BOX(&adamw_step_cpu));
  m.impl("lion_step", TORCH_BOX(&lion_step_cpu));
}

}  // namespace fp8mp
