// CUDA LayerNorm / RMSNorm over the last dimension, optionally writing FP8.
//
// Forward and grad_x: a team of threads per row, a warp (8 rows per 256-thread
// block) when H <= kWarpRowMax, else the whole block. Statistics are fp32 with
// the same two-pass formulas as the CPU (norm_common.h), reduced with warp
// shuffles and, for block teams, shared memory summed in a fixed order. The
// FP8 variant rounds y to x's dtype, encodes with fp8_format.h's encode<F>
// (the CPU's function, so the two agree bit for bit on the same y) and reduces
// amax per block with one atomicMax (cuda_reduce.cuh).
//
// grad_weight / grad_bias: a deterministic two-stage reduction over rows, no
// float atomics: per-(column tile, row chunk) partial sums, then one thread per
// column adds the chunks in order.
//
// Not fused with grad_x, so backward reads x and grad_out
// twice: for bf16 that is 4 extra bytes per element on top of the 6 that
// grad_x needs (read x, grad_out; write grad_x), about 1.7x the minimum. A
// fused, still deterministic kernel must keep each column's partial sums where
// the row teams produce them: in registers (hidden / team columns per thread,
// so one instantiation per hidden-size range and a register-bound occupancy,
// which is what Transformer Engine's tuned per-size kernels do) or as per-team
// partial rows in global memory, whose read-modify-write per row moves more
// bytes through L2 than the second read it saves. Neither can be tuned or even
// timed without a GPU; the two-kernel form is kept, correct and deterministic,
// until gpu_check.sh can measure a fused variant against it.
#include "norm/norm_cuda_kernels.cuh"

#include <algorithm>
#include <limits>
#include <stdexcept>
#include <string>
#include <type_traits>

#include "common/cuda_check.cuh"
#include "common/cuda_reduce.cuh"
#include "common/nan_keeping_scale.h"

