// The arithmetic of fp8mp's fused optimizer steps, shared by the CPU and CUDA kernels (the functions are
// __host__ __device__ and both builds keep IEEE fp32 / fp64 semantics: no contraction, IEEE division and
// square root), so a step writes the same bits on either device:
//   * the update rules (AdamW, Lion), each written once, in fp32 on one element;
//   * the per-step scalars (bias corrections) from the step count, in fp64 by exponentiation by squaring
//     (no library pow, whose last bit differs between libm and CUDA);
//   * the state encodings: float32, bfloat16 (stochastic rounding) or float8_e4m3fn with one fp32 scale per
//     kStateBlock contiguous elements (absmax / 448, stochastic rounding); a rule may keep a state in the
//     square-root domain when it is FP8 (AdamW's second moment: sqrt(v) has the range of m, v twice that);
//   * the counter-based random bits of stochastic rounding: a splitmix64-style hash of
//     (seed, step, global element index), so a resumed run draws the same bits, and a shard of the tensor
//     (StepBuffers::element_offset) those of the whole;
//   * the NaN bits written, whatever NaN the arithmetic left (x86 and NVIDIA differ, and so do operand orders
//     that a compiler may swap): float32 0x7FC00000 (nan_keeping_scale.h's canonical NaN), bfloat16 0x7FC0,
//     E4M3 code 0x7F.
// Standard library only, like fp8_format.h.
#pragma once

#include <cmath>
#include <cstdint>

#include "common/fp8_format.h"
#include "blockwise/block_scale_rule.h"
#include "common/half_types.h"
#include "common/nan_keeping_scale.h"

