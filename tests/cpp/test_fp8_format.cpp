// encode/decode of fp8_format.h against an independent reading of the OCP FP8
// spec: values from the bit-field formula, rounding by searching the sorted
// list of representable values. Needs neither Python nor torch.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "common/fp8_format.h"

using fp8mp::decode;
using fp8mp::encode;
using fp8mp::Fp8Format;

namespace {

struct Spec {
  int man_bits, bias;
  bool has_inf;
  double max;
};

template <Fp8Format F>
Spec spec() {
  return F == Fp8Format::E4M3 ? Spec{3, 7, false, 448.0} : Spec{2, 15, true, 57344.0};
}

// The value of a code from the spec's bit fields (NaN as quiet NaN).
template <Fp8Format F>
double spec_value(int code) {
  const Spec s = spec<F>();
  const int sign = code >> 7, mag = code & 0x7F;
  const int exponent = mag >> s.man_bits, mantissa = mag & ((1 << s.man_bits) - 1);
  const int max_exponent = (1 << (7 - s.man_bits)) - 1;
  double value;
  if (!s.has_inf && mag == 0x7F) {
    value = std::numeric_limits<double>::quiet_NaN();
  } else if (s.has_inf && exponent == max_exponent) {
    value = mantissa == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  } else if (exponent == 0) {
    value = std::ldexp(double(mantissa), 1 - s.bias - s.man_bits);
  } else {
    value = std::ldexp(1.0 + double(mantissa) / double(1 << s.man_bits), exponent - s.bias);
  }
  return sign ? -value : value;
}

// Reference rounding: nearest finite non-negative value, ties to the even code, saturating.
template <Fp8Format F>
int reference_encode(float x) {
  const Spec s = spec<F>();
  const int sign = std::signbit(x) ? 0x80 : 0;
  if (std::isnan(x)) return sign | 0x7F;
  if (std::isinf(x)) return sign | (s.has_inf ? 0x7C : 0x7E);
  const double a = std::fabs(double(x));
  if (a >= s.max) return sign | (s.has_inf ? 0x7B : 0x7E);
  std::vector<std::pair<double, int>> finite;
  for (int code = 0; code < 0x80; ++code) {
    const double v = spec_value<F>(code);
    if (std::isfinite(v)) finite.emplace_back(v, code);
  }
  auto hi = std::lower_bound(finite.begin(), finite.end(), std::make_pair(a, -1));
  if (hi->first == a) return sign | hi->second;
  auto lo = hi - 1;
  const double d_lo = a - lo->first, d_hi = hi->first - a;
  if (d_lo < d_hi) return sign | lo->second;
  if (d_hi < d_lo) return sign | hi->second;
  return sign | ((lo->second % 2 == 0) ? lo->second : hi->second);
}

template <Fp8Format F>
void check_all_codes_decode() {
  for (int code = 0; code < 256; ++code) {
    const double expected = spec_value<F>(code);
    const float got = decode<F>(uint8_t(code));
    INFO("code " << code);
    if (std::isnan(expected)) {
      REQUIRE(std::isnan(got));
    } else {
      REQUIRE(double(got) == expected);
      REQUIRE(std::signbit(got) == bool(code & 0x80));
    }
  }
}

template <Fp8Format F>
void check_all_codes_round_trip() {
  for (int code = 0; code < 256; ++code) {
    const float v = decode<F>(uint8_t(code));
    const int expected = std::isnan(v) ? ((code & 0x80) | 0x7F) : code;
    INFO("code " << code << " value " << v);
    REQUIRE(int(encode<F>(v)) == expected);
  }
}

template <Fp8Format F>
void check_ties_and_neighbours() {
  for (int code = 0; code < 0x7F; ++code) {
    const double lo = spec_value<F>(code), hi = spec_value<F>(code + 1);
    if (!std::isfinite(lo) || !std::isfinite(hi)) continue;
    const float mid = float((lo + hi) / 2);  // exact in fp32
    REQUIRE(double(mid) == (lo + hi) / 2);
    const int even = code % 2 == 0 ? code : code + 1;
    INFO("between codes " << code << " and " << code + 1);
    REQUIRE(int(encode<F>(mid)) == even);
    REQUIRE(int(encode<F>(-mid)) == (even | 0x80));
    REQUIRE(int(encode<F>(std::nextafter(mid, 0.0f))) == code);
    REQUIRE(int(encode<F>(std::nextafter(mid, INFINITY))) == code + 1);
  }
}

template <Fp8Format F>
void check_fp32_sweep() {
  // Every 251st fp32 bit pattern (17 million values, all exponents, both signs).
  std::vector<int> mismatches;
  for (uint64_t bits = 0; bits <= 0xFFFFFFFFull; bits += 251) {
    const float x = fp8mp::bits_to_float(uint32_t(bits));
    const int got = encode<F>(x), expected = reference_encode<F>(x);
    if (got != expected && mismatches.size() < 5) mismatches.push_back(int(bits));
  }
  REQUIRE(mismatches.empty());
}

}  // namespace