namespace fp8mp::cuda {
namespace {

constexpr int kBlock = 256;
constexpr int64_t kWarpRowMax = 1024;  // rows up to this length get one warp each
constexpr int kColTile = 32;           // grad_weight partials: 32 columns x 8 row lanes per block
constexpr int kRowLanes = 8;
constexpr int64_t kMaxChunks = 256;
constexpr int64_t kMinRowsPerChunk = 32;

// Sum over the kTeam threads sharing a row; every thread of the team gets the
// same bits. Block teams go through shared memory, added in warp order.
template <int kTeam>
__device__ __forceinline__ float team_sum(float value, float* scratch) {
  value = warp_sum(value);
  if constexpr (kTeam > 32) {
    constexpr int kWarps = kTeam / 32;
    const int warp = threadIdx.x / 32;
    __syncthreads();  // scratch may still be read by a previous team_sum
    if (threadIdx.x % 32 == 0) scratch[warp] = value;
    __syncthreads();
    value = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) value += scratch[w];
  }
  return value;
}

// One row per team. OutT = scalar_t writes the high-precision output; OutT =
// uint8_t writes encode<F>(float(scalar_t(y)) * scale) and reduces amax.
template <bool kCentered, int kTeam, bool kFp8, Fp8Format F, typename scalar_t>
__global__ void norm_fwd_kernel(const scalar_t* __restrict__ x, const float* __restrict__ g,
                                const float* __restrict__ b, void* __restrict__ out_raw, float* __restrict__ mean_out,
                                float* __restrict__ rstd_out, int64_t rows, int64_t hidden, float eps,
                                const float* __restrict__ scale, uint32_t* __restrict__ amax_bits) {
  __shared__ float scratch[kBlock / 32];
  constexpr int kTeamsPerBlock = kBlock / kTeam;
  const int lane = threadIdx.x % kTeam;
  const int64_t row = int64_t(blockIdx.x) * kTeamsPerBlock + threadIdx.x / kTeam;
  const float fn = static_cast<float>(hidden);
  uint32_t local_amax = 0;
  // For block teams row is uniform across the block, so the __syncthreads in team_sum are safe.
  if (row < rows) {
    const scalar_t* xr = x + row * hidden;
    float mean = 0.0f, rstd;
    if constexpr (kCentered) {
      float sum = 0.0f;
      for (int64_t i = lane; i < hidden; i += kTeam) sum += static_cast<float>(xr[i]);
      const float mean0 = team_sum<kTeam>(sum, scratch) / fn;
      float sum_d = 0.0f, sum_d2 = 0.0f;
      for (int64_t i = lane; i < hidden; i += kTeam) {
        const float d = static_cast<float>(xr[i]) - mean0;
        sum_d += d;
        sum_d2 += d * d;
      }
      sum_d = team_sum<kTeam>(sum_d, scratch);
      sum_d2 = team_sum<kTeam>(sum_d2, scratch);
      layernorm_stats(mean0, sum_d, sum_d2, fn, eps, mean, rstd);
    } else {
      float sum_sq = 0.0f;
      for (int64_t i = lane; i < hidden; i += kTeam) {
        const float v = static_cast<float>(xr[i]);
        sum_sq += v * v;
      }
      rstd = rmsnorm_rstd(team_sum<kTeam>(sum_sq, scratch), fn, eps);
    }
    if (lane == 0) {
      if constexpr (kCentered) mean_out[row] = mean;
      rstd_out[row] = rstd;
    }
    const float s = kFp8 ? checked_scale(*scale) : 1.0f;
    for (int64_t i = lane; i < hidden; i += kTeam) {
      float y = normalized<kCentered>(static_cast<float>(xr[i]), mean, rstd) * g[i];
      if (b != nullptr) y = y + b[i];
      const scalar_t rounded = static_cast<scalar_t>(pin_nan(y));
      if constexpr (kFp8) {
        const float v = static_cast<float>(rounded);
        local_amax = max_u32(local_amax, float_to_bits(v) & 0x7FFFFFFFu);
        static_cast<uint8_t*>(out_raw)[row * hidden + i] = encode<F>(scale_keep_nan(v, s));
      } else {
        static_cast<scalar_t*>(out_raw)[row * hidden + i] = rounded;
      }
    }
  }
  if constexpr (kFp8) block_amax_to_global(local_amax, amax_bits);  // reached by every thread
}

template <bool kCentered, int kTeam, typename scalar_t>
__global__ void norm_bwd_x_kernel(const scalar_t* __restrict__ grad_out, const scalar_t* __restrict__ x,
                                  const float* __restrict__ g, const float* __restrict__ mean,
                                  const float* __restrict__ rstd, scalar_t* __restrict__ grad_x, int64_t rows,
                                  int64_t hidden) {
  __shared__ float scratch[kBlock / 32];
  constexpr int kTeamsPerBlock = kBlock / kTeam;
  const int lane = threadIdx.x % kTeam;
  const int64_t row = int64_t(blockIdx.x) * kTeamsPerBlock + threadIdx.x / kTeam;
  if (row >= rows) return;  // uniform across the block for block teams; warps have no block barrier
  const scalar_t* xr = x + row * hidden;
  const scalar_t* gr = grad_out + row * hidden;
  const float mu = kCentered ? mean[row] : 0.0f, rs = rstd[row];
  const float fn = static_cast<float>(hidden);
  float sum_dy = 0.0f, sum_dy_xhat = 0.0f;
  for (int64_t i = lane; i < hidden; i += kTeam) {
    const float dy = static_cast<float>(gr[i]) * g[i];
    sum_dy += dy;
    sum_dy_xhat += dy * normalized<kCentered>(static_cast<float>(xr[i]), mu, rs);
  }
  const float mean_dy = kCentered ? team_sum<kTeam>(sum_dy, scratch) / fn : 0.0f;
  const float mean_dy_xhat = team_sum<kTeam>(sum_dy_xhat, scratch) / fn;
  for (int64_t i = lane; i < hidden; i += kTeam) {
    const float dy = static_cast<float>(gr[i]) * g[i];
    const float xhat = normalized<kCentered>(static_cast<float>(xr[i]), mu, rs);
    grad_x[row * hidden + i] = static_cast<scalar_t>(norm_grad_x<kCentered>(dy, xhat, mean_dy, mean_dy_xhat, rs));
  }
}

// Stage 1: block (kColTile x kRowLanes) sums grad_out * xhat (and grad_out) over
// one chunk of rows for kColTile columns, in a fixed order.
template <bool kCentered, typename scalar_t>
__global__ void norm_bwd_param_partials_kernel(const scalar_t* __restrict__ grad_out, const scalar_t* __restrict__ x,
                                               const float* __restrict__ mean, const float* __restrict__ rstd,
                                               int64_t rows, int64_t hidden, int64_t rows_per_chunk,
                                               float* __restrict__ partial_w, float* __restrict__ partial_b) {
  __shared__ float tile_w[kRowLanes][kColTile + 1];
  __shared__ float tile_b[kRowLanes][kColTile + 1];
  const int64_t col = int64_t(blockIdx.x) * kColTile + threadIdx.x;
  const int64_t chunk = blockIdx.y;
  const int64_t r0 = chunk * rows_per_chunk;
  const int64_t r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;
  float acc_w = 0.0f, acc_b = 0.0f;
  if (col < hidden) {
    for (int64_t r = r0 + threadIdx.y; r < r1; r += kRowLanes) {
      const float grad = static_cast<float>(grad_out[r * hidden + col]);
      const float xhat = normalized<kCentered>(static_cast<float>(x[r * hidden + col]), kCentered ? mean[r] : 0.0f, rstd[r]);
      acc_w += grad * xhat;
      acc_b += grad;
    }
  }
  tile_w[threadIdx.y][threadIdx.x] = acc_w;
  tile_b[threadIdx.y][threadIdx.x] = acc_b;
  __syncthreads();
  if (threadIdx.y == 0 && col < hidden) {
    float w = 0.0f, bsum = 0.0f;
#pragma unroll
    for (int k = 0; k < kRowLanes; ++k) {
      w += tile_w[k][threadIdx.x];
      bsum += tile_b[k][threadIdx.x];
    }
    partial_w[chunk * hidden + col] = w;
    if (partial_b != nullptr) partial_b[chunk * hidden + col] = bsum;
  }
}

// Stage 2: one thread per column adds the chunks' partials in chunk order, rounded once to the weight's type.
// A NaN there is the canonical NaN, as on the CPU (norm_common.h): NVIDIA's fp32 Inf - Inf is 0x7FFFFFFF.
template <typename scalar_t>
__global__ void sum_chunks_kernel(const float* __restrict__ partial, int64_t chunks, int64_t hidden,
                                  scalar_t* __restrict__ out) {
  const int64_t col = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (col >= hidden) return;
  float acc = 0.0f;
  for (int64_t c = 0; c < chunks; ++c) acc += partial[c * hidden + col];
  out[col] = static_cast<scalar_t>(pin_nan(acc));
}

// out[i] = float(p[i]) (+ 1 with add_one), or 1 without p: the fp32 gain and bias vectors.
template <typename scalar_t>
__global__ void param_fp32_kernel(const scalar_t* __restrict__ p, float* __restrict__ out, int64_t n, bool add_one) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  if (p == nullptr) {
    out[i] = 1.0f;
  } else {
    const float v = static_cast<float>(p[i]);
    out[i] = add_one ? __fadd_rn(v, 1.0f) : v;
  }
}

