// CPU implementation of the fused optimizer steps: one pass over each block of kStateBlock elements reads
// parameter, gradient and states once, keeps the new states in a block-sized buffer while their amax is
// found, and writes parameter, states and scales once.
#include "optim/optim_cpu_kernels.h"

namespace fp8mp::cpu {
namespace {

using optim::kStateBlock;
using optim::StateType;

template <typename Rule, typename P, typename G, StateType S>
void step_blocks(const optim::StepBuffers& b, const typename Rule::Scalars& c, const optim::StepKeys& keys,
                 int64_t first_block, int64_t last_block) {
  constexpr int K = Rule::kStates;
  auto* param = static_cast<P*>(b.param);
  const auto* grad = static_cast<const G*>(b.grad);
  float updated[K][kStateBlock];
  for (int64_t block = first_block; block < last_block; ++block) {
    const int64_t begin = block * kStateBlock;
    const int64_t count = b.numel - begin < kStateBlock ? b.numel - begin : kStateBlock;
    float scale[K] = {};
    if constexpr (S == StateType::E4M3) {
      for (int k = 0; k < K; ++k) scale[k] = b.state_scale[k][block];
    }
    float amax[K] = {};
    for (int64_t j = 0; j < count; ++j) {
      const int64_t i = begin + j;
      float s[K];
      for (int k = 0; k < K; ++k) s[k] = optim::load_state<S>(b.state[k], i, scale[k], Rule::sqrt_domain(k));
      const float p = Rule::update(c, optim::load_float(grad, i), optim::load_float(param, i), s);
      optim::store_param(param, i, p, keys.param);
      for (int k = 0; k < K; ++k) {
        if constexpr (S == StateType::E4M3) {
          updated[k][j] = optim::fp8_stored_value(s[k], Rule::sqrt_domain(k));
          const float magnitude = std::fabs(updated[k][j]);
          amax[k] = magnitude > amax[k] || magnitude != magnitude ? magnitude : amax[k];
        } else {
          optim::store_wide_state<S>(b.state[k], i, s[k], keys.state[k]);
        }
      }
    }
    if constexpr (S == StateType::E4M3) {
      for (int k = 0; k < K; ++k) {
        const float multiplier = optim::block_encode_multiplier(amax[k]);
        auto* codes = static_cast<uint8_t*>(b.state[k]) + begin;
        for (int64_t j = 0; j < count; ++j) {
          codes[j] = optim::e4m3_stochastic_code(updated[k][j] * multiplier,
                                                 optim::random_bits(keys.state[k], begin + j),
                                                 Rule::sqrt_domain(k));
        }
        b.state_scale[k][block] = optim::block_scale(amax[k]);
      }
    }
  }
}

template <typename Rule>
void step(const optim::StepBuffers& b, const typename Rule::Hyper& hyper, ParallelFor parallel_for) {
  if (b.found_inf != nullptr && *b.found_inf != 0.0f) return;
  const int64_t t = *b.step + 1;
  const typename Rule::Scalars c = Rule::scalars(hyper, t);
  const optim::StepKeys keys = optim::step_keys(b.seed, t);
  const int64_t blocks = (b.numel + kStateBlock - 1) / kStateBlock;
  FP8MP_DISPATCH_STATE(b.state_type, [&] {
    const auto run = [&](auto param_tag, auto grad_tag) {
      using P = decltype(param_tag);
      using G = decltype(grad_tag);
      parallel_for(0, blocks, 64, [&](int64_t first, int64_t last) {
        step_blocks<Rule, P, G, kState>(b, c, keys, first, last);
      });
    };
    if (b.param_is_bf16) {
      b.grad_is_bf16 ? run(bf16{}, bf16{}) : run(bf16{}, float{});
    } else {
      b.grad_is_bf16 ? run(float{}, bf16{}) : run(float{}, float{});
    }
  });
  *b.step = t;
}

}  // namespace

void adamw_step(const optim::StepBuffers& buffers, const optim::AdamW::Hyper& hyper, ParallelFor parallel_for) {
  step<optim::AdamW>(buffers, hyper, parallel_for);
}

void lion_step(const optim::StepBuffers& buffers, const optim::Lion::Hyper& hyper, ParallelFor parallel_for) {
  step<optim::Lion>(buffers, hyper, parallel_for);
}

}  // namespace fp8mp::cpu
