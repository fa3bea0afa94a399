// CPU LayerNorm / RMSNorm over the last dimension, optionally writing FP8.
//
// Rows are spread over threads with the ParallelFor the glue hands in. Per row: two passes for
// the statistics (sum, then centered sums), one pass for the output; the rows
// of a task stay in cache between passes. Sums use kLanes independent fp32
// accumulators, which lets the compiler vectorize them without reassociating
// (and is more accurate than one running sum). The backward reduces
// grad_weight / grad_bias over rows in fixed chunks, then sums the chunks in
// order, so results do not depend on the thread count.
#include "norm/norm_cpu_kernels.h"

#include <algorithm>
#include <atomic>
#include <type_traits>
#include <vector>

#include "common/cpu_isa.h"

namespace fp8mp::cpu {
namespace {

constexpr int64_t kGrain = 1 << 15;  // elements per parallel task
constexpr int kLanes = 16;
constexpr int64_t kMaxBwdChunks = 64;  // row chunks of the grad_weight reduction

float combine_lanes(float (&acc)[kLanes], float tail) {
  for (int width = kLanes / 2; width > 0; width /= 2) {
    for (int k = 0; k < width; ++k) acc[k] += acc[k + width];
  }
  return acc[0] + tail;
}

// sum(x), or sum(x^2) when kSquares.
template <bool kSquares, typename scalar_t>
float row_sum(const scalar_t* __restrict x, int64_t n) {
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
void centered_sums(const scalar_t* __restrict x, int64_t n, float mean0, float& sum_d, float& sum_d2) {
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
    const float mean0 = with_cpu_isa([&] { return row_sum<false>(x, n); }) / fn;
    float sum_d, sum_d2;
    with_cpu_isa([&] { centered_sums(x, n, mean0, sum_d, sum_d2); });
    layernorm_stats(mean0, sum_d, sum_d2, fn, eps, mean, rstd);
  } else {
    mean = 0.0f;
    rstd = rmsnorm_rstd(with_cpu_isa([&] { return row_sum<true>(x, n); }), fn, eps);
  }
}

// y = normalized(x) * g (+ b), rounded to scalar_t.
template <bool kCentered, bool kHasBias, typename scalar_t>
void normalize_row(const scalar_t* __restrict x, scalar_t* __restrict out, const float* __restrict g,
                                    const float* __restrict b, int64_t n, float mean, float rstd) {
  for (int64_t i = 0; i < n; ++i) {
    float y = normalized<kCentered>(static_cast<float>(x[i]), mean, rstd) * g[i];
    if constexpr (kHasBias) y = y + b[i];
    out[i] = static_cast<scalar_t>(pin_nan(y));
  }
}

// Same y, rounded once to scalar_t (the value normalize_row writes), then cast to FP8; returns max |y| bits.
template <Fp8Format F, bool kCentered, bool kHasBias, typename scalar_t>
uint32_t normalize_row_fp8(const scalar_t* __restrict x, uint8_t* __restrict out,
                                            const float* __restrict g, const float* __restrict b, int64_t n,
                                            float mean, float rstd, float scale) {
  uint32_t amax_bits = 0;
  for (int64_t i = 0; i < n; ++i) {
    float y = normalized<kCentered>(static_cast<float>(x[i]), mean, rstd) * g[i];
    if constexpr (kHasBias) y = y + b[i];
    const float rounded = static_cast<float>(static_cast<scalar_t>(pin_nan(y)));
    const uint32_t abs_bits = float_to_bits(rounded) & 0x7FFFFFFFu;
    amax_bits = abs_bits > amax_bits ? abs_bits : amax_bits;
    out[i] = encode<F>(scale_keep_nan(rounded, scale));
  }
  return amax_bits;
}

// The effective gain as an fp32 vector: weight, 1 + weight with zero_centered_gamma, or ones.
std::vector<float> gain_fp32(const void* weight, HpType weight_type, int64_t hidden, bool zero_centered_gamma) {
  std::vector<float> g(size_t(hidden), 1.0f);
  if (weight == nullptr) return g;
  FP8MP_DISPATCH_HP(weight_type, [&] {
    const scalar_t* w = static_cast<const scalar_t*>(weight);
    for (int64_t i = 0; i < hidden; ++i) g[i] = zero_centered_gamma ? static_cast<float>(w[i]) + 1.0f : static_cast<float>(w[i]);
  });
  return g;
}

std::vector<float> bias_fp32(const void* bias, HpType bias_type, int64_t hidden) {
  std::vector<float> b;
  if (bias == nullptr) return b;
  b.resize(size_t(hidden));
  FP8MP_DISPATCH_HP(bias_type, [&] {
    const scalar_t* p = static_cast<const scalar_t*>(bias);
    for (int64_t i = 0; i < hidden; ++i) b[i] = static_cast<float>(p[i]);
  });
  return b;
}

// Forward of both norms, high-precision or FP8 output.
template <bool kCentered>
void norm_fwd_impl(const NormFwdArgs& args, ParallelFor parallel_for) {
  const int64_t hidden = args.hidden, rows = args.rows;
  const std::vector<float> g = gain_fp32(args.weight, args.weight_type, hidden, args.zero_centered_gamma);
  const std::vector<float> b = bias_fp32(args.bias, args.bias_type, hidden);
  const float eps_f = args.eps;
  const float scale_value = args.fp8 ? checked_scale(*args.scale) : 1.0f;
  const float* g_ptr = g.data();
  const float* b_ptr = b.empty() ? nullptr : b.data();
  float* mean_ptr = kCentered ? args.mean : nullptr;
  float* rstd_ptr = args.rstd;
  std::atomic<uint32_t> amax_bits{0};
  const int64_t grain = std::max<int64_t>(1, kGrain / hidden);

  FP8MP_DISPATCH_HP(args.x_type, [&] {
    const scalar_t* x_ptr = static_cast<const scalar_t*>(args.x);
    auto run = [&](auto has_bias, auto write_row) {
      parallel_for(0, rows, grain, [&](int64_t begin, int64_t end) {
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
    if (!args.fp8) {
      scalar_t* out_ptr = static_cast<scalar_t*>(args.out);
      with_bias([&](auto has_bias, int64_t r, const scalar_t* xr, float mu, float rs) -> uint32_t {
        with_cpu_isa([&] {
          normalize_row<kCentered, decltype(has_bias)::value>(xr, out_ptr + r * hidden, g_ptr, b_ptr, hidden, mu, rs);
        });
        return 0;
      });
    } else {
      uint8_t* out_ptr = static_cast<uint8_t*>(args.out);
      FP8MP_DISPATCH_FORMAT(args.format, [&] {
        with_bias([&](auto has_bias, int64_t r, const scalar_t* xr, float mu, float rs) -> uint32_t {
          return with_cpu_isa([&] {
            return normalize_row_fp8<kFormat, kCentered, decltype(has_bias)::value>(
                xr, out_ptr + r * hidden, g_ptr, b_ptr, hidden, mu, rs, scale_value);
          });
        });
      });
    }
  });
  if (args.fp8) *args.amax = bits_to_float(amax_bits.load());
}

// One row of the backward: grad_x, and (with gw_part) the row's grad_out * xhat
// (and grad_out, for LayerNorm's bias) added to the chunk's partial sums.
template <bool kCentered, typename scalar_t>
void bwd_row(const scalar_t* __restrict go, const scalar_t* __restrict x, scalar_t* __restrict gx,
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
void norm_bwd_impl(const NormBwdArgs& args, ParallelFor parallel_for) {
  const int64_t hidden = args.hidden, rows = args.rows;
  const std::vector<float> g = gain_fp32(args.weight, args.weight_type, hidden, args.zero_centered_gamma);
  const bool want_params = args.weight != nullptr;
  const int64_t chunks = std::max<int64_t>(1, std::min<int64_t>(rows, kMaxBwdChunks));
  const int64_t rows_per_chunk = rows == 0 ? 1 : (rows + chunks - 1) / chunks;
  // [chunk][0] = partial grad_weight, [chunk][1] = partial grad_bias
  std::vector<float> partials(size_t(want_params ? chunks * 2 * hidden : 0), 0.0f);
  const float* g_ptr = g.data();
  const float* rstd_ptr = args.rstd;
  const float* mean_ptr = kCentered ? args.mean : nullptr;
  float* partial_ptr = partials.data();
  const float fn = static_cast<float>(hidden);

  FP8MP_DISPATCH_HP(args.x_type, [&] {
    const scalar_t* x_ptr = static_cast<const scalar_t*>(args.x);
    const scalar_t* go_ptr = static_cast<const scalar_t*>(args.grad_out);
    scalar_t* gx_ptr = static_cast<scalar_t*>(args.grad_x);
    const int64_t chunk_grain = std::max<int64_t>(1, kGrain / std::max<int64_t>(1, rows_per_chunk * hidden));
    parallel_for(0, (rows + rows_per_chunk - 1) / rows_per_chunk, chunk_grain, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) {
        float* gw_part = want_params ? partial_ptr + c * 2 * hidden : nullptr;
        float* gb_part = want_params ? gw_part + hidden : nullptr;
        for (int64_t r = c * rows_per_chunk; r < std::min(rows, (c + 1) * rows_per_chunk); ++r) {
          with_cpu_isa([&] {
            bwd_row<kCentered>(go_ptr + r * hidden, x_ptr + r * hidden, gx_ptr + r * hidden, g_ptr,
                               kCentered ? mean_ptr[r] : 0.0f, rstd_ptr[r], hidden, fn, gw_part, gb_part);
          });
        }
      }
    });
  });

  if (!want_params) return;
  std::vector<float> sums(size_t(2 * hidden));
  float* sums_ptr = sums.data();
  parallel_for(0, 2 * hidden, kGrain / std::max<int64_t>(1, chunks), [&](int64_t begin, int64_t end) {
    for (int64_t j = begin; j < end; ++j) sums_ptr[j] = 0.0f;
    for (int64_t c = 0; c < chunks; ++c) {
      const float* part = partial_ptr + c * 2 * hidden;
      for (int64_t j = begin; j < end; ++j) sums_ptr[j] += part[j];
    }
  });
  FP8MP_DISPATCH_HP(args.weight_type, [&] {
    scalar_t* gw = static_cast<scalar_t*>(args.grad_weight);
    scalar_t* gb = static_cast<scalar_t*>(args.grad_bias);
    // A NaN the sums make (Inf - Inf) or carry is the canonical NaN, as on CUDA (norm_common.h).
    for (int64_t i = 0; i < hidden; ++i) {
      gw[i] = static_cast<scalar_t>(pin_nan(sums_ptr[i]));
      if (gb != nullptr) gb[i] = static_cast<scalar_t>(pin_nan(sums_ptr[hidden + i]));
    }
  });
}

}  // namespace

void norm_fwd(const NormFwdArgs& args, ParallelFor parallel_for) {
  if (args.centered) {
    norm_fwd_impl<true>(args, parallel_for);
  } else {
    norm_fwd_impl<false>(args, parallel_for);
  }
}

namespace {

// One task on the calling thread (the strips of norm_fwd_block_fp8 are the parallel units).
void serial_for(int64_t begin, int64_t end, int64_t, const RangeBody& body) {
  if (begin < end) body(begin, end);
}

}  // namespace

void norm_fwd_block_fp8(const NormFwdArgs& args, int64_t row_block, int64_t col_block, BlockScaleMode mode,
                        uint8_t* y, void* scale_inv, uint8_t* y_t, void* scale_inv_t, ParallelFor parallel_for) {
  const int64_t rows = args.rows, hidden = args.hidden;
  if (rows == 0 || hidden == 0) return;
  const int64_t strips = (rows + col_block - 1) / col_block;
  FP8MP_DISPATCH_HP(args.x_type, [&] {
    parallel_for(0, strips, 1, [&](int64_t begin, int64_t end) {
      std::vector<scalar_t> strip_out(static_cast<size_t>(std::min(col_block, rows) * hidden));
      for (int64_t strip = begin; strip < end; ++strip) {
        const int64_t r0 = strip * col_block, strip_rows = std::min(col_block, rows - r0);
        NormFwdArgs part = args;  // norm_fwd of these rows alone, into the strip buffer
        part.x = static_cast<const scalar_t*>(args.x) + r0 * hidden;
        part.rows = strip_rows;
        part.mean = args.mean != nullptr ? args.mean + r0 : nullptr;
        part.rstd = args.rstd + r0;
        part.out = strip_out.data();
        part.fp8 = false;
        norm_fwd(part, serial_for);
        block_quantize_transpose_strip(strip_out.data(), args.x_type, r0, strip_rows, rows, hidden, row_block,
                                       col_block, args.format, mode, y, scale_inv, y_t, scale_inv_t);
      }
    });
  });
}

void norm_bwd(const NormBwdArgs& args, ParallelFor parallel_for) {
  if (args.centered) {
    norm_bwd_impl<true>(args, parallel_for);
  } else {
    norm_bwd_impl<false>(args, parallel_for);
  }
}

}  // namespace fp8mp::cpu
