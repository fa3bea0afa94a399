// The one schema file: every fp8mp op is declared here, once. Device
// implementations live in each family's folder: torch-free kernels in
// <family>_cpu_kernels.cpp / _cuda_kernels.cu, their torch glue (checks, allocation,
// STABLE_TORCH_LIBRARY_IMPL) in <family>_cpu.cpp / _cuda.cpp; fake (meta) kernels and autograd in Python, in the
// family's module of fp8mp/ops/ (cast.py, gemm.py, norm.py, scale_update.py, blockwise.py).
#include <torch/csrc/stable/library.h>

STABLE_TORCH_LIBRARY(fp8mp, m) {
  // y = saturate(round_nearest_even(x * scale)) in fmt; amax[0] = max|x| (NaN if x has a NaN).
  m.def("cast_to_fp8(Tensor x, Tensor scale, Tensor(a!) amax, str fmt) -> Tensor");
  // Same, for a 2-D x, also returning the FP8 transpose (contiguous) from the same read of x.
  m.def("cast_to_fp8_transpose(Tensor x, Tensor scale, Tensor(a!) amax, str fmt) -> (Tensor, Tensor)");
  // Same, also returning dbias = the fp32 column sums of x (a bias gradient) from the same read of x: each
  // 64-row tile row of x summed row by row, then the tile rows' sums in order (deterministic, any threads).
  m.def("cast_to_fp8_transpose_dbias(Tensor x, Tensor scale, Tensor(a!) amax, str fmt) -> (Tensor, Tensor, Tensor)");
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

  // Normalization over the last dimension H, statistics in fp32. LayerNorm:
  // out = (x - mean) * rstd * g + bias with g = weight, or 1 + weight when zero_centered_gamma
  // (g = 1 without weight); out has x's dtype, mean and rstd are fp32 of shape x.shape[:-1].
  m.def("layernorm_fwd(Tensor x, Tensor? weight, Tensor? bias, float eps, bool zero_centered_gamma) -> (Tensor out, Tensor mean, Tensor rstd)");
  // Same, out = cast_to_fp8(layernorm_fwd's out) fused into the norm; amax[0] = max|out in x's dtype|.
  m.def("layernorm_fwd_fp8(Tensor x, Tensor? weight, Tensor? bias, float eps, bool zero_centered_gamma, Tensor scale, Tensor(a!) amax, str fmt) -> (Tensor out, Tensor mean, Tensor rstd)");
  // Gradients of layernorm_fwd; grad_weight / grad_bias in weight's dtype, empty float32 tensors without a weight.
  m.def("layernorm_bwd(Tensor grad_out, Tensor x, Tensor mean, Tensor rstd, Tensor? weight, bool zero_centered_gamma) -> (Tensor grad_x, Tensor grad_weight, Tensor grad_bias)");
  // RMSNorm: out = x * rstd * g, rstd = 1 / sqrt(mean(x^2) + eps).
  m.def("rmsnorm_fwd(Tensor x, Tensor? weight, float eps, bool zero_centered_gamma) -> (Tensor out, Tensor rstd)");
  // Same with the FP8 cast and amax fused, as layernorm_fwd_fp8.
  m.def("rmsnorm_fwd_fp8(Tensor x, Tensor? weight, float eps, bool zero_centered_gamma, Tensor scale, Tensor(a!) amax, str fmt) -> (Tensor out, Tensor rstd)");
  // Gradients of rmsnorm_fwd; grad_weight in weight's dtype, an empty float32 tensor without a weight.
  m.def("rmsnorm_bwd(Tensor grad_out, Tensor x, Tensor rstd, Tensor? weight, bool zero_centered_gamma) -> (Tensor grad_x, Tensor grad_weight)");

  // Fine-grained (block) scaling, csrc/blockwise/. x [R, C] is cut into block_rows x block_cols tiles
  // (edge tiles may be smaller, scaled as if zero-padded), each with its own scale from its own amax:
  // data [R, C] in fmt; scale_inv [ceil(R / block_rows), ceil(C / block_cols)], row-major, float32
  // (scale_mode "fp32": scale = fp8_max / amax; "pow2": that rounded down to a power of two) or
  // float8_e8m0fnu ("e8m0_floor": OCP MX v1.0; "e8m0_rceil": the smallest 2^e >= amax / fp8_max).
  m.def("block_quantize(Tensor x, int block_rows, int block_cols, str fmt, str scale_mode) -> (Tensor data, Tensor scale_inv)");
  // Both 1-row quantizations backward needs, from the same reads of x: data [R, C] in 1 x row_block tiles
  // along each row (scale_inv [R, ceil(C / row_block)]) and data_t [C, R] = x.T in 1 x col_block tiles along
  // each column of x (scale_inv_t [C, ceil(R / col_block)]); bit for bit block_quantize(x, 1, row_block) and
  // block_quantize(x.T, 1, col_block).
  m.def(
      "block_quantize_transpose(Tensor x, int row_block, int col_block, str fmt, str scale_mode) -> "
      "(Tensor data, Tensor scale_inv, Tensor data_t, Tensor scale_inv_t)");
  // LayerNorm (is_layernorm) or RMSNorm (bias None) of a 2-D x writing block-scaled FP8 directly: the
  // four outputs of block_quantize_transpose(norm output in x's dtype, row_block, col_block, fmt, scale_mode),
  // bit for bit, without the norm output in memory; mean ([R] for LayerNorm, [0] for RMSNorm) and rstd [R]
  // as layernorm_fwd / rmsnorm_fwd give them, for the norm's backward. CPU only (csrc/norm).
  m.def(
      "norm_fwd_block_fp8(Tensor x, Tensor? weight, Tensor? bias, float eps, bool is_layernorm, "
      "bool zero_centered_gamma, int row_block, int col_block, str fmt, str scale_mode) -> (Tensor data, "
      "Tensor scale_inv, Tensor data_t, Tensor scale_inv_t, Tensor mean, Tensor rstd)");
  // out = sum over K chunks c of block_k: fp32(sum_{k in c} dec(a) * dec(b)) * (a_scale_inv[m / a_block_rows, c] *
  // b_scale_inv[n / b_block_rows, c]), accumulated in fp32, plus bias, rounded once to out_dtype; a [M, K], b [N, K].
  m.def(
      "block_scaled_gemm(Tensor a, Tensor a_scale_inv, Tensor b, Tensor b_scale_inv, int a_block_rows, "
      "int b_block_rows, int block_k, Tensor? bias, ScalarType out_dtype) -> Tensor");

  // Grouped FP8 GEMMs of mixture-of-experts layers (csrc/grouped_gemm/), tokens sorted by group and offs [G]
  // int32 the groups' cumulative ends (torch._grouped_mm's layout), checked: non-decreasing, ending at the token
  // count; on a's device, or on the CPU (a CUDA op then reads it without a device-to-host copy and sync).
  // Grouped along M: a [M, K], b [G, N, K], b_scale_inv [G] (one scale per group's matrix), bias [G, N];
  // out [M, N], group g's rows = fp8_gemm(a's rows of g, a_scale_inv, b[g], b_scale_inv[g], bias[g]) bit for bit
  // on CPU. K and N multiples of 16.
  m.def(
      "fp8_grouped_gemm(Tensor a, Tensor a_scale_inv, Tensor b, Tensor b_scale_inv, Tensor offs, Tensor? bias, "
      "ScalarType out_dtype, bool use_fast_accum=False) -> Tensor");
  // Grouped along K (a grouped weight gradient): a [N, T], b [K, T], offs along T; out [G, N, K],
  // out[g] = fp8_gemm(a[:, cols of g], a_scale_inv, b[:, cols of g], b_scale_inv) (zeros for an empty group).
  m.def(
      "fp8_grouped_gemm_wgrad(Tensor a, Tensor a_scale_inv, Tensor b, Tensor b_scale_inv, Tensor offs, "
      "ScalarType out_dtype, bool use_fast_accum=False) -> Tensor");
  // Grouped along M with block scales (the fine-grained recipes): a [M, K] in 1 x block_k blocks, a_scale_inv
  // [M, ceil(K / block_k)]; b [G, N, K], b_scale_inv [G, ceil(N / b_block_rows), ceil(K / block_k)]; group g's rows
  // of out = block_scaled_gemm(a's rows of g, their scales, b[g], b_scale_inv[g], 1, b_block_rows, block_k,
  // bias[g]), bit for bit on CPU; on CUDA the recipes CUDA block_scaled_gemm takes.
  m.def(
      "block_scaled_grouped_gemm(Tensor a, Tensor a_scale_inv, Tensor b, Tensor b_scale_inv, Tensor offs, "
      "int a_block_rows, int b_block_rows, int block_k, Tensor? bias, ScalarType out_dtype) -> Tensor");
  // Grouped along K with block scales (the fine-grained recipes' weight gradient): a [N, T] and b [K, T], offs along
  // T; each group's columns quantized on their own in 1 x block_k blocks from the group's first column, so
  // a_scale_inv [N, C] and b_scale_inv [K, C] hold group g's ceil(T_g / block_k) chunks after those of the groups
  // before it (C = their sum); out [G, N, K], out[g] = block_scaled_gemm(a[:, cols of g], its chunks, b[:, cols of
  // g], its chunks, 1, 1, block_k) bit for bit on CPU (zeros for an empty group).
  m.def(
      "block_scaled_grouped_gemm_wgrad(Tensor a, Tensor a_scale_inv, Tensor b, Tensor b_scale_inv, Tensor offs, "
      "int block_k, ScalarType out_dtype) -> Tensor");
  // Fused optimizer steps, csrc/optim/: one read and one write of param, grad and states, in place. States
  // are float32, bfloat16 or float8_e4m3fn with a float32 scale per 128 elements (AdamW's exp_avg_sq then
  // holds sqrt(v)); bfloat16 and FP8 values (param and states) are rounded stochastically with bits hashed
  // from (seed, step, element_offset + element): element_offset is a shard's offset in the whole tensor (a
  // multiple of 128 with FP8 states), so a shard draws the whole tensor's bits. Nothing changes when
  // found_inf is given and nonzero; else step += 1.
  m.def(
      "adamw_step(Tensor(a!) param, Tensor grad, Tensor(b!) exp_avg, Tensor(c!)? exp_avg_scale, "
      "Tensor(d!) exp_avg_sq, Tensor(e!)? exp_avg_sq_scale, Tensor(f!) step, Tensor? found_inf, float lr, "
      "float beta1, float beta2, float eps, float weight_decay, int seed, int element_offset=0) -> ()");
  m.def(
      "lion_step(Tensor(a!) param, Tensor grad, Tensor(b!) exp_avg, Tensor(c!)? exp_avg_scale, Tensor(f!) step, "
      "Tensor? found_inf, float lr, float beta1, float beta2, float weight_decay, int seed, int element_offset=0) -> ()");
}
