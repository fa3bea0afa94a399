// The block-scaled kernels of csrc/blockwise without torch: the tile scale rule of block_scale_rule.h
// (shared with the CUDA kernels) against the documented formulas written independently here with
// <cmath> (ilogb, ldexp, double division), and the CPU block_quantize / block_quantize_transpose /
// block_scaled_gemm kernels on small tensors: edge tiles scaled from the elements they have, the
// NaN / Inf rules, the two layouts of the transpose, the per-chunk scales of the GEMM.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "blockwise/block_scale_layout.h"
#include "blockwise/block_scale_rule.h"
#include "blockwise/blockwise_cpu_kernels.h"
#include "common/fp8_format.h"
#include "float_bits.h"

using fp8mp::BlockScaleMode;
using fp8mp::Fp8Format;
using fp8mp::HpType;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNan = std::numeric_limits<float>::quiet_NaN();

using fp8mp_test::bits;
using fp8mp_test::from_bits;
using fp8mp_test::serial_for;

// Positive finite floats from random bit patterns (every exponent, subnormals included), plus the edges.
std::vector<float> amax_samples() {
  std::vector<float> v = {0.0f, std::numeric_limits<float>::denorm_min(), 0x1p-127f, 0x1p-126f, 1e-12f, 1.0f,
                          448.0f, 449.0f, 447.99997f, 57344.0f, 0x1p100f, std::numeric_limits<float>::max()};
  std::mt19937 rng(7);
  for (int i = 0; i < 20000; ++i) v.push_back(from_bits(rng() & 0x7F7FFFFFu));
  return v;
}

int clamp_int(int v, int lo, int hi) { return v < lo ? lo : (v > hi ? hi : v); }

// OCP MX v1.0: floor(log2(amax)) - emax_elem, biased by 127, in [0, 254] (amax 0 counts as the smallest).
int floor_code_reference(float amax, int emax_elem) {
  const int floor_log2 = amax == 0.0f ? -1000 : std::ilogb(amax);
  return clamp_int(floor_log2 - emax_elem, -127, 127) + 127;
}

// NVIDIA RCEIL: the smallest 2^e >= amax / fp8_max (the fp32 quotient), e in [-127, 127].
int rceil_code_reference(float amax, float fp8_max) {
  const float descale = amax / fp8_max;
  if (descale == 0.0f) return 0;
  int e = std::ilogb(descale);
  if (std::ldexp(1.0, e) < double(descale)) ++e;
  return clamp_int(e, -127, 127) + 127;
}

template <Fp8Format F>
float dequantized(uint8_t code, float scale_inv) {
  return fp8mp::decode<F>(code) * scale_inv;
}

}  // namespace

TEST_CASE("fp32 and pow2 tile scales are fp8_max / max(amax, 1e-12), in double, then rounded down", "[blockwise]") {
  for (const float amax : amax_samples()) {
    const double reference = 448.0 / std::max(double(amax), 1e-12);
    const auto s = fp8mp::block_tile_scale<Fp8Format::E4M3>(amax, BlockScaleMode::Fp32);
    REQUIRE(s.multiplier == float(reference));
    REQUIRE(s.scale_inv == 1.0f / float(reference));
    const auto p = fp8mp::block_tile_scale<Fp8Format::E4M3>(amax, BlockScaleMode::Pow2);
    if (std::isinf(float(reference))) {
      REQUIRE(std::isinf(p.multiplier));  // amax below 448 / FLT_MAX: no power of two to round to
    } else {
      int e = 0;
      REQUIRE(std::frexp(p.multiplier, &e) == 0.5f);                    // a power of two ...
      REQUIRE(p.multiplier <= float(reference));                        // ... at most the fp32 scale
      REQUIRE(2.0 * double(p.multiplier) > double(float(reference)));  // ... and the largest such
      REQUIRE(p.scale_inv * p.multiplier == 1.0f);                      // dequantization is exact
    }
  }
  const auto e5m2 = fp8mp::block_tile_scale<Fp8Format::E5M2>(57344.0f, BlockScaleMode::Fp32);
  REQUIRE((e5m2.multiplier == 1.0f && e5m2.scale_inv == 1.0f));
}

