// CPU LayerNorm / RMSNorm over the last dimension, optionally writing FP8.
//
// Rows are spread over threads with at::parallel_for. Per row: two passes for
// the statistics (sum, then centered sums), one pass for the output; the rows
// of a task stay in cache between passes. Sums use kLanes independent fp32
// accumulators, which lets the compiler vectorize them without reassociating
// (and is more accurate than one running sum). The backward reduces
// grad_weight / grad_bias over rows in fixed chunks, then sums the chunks in
// order, so results do not depend on the thread count.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <atomic>
#include <vector>

#include "common/cpu_clones.h"
#include "common/fp8_format.h"
#include "norm/norm_common.h"
#include "norm/norm_entry_points.h"
#include "norm/norm_checks.h"

namespace fp8mp {
namespace {

constexpr int64_t kGrain = 1 << 15;  // elements per parallel task
constexpr int kLanes = 16;
constexpr int64_t kMaxBwdChunks = 64;  // row chunks of the grad_weight reduction

void atomic_max_bits(std::atomic<uint32_t>& target, uint32_t value) {
  uint32_t seen = target.load(std::memory_order_relaxed);
  while (value > seen && !target.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}

float combine_lanes(float (&acc)[kLanes], float tail) {
  for (int width = kLanes / 2; width > 0; width /= 2) {
    for (int k = 0; k < width; ++k) acc[k] += acc[k + width];
  }
  return acc[0] + tail;
}

// sum(x), or sum(x^2) when kSquares.
template <bool kSquares, typename scalar_t>
FP8MP_CPU_CLONES float row_sum(const scalar_t* __restrict x, int64_t n) {
  float acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int k = 0; k < kLanes; ++k) {
      const float v = static_cast<float>(x[i + k]);
      acc[k] += kSquares ? v * v : v;
    }
  }
  float tail = 0.0f;
  for (; i < n; ++i) {
    const float v = static_cast<float>(x[i]);
    tail += kSquares ? v * v : v;
  }
  return combine_lanes(acc, tail);
}

// sum(x - mean0) and sum((x - mean0)^2).
template <typename scalar_t>
FP8MP_CPU_CLONES void centered_sums(const scalar_t* __restrict x, int64_t n, float mean0, float& sum_d, float& sum_d2) {
  float acc[kLanes] = {}, acc2[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int k = 0; k < kLanes; ++k) {
      const float d = static_cast<float>(x[i + k]) - mean0;
      acc[k] += d;
      acc2[k] += d * d;
    }
  }
  float tail = 0.0f, tail2 = 0.0f;
  for (; i < n; ++i) {
    const float d = static_cast<float>(x[i]) - mean0;
    tail += d;
    tail2 += d * d;
  }
  sum_d = combine_lanes(acc, tail);
  sum_d2 = combine_lanes(acc2, tail2);
}

template <bool kCentered, typename scalar_t>
void row_stats(const scalar_t* x, int64_t n, float eps, float& mean, float& rstd) {
  const float fn = static_cast<float>(n);
  if constexpr (kCentered) {
    const float mean0 = row_sum<false>(x, n) / fn;
    float sum_d, sum_d2;
    centered_sums(x, n, mean0, sum_d, sum_d2);
    layernorm_stats(mean0, sum_d, sum_d2, fn, eps, mean, rstd);
  } else {
    mean = 0.0f;
    rstd = rmsnorm_rstd(row_sum<true>(x, n), fn, eps);
  }
}

// y = normalized(x) * g (+ b), rounded to scalar_t.
template <bool kCentered, bool kHasBias, typename scalar_t>
FP8MP_CPU_CLONES void normalize_row(const scalar_t* __restrict x, scalar_t* __restrict out, const float* __restrict g,
                                    const float* __restrict b, int64_t n, float mean, float rstd) {
  for (int64_t i = 0; i < n; ++i) {
    float y = normalized<kCentered>(static_cast<float>(x[i]), mean, rstd) * g[i];
    if constexpr (kHasBias) y = y + b[i];
    out[i] = static_cast<scalar_t>(y);
  }
}

