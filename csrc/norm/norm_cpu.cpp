// CPU glue of the norm ops: the shared entry points (norm_entry_points.h) run
// on the torch-free kernels of norm_cpu_kernels.cpp.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "norm/norm_cpu_kernels.h"
#include "norm/norm_entry_points.h"

namespace fp8mp {
namespace {

struct CpuNorm {
  static void fwd(const NormFwdArgs& args, const at::Tensor&) { cpu::norm_fwd(args, torch_parallel_for); }
  static void bwd(const NormBwdArgs& args, const at::Tensor&) { cpu::norm_bwd(args, torch_parallel_for); }
};

}  // namespace

TORCH_LIBRARY_IMPL(fp8mp, CPU, m) { register_norm_ops<CpuNorm>(m); }

}  // namespace fp8mp