TEST_CASE("E4M3 decode of all 256 codes follows the spec", "[format]") { check_all_codes_decode<Fp8Format::E4M3>(); }
TEST_CASE("E5M2 decode of all 256 codes follows the spec", "[format]") { check_all_codes_decode<Fp8Format::E5M2>(); }
TEST_CASE("E4M3 encode(decode(code)) == code", "[format]") { check_all_codes_round_trip<Fp8Format::E4M3>(); }
TEST_CASE("E5M2 encode(decode(code)) == code", "[format]") { check_all_codes_round_trip<Fp8Format::E5M2>(); }
TEST_CASE("E4M3 ties round to even", "[format]") { check_ties_and_neighbours<Fp8Format::E4M3>(); }
TEST_CASE("E5M2 ties round to even", "[format]") { check_ties_and_neighbours<Fp8Format::E5M2>(); }
TEST_CASE("E4M3 matches the reference on a sweep of fp32", "[format][sweep]") { check_fp32_sweep<Fp8Format::E4M3>(); }
TEST_CASE("E5M2 matches the reference on a sweep of fp32", "[format][sweep]") { check_fp32_sweep<Fp8Format::E5M2>(); }

TEST_CASE("saturation and specials", "[format]") {
  const float inf = std::numeric_limits<float>::infinity(), nan = std::numeric_limits<float>::quiet_NaN();
  // E4M3: no Inf; everything beyond 448 saturates, NaN is S.1111.111.
  CHECK(int(encode<Fp8Format::E4M3>(448.0f)) == 0x7E);
  CHECK(int(encode<Fp8Format::E4M3>(464.0f)) == 0x7E);  // midpoint to the NaN code: saturates
  CHECK(int(encode<Fp8Format::E4M3>(1e30f)) == 0x7E);
  CHECK(int(encode<Fp8Format::E4M3>(-std::numeric_limits<float>::max())) == 0xFE);
  CHECK(int(encode<Fp8Format::E4M3>(inf)) == 0x7E);
  CHECK(int(encode<Fp8Format::E4M3>(-inf)) == 0xFE);
  CHECK(int(encode<Fp8Format::E4M3>(nan)) == 0x7F);
  CHECK(int(encode<Fp8Format::E4M3>(-nan)) == 0xFF);
  // E5M2: finite overflow saturates to 57344, Inf stays Inf.
  CHECK(int(encode<Fp8Format::E5M2>(61440.0f)) == 0x7B);
  CHECK(int(encode<Fp8Format::E5M2>(-1e38f)) == 0xFB);
  CHECK(int(encode<Fp8Format::E5M2>(inf)) == 0x7C);
  CHECK(int(encode<Fp8Format::E5M2>(-inf)) == 0xFC);
  CHECK(int(encode<Fp8Format::E5M2>(nan)) == 0x7F);
  // Signed zero and the subnormal boundary.
  CHECK(int(encode<Fp8Format::E4M3>(0.0f)) == 0x00);
  CHECK(int(encode<Fp8Format::E4M3>(-0.0f)) == 0x80);
  CHECK(int(encode<Fp8Format::E5M2>(-0.0f)) == 0x80);
  const float e4m3_min_subnormal = std::ldexp(1.0f, -9), e5m2_min_subnormal = std::ldexp(1.0f, -16);
  CHECK(int(encode<Fp8Format::E4M3>(e4m3_min_subnormal)) == 0x01);
  CHECK(int(encode<Fp8Format::E4M3>(e4m3_min_subnormal / 2)) == 0x00);  // tie to even (zero)
  CHECK(int(encode<Fp8Format::E4M3>(std::nextafter(e4m3_min_subnormal / 2, 1.0f))) == 0x01);
  CHECK(int(encode<Fp8Format::E5M2>(e5m2_min_subnormal * 1.5f)) == 0x02);  // tie between 1 and 2 -> 2
  CHECK(int(encode<Fp8Format::E4M3>(std::numeric_limits<float>::denorm_min())) == 0x00);
  CHECK(int(encode<Fp8Format::E4M3>(-std::numeric_limits<float>::denorm_min())) == 0x80);
}