TEST_CASE("E8M0 floor codes are OCP MX v1.0's floor(log2(amax)) - emax_elem", "[blockwise]") {
  for (const float amax : amax_samples()) {
    for (const auto [format_e4m3, emax] : {std::pair{true, 8}, std::pair{false, 15}}) {
      const auto s = format_e4m3 ? fp8mp::block_tile_scale<Fp8Format::E4M3>(amax, BlockScaleMode::E8m0Floor)
                                 : fp8mp::block_tile_scale<Fp8Format::E5M2>(amax, BlockScaleMode::E8m0Floor);
      const int code = floor_code_reference(amax, emax);
      REQUIRE(int(s.e8m0_code) == code);
      // x is divided by 2^(code - 127), or by the smallest normal float for code 0.
      REQUIRE(double(s.multiplier) == std::ldexp(1.0, -std::max(code - 127, -126)));
    }
  }
  // amax = 1.0 in E4M3: e = 0 - 8, code 119, x * 256; 448 = 1.75 * 2^8: code 127.
  REQUIRE(int(fp8mp::block_tile_scale<Fp8Format::E4M3>(1.0f, BlockScaleMode::E8m0Floor).e8m0_code) == 119);
  REQUIRE(int(fp8mp::block_tile_scale<Fp8Format::E4M3>(448.0f, BlockScaleMode::E8m0Floor).e8m0_code) == 127);
}

TEST_CASE("E8M0 rceil codes are the smallest power of two >= amax / fp8_max", "[blockwise]") {
  for (const float amax : amax_samples()) {
    const auto s = fp8mp::block_tile_scale<Fp8Format::E4M3>(amax, BlockScaleMode::E8m0Rceil);
    const int code = rceil_code_reference(amax, 448.0f);
    REQUIRE(int(s.e8m0_code) == code);
    REQUIRE(double(s.multiplier) == (code == 0 ? 1.0 : std::ldexp(1.0, 127 - code)));
    if (code > 0 && code < 254) REQUIRE(amax * s.multiplier <= 448.0f);  // every element fits without clamping
    const auto e5 = fp8mp::block_tile_scale<Fp8Format::E5M2>(amax, BlockScaleMode::E8m0Rceil);
    REQUIRE(int(e5.e8m0_code) == rceil_code_reference(amax, 57344.0f));
  }
  REQUIRE(int(fp8mp::block_tile_scale<Fp8Format::E4M3>(448.0f, BlockScaleMode::E8m0Rceil).e8m0_code) == 127);
  REQUIRE(int(fp8mp::block_tile_scale<Fp8Format::E4M3>(449.0f, BlockScaleMode::E8m0Rceil).e8m0_code) == 128);
}

TEST_CASE("a NaN amax gives NaN scales, an Inf amax a zero scale (fp32) or the top codes (E8M0)", "[blockwise]") {
  using fp8mp::block_tile_scale;
  const auto nan32 = block_tile_scale<Fp8Format::E4M3>(kNan, BlockScaleMode::Fp32);
  REQUIRE((bits(nan32.scale_inv) == fp8mp::kCanonicalNanBits && bits(nan32.multiplier) == fp8mp::kCanonicalNanBits));
  REQUIRE(int(block_tile_scale<Fp8Format::E4M3>(kNan, BlockScaleMode::E8m0Floor).e8m0_code) == 255);
  REQUIRE(int(block_tile_scale<Fp8Format::E4M3>(kNan, BlockScaleMode::E8m0Rceil).e8m0_code) == 255);
  const auto inf32 = block_tile_scale<Fp8Format::E4M3>(kInf, BlockScaleMode::Pow2);
  REQUIRE((inf32.multiplier == 0.0f && std::isinf(inf32.scale_inv)));
  REQUIRE(int(block_tile_scale<Fp8Format::E4M3>(kInf, BlockScaleMode::E8m0Floor).e8m0_code) == 128 - 8 + 127);
  REQUIRE(int(block_tile_scale<Fp8Format::E4M3>(kInf, BlockScaleMode::E8m0Rceil).e8m0_code) == 254);
  // The element rule: a NaN input keeps its sign, a NaN the scaling makes is +NaN.
  REQUIRE(fp8mp::block_encode<Fp8Format::E4M3>(-kNan, 1.0f, false) == 0xFF);
  REQUIRE(fp8mp::block_encode<Fp8Format::E4M3>(-kNan, kNan, false) == 0xFF);
  REQUIRE(fp8mp::block_encode<Fp8Format::E4M3>(-kInf, 0.0f, false) == 0x7F);  // x86 alone would write 0xFF
  REQUIRE(fp8mp::block_encode<Fp8Format::E4M3>(-2.0f, kNan, true) == 0x7F);
  REQUIRE(fp8mp::block_encode<Fp8Format::E4M3>(-1000.0f, 1.0f, true) == 0xFE);  // clamped to -448
}

