// Argument checks shared by the CPU and CUDA implementations, so that both
// devices reject bad input with the same message naming the argument.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/util/string_view.h>

#include <optional>

#include "fp8_format.h"

namespace fp8mp {

// "e4m3" / "e5m2" (any case). Anything else raises ValueError naming `fmt`.
Fp8Format parse_format(c10::string_view fmt, const char* op);

at::ScalarType fp8_dtype(Fp8Format format);

// Format of a float8 tensor; raises naming `arg` when `t` is not float8_e4m3fn/float8_e5m2.
Fp8Format format_of(const at::Tensor& t, const char* op, const char* arg);

// A 1-element fp32 tensor on the same device as `like` (scales and amaxes).
void check_scalar_tensor(const at::Tensor& t, const at::Tensor& like, const char* op, const char* arg);

// fp32, bf16 or fp16 (the high-precision dtypes fp8mp converts from and to).
void check_high_precision_dtype(at::ScalarType dtype, const char* op, const char* arg);

// All checks of cast_to_fp8 / cast_to_fp8_transpose; returns the parsed format.
Fp8Format check_cast_to_fp8_args(const at::Tensor& x, const at::Tensor& scale, const at::Tensor& amax,
                                 c10::string_view fmt, const char* op);

// All checks of cast_from_fp8; returns the format of `y`.
Fp8Format check_cast_from_fp8_args(const at::Tensor& y, const at::Tensor& scale_inv, at::ScalarType out_dtype);

// How update_amax_history_and_scale turns a column of the history into the amax a scale is computed from.
enum class AmaxComputeAlgo : int { Max = 0, MostRecent = 1 };

// "max" / "most_recent". Anything else raises ValueError naming `amax_compute_algo`.
AmaxComputeAlgo parse_amax_compute_algo(c10::string_view algo, const char* op);

// Sizes of one group of T tensors whose amax history is H rows long.
struct AmaxHistoryShape {
  int64_t history_len;  // H >= 1
  int64_t num_tensors;  // T >= 0
};

// All checks of update_amax_history_and_scale: contiguous float32 tensors on
// one device with shapes amax [T], amax_history [H, T], scale / scale_inv /
// fp8_max [T]; the three mutated tensors overlap neither each other nor the
// inputs; margin >= 0; a known algo. dtype, layout and device errors are
// RuntimeError, shape and value errors ValueError, each naming the argument.
AmaxHistoryShape check_update_amax_history_args(const at::Tensor& amax, const at::Tensor& amax_history,
                                                const at::Tensor& scale, const at::Tensor& scale_inv,
                                                const at::Tensor& fp8_max, int64_t margin,
                                                c10::string_view amax_compute_algo, AmaxComputeAlgo* algo);

struct GemmFormats {
  Fp8Format a;
  Fp8Format b;
};

// All checks of fp8_gemm: a [M, K] and b [N, K] 2-D FP8 on one device, not both
// E5M2; 1-element fp32 scale_invs on that device; out_dtype fp32/bf16/fp16;
// bias, when given, [N] of dtype out_dtype on that device. Dtype and device
// errors raise RuntimeError, shape errors ValueError, each naming the argument.
GemmFormats check_fp8_gemm_args(const at::Tensor& a, const at::Tensor& a_scale_inv, const at::Tensor& b,
                                const at::Tensor& b_scale_inv, const std::optional<at::Tensor>& bias,
                                at::ScalarType out_dtype);
// layernorm_fwd / rmsnorm_fwd (bias is absent for RMSNorm): x float32/bfloat16/float16 with
// dim >= 1 and a non-empty last dimension H; weight and bias, when given, of shape [H], of
// one high-precision dtype and on x's device; eps > 0 and finite as a float32.
void check_norm_fwd_args(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                         const std::optional<at::Tensor>& bias, double eps, const char* op);

// layernorm_fwd_fp8 / rmsnorm_fwd_fp8: the forward checks plus scale, amax and fmt; returns the format.
Fp8Format check_norm_fwd_fp8_args(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                                  const std::optional<at::Tensor>& bias, double eps, const at::Tensor& scale,
                                  const at::Tensor& amax, c10::string_view fmt, const char* op);

// layernorm_bwd / rmsnorm_bwd (mean is nullptr for RMSNorm): x and weight as in the forward,
// grad_out of x's shape and dtype, mean and rstd float32 of shape x.shape[:-1], all on x's device.
void check_norm_bwd_args(const at::Tensor& grad_out, const at::Tensor& x, const at::Tensor* mean,
                         const at::Tensor& rstd, const std::optional<at::Tensor>& weight, const char* op);

}  // namespace fp8mp
