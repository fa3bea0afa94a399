// The AVX-512 encode (csrc/cast/encode_avx512.h) against fp8_format.h's scalar
// encode<F> on every fp32 bit pattern (with scale 1, which only quiets signaling
// NaNs, the same in both), every bf16 and fp16 bit pattern with several scales,
// runs of every length up to 140 (64-value steps, then a zero-padded one stored
// masked), negative, zero, infinite and NaN scales, and the amax as bits. And the 16x64 transpose and runs of
// 64x64 cast-transpose blocks against byte-by-byte ones. Skipped on CPUs without AVX-512.
#define CATCH_CONFIG_PREFIX_ALL
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "cast/encode_avx512.h"
#include "common/cpu_features.h"
#include "common/fp8_format.h"
#include "common/nan_keeping_scale.h"
#include "common/half_types.h"

#if FP8MP_AVX512_KERNELS
namespace {

using fp8mp::Fp8Format;

// First index where the vector and scalar encodes differ over x[0, n), or -1; and the amax bits match.
template <Fp8Format F, typename scalar_t>
int64_t first_mismatch(const scalar_t* x, int64_t n, float scale, std::vector<uint8_t>& y) {
  y.assign(size_t(n) + 1, 0xAA);  // one guard byte after the run: the tail must not write past it
  const uint32_t amax = fp8mp::cpu::encode_span_avx512<F>(x, y.data(), n, scale);
  uint32_t expected_amax = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float v = static_cast<float>(x[i]);
    expected_amax = std::max(expected_amax, fp8mp::float_to_bits(v) & 0x7FFFFFFFu);
    // scale_keep_nan: a NaN v keeps its sign, a NaN the product makes is +NaN (the GPU's bits too).
    if (y[i] != fp8mp::encode<F>(fp8mp::scale_keep_nan(v, scale))) return i;
  }
  CATCH_REQUIRE(y[n] == 0xAA);
  CATCH_REQUIRE(amax == expected_amax);
  return -1;
}

template <Fp8Format F>
void check_every_fp32() {
  constexpr int64_t kChunk = int64_t(1) << 20;
  std::vector<float> x(kChunk);
  std::vector<uint8_t> y;
  for (uint64_t start = 0; start < (uint64_t(1) << 32); start += kChunk) {
    for (int64_t i = 0; i < kChunk; ++i) x[i] = fp8mp::bits_to_float(uint32_t(start + uint64_t(i)));
    const int64_t bad = first_mismatch<F>(x.data(), kChunk, 1.0f, y);
    if (bad >= 0) {
      CATCH_INFO("fp32 bits 0x" << std::hex << fp8mp::float_to_bits(x[bad]) << ": vector 0x" << int(y[bad])
                                << ", scalar 0x" << int(fp8mp::encode<F>(x[bad])));
      CATCH_REQUIRE(bad < 0);
    }
  }
}

template <Fp8Format F, typename half_t>
void check_every_16bit() {
  std::vector<half_t> x(1 << 16);
  for (uint32_t b = 0; b < (1u << 16); ++b) x[b].bits = uint16_t(b);
  std::vector<uint8_t> y;
  // 1; a non-power of two; one that pushes values into saturation; one into the subnormals and to zero.
  for (float scale : {1.0f, 1.75f, 3.0e4f, 0.0009765625f, 1.0e-30f}) {
    CATCH_INFO("scale " << scale);
    CATCH_REQUIRE(first_mismatch<F>(x.data(), int64_t(x.size()), scale, y) == -1);
  }
}

}  // namespace

CATCH_TEST_CASE("AVX-512 encode equals the scalar encode on every fp32 bit pattern", "[encode][avx512]") {
  if (!fp8mp::cpu::cpu_features().avx512) CATCH_WARN("no AVX-512 on this CPU: skipped");
  if (!fp8mp::cpu::cpu_features().avx512) return;
  CATCH_SECTION("e4m3") { check_every_fp32<Fp8Format::E4M3>(); }
  CATCH_SECTION("e5m2") { check_every_fp32<Fp8Format::E5M2>(); }
}

CATCH_TEST_CASE("AVX-512 encode equals the scalar encode on every bf16 and fp16 bit pattern", "[encode][avx512]") {
  if (!fp8mp::cpu::cpu_features().avx512) return;
  check_every_16bit<Fp8Format::E4M3, fp8mp::bf16>();
  check_every_16bit<Fp8Format::E5M2, fp8mp::bf16>();
  check_every_16bit<Fp8Format::E4M3, fp8mp::fp16>();
  check_every_16bit<Fp8Format::E5M2, fp8mp::fp16>();
}

CATCH_TEST_CASE("AVX-512 encode handles every run length (the masked tail)", "[encode][avx512]") {
  if (!fp8mp::cpu::cpu_features().avx512) return;
  std::vector<float> x(141);
  for (size_t i = 0; i < x.size(); ++i) x[i] = (i % 2 ? -1.0f : 1.0f) * float(i * i) * 0.37f;
  x[97] = fp8mp::bits_to_float(0xFFC00001u);  // a NaN late in the run: the amax must see it from any run covering it
  std::vector<uint8_t> y;
  for (int64_t n = 0; n < int64_t(x.size()); ++n) {
    CATCH_INFO("n = " << n);
    CATCH_REQUIRE(first_mismatch<Fp8Format::E4M3>(x.data(), n, 2.5f, y) == -1);
    CATCH_REQUIRE(first_mismatch<Fp8Format::E5M2>(x.data() + 1, n, 2.5f, y) == -1);
  }
}