// Same y, rounded once to scalar_t (the value normalize_row writes), then cast to FP8; returns max |y| bits.
template <Fp8Format F, bool kCentered, bool kHasBias, typename scalar_t>
FP8MP_CPU_CLONES uint32_t normalize_row_fp8(const scalar_t* __restrict x, uint8_t* __restrict out,
                                            const float* __restrict g, const float* __restrict b, int64_t n,
                                            float mean, float rstd, float scale) {
  uint32_t amax_bits = 0;
  for (int64_t i = 0; i < n; ++i) {
    float y = normalized<kCentered>(static_cast<float>(x[i]), mean, rstd) * g[i];
    if constexpr (kHasBias) y = y + b[i];
    const float rounded = static_cast<float>(static_cast<scalar_t>(y));
    const uint32_t abs_bits = float_to_bits(rounded) & 0x7FFFFFFFu;
    amax_bits = abs_bits > amax_bits ? abs_bits : amax_bits;
    out[i] = encode<F>(rounded * scale);
  }
  return amax_bits;
}

// Forward of both norms, high-precision (fp8 == nullopt) or FP8 output.
template <bool kCentered>
std::tuple<at::Tensor, at::Tensor, at::Tensor> norm_fwd_cpu(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                                                            const std::optional<at::Tensor>& bias, double eps,
                                                            bool zero_centered_gamma, std::optional<Fp8Format> fp8,
                                                            const at::Tensor* scale, at::Tensor* amax, const char* op) {
  const at::Tensor xc = x.contiguous();
  const int64_t hidden = x.size(-1);
  const int64_t rows = xc.numel() / hidden;
  const at::Tensor g = norm_gain_fp32(weight, hidden, zero_centered_gamma, x);
  const at::Tensor b = norm_bias_fp32(bias);
  const auto stats_options = x.options().dtype(at::kFloat);
  at::Tensor mean = kCentered ? at::empty(norm_stats_shape(x), stats_options) : at::Tensor();
  at::Tensor rstd = at::empty(norm_stats_shape(x), stats_options);
  at::Tensor out = at::empty(x.sizes(), fp8 ? x.options().dtype(fp8_dtype(*fp8)) : x.options());
  const float eps_f = static_cast<float>(eps);
  const float scale_value = fp8 ? scale->item<float>() : 1.0f;
  const float* g_ptr = g.const_data_ptr<float>();
  const float* b_ptr = b.defined() ? b.const_data_ptr<float>() : nullptr;
  float* mean_ptr = kCentered ? mean.mutable_data_ptr<float>() : nullptr;
  float* rstd_ptr = rstd.mutable_data_ptr<float>();
  std::atomic<uint32_t> amax_bits{0};
  const int64_t grain = std::max<int64_t>(1, kGrain / hidden);

  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "fp8mp::norm_fwd", [&] {
    const scalar_t* x_ptr = xc.const_data_ptr<scalar_t>();
    auto run = [&](auto has_bias, auto write_row) {
      at::parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
        uint32_t local = 0;
        for (int64_t r = begin; r < end; ++r) {
          const scalar_t* xr = x_ptr + r * hidden;
          float mu, rs;
          row_stats<kCentered>(xr, hidden, eps_f, mu, rs);
          if constexpr (kCentered) mean_ptr[r] = mu;
          rstd_ptr[r] = rs;
          const uint32_t row_amax = write_row(has_bias, r, xr, mu, rs);
          local = row_amax > local ? row_amax : local;
        }
        atomic_max_bits(amax_bits, local);
      });
    };
    auto with_bias = [&](auto write_row) {
      if (b_ptr != nullptr) {
        run(std::true_type{}, write_row);
      } else {
        run(std::false_type{}, write_row);
      }
    };
    if (!fp8) {
      scalar_t* out_ptr = out.mutable_data_ptr<scalar_t>();
      with_bias([&](auto has_bias, int64_t r, const scalar_t* xr, float mu, float rs) -> uint32_t {
        normalize_row<kCentered, decltype(has_bias)::value>(xr, out_ptr + r * hidden, g_ptr, b_ptr, hidden, mu, rs);
        return 0;
      });
    } else {
      uint8_t* out_ptr = reinterpret_cast<uint8_t*>(out.data_ptr());
      FP8MP_DISPATCH_FORMAT(*fp8, [&] {
        with_bias([&](auto has_bias, int64_t r, const scalar_t* xr, float mu, float rs) -> uint32_t {
          return normalize_row_fp8<kFormat, kCentered, decltype(has_bias)::value>(
              xr, out_ptr + r * hidden, g_ptr, b_ptr, hidden, mu, rs, scale_value);
        });
      });
    }
  });
  if (fp8) amax->fill_(bits_to_float(amax_bits.load()));
  return {out, mean, rstd};
}

