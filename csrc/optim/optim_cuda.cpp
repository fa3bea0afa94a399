// CUDA glue of the fused optimizer steps (stable ABI): argument checks, device guard and registration around the
// torch-free kernels of optim_cuda_kernels.cu.
#include "optim/optim_cuda.h"

#include "common/stable_cuda.h"
#include "optim/optim_checks.h"
#include "optim/optim_cuda_kernels.cuh"

namespace fp8mp {
namespace cuda_glue {

void adamw_step(Tensor param, Tensor grad, Tensor exp_avg, std::optional<Tensor> exp_avg_scale, Tensor exp_avg_sq,
                std::optional<Tensor> exp_avg_sq_scale, Tensor step, std::optional<Tensor> found_inf, double lr,
                double beta1, double beta2, double eps, double weight_decay, int64_t seed, int64_t element_offset) {
  const auto args = check_adamw_step_args(param, grad, exp_avg, exp_avg_scale, exp_avg_sq, exp_avg_sq_scale, step,
                                          found_inf, lr, beta1, beta2, eps, weight_decay, seed, element_offset);
  const auto guard = guard_device_of(param);
  cuda::adamw_step(args.buffers, args.hyper, current_cuda_stream(param));
}

void lion_step(Tensor param, Tensor grad, Tensor exp_avg, std::optional<Tensor> exp_avg_scale, Tensor step,
               std::optional<Tensor> found_inf, double lr, double beta1, double beta2, double weight_decay,
               int64_t seed, int64_t element_offset) {
  const auto args =
      check_lion_step_args(param, grad, exp_avg, exp_avg_scale, step, found_inf, lr, beta1, beta2, weight_decay, seed,
                           element_offset);
  const auto guard = guard_device_of(param);
  cuda::lion_step(args.buffers, args.hyper, current_cuda_stream(param));
}

}  // namespace cuda_glue

STABLE_TORCH_LIBRARY_IMPL(fp8mp, CUDA, m) {
  m.impl("adamw_step", TORCH_BOX(&cuda_glue::adamw_step));
  m.impl("lion_step", TORCH_BOX(&cuda_glue::lion_step));
}

}  // namespace fp8mp