unsigned grid_for(int64_t units, const char* op) {
  if (units > std::numeric_limits<int>::max()) throw std::invalid_argument(std::string(op) + ": too many rows for one launch");
  return unsigned(units > 0 ? units : 1);
}

void param_fp32(const void* p, HpType type, float* out, int64_t n, bool add_one, cudaStream_t stream) {
  FP8MP_DISPATCH_HP(type, [&] {
    param_fp32_kernel<scalar_t><<<grid_for((n + kBlock - 1) / kBlock, "fp8mp::norm"), kBlock, 0, stream>>>(
        static_cast<const scalar_t*>(p), out, n, add_one);
    FP8MP_CUDA_LAUNCH_CHECK();
  });
}

struct BwdChunks {
  int64_t rows_per_chunk, chunks;
};

BwdChunks bwd_chunks(int64_t rows) {
  const int64_t rows_per_chunk = std::max(kMinRowsPerChunk, (rows + kMaxChunks - 1) / kMaxChunks);
  return {rows_per_chunk, (rows + rows_per_chunk - 1) / rows_per_chunk};
}

template <bool kCentered>
void norm_fwd_impl(const NormFwdArgs& args, float* scratch, cudaStream_t stream) {
  const char* op = kCentered ? "fp8mp::layernorm_fwd" : "fp8mp::rmsnorm_fwd";
  const int64_t hidden = args.hidden, rows = args.rows;
  uint32_t* amax_bits = nullptr;
  if (args.fp8) {
    FP8MP_CUDA_CHECK(cudaMemsetAsync(args.amax, 0, sizeof(float), stream));
    amax_bits = reinterpret_cast<uint32_t*>(args.amax);
  }
  if (rows == 0) return;
  float* g_ptr = scratch;
  float* b_ptr = args.bias != nullptr ? scratch + hidden : nullptr;
  param_fp32(args.weight, args.weight_type, g_ptr, hidden, args.zero_centered_gamma, stream);
  if (b_ptr != nullptr) param_fp32(args.bias, args.bias_type, b_ptr, hidden, false, stream);
  const float eps_f = args.eps;
  float* mean_ptr = kCentered ? args.mean : nullptr;
  float* rstd_ptr = args.rstd;
  const float* scale_ptr = args.fp8 ? args.scale : nullptr;
  const bool warp_rows = hidden <= kWarpRowMax;

  FP8MP_DISPATCH_HP(args.x_type, [&] {
    const scalar_t* x_ptr = static_cast<const scalar_t*>(args.x);
    auto launch = [&](auto team, auto is_fp8, auto format) {
      constexpr int kTeam = decltype(team)::value;
      const unsigned grid = grid_for((rows + kBlock / kTeam - 1) / (kBlock / kTeam), op);
      norm_fwd_kernel<kCentered, kTeam, decltype(is_fp8)::value, decltype(format)::value, scalar_t>
          <<<grid, kBlock, 0, stream>>>(x_ptr, g_ptr, b_ptr, args.out, mean_ptr, rstd_ptr, rows, hidden, eps_f,
                                        scale_ptr, amax_bits);
      FP8MP_CUDA_LAUNCH_CHECK();
    };
    auto with_team = [&](auto is_fp8, auto format) {
      if (warp_rows) {
        launch(std::integral_constant<int, 32>{}, is_fp8, format);
      } else {
        launch(std::integral_constant<int, kBlock>{}, is_fp8, format);
      }
    };
    if (!args.fp8) {
      with_team(std::false_type{}, std::integral_constant<Fp8Format, Fp8Format::E4M3>{});
    } else {
      FP8MP_DISPATCH_FORMAT(args.format,
                            [&] { with_team(std::true_type{}, std::integral_constant<Fp8Format, kFormat>{}); });
    }
  });
}

