// CPU implementation of the fused optimizer steps: one pass over each block of kStateBlock elements reads
// parameter, gradient and states once, keeps the new states in a block-sized buffer while their amax is
// found, and writes parameter, states and scales once.
#include "optim/optim_cpu_kernels.h"

#include <type_traits>

#include "common/fp8_decode_table.h"

namespace fp8mp::cpu {
namespace {

using optim::kStateBlock;
using optim::StateType;

template <typename Rule, typename P, typename G, StateType S>
void step_blocks(const optim::StepBuffers& b, const typename Rule::Scalars& c, uint64_t key,
                 int64_t first_block, int64_t last_block) {
  constexpr int K = Rule::kStates;
  auto* param = static_cast<P*>(b.param);
  const auto* grad = static_cast<const G*>(b.grad);
  float previous[K][kStateBlock];  // FP8 states decoded (by table) before the update loop, which then vectorizes
  float updated[K][kStateBlock];
  uint64_t random[kStateBlock];  // element_random of the block's elements, for the parameter and the FP8 encode
  constexpr bool kRandom = std::is_same_v<P, bf16> || S != StateType::Float32;
  for (int64_t block = first_block; block < last_block; ++block) {
    const int64_t begin = block * kStateBlock;
    const int64_t count = b.numel - begin < kStateBlock ? b.numel - begin : kStateBlock;
    if constexpr (S == StateType::E4M3) {
      const float* table = decode_table<Fp8Format::E4M3>().data();
      for (int k = 0; k < K; ++k) {
        const float scale = b.state_scale[k][block];
        const auto* codes = static_cast<const uint8_t*>(b.state[k]) + begin;
        for (int64_t j = 0; j < count; ++j) {
          previous[k][j] = optim::fp8_state_value(table[codes[j]], scale, Rule::sqrt_domain(k));
        }
      }
    }
    for (int64_t j = 0; j < count; ++j) {
      const int64_t i = begin + j;
      float s[K];
      for (int k = 0; k < K; ++k) {
        if constexpr (S == StateType::E4M3) {
          s[k] = previous[k][j];
        } else {
          s[k] = optim::load_state<S>(b.state[k], i, 0.0f, false);
        }
      }
      const float p = Rule::update(c, optim::load_float(grad, i), optim::load_float(param, i), s);
      if constexpr (kRandom) random[j] = optim::element_random(key, i);
      optim::store_param(param, i, p, kRandom ? random[j] : 0u);
      for (int k = 0; k < K; ++k) {
        if constexpr (S == StateType::E4M3) {
          updated[k][j] = optim::fp8_stored_value(s[k], Rule::sqrt_domain(k));
        } else {
          optim::store_wide_state<S>(b.state[k], i, s[k], kRandom ? optim::state_random(random[j], k) : 0u);
        }
      }
    }
    if constexpr (S == StateType::E4M3) {
      for (int k = 0; k < K; ++k) {
        // Positive floats order like their bits and NaN's sort above Inf's: an integer max (which vectorizes)
        // is the NaN-propagating amax.
        uint32_t amax_bits = 0;
        for (int64_t j = 0; j < count; ++j) {
          const uint32_t magnitude_bits = float_to_bits(updated[k][j]) & 0x7FFFFFFFu;
          amax_bits = magnitude_bits > amax_bits ? magnitude_bits : amax_bits;
        }
        const float amax = bits_to_float(amax_bits);
        const float multiplier = optim::state_block_encode_multiplier(amax);
        auto* codes = static_cast<uint8_t*>(b.state[k]) + begin;
        for (int64_t j = 0; j < count; ++j) {
          codes[j] = optim::e4m3_stochastic_code(updated[k][j] * multiplier,
                                                 optim::state_random(random[j], k),
                                                 Rule::sqrt_domain(k));
        }
        b.state_scale[k][block] = optim::state_block_scale(amax);
      }
    }
  }
}

template <typename Rule>
void step(const optim::StepBuffers& b, const typename Rule::Hyper& hyper, ParallelFor parallel_for) {
  if (b.found_inf != nullptr && *b.found_inf != 0.0f) return;
  const int64_t t = *b.step + 1;
  const typename Rule::Scalars c = Rule::scalars(hyper, t);
  const uint64_t key = optim::step_key(b.seed, t);
  const int64_t blocks = (b.numel + kStateBlock - 1) / kStateBlock;
  FP8MP_DISPATCH_STATE(b.state_type, [&] {
    const auto run = [&](auto param_tag, auto grad_tag) {
      using P = decltype(param_tag);
      using G = decltype(grad_tag);
      parallel_for(0, blocks, 64, [&](int64_t first, int64_t last) {
        step_blocks<Rule, P, G, kState>(b, c, key, first, last);
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
