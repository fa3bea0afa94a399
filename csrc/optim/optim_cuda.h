// The CUDA glue of the fused optimizer steps (optim_cuda.cpp), declared so that the CPU test suite runs it on CPU
// tensors with the kernel launches stubbed (tests/cpp/test_cuda_glue.cpp).
#pragma once

#include <optional>

#include "common/stable.h"

namespace fp8mp::cuda_glue {

void adamw_step(Tensor param, Tensor grad, Tensor exp_avg, std::optional<Tensor> exp_avg_scale, Tensor exp_avg_sq,
                std::optional<Tensor> exp_avg_sq_scale, Tensor step, std::optional<Tensor> found_inf, double lr,
                double beta1, double beta2, double eps, double weight_decay, int64_t seed, int64_t element_offset);
void lion_step(Tensor param, Tensor grad, Tensor exp_avg, std::optional<Tensor> exp_avg_scale, Tensor step,
               std::optional<Tensor> found_inf, double lr, double beta1, double beta2, double weight_decay,
               int64_t seed, int64_t element_offset);

}  // namespace fp8mp::cuda_glue