template <bool kCentered>
void norm_bwd_impl(const NormBwdArgs& args, float* scratch, cudaStream_t stream) {
  const char* op = kCentered ? "fp8mp::layernorm_bwd" : "fp8mp::rmsnorm_bwd";
  const int64_t hidden = args.hidden, rows = args.rows;
  const bool want_params = args.weight != nullptr;
  const size_t param_bytes = size_t(hidden) * (args.weight_type == HpType::Float32 ? 4 : 2);
  if (rows == 0) {
    if (want_params) {
      FP8MP_CUDA_CHECK(cudaMemsetAsync(args.grad_weight, 0, param_bytes, stream));
      if (args.grad_bias != nullptr) FP8MP_CUDA_CHECK(cudaMemsetAsync(args.grad_bias, 0, param_bytes, stream));
    }
    return;
  }
  float* g_ptr = scratch;
  param_fp32(args.weight, args.weight_type, g_ptr, hidden, args.zero_centered_gamma, stream);
  const float* mean_ptr = kCentered ? args.mean : nullptr;
  const float* rstd_ptr = args.rstd;
  const auto [rows_per_chunk, chunks] = bwd_chunks(rows);

  FP8MP_DISPATCH_HP(args.x_type, [&] {
    const scalar_t* x_ptr = static_cast<const scalar_t*>(args.x);
    const scalar_t* go_ptr = static_cast<const scalar_t*>(args.grad_out);
    scalar_t* gx_ptr = static_cast<scalar_t*>(args.grad_x);
    if (hidden <= kWarpRowMax) {
      const unsigned grid = grid_for((rows + kBlock / 32 - 1) / (kBlock / 32), op);
      norm_bwd_x_kernel<kCentered, 32, scalar_t>
          <<<grid, kBlock, 0, stream>>>(go_ptr, x_ptr, g_ptr, mean_ptr, rstd_ptr, gx_ptr, rows, hidden);
    } else {
      norm_bwd_x_kernel<kCentered, kBlock, scalar_t>
          <<<grid_for(rows, op), kBlock, 0, stream>>>(go_ptr, x_ptr, g_ptr, mean_ptr, rstd_ptr, gx_ptr, rows, hidden);
    }
    FP8MP_CUDA_LAUNCH_CHECK();
    if (!want_params) return;
    float* partial_w = scratch + hidden;
    float* partial_b = kCentered ? partial_w + chunks * hidden : nullptr;
    const dim3 grid(grid_for((hidden + kColTile - 1) / kColTile, op), unsigned(chunks));
    norm_bwd_param_partials_kernel<kCentered, scalar_t><<<grid, dim3(kColTile, kRowLanes), 0, stream>>>(
        go_ptr, x_ptr, mean_ptr, rstd_ptr, rows, hidden, rows_per_chunk, partial_w, partial_b);
    FP8MP_CUDA_LAUNCH_CHECK();
    const unsigned col_blocks = grid_for((hidden + kBlock - 1) / kBlock, op);
    FP8MP_DISPATCH_HP(args.weight_type, [&] {
      sum_chunks_kernel<scalar_t><<<col_blocks, kBlock, 0, stream>>>(partial_w, chunks, hidden,
                                                                     static_cast<scalar_t*>(args.grad_weight));
      FP8MP_CUDA_LAUNCH_CHECK();
      if (kCentered) {
        sum_chunks_kernel<scalar_t><<<col_blocks, kBlock, 0, stream>>>(partial_b, chunks, hidden,
                                                                       static_cast<scalar_t*>(args.grad_bias));
        FP8MP_CUDA_LAUNCH_CHECK();
      }
    });
  });
}

}  // namespace

size_t norm_fwd_scratch_floats(const NormFwdArgs& args) { return size_t(2 * args.hidden); }

size_t norm_bwd_scratch_floats(const NormBwdArgs& args) {
  const int64_t partials = args.weight != nullptr ? (args.centered ? 2 : 1) * bwd_chunks(args.rows).chunks : 0;
  return size_t((1 + partials) * args.hidden);
}

void norm_fwd(const NormFwdArgs& args, float* scratch, cudaStream_t stream) {
  if (args.centered) {
    norm_fwd_impl<true>(args, scratch, stream);
  } else {
    norm_fwd_impl<false>(args, scratch, stream);
  }
}

void norm_bwd(const NormBwdArgs& args, float* scratch, cudaStream_t stream) {
  if (args.centered) {
    norm_bwd_impl<true>(args, scratch, stream);
  } else {
    norm_bwd_impl<false>(args, scratch, stream);
  }
}

}  // namespace fp8mp::cuda
