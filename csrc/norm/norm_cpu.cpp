// CPU glue of the norm ops (stable ABI): the shared entry points
// (norm_entry_points.h) run on the torch-free kernels of norm_cpu_kernels.cpp.
#include "norm/norm_cpu_kernels.h"
#include "norm/norm_entry_points.h"

namespace fp8mp {
namespace {

struct CpuNorm {
  static void fwd(const NormFwdArgs& args, const Tensor&) { cpu::norm_fwd(args, stable_parallel_for); }
  static void bwd(const NormBwdArgs& args, const Tensor&) { cpu::norm_bwd(args, stable_parallel_for); }
};

}  // namespace

STABLE_TORCH_LIBRARY_IMPL(fp8mp, CPU, m) { register_norm_ops<CpuNorm>(m); }

}  // namespace fp8mp
