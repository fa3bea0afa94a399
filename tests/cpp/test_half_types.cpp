// fp8mp's torch-free 16-bit storage types (common/half_types.h) convert like torch's
// c10::BFloat16 / c10::Half, bit for bit, over every 16-bit code and a dense sweep of
// fp32 bit patterns (every sign, exponent and rounding case, NaN and Inf included).
#define CATCH_CONFIG_PREFIX_ALL  // torch (glog-style logging) defines its own CHECK
#include <catch2/catch.hpp>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>
#include <cstring>

#include "common/half_types.h"

namespace {

uint32_t bits_of(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float float_of(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

template <typename Ours, typename Torch>
uint16_t torch_bits(float f) {
  const Torch t(f);
  uint16_t u;
  std::memcpy(&u, &t, 2);
  return u;
}

}  // namespace

CATCH_TEST_CASE("bf16 and fp16 decode every code like c10", "[half_types]") {
  for (uint32_t code = 0; code < 65536; ++code) {
    fp8mp::bf16 b;
    fp8mp::fp16 h;
    b.bits = h.bits = static_cast<uint16_t>(code);
    CATCH_REQUIRE(bits_of(static_cast<float>(b)) == bits_of(static_cast<float>(c10::BFloat16(code, c10::BFloat16::from_bits()))));
    CATCH_REQUIRE(bits_of(static_cast<float>(h)) == bits_of(static_cast<float>(c10::Half(code, c10::Half::from_bits()))));
  }
}

CATCH_TEST_CASE("bf16 and fp16 round fp32 like c10", "[half_types]") {
  // A stride of 251 visits every exponent with many mantissas; the low 16 values around
  // each half-way point are covered by the offsets below.
  uint64_t mismatches = 0;
  for (uint64_t u = 0; u < (uint64_t(1) << 32); u += 251) {
    for (uint32_t offset : {0u, 1u, 0xFFFu, 0x1000u, 0x1001u, 0x7FFFu, 0x8000u, 0x8001u}) {
      const float f = float_of(uint32_t(u) + offset);
      mismatches += fp8mp::bf16(f).bits != torch_bits<fp8mp::bf16, c10::BFloat16>(f);
      mismatches += fp8mp::fp16(f).bits != torch_bits<fp8mp::fp16, c10::Half>(f);
    }
  }
  CATCH_REQUIRE(mismatches == 0);
}