CATCH_TEST_CASE("AVX-512 encode with negative, zero, infinite and NaN scales", "[encode][avx512]") {
  if (!fp8mp::cpu::cpu_features().avx512) return;
  std::vector<fp8mp::bf16> x(1 << 16);
  for (uint32_t b = 0; b < (1u << 16); ++b) x[b].bits = uint16_t(b);
  std::vector<uint8_t> y;
  for (float scale : {-1.0f, -3.0e4f, 0.0f, -0.0f, INFINITY, -INFINITY, fp8mp::bits_to_float(0x7FC00000u),
                      fp8mp::bits_to_float(0xFF800001u)}) {
    CATCH_INFO("scale bits 0x" << std::hex << fp8mp::float_to_bits(scale));
    CATCH_REQUIRE(first_mismatch<Fp8Format::E4M3>(x.data(), int64_t(x.size()), scale, y) == -1);
    CATCH_REQUIRE(first_mismatch<Fp8Format::E5M2>(x.data(), int64_t(x.size()), scale, y) == -1);
  }
}

CATCH_TEST_CASE("AVX-512 64x64 transpose equals a byte-by-byte transpose", "[transpose][avx512]") {
  if (!fp8mp::cpu::cpu_features().avx512) return;
  const int64_t src_stride = 70, dst_stride = 83;  // neither a multiple of 16: unaligned rows
  std::vector<uint8_t> src(64 * src_stride), dst(64 * dst_stride, 0xEE);
  for (size_t i = 0; i < src.size(); ++i) src[i] = uint8_t(i * 131 + 7);
  fp8mp::cpu::transpose64x64_avx512(src.data(), src_stride, dst.data(), dst_stride);
  for (int64_t j = 0; j < 64; ++j) {
    for (int64_t i = 0; i < dst_stride; ++i) {
      const uint8_t expected = i < 64 ? src[i * src_stride + j] : uint8_t(0xEE);  // nothing else written
      CATCH_REQUIRE(dst[j * dst_stride + i] == expected);
    }
  }
}

CATCH_TEST_CASE("AVX-512 runs of 64x64 cast-transpose blocks equal the scalar encode, transposed",
                "[transpose][avx512]") {
  if (!fp8mp::cpu::cpu_features().avx512) return;
  // Runs of 1 to 4 blocks: with and without the prefetches of the blocks ahead. Unaligned rows, as
  // inside a larger matrix, and a margin in every row that nothing may write; then 64-byte aligned rows,
  // with ordinary and with non-temporal stores (streaming: taken only for aligned rows).
  for (const bool aligned : {false, true}) {
    for (const bool streaming : {false, true}) {
      for (int64_t blocks = 1; blocks <= 4; ++blocks) {
        CATCH_INFO("blocks = " << blocks << ", aligned rows " << aligned << ", streaming " << streaming);
        const int64_t width = 64 * blocks, x_stride = aligned ? width : width + 11;
        const int64_t y_stride = aligned ? width + 64 : width + 3, yt_stride = aligned ? 128 : 70;
        std::vector<fp8mp::fp16> x(64 * x_stride);
        for (size_t i = 0; i < x.size(); ++i) x[i].bits = uint16_t(i * 2654435761u >> 7);  // every kind of value, NaNs too
        std::vector<uint8_t> y_storage(64 * y_stride + 64, 0xEE), yt_storage(width * yt_stride + 64, 0xEE);
        const auto at_64 = [](std::vector<uint8_t>& v) {
          return v.data() + (64 - reinterpret_cast<uintptr_t>(v.data()) % 64) % 64;
        };
        uint8_t* const y = at_64(y_storage);
        uint8_t* const yt = at_64(yt_storage);
        const uint32_t amax = fp8mp::cpu::cast_transpose_rows64_avx512<Fp8Format::E5M2>(
            x.data(), x_stride, y, y_stride, yt, yt_stride, blocks, 0.375f, streaming);
        uint32_t expected_amax = 0;
        for (int64_t r = 0; r < 64; ++r) {
          for (int64_t c = 0; c < width; ++c) {
            const float v = static_cast<float>(x[r * x_stride + c]);
            expected_amax = std::max(expected_amax, fp8mp::float_to_bits(v) & 0x7FFFFFFFu);
            const uint8_t code = fp8mp::encode<Fp8Format::E5M2>(v * 0.375f);
            CATCH_REQUIRE(y[r * y_stride + c] == code);
            CATCH_REQUIRE(yt[c * yt_stride + r] == code);
          }
          for (int64_t c = width; c < y_stride; ++c) CATCH_REQUIRE(y[r * y_stride + c] == 0xEE);
        }
        for (int64_t c = 0; c < width; ++c) {
          for (int64_t r = 64; r < yt_stride; ++r) CATCH_REQUIRE(yt[c * yt_stride + r] == 0xEE);
        }
        CATCH_REQUIRE(amax == expected_amax);
      }
    }
  }
}
#endif
