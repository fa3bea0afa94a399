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
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <torch/library.h>

#include <limits>

#include "common/cuda_reduce.cuh"
#include "common/fp8_format.h"
#include "norm/norm_common.h"
#include "norm/norm_entry_points.h"
#include "norm/norm_checks.h"

namespace fp8mp {
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
    const float s = kFp8 ? *scale : 1.0f;
    for (int64_t i = lane; i < hidden; i += kTeam) {
      float y = normalized<kCentered>(static_cast<float>(xr[i]), mean, rstd) * g[i];
      if (b != nullptr) y = y + b[i];
      const scalar_t rounded = static_cast<scalar_t>(y);
      if constexpr (kFp8) {
        const float v = static_cast<float>(rounded);
        local_amax = max_u32(local_amax, float_to_bits(v) & 0x7FFFFFFFu);
        static_cast<uint8_t*>(out_raw)[row * hidden + i] = encode<F>(v * s);
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

// Stage 2: one thread per column adds the chunks' partials in chunk order.
__global__ void sum_chunks_kernel(const float* __restrict__ partial, int64_t chunks, int64_t hidden,
                                  float* __restrict__ out) {
  const int64_t col = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (col >= hidden) return;
  float acc = 0.0f;
  for (int64_t c = 0; c < chunks; ++c) acc += partial[c * hidden + col];
  out[col] = acc;
}

unsigned grid_for(int64_t units, const char* op) {
  TORCH_CHECK(units <= std::numeric_limits<int>::max(), op, ": too many rows for one launch");
  return unsigned(units > 0 ? units : 1);
}

template <bool kCentered>
std::tuple<at::Tensor, at::Tensor, at::Tensor> norm_fwd_cuda(const at::Tensor& x, const std::optional<at::Tensor>& weight,
                                                             const std::optional<at::Tensor>& bias, double eps,
                                                             bool zero_centered_gamma, std::optional<Fp8Format> fp8,
                                                             const at::Tensor* scale, at::Tensor* amax, const char* op) {
  const c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor xc = x.contiguous();
  const int64_t hidden = x.size(-1);
  const int64_t rows = xc.numel() / hidden;
  const at::Tensor g = norm_gain_fp32(weight, hidden, zero_centered_gamma, x);
  const at::Tensor b = norm_bias_fp32(bias);
  const auto stats_options = x.options().dtype(at::kFloat);
  at::Tensor mean = kCentered ? at::empty(norm_stats_shape(x), stats_options) : at::Tensor();
  at::Tensor rstd = at::empty(norm_stats_shape(x), stats_options);
  at::Tensor out = at::empty(x.sizes(), fp8 ? x.options().dtype(fp8_dtype(*fp8)) : x.options());
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  uint32_t* amax_bits = nullptr;
  if (fp8) {
    C10_CUDA_CHECK(cudaMemsetAsync(amax->data_ptr(), 0, sizeof(float), stream));
    amax_bits = reinterpret_cast<uint32_t*>(amax->data_ptr());
  }
  if (rows == 0) return {out, mean, rstd};
  const float eps_f = static_cast<float>(eps);
  const float* g_ptr = g.const_data_ptr<float>();
  const float* b_ptr = b.defined() ? b.const_data_ptr<float>() : nullptr;
  float* mean_ptr = kCentered ? mean.mutable_data_ptr<float>() : nullptr;
  float* rstd_ptr = rstd.mutable_data_ptr<float>();
  const float* scale_ptr = fp8 ? scale->const_data_ptr<float>() : nullptr;
  const bool warp_rows = hidden <= kWarpRowMax;

  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "fp8mp::norm_fwd_cuda", [&] {
    const scalar_t* x_ptr = xc.const_data_ptr<scalar_t>();
    auto launch = [&](auto team, auto is_fp8, auto format) {
      constexpr int kTeam = decltype(team)::value;
      const unsigned grid = grid_for((rows + kBlock / kTeam - 1) / (kBlock / kTeam), op);
      norm_fwd_kernel<kCentered, kTeam, decltype(is_fp8)::value, decltype(format)::value, scalar_t>
          <<<grid, kBlock, 0, stream>>>(x_ptr, g_ptr, b_ptr, out.data_ptr(), mean_ptr, rstd_ptr, rows, hidden, eps_f,
                                        scale_ptr, amax_bits);
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    };
    auto with_team = [&](auto is_fp8, auto format) {
      if (warp_rows) {
        launch(std::integral_constant<int, 32>{}, is_fp8, format);
      } else {
        launch(std::integral_constant<int, kBlock>{}, is_fp8, format);
      }
    };
    if (!fp8) {
      with_team(std::false_type{}, std::integral_constant<Fp8Format, Fp8Format::E4M3>{});
    } else {
      FP8MP_DISPATCH_FORMAT(*fp8, [&] { with_team(std::true_type{}, std::integral_constant<Fp8Format, kFormat>{}); });
    }
  });
  return {out, mean, rstd};
}

template <bool kCentered>
std::tuple<at::Tensor, at::Tensor, at::Tensor> norm_bwd_cuda(const at::Tensor& grad_out, const at::Tensor& x,
                                                             const at::Tensor* mean, const at::Tensor& rstd,
                                                             const std::optional<at::Tensor>& weight,
                                                             bool zero_centered_gamma, const char* op) {
  const c10::cuda::CUDAGuard guard(x.device());
  const at::Tensor xc = x.contiguous(), gc = grad_out.contiguous(), rstd_c = rstd.contiguous();
  const at::Tensor mean_c = mean != nullptr ? mean->contiguous() : at::Tensor();
  const int64_t hidden = x.size(-1);
  const int64_t rows = xc.numel() / hidden;
  const at::Tensor g = norm_gain_fp32(weight, hidden, zero_centered_gamma, x);
  at::Tensor grad_x = at::empty(x.sizes(), x.options());
  const auto f32 = x.options().dtype(at::kFloat);
  const bool want_params = weight.has_value();
  at::Tensor grad_w = want_params ? at::zeros({hidden}, f32) : at::empty({0}, f32);
  at::Tensor grad_b = want_params ? at::zeros({hidden}, f32) : at::empty({0}, f32);
  if (rows == 0) {
    if (want_params) return {grad_x, grad_w.to(weight->scalar_type()), grad_b.to(weight->scalar_type())};
    return {grad_x, grad_w, grad_b};
  }
  cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  const float* g_ptr = g.const_data_ptr<float>();
  const float* mean_ptr = kCentered ? mean_c.const_data_ptr<float>() : nullptr;
  const float* rstd_ptr = rstd_c.const_data_ptr<float>();
  const int64_t rows_per_chunk = std::max(kMinRowsPerChunk, (rows + kMaxChunks - 1) / kMaxChunks);
  const int64_t chunks = (rows + rows_per_chunk - 1) / rows_per_chunk;
  at::Tensor partials = want_params ? at::empty({kCentered ? 2 : 1, chunks, hidden}, f32) : at::Tensor();

  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "fp8mp::norm_bwd_cuda", [&] {
    const scalar_t* x_ptr = xc.const_data_ptr<scalar_t>();
    const scalar_t* go_ptr = gc.const_data_ptr<scalar_t>();
    scalar_t* gx_ptr = grad_x.mutable_data_ptr<scalar_t>();
    if (hidden <= kWarpRowMax) {
      const unsigned grid = grid_for((rows + kBlock / 32 - 1) / (kBlock / 32), op);
      norm_bwd_x_kernel<kCentered, 32, scalar_t>
          <<<grid, kBlock, 0, stream>>>(go_ptr, x_ptr, g_ptr, mean_ptr, rstd_ptr, gx_ptr, rows, hidden);
    } else {
      norm_bwd_x_kernel<kCentered, kBlock, scalar_t>
          <<<grid_for(rows, op), kBlock, 0, stream>>>(go_ptr, x_ptr, g_ptr, mean_ptr, rstd_ptr, gx_ptr, rows, hidden);
    }
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    if (!want_params) return;
    float* partial_w = partials.mutable_data_ptr<float>();
    float* partial_b = kCentered ? partial_w + chunks * hidden : nullptr;
    const dim3 grid(grid_for((hidden + kColTile - 1) / kColTile, op), unsigned(chunks));
    norm_bwd_param_partials_kernel<kCentered, scalar_t><<<grid, dim3(kColTile, kRowLanes), 0, stream>>>(
        go_ptr, x_ptr, mean_ptr, rstd_ptr, rows, hidden, rows_per_chunk, partial_w, partial_b);
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    const unsigned col_blocks = grid_for((hidden + kBlock - 1) / kBlock, op);
    sum_chunks_kernel<<<col_blocks, kBlock, 0, stream>>>(partial_w, chunks, hidden, grad_w.mutable_data_ptr<float>());
    C10_CUDA_KERNEL_LAUNCH_CHECK();
    if (kCentered) {
      sum_chunks_kernel<<<col_blocks, kBlock, 0, stream>>>(partial_b, chunks, hidden, grad_b.mutable_data_ptr<float>());
      C10_CUDA_KERNEL_LAUNCH_CHECK();
    }
  });
  if (!want_params) return {grad_x, grad_w, grad_b};
  const auto wdtype = weight->scalar_type();
  return {grad_x, grad_w.to(wdtype), grad_b.to(wdtype)};
}

struct CudaNorm {
  template <bool kCentered, typename... Args>
  static NormFwdResult fwd(Args&&... args) {
    return norm_fwd_cuda<kCentered>(std::forward<Args>(args)...);
  }
  template <bool kCentered, typename... Args>
  static NormFwdResult bwd(Args&&... args) {
    return norm_bwd_cuda<kCentered>(std::forward<Args>(args)...);
  }
};

}  // namespace

TORCH_LIBRARY_IMPL(fp8mp, CUDA, m) { register_norm_ops<CudaNorm>(m); }

}  // namespace fp8mp
