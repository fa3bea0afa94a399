// The one schema file: every fp8mp op is declared here, once. Device
// implementations live in *_cpu.cpp / *_cuda.cu (TORCH_LIBRARY_IMPL), fake
// (meta) kernels and autograd in Python (fp8mp/ops.py).
#include <torch/library.h>

TORCH_LIBRARY(fp8mp, m) {
  // y = saturate(round_nearest_even(x * scale)) in fmt; amax[0] = max|x| (NaN if x has a NaN).
  m.def("cast_to_fp8(Tensor x, Tensor scale, Tensor(a!) amax, str fmt) -> Tensor");
  // Same, for a 2-D x, also returning the FP8 transpose (contiguous) from the same read of x.
  m.def("cast_to_fp8_transpose(Tensor x, Tensor scale, Tensor(a!) amax, str fmt) -> (Tensor, Tensor)");
  // x = float(y) * scale_inv, rounded to out_dtype.
  m.def("cast_from_fp8(Tensor y, Tensor scale_inv, ScalarType out_dtype) -> Tensor");
  // Delayed scaling for a group of T tensors, all in one call: roll amax_history [H, T] down one row and
  // put amax [T] in row 0; effective = column max of the history ("max") or amax ("most_recent");
  // scale = fp8_max / effective / 2^margin where effective is finite and > 0 and that is finite and > 0,
  // else the old scale is kept; scale_inv = 1 / scale.
  m.def(
      "update_amax_history_and_scale(Tensor amax, Tensor(a!) amax_history, Tensor(b!) scale, Tensor(c!) scale_inv, "
      "Tensor fp8_max, int margin, str amax_compute_algo) -> ()");

  // out = (dec(a) @ dec(b).T) * (a_scale_inv * b_scale_inv) + bias, fp32 accumulation, rounded once to out_dtype.
  m.def(
      "fp8_gemm(Tensor a, Tensor a_scale_inv, Tensor b, Tensor b_scale_inv, Tensor? bias, ScalarType out_dtype, "
      "bool use_fast_accum=False) -> Tensor");
}