// One row of the backward: grad_x, and (with gw_part) the row's grad_out * xhat
// (and grad_out, for LayerNorm's bias) added to the chunk's partial sums.
template <bool kCentered, typename scalar_t>
FP8MP_CPU_CLONES void bwd_row(const scalar_t* __restrict go, const scalar_t* __restrict x, scalar_t* __restrict gx,
                              const float* __restrict g, float mean, float rstd, int64_t n, float fn,
                              float* __restrict gw_part, float* __restrict gb_part) {
  float acc_dy[kLanes] = {}, acc_dy_xhat[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int k = 0; k < kLanes; ++k) {
      const float dy = static_cast<float>(go[i + k]) * g[i + k];
      const float xhat = normalized<kCentered>(static_cast<float>(x[i + k]), mean, rstd);
      acc_dy[k] += dy;
      acc_dy_xhat[k] += dy * xhat;
    }
  }
  float tail_dy = 0.0f, tail_dy_xhat = 0.0f;
  for (; i < n; ++i) {
    const float dy = static_cast<float>(go[i]) * g[i];
    const float xhat = normalized<kCentered>(static_cast<float>(x[i]), mean, rstd);
    tail_dy += dy;
    tail_dy_xhat += dy * xhat;
  }
  const float mean_dy = combine_lanes(acc_dy, tail_dy) / fn;
  const float mean_dy_xhat = combine_lanes(acc_dy_xhat, tail_dy_xhat) / fn;
  for (i = 0; i < n; ++i) {
    const float dy = static_cast<float>(go[i]) * g[i];
    const float xhat = normalized<kCentered>(static_cast<float>(x[i]), mean, rstd);
    gx[i] = static_cast<scalar_t>(norm_grad_x<kCentered>(dy, xhat, mean_dy, mean_dy_xhat, rstd));
  }
  if (gw_part == nullptr) return;
  for (i = 0; i < n; ++i) {
    const float grad = static_cast<float>(go[i]);
    gw_part[i] += grad * normalized<kCentered>(static_cast<float>(x[i]), mean, rstd);
    if constexpr (kCentered) gb_part[i] += grad;
  }
}