TEST_CASE("block_quantize scales every tile, edge tiles included, from its own elements", "[blockwise]") {
  const int64_t rows = 5, cols = 7, block_rows = 2, block_cols = 3;  // tiles of 2x3, 2x1, 1x3 and 1x1 at the edges
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(size_t(rows * cols));
  for (int64_t i = 0; i < rows * cols; ++i) x[size_t(i)] = normal(rng) * std::ldexp(1.0f, int(i % 9) - 4);
  for (const auto mode : {BlockScaleMode::Fp32, BlockScaleMode::Pow2, BlockScaleMode::E8m0Floor,
                          BlockScaleMode::E8m0Rceil}) {
    std::vector<uint8_t> y(x.size());
    std::vector<float> scale_f(3 * 3);
    std::vector<uint8_t> scale_e(3 * 3);
    void* scale = fp8mp::is_e8m0(mode) ? static_cast<void*>(scale_e.data()) : static_cast<void*>(scale_f.data());
    fp8mp::cpu::block_quantize(x.data(), HpType::Float32, rows, cols, block_rows, block_cols, Fp8Format::E4M3, mode,
                               y.data(), scale, serial_for);
    for (int64_t tr = 0; tr < 3; ++tr) {
      for (int64_t tc = 0; tc < 3; ++tc) {
        float amax = 0.0f;
        for (int64_t r = tr * 2; r < std::min<int64_t>(rows, tr * 2 + 2); ++r) {
          for (int64_t c = tc * 3; c < std::min<int64_t>(cols, tc * 3 + 3); ++c) amax = std::max(amax, std::fabs(x[size_t(r * cols + c)]));
        }
        const auto s = fp8mp::block_tile_scale<Fp8Format::E4M3>(amax, mode);
        const float scale_inv = fp8mp::is_e8m0(mode) ? std::ldexp(1.0f, int(scale_e[size_t(tr * 3 + tc)]) - 127)
                                                     : scale_f[size_t(tr * 3 + tc)];
        if (fp8mp::is_e8m0(mode)) {
          REQUIRE(scale_e[size_t(tr * 3 + tc)] == s.e8m0_code);
        } else {
          REQUIRE(scale_inv == s.scale_inv);
        }
        for (int64_t r = tr * 2; r < std::min<int64_t>(rows, tr * 2 + 2); ++r) {
          for (int64_t c = tc * 3; c < std::min<int64_t>(cols, tc * 3 + 3); ++c) {
            const float v = x[size_t(r * cols + c)];
            const uint8_t code = y[size_t(r * cols + c)];
            REQUIRE(code == fp8mp::block_encode<Fp8Format::E4M3>(v, s.multiplier, fp8mp::is_e8m0(mode)));
            // The tile's largest element dequantizes to within E4M3's half step (2^-4) of itself.
            if (std::fabs(v) == amax && amax > 0.0f) {
              REQUIRE(std::fabs(dequantized<Fp8Format::E4M3>(code, scale_inv) - v) <= amax * 0x1p-4f);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("block_quantize_transpose is block_quantize of x and of x^T", "[blockwise]") {
  const int64_t rows = 37, cols = 20, row_block = 8, col_block = 16;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> x(size_t(rows * cols)), xt(x.size());
  for (auto& v : x) v = normal(rng);
  x[3] = -kNan;
  x[5 * cols + 7] = kInf;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) xt[size_t(c * rows + r)] = x[size_t(r * cols + c)];
  }
  for (const auto mode : {BlockScaleMode::Fp32, BlockScaleMode::E8m0Rceil}) {
    const size_t n_scale = size_t(rows * 3), n_scale_t = size_t(cols * 3);
    std::vector<uint8_t> y(x.size()), y_t(x.size()), ref(x.size()), ref_t(x.size());
    std::vector<float> s(n_scale), s_t(n_scale_t), ref_s(n_scale), ref_s_t(n_scale_t);  // fp32 or E8M0 bytes
    fp8mp::cpu::block_quantize_transpose(x.data(), HpType::Float32, rows, cols, row_block, col_block, Fp8Format::E5M2,
                                         mode, y.data(), s.data(), y_t.data(), s_t.data(), serial_for);
    fp8mp::cpu::block_quantize(x.data(), HpType::Float32, rows, cols, 1, row_block, Fp8Format::E5M2, mode, ref.data(),
                               ref_s.data(), serial_for);
    fp8mp::cpu::block_quantize(xt.data(), HpType::Float32, cols, rows, 1, col_block, Fp8Format::E5M2, mode,
                               ref_t.data(), ref_s_t.data(), serial_for);
    REQUIRE(y == ref);
    REQUIRE(y_t == ref_t);
    REQUIRE(std::memcmp(s.data(), ref_s.data(), n_scale * sizeof(float)) == 0);
    REQUIRE(std::memcmp(s_t.data(), ref_s_t.data(), n_scale_t * sizeof(float)) == 0);
    REQUIRE(y[3] == 0xFF);  // -NaN keeps its sign in both layouts
    REQUIRE(y_t[size_t(3 * rows)] == 0xFF);
  }
}

TEST_CASE("block_scaled_gemm multiplies each K chunk's sum by that chunk's two scales", "[blockwise]") {
  // a [2, K] and b [3, K] all ones (E4M3 code 0x38), K = 10 in chunks of 4, 4 and 2; scale_inv per chunk.
  const int64_t M = 2, N = 3, K = 10, block_k = 4, chunks = 3;
  std::vector<uint8_t> a(size_t(M * K), 0x38), b(size_t(N * K), 0x38);
  std::vector<float> sa = {1.0f, 2.0f, 4.0f, 0.5f, 0.25f, 8.0f};               // [M, chunks]
  std::vector<float> sb = {1.0f, 1.0f, 1.0f, 3.0f, 0.0f, 1.0f, 0.125f, 2.0f, 16.0f};  // [N, chunks]
  const fp8mp::cpu::BatchedMatmulNtFp32 matmul = [](const float* x, const float* y, float* out, int64_t batch,
                                                    int64_t r, int64_t n, int64_t k) {
    for (int64_t p = 0; p < batch; ++p) {
      for (int64_t i = 0; i < r; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          float acc = 0.0f;
          for (int64_t q = 0; q < k; ++q) acc += x[(p * r + i) * k + q] * y[(p * n + j) * k + q];
          out[(p * r + i) * n + j] = acc;
        }
      }
    }
  };
  std::vector<float> out(size_t(M * N));
  const std::vector<float> bias = {0.5f, -1.0f, 0.0f};
  fp8mp::cpu::block_scaled_gemm({a.data(), Fp8Format::E4M3, sa.data(), fp8mp::cpu::BlockScaleType::Fp32, 1},
                                {b.data(), Fp8Format::E4M3, sb.data(), fp8mp::cpu::BlockScaleType::Fp32, 1}, M, N, K,
                                block_k, bias.data(), out.data(), HpType::Float32, matmul, serial_for);
  const float width[chunks] = {4.0f, 4.0f, 2.0f};
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t n = 0; n < N; ++n) {
      float want = 0.0f;
      for (int64_t c = 0; c < chunks; ++c) want += width[c] * (sa[size_t(m * chunks + c)] * sb[size_t(n * chunks + c)]);
      REQUIRE(out[size_t(m * N + n)] == want + bias[size_t(n)]);
    }
  }
}

TEST_CASE("cuBLASLt scale layouts: each a bijection, VEC32 the 128x4 swizzle of torchao's to_blocked", "[blockwise]") {
  using fp8mp::LtScaleLayout;
  for (const auto layout : {LtScaleLayout::OuterVec, LtScaleLayout::Vec128, LtScaleLayout::Blk128x128,
                            LtScaleLayout::Vec32Swizzled}) {
    for (const auto [rows, k_tiles] : {std::pair<int64_t, int64_t>{1, 1}, {130, 3}, {256, 8}, {208, 10}, {7, 5}}) {
      const fp8mp::LtScaleShape shape = fp8mp::lt_scale_shape(layout, rows, k_tiles);
      std::vector<int> hits(size_t(shape.elements), 0);
      for (int64_t o = 0; o < shape.outer; ++o) {
        for (int64_t k = 0; k < shape.k_tiles; ++k) {
          const int64_t at = fp8mp::lt_scale_offset(layout, shape, o, k);
          REQUIRE((at >= 0 && at < shape.elements));
          ++hits[size_t(at)];
        }
      }
      for (const int h : hits) REQUIRE(h == 1);
    }
  }
  // Shapes as cuBLASLt documents them for an operand of 208 rows and 10 K chunks.
  const auto vec128 = fp8mp::lt_scale_shape(LtScaleLayout::Vec128, 206, 10);
  REQUIRE((vec128.outer == 208 && vec128.k_tiles == 10));  // rows padded to 4, K-chunk major
  REQUIRE(fp8mp::lt_scale_offset(LtScaleLayout::Vec128, vec128, 5, 2) == 2 * 208 + 5);
  const auto blk = fp8mp::lt_scale_shape(LtScaleLayout::Blk128x128, 300, 5);
  REQUIRE((blk.outer == 3 && blk.k_tiles == 8));  // row blocks, K blocks padded to 4
  REQUIRE(fp8mp::lt_scale_offset(LtScaleLayout::Blk128x128, blk, 2, 3) == 2 * 8 + 3);

  // torchao's to_blocked, step by step: pad [rows, k] to [128 * rb, 4 * cb], view as (rb, 128, cb, 4),
  // permute to (rb, cb, 128, 4), reshape each 128 x 4 block to (4, 32, 4), swap the first two axes
  // (-> 32, 4, 4) and flatten.
  const int64_t rows = 300, k = 6, rb = 3, cb = 2;
  std::vector<int64_t> blocked;
  for (int64_t b_row = 0; b_row < rb; ++b_row) {
    for (int64_t b_col = 0; b_col < cb; ++b_col) {
      for (int64_t j = 0; j < 32; ++j) {
        for (int64_t i = 0; i < 4; ++i) {
          for (int64_t c = 0; c < 4; ++c) blocked.push_back((b_row * 128 + i * 32 + j) * (4 * cb) + b_col * 4 + c);
        }
      }
    }
  }
  const auto swz = fp8mp::lt_scale_shape(LtScaleLayout::Vec32Swizzled, rows, k);
  REQUIRE((swz.outer == 384 && swz.k_tiles == 8 && int64_t(blocked.size()) == swz.elements));
  for (int64_t o = 0; o < swz.outer; ++o) {
    for (int64_t kk = 0; kk < swz.k_tiles; ++kk) {
      REQUIRE(blocked[size_t(fp8mp::lt_scale_offset(LtScaleLayout::Vec32Swizzled, swz, o, kk))] == o * (4 * cb) + kk);
    }
  }
}
