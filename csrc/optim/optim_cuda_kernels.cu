// CUDA implementation of the fused optimizer steps: one thread block of kStateBlock threads per block of
// state elements (grid-stride over the blocks), one element per thread. A thread reads its parameter,
// gradient and states once; the FP8 states' new block amax is a warp-shuffle then shared-memory max, after
// which each thread writes its own codes and thread 0 the block's scale (every thread has read the old scale
// by then). The step count is read by every thread and incremented by a one-thread launch after the step,
// in stream order, so neither the host nor the main kernel waits on it.
#include "optim/optim_cuda_kernels.cuh"

#include <algorithm>

#include "common/cuda_check.cuh"

namespace fp8mp::cuda {
namespace {

using optim::kStateBlock;
using optim::StateType;

constexpr int kThreads = int(kStateBlock);
constexpr int kWarps = kThreads / 32;
static_assert(kThreads % 32 == 0, "a state block is a whole number of warps");

__device__ __forceinline__ float nan_max(float a, float b) { return (b > a || b != b) ? b : a; }

// The max of `value` over the thread block, NaN-propagating, returned to every thread.
__device__ __forceinline__ float block_amax(float value, float* shared) {
  for (int offset = 16; offset > 0; offset /= 2) value = nan_max(value, __shfl_xor_sync(0xFFFFFFFFu, value, offset));
  if (threadIdx.x % 32 == 0) shared[threadIdx.x / 32] = value;
  __syncthreads();
  float amax = shared[0];
  for (int w = 1; w < kWarps; ++w) amax = nan_max(amax, shared[w]);
  __syncthreads();  // shared is reused by the next state
  return amax;
}

template <typename Rule, typename P, typename G, StateType S>
__global__ void __launch_bounds__(kThreads) step_kernel(optim::StepBuffers b, typename Rule::Hyper hyper) {
  constexpr int K = Rule::kStates;
  if (b.found_inf != nullptr && *b.found_inf != 0.0f) return;
  __shared__ float shared[kWarps];
  const int64_t t = *b.step + 1;
  const typename Rule::Scalars c = Rule::scalars(hyper, t);
  const uint64_t key = optim::step_key(b.seed, t);
  auto* param = static_cast<P*>(b.param);
  const auto* grad = static_cast<const G*>(b.grad);
  const int64_t blocks = (b.numel + kStateBlock - 1) / kStateBlock;
  for (int64_t block = blockIdx.x; block < blocks; block += gridDim.x) {
    const int64_t i = block * kStateBlock + threadIdx.x;
    const bool valid = i < b.numel;
    float scale[K] = {};
    if constexpr (S == StateType::E4M3) {
      for (int k = 0; k < K; ++k) scale[k] = b.state_scale[k][block];
    }
    float s[K] = {};
    const uint64_t random = valid ? optim::element_random(key, b.element_offset + i) : 0u;
    if (valid) {
      for (int k = 0; k < K; ++k) s[k] = optim::load_state<S>(b.state[k], i, scale[k], Rule::sqrt_domain(k));
      const float p = Rule::update(c, optim::load_float(grad, i), optim::load_float(param, i), s);
      optim::store_param(param, i, p, random);
    }
    for (int k = 0; k < K; ++k) {
      if constexpr (S == StateType::E4M3) {
        const float stored = valid ? optim::fp8_stored_value(s[k], Rule::sqrt_domain(k)) : 0.0f;
        const float amax = block_amax(fabsf(stored), shared);
        if (valid) {
          static_cast<uint8_t*>(b.state[k])[i] = optim::e4m3_stochastic_code(
              __fmul_rn(stored, optim::state_block_encode_multiplier(amax)), optim::state_random(random, k),
              Rule::sqrt_domain(k));
        }
        if (threadIdx.x == 0) b.state_scale[k][block] = optim::state_block_scale(amax);
      } else if (valid) {
        optim::store_wide_state<S>(b.state[k], i, s[k], optim::state_random(random, k));
      }
    }
  }
}

__global__ void increment_step_kernel(int64_t* step, const float* found_inf) {
  if (found_inf == nullptr || *found_inf == 0.0f) *step += 1;
}

template <typename Rule>
void step(const optim::StepBuffers& b, const typename Rule::Hyper& hyper, cudaStream_t stream) {
  const int64_t blocks = (b.numel + kStateBlock - 1) / kStateBlock;
  if (blocks > 0) {
    const unsigned grid = unsigned(std::min<int64_t>(blocks, int64_t(1) << 20));
    FP8MP_DISPATCH_STATE(b.state_type, [&] {
      const auto launch = [&](auto param_tag, auto grad_tag) {
        step_kernel<Rule, decltype(param_tag), decltype(grad_tag), kState><<<grid, kThreads, 0, stream>>>(b, hyper);
      };
      if (b.param_is_bf16) {
        b.grad_is_bf16 ? launch(bf16{}, bf16{}) : launch(bf16{}, float{});
      } else {
        b.grad_is_bf16 ? launch(float{}, bf16{}) : launch(float{}, float{});
      }
    });
    FP8MP_CUDA_LAUNCH_CHECK();
  }
  increment_step_kernel<<<1, 1, 0, stream>>>(b.step, b.found_inf);
  FP8MP_CUDA_LAUNCH_CHECK();
}

}  // namespace

void adamw_step(const optim::StepBuffers& buffers, const optim::AdamW::Hyper& hyper, cudaStream_t stream) {
  step<optim::AdamW>(buffers, hyper, stream);
}

void lion_step(const optim::StepBuffers& buffers, const optim::Lion::Hyper& hyper, cudaStream_t stream) {
  step<optim::Lion>(buffers, hyper, stream);
}

}  // namespace fp8mp::cuda
