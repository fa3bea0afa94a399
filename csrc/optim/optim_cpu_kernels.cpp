// CPU implementation of the fused optimizer steps: one pass over each block of kStateBlock elements reads
// parameter, gradient and states once, keeps the new states in a block-sized buffer while their amax is
// found, and writes parameter, states and scales once.
//
// The block's work is split into loops the compiler vectorizes (the random bits of the block, the FP8
// decode, the update rule, the amax, the FP8 encode), compiled for AVX-512, AVX2 and baseline x86-64
// (with_cpu_isa: the CPU's best, or the level FP8MP_CPU_ISA asks for). They are optim_rule.h's functions element by element,
// and the build keeps IEEE fp32 semantics (no contraction, no reassociation; -fno-math-errno only lets the
// update's sqrt vectorize), so every ISA writes the bits of the one-element-at-a-time loop;
// FP8MP_CPU_OPTIM=scalar runs that loop (not vectorized, with GCC) instead, to check it.
#include "optim/optim_cpu_kernels.h"

#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "common/cpu_isa.h"

#if defined(__GNUC__) && !defined(__clang__)
#define FP8MP_NOT_VECTORIZED __attribute__((optimize("no-tree-vectorize")))
#else
#define FP8MP_NOT_VECTORIZED
#endif

namespace fp8mp::cpu {
namespace {

using optim::kStateBlock;
using optim::StateType;

// decode<Fp8Format::E4M3>(code), branch-free so that the loop over a block vectorizes (a table lookup does
// not: it is a load per element). Normal codes: the exponent re-biased by adding (127 - 7) << 23 to the
// code's bits moved to fp32's places; subnormal ones (exponent 0): mantissa * 2^-9, exact; NaN: sign|0x7FC00000.
inline float e4m3_value(uint8_t code) {
  constexpr uint32_t kRebias = uint32_t(127 - FormatTraits<Fp8Format::E4M3>::kBias) << 23;
  constexpr int kShift = 23 - FormatTraits<Fp8Format::E4M3>::kManBits;
  const uint32_t magnitude = code & 0x7Fu;
  const uint32_t subnormal = float_to_bits(float(magnitude) * 0x1p-9f);
  uint32_t bits = uint32_t(select(magnitude < 8u, int32_t(subnormal), int32_t((magnitude << kShift) + kRebias)));
  bits = uint32_t(select(magnitude == uint32_t(kNanCode), int32_t(0x7FC00000u), int32_t(bits)));
  return bits_to_float(bits | (uint32_t(code & 0x80u) << 24));
}

// One block of `count` (<= kStateBlock) elements starting at element `begin`, its FP8 scales at `block`.
// Inlined into each caller, so that a full block's loops have a constant trip count.
template <typename Rule, typename P, typename G, StateType S>
__attribute__((always_inline)) inline void step_block(const optim::StepBuffers& b, const typename Rule::Scalars& scalars,
                                                      uint64_t key, int64_t block, int64_t begin, int64_t count) {
  constexpr int K = Rule::kStates;
  const typename Rule::Scalars c = scalars;  // a copy: the parameter stores cannot alias it
  constexpr bool kRandom = std::is_same_v<P, bf16> || S != StateType::Float32;
  auto* __restrict param = static_cast<P*>(b.param) + begin;
  const auto* __restrict grad = static_cast<const G*>(b.grad) + begin;
  alignas(64) float state[K][kStateBlock];  // in: the states as the rule sees them; out: as FP8 stores them
  alignas(64) uint64_t random[kStateBlock];  // element_random of the block's elements
  if constexpr (kRandom) {
    for (int64_t j = 0; j < count; ++j) random[j] = optim::element_random(key, b.element_offset + begin + j);
  }
  for (int k = 0; k < K; ++k) {
    if constexpr (S == StateType::E4M3) {
      const float scale = b.state_scale[k][block];
      const auto* __restrict codes = static_cast<const uint8_t*>(b.state[k]) + begin;
      for (int64_t j = 0; j < count; ++j) {
        state[k][j] = optim::fp8_state_value(e4m3_value(codes[j]), scale, Rule::sqrt_domain(k));
      }
    } else {
      for (int64_t j = 0; j < count; ++j) state[k][j] = optim::load_state<S>(b.state[k], begin + j, 0.0f, false);
    }
  }
  for (int64_t j = 0; j < count; ++j) {
    float s[K];
    for (int k = 0; k < K; ++k) s[k] = state[k][j];
    const float p = Rule::update(c, optim::load_float(grad, j), optim::load_float(param, j), s);
    optim::store_param(param, j, p, kRandom ? random[j] : 0u);
    for (int k = 0; k < K; ++k) state[k][j] = S == StateType::E4M3 ? optim::fp8_stored_value(s[k], Rule::sqrt_domain(k)) : s[k];
  }
  for (int k = 0; k < K; ++k) {
    if constexpr (S == StateType::E4M3) {
      // Positive floats order like their bits and NaN's sort above Inf's: an integer max (which vectorizes)
      // is the NaN-propagating amax.
      uint32_t amax_bits = 0;
      for (int64_t j = 0; j < count; ++j) {
        const uint32_t magnitude_bits = float_to_bits(state[k][j]) & 0x7FFFFFFFu;
        amax_bits = magnitude_bits > amax_bits ? magnitude_bits : amax_bits;
      }
      const float amax = bits_to_float(amax_bits);
      const float multiplier = optim::state_block_encode_multiplier(amax);
      auto* __restrict codes = static_cast<uint8_t*>(b.state[k]) + begin;
      for (int64_t j = 0; j < count; ++j) {
        codes[j] = optim::e4m3_stochastic_code(state[k][j] * multiplier, optim::state_random(random[j], k),
                                               Rule::sqrt_domain(k));
      }
      b.state_scale[k][block] = optim::state_block_scale(amax);
    } else {
      for (int64_t j = 0; j < count; ++j) {
        optim::store_wide_state<S>(b.state[k], begin + j, state[k][j],
                                   kRandom ? optim::state_random(random[j], k) : 0u);
      }
    }
  }
}

// Blocks [first_block, last_block): the vectorized loops (called through with_cpu_isa).
template <typename Rule, typename P, typename G, StateType S>
void step_blocks(const optim::StepBuffers& b, const typename Rule::Scalars& c, uint64_t key,
                                  int64_t first_block, int64_t last_block) {
  for (int64_t block = first_block; block < last_block; ++block) {
    const int64_t begin = block * kStateBlock;
    if (b.numel - begin >= kStateBlock) {
      step_block<Rule, P, G, S>(b, c, key, block, begin, kStateBlock);
    } else {
      step_block<Rule, P, G, S>(b, c, key, block, begin, b.numel - begin);
    }
  }
}

// The same blocks one element at a time (FP8MP_CPU_OPTIM=scalar).
template <typename Rule, typename P, typename G, StateType S>
FP8MP_NOT_VECTORIZED void step_blocks_scalar(const optim::StepBuffers& b, const typename Rule::Scalars& c,
                                             uint64_t key, int64_t first_block, int64_t last_block) {
  for (int64_t block = first_block; block < last_block; ++block) {
    const int64_t begin = block * kStateBlock;
    step_block<Rule, P, G, S>(b, c, key, block, begin, b.numel - begin < kStateBlock ? b.numel - begin : kStateBlock);
  }
}

bool scalar_forced() {
  static const bool forced = [] {
    const char* value = std::getenv("FP8MP_CPU_OPTIM");
    return value != nullptr && std::strcmp(value, "scalar") == 0;
  }();
  return forced;
}

template <typename Rule>
void step(const optim::StepBuffers& b, const typename Rule::Hyper& hyper, ParallelFor parallel_for) {
  if (b.found_inf != nullptr && *b.found_inf != 0.0f) return;
  const int64_t t = *b.step + 1;
  const typename Rule::Scalars c = Rule::scalars(hyper, t);
  const uint64_t key = optim::step_key(b.seed, t);
  const int64_t blocks = (b.numel + kStateBlock - 1) / kStateBlock;
  const bool scalar = scalar_forced();
  FP8MP_DISPATCH_STATE(b.state_type, [&] {
    const auto run = [&](auto param_tag, auto grad_tag) {
      using P = decltype(param_tag);
      using G = decltype(grad_tag);
      parallel_for(0, blocks, 64, [&](int64_t first, int64_t last) {
        if (scalar) {
          step_blocks_scalar<Rule, P, G, kState>(b, c, key, first, last);
        } else {
          with_cpu_isa([&] { step_blocks<Rule, P, G, kState>(b, c, key, first, last); });
        }
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