namespace fp8mp::optim {

// Contiguous elements of a state that share one FP8 scale (the last block of a tensor may be shorter).
constexpr int64_t kStateBlock = 128;

enum class StateType : int { Float32 = 0, BFloat16 = 1, E4M3 = 2 };

FP8MP_HOST_DEVICE uint64_t mix64(uint64_t z) {
  z ^= z >> 30;
  z *= 0xBF58476D1CE4E5B9ull;
  z ^= z >> 27;
  z *= 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// The random key of one optimizer step `step` (1-based) of one tensor: (seed, step) mixed once.
FP8MP_HOST_DEVICE uint64_t step_key(uint64_t seed, int64_t step) {
  return mix64(seed + 0x9E3779B97F4A7C15ull * uint64_t(step));
}

// 64 random bits for element `index` of the tensor at one step, one mix per element, shared out among what
// the step rounds stochastically: bits 0-15 the bf16 parameter (param_random), bits 16-39 state 0 and
// bits 40-63 state 1 (state_random: 24 bits each, at the top of a 32-bit word).
FP8MP_HOST_DEVICE uint64_t element_random(uint64_t key, int64_t index) {
  return mix64(key ^ (uint64_t(index) * 0xD1B54A32D192ED03ull));
}
FP8MP_HOST_DEVICE uint32_t param_random(uint64_t random) { return uint32_t(random & 0xFFFFu); }
FP8MP_HOST_DEVICE uint32_t state_random(uint64_t random, int k) {
  return uint32_t((random >> (16 + 24 * k)) & 0xFFFFFFu) << 8;
}

// bf16 bits of x rounded stochastically: up (in magnitude) with probability (the dropped 16 bits) / 2^16
// against the low 16 bits of `random`,
// so the expected value is x. NaN becomes 0x7FC0 (torch's bits), Inf stays Inf; a finite value within one
// bf16 step of the largest rounds to Inf with the probability of crossing it, as nearest rounding would.
// Branch-free (the CPU loop vectorizes): Inf needs no case of its own, as adding less than 2^16 to its bits
// leaves their upper half as it is.
FP8MP_HOST_DEVICE uint16_t bf16_stochastic_bits(float x, uint32_t random) {
  const uint32_t u = float_to_bits(x);
  const int32_t rounded = int32_t((u + (random & 0xFFFFu)) >> 16);
  return uint16_t(select((u & 0x7FFFFFFFu) > 0x7F800000u, 0x7FC0, rounded));
}

FP8MP_HOST_DEVICE float bf16_bits_to_float(uint16_t bits) { return bits_to_float(uint32_t(bits) << 16); }

// base^n for n >= 0, by squaring: the same fp64 products on every device.
FP8MP_HOST_DEVICE double pow_by_squaring(double base, int64_t n) {
  double result = 1.0;
  while (n > 0) {
    if (n & 1) result = result * base;
    base = base * base;
    n >>= 1;
  }
  return result;
}

// IEEE square root, rounded to nearest, of a float or a double on both devices.
template <typename T>
FP8MP_HOST_DEVICE T ieee_sqrt(T x) {
#if defined(__CUDA_ARCH__)
  if constexpr (sizeof(T) == 4) {
    return __fsqrt_rn(x);
  } else {
    return __dsqrt_rn(x);
  }
#else
  return std::sqrt(x);
#endif
}

// The FP8 scale of a block whose largest magnitude is amax: values = decode(code) * scale. A zero block
// has scale 0 (its codes are 0), a block holding a NaN the canonical NaN.
FP8MP_HOST_DEVICE float state_block_scale(float amax) {
  return pin_nan(block_div(amax, FormatTraits<Fp8Format::E4M3>::kMax));
}
FP8MP_HOST_DEVICE float state_block_encode_multiplier(float amax) {
  return amax > 0.0f ? block_div(FormatTraits<Fp8Format::E4M3>::kMax, amax) : 0.0f;
}

// The E4M3 code of x (already in the block's units, |x| <= 448 up to rounding) rounded stochastically to one
// of its two neighbours, up (in magnitude) with probability (|x| - lo) / (hi - lo), so the expected value is
// x: an EMA whose step is below E4M3's spacing (AdamW's v at beta2 = 0.999, Lion's m at 0.99) still moves on
// average, where nearest rounding would freeze it. Normal range: 20 random bits added below the 3 mantissa
// bits kept, then truncated (a carry moves to the next binade, as it should). Subnormal range (|x| < 2^-6,
// spacing 2^-9): floor(|x| 2^9 + uniform). Branch-free; values just above 448 truncate to 448; NaN becomes
// 0x7F, whatever its sign. `keep_positive`: a positive x below the smallest subnormal keeps that subnormal
// instead of 0 (for AdamW's sqrt(v), a denominator: 0 would turn a surviving m into a step of m / eps).
FP8MP_HOST_DEVICE uint8_t e4m3_stochastic_code(float x, uint32_t random, bool keep_positive) {
  constexpr uint32_t kDropped = 23 - FormatTraits<Fp8Format::E4M3>::kManBits;  // 20 fp32 mantissa bits
  constexpr uint32_t kMinNormalBits = uint32_t(127 + 1 - FormatTraits<Fp8Format::E4M3>::kBias) << 23;  // 2^-6
  const uint32_t bits = float_to_bits(x);
  const uint32_t magnitude_bits = bits & 0x7FFFFFFFu;
  const uint32_t truncated = (magnitude_bits + (random >> (32 - kDropped))) & ~((1u << kDropped) - 1u);
  const int32_t normal_code = int32_t(encode<Fp8Format::E4M3>(bits_to_float(truncated)));  // exact: no rounding left
  const float uniform = float(random >> 8) * 0x1p-24f;
#if defined(__CUDA_ARCH__)
  const float subnormal_position = __fadd_rn(__fmul_rn(bits_to_float(magnitude_bits), 512.0f), uniform);
#else
  const float subnormal_position = bits_to_float(magnitude_bits) * 512.0f + uniform;
#endif
  int32_t code = select(magnitude_bits < kMinNormalBits, int32_t(subnormal_position), normal_code);
  code = select(keep_positive && code == 0 && magnitude_bits != 0u && (bits >> 31) == 0u, 1, code);
  const bool is_nan = magnitude_bits > 0x7F800000u;
  code = select(is_nan, kNanCode, code);
  return uint8_t(uint32_t(code) | uint32_t(select(is_nan, 0, int32_t((bits >> 24) & 0x80u))));
}

// ------------------------------------------------------------------------------------------------ AdamW
// Decoupled weight decay (Loshchilov & Hutter), torch.optim.AdamW's formula with t = step count after this step:
//   m = b1 m + (1 - b1) g;  v = b2 v + (1 - b2) g^2
//   p = p (1 - lr wd) - (lr / (1 - b1^t)) m / (sqrt(v) / sqrt(1 - b2^t) + eps)
struct AdamW {
  static constexpr int kStates = 2;
  // FP8 keeps sqrt(v) (state 1): it spans the range of m, where v spans its square.
  FP8MP_HOST_DEVICE static constexpr bool sqrt_domain(int k) { return k == 1; }
  struct Hyper {
    double lr, beta1, beta2, eps, weight_decay;
  };
  struct Scalars {
    float beta1, one_minus_beta1, beta2, one_minus_beta2, eps, decay, step_size, bias_correction2_sqrt;
  };

  FP8MP_HOST_DEVICE static Scalars scalars(const Hyper& h, int64_t t) {
    const double bias_correction1 = 1.0 - pow_by_squaring(h.beta1, t);
    const double bias_correction2 = 1.0 - pow_by_squaring(h.beta2, t);
    return {float(h.beta1), float(1.0 - h.beta1), float(h.beta2), float(1.0 - h.beta2), float(h.eps),
            float(1.0 - h.lr * h.weight_decay), float(h.lr / bias_correction1), float(ieee_sqrt(bias_correction2))};
  }

  // One element: the new parameter; s[0] = m and s[1] = v in, their new values out.
  FP8MP_HOST_DEVICE static float update(const Scalars& c, float g, float p, float* s) {
    const float m = c.beta1 * s[0] + c.one_minus_beta1 * g;
    const float v = c.beta2 * s[1] + c.one_minus_beta2 * (g * g);
    const float denom = block_div(ieee_sqrt(v), c.bias_correction2_sqrt) + c.eps;
    s[0] = m;
    s[1] = v;
    return p * c.decay - c.step_size * block_div(m, denom);
  }
};

// ------------------------------------------------------------------------------------------------- Lion
// Chen et al., "Symbolic Discovery of Optimization Algorithms" (2023), with decoupled weight decay:
//   p = p (1 - lr wd) - lr sign(b1 m + (1 - b1) g);  m = b2 m + (1 - b2) g
struct Lion {
  static constexpr int kStates = 1;
  FP8MP_HOST_DEVICE static constexpr bool sqrt_domain(int) { return false; }
  struct Hyper {
    double lr, beta1, beta2, weight_decay;
  };
  struct Scalars {
    float lr, beta1, one_minus_beta1, beta2, one_minus_beta2, decay;
  };

  FP8MP_HOST_DEVICE static Scalars scalars(const Hyper& h, int64_t) {
    return {float(h.lr), float(h.beta1), float(1.0 - h.beta1), float(h.beta2), float(1.0 - h.beta2),
            float(1.0 - h.lr * h.weight_decay)};
  }

  FP8MP_HOST_DEVICE static float update(const Scalars& c, float g, float p, float* s) {
    const float interpolated = c.beta1 * s[0] + c.one_minus_beta1 * g;
    const float sign = interpolated > 0.0f ? 1.0f : (interpolated < 0.0f ? -1.0f : 0.0f);
    s[0] = c.beta2 * s[0] + c.one_minus_beta2 * g;
    return p * c.decay - c.lr * sign;
  }
};

// -------------------------------------------------------------------------------------- element access
template <typename T>
FP8MP_HOST_DEVICE float load_float(const T* data, int64_t i) {
  return float(data[i]);
}

// An FP8 state's value as the rule sees it: the decoded code times its block's scale, squared back out of the
// sqrt domain.
FP8MP_HOST_DEVICE float fp8_state_value(float decoded, float scale, bool sqrt_domain) {
  const float stored = decoded * scale;
  return sqrt_domain ? stored * stored : stored;
}

// One state value as the rule sees it.
template <StateType S>
FP8MP_HOST_DEVICE float load_state(const void* data, int64_t i, float scale, bool sqrt_domain) {
  if constexpr (S == StateType::Float32) {
    return static_cast<const float*>(data)[i];
  } else if constexpr (S == StateType::BFloat16) {
    return bf16_bits_to_float(static_cast<const uint16_t*>(data)[i]);
  } else {
    return fp8_state_value(decode<Fp8Format::E4M3>(static_cast<const uint8_t*>(data)[i]), scale, sqrt_domain);
  }
}

// What an FP8 state stores of the rule's new value (before its block's scale).
FP8MP_HOST_DEVICE float fp8_stored_value(float value, bool sqrt_domain) {
  return sqrt_domain ? ieee_sqrt(value) : value;
}

// A new state value written as float32 (a NaN canonical) or bfloat16 (the FP8 states are written per block, by the kernels);
// `random` is state_random's word.
template <StateType S>
FP8MP_HOST_DEVICE void store_wide_state(void* data, int64_t i, float value, uint32_t random) {
  if constexpr (S == StateType::Float32) {
    static_cast<float*>(data)[i] = pin_nan(value);
  } else {
    static_cast<uint16_t*>(data)[i] = bf16_stochastic_bits(value, random >> 16);
  }
}

// The new parameter: float32 exactly (a NaN canonical), bfloat16 with stochastic rounding (`random`:
// element_random's bits).
FP8MP_HOST_DEVICE void store_param(float* data, int64_t i, float value, uint64_t) { data[i] = pin_nan(value); }
FP8MP_HOST_DEVICE void store_param(bf16* data, int64_t i, float value, uint64_t random) {
  data[i].bits = bf16_stochastic_bits(value, param_random(random));
}

// Dispatch runtime dtypes to compile-time ones: FP8MP_DISPATCH_STATE(s, [&] { f<kState>(); }).
#define FP8MP_DISPATCH_STATE(STATE, ...)                                  \
  [&] {                                                                   \
    if ((STATE) == ::fp8mp::optim::StateType::Float32) {                  \
      constexpr auto kState = ::fp8mp::optim::StateType::Float32;         \
      return __VA_ARGS__();                                               \
    } else if ((STATE) == ::fp8mp::optim::StateType::BFloat16) {          \
      constexpr auto kState = ::fp8mp::optim::StateType::BFloat16;        \
      return __VA_ARGS__();                                               \
    } else {                                                              \
      constexpr auto kState = ::fp8mp::optim::StateType::E4M3;            \
      return __VA_ARGS__();                                               \
    }                                                                     \
  }()

// The buffers of one step of one parameter (device pointers on CUDA). state_scale[k] is null unless the
// states are E4M3; found_inf may be null (never skip).
struct StepBuffers {
  void* param;
  bool param_is_bf16;
  const void* grad;
  bool grad_is_bf16;
  StateType state_type;
  void* state[2];
  float* state_scale[2];
  int64_t* step;
  const float* found_inf;
  int64_t numel;
  uint64_t seed;
  // The global index of element 0 (a shard's offset in the whole tensor): the random bits of element i are
  // element_random(key, element_offset + i), so a sharded step draws the bits of the unsharded one. A multiple
  // of kStateBlock when the states are E4M3, so that the blocks are the whole tensor's.
  int64_t element_offset;
};

}  // namespace fp8mp::optim