// Backward of both norms. Rows are split into at most kMaxBwdChunks chunks,
// fixed by the row count; each chunk writes its rows of grad_x and its own
// partial sums of grad_out * xhat and grad_out, which are then added in chunk order.
template <bool kCentered>
std::tuple<at::Tensor, at::Tensor, at::Tensor> norm_bwd_cpu(const at::Tensor& grad_out, const at::Tensor& x,
                                                            const at::Tensor* mean, const at::Tensor& rstd,
                                                            const std::optional<at::Tensor>& weight,
                                                            bool zero_centered_gamma, const char* op) {
  const at::Tensor xc = x.contiguous(), gc = grad_out.contiguous(), rstd_c = rstd.contiguous();
  const at::Tensor mean_c = mean != nullptr ? mean->contiguous() : at::Tensor();
  const int64_t hidden = x.size(-1);
  const int64_t rows = xc.numel() / hidden;
  const at::Tensor g = norm_gain_fp32(weight, hidden, zero_centered_gamma, x);
  at::Tensor grad_x = at::empty(x.sizes(), x.options());
  const bool want_params = weight.has_value();
  const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(rows, kMaxBwdChunks));
  const int64_t rows_per_chunk = rows == 0 ? 1 : (rows + chunks - 1) / chunks;
  // [chunk][0] = partial grad_weight, [chunk][1] = partial grad_bias
  at::Tensor partials = at::zeros({want_params ? chunks : 0, 2, hidden}, x.options().dtype(at::kFloat));
  const float* g_ptr = g.const_data_ptr<float>();
  const float* rstd_ptr = rstd_c.const_data_ptr<float>();
  const float* mean_ptr = kCentered ? mean_c.const_data_ptr<float>() : nullptr;
  float* partial_ptr = partials.mutable_data_ptr<float>();
  const float fn = static_cast<float>(hidden);

  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "fp8mp::norm_bwd", [&] {
    const scalar_t* x_ptr = xc.const_data_ptr<scalar_t>();
    const scalar_t* go_ptr = gc.const_data_ptr<scalar_t>();
    scalar_t* gx_ptr = grad_x.mutable_data_ptr<scalar_t>();
    const int64_t chunk_grain = std::max<int64_t>(1, kGrain / std::max<int64_t>(1, rows_per_chunk * hidden));
    at::parallel_for(0, (rows + rows_per_chunk - 1) / rows_per_chunk, chunk_grain, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        float* gw_part = want_params ? partial_ptr + c * 2 * hidden : nullptr;
        float* gb_part = want_params ? gw_part + hidden : nullptr;
        for (int64_t r = c * rows_per_chunk; r < std::min(rows, (c + 1) * rows_per_chunk); ++r) {
          bwd_row<kCentered>(go_ptr + r * hidden, x_ptr + r * hidden, gx_ptr + r * hidden, g_ptr,
                             kCentered ? mean_ptr[r] : 0.0f, rstd_ptr[r], hidden, fn, gw_part, gb_part);
        }
      }
    });
  });

  if (!want_params) {
    const auto options = x.options().dtype(at::kFloat);
    return {grad_x, at::empty({0}, options), at::empty({0}, options)};
  }
  at::Tensor sums = at::empty({2, hidden}, x.options().dtype(at::kFloat));
  float* sums_ptr = sums.mutable_data_ptr<float>();
  at::parallel_for(0, 2 * hidden, kGrain / std::max<int64_t>(1, chunks), [&](int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; ++j) sums_ptr[j] = 0.0f;
    for (int64_t c = 0; c < chunks; ++c) {
      const float* part = partial_ptr + c * 2 * hidden;
      for (int64_t j = begin; j < end; ++j) sums_ptr[j] += part[j];
    }
  });
  const auto wdtype = weight->scalar_type();
  // copy = true: grad_weight and grad_bias must not alias one buffer
  return {grad_x, sums[0].to(wdtype, false, true), sums[1].to(wdtype, false, true)};
}

struct CpuNorm {
  template <bool kCentered, typename... Args>
  static NormFwdResult fwd(Args&&... args) {
    return norm_fwd_cpu<kCentered>(std::forward<Args>(args)...);
  }
  template <bool kCentered, typename... Args>
  static NormFwdResult bwd(Args&&... args) {
    return norm_bwd_cpu<kCentered>(std::forward<Args>(args)...);
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(fp8mp, CPU, m) { register_norm_ops<CpuNorm>(m); }

}  // namespace fp8mp
