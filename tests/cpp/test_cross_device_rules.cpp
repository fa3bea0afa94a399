// The host logic of the CUDA code, checked without a GPU: which path block_scaled_gemm takes on each GPU
// generation and cuBLASLt (block_gemm_path.h), how it pads a 1 x 128 operand, which GPUs a build holds code
// for (device_support.h), and the NaN bits both devices write (nan_keeping_scale.h) through the CPU kernels.
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "blockwise/block_gemm_path.h"
#include "blockwise/block_gemm_recipe.h"
#include "blockwise/block_scale_layout.h"
#include "cast/cast_cpu_kernels.h"
#include "common/device_support.h"
#include "common/fp8_format.h"
#include "float_bits.h"
#include "gemm/heuristic_shape.h"
#include "common/nan_keeping_scale.h"
#include "norm/norm_cpu_kernels.h"
#include "scale_update/scale_rule.h"

using fp8mp::BlockGemmPath;
using fp8mp::BlockGemmRecipe;
using fp8mp::Fp8Format;
using fp8mp::HpType;

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr uint32_t kPositiveQuietNan = 0x7FC00000u;  // IEEE 754's quiet bit, sign clear: the canonical NaN
constexpr uint32_t kX86DefaultNan = 0xFFC00000u;     // what x86 SSE writes for a NaN it makes

using fp8mp_test::bits;
using fp8mp_test::from_bits;
using fp8mp_test::serial_for;

constexpr Fp8Format kE4M3 = Fp8Format::E4M3, kE5M2 = Fp8Format::E5M2;
constexpr size_t k129 = 120900, k128 = 120800, k1283 = 120803, k1284 = 120804, k131 = 130101;

}  // namespace

TEST_CASE("rowwise and DeepSeek-V3 run cuBLASLt's block modes on 9.x only, chunked on every other FP8 GPU",
          "[block_gemm_path]") {
  for (const auto recipe : {BlockGemmRecipe::Rowwise, BlockGemmRecipe::DeepSeek}) {
    REQUIRE(fp8mp::choose_block_gemm_path(recipe, kE4M3, kE4M3, 90, k131, k131, false).path == BlockGemmPath::Native);
    REQUIRE(fp8mp::choose_block_gemm_path(recipe, kE4M3, kE4M3, 90, k129, k129, false).path == BlockGemmPath::Native);
    // Hopper with a cuBLASLt (loaded or built against) older than 12.9: no block modes there.
    REQUIRE(fp8mp::choose_block_gemm_path(recipe, kE4M3, kE4M3, 90, k128, k131, false).path == BlockGemmPath::Chunked);
    REQUIRE(fp8mp::choose_block_gemm_path(recipe, kE4M3, kE4M3, 90, k131, k128, false).path == BlockGemmPath::Chunked);
    for (const int cc : {89, 100, 103, 110, 120, 121}) {  // Ada, Blackwell datacenter and consumer
      const auto choice = fp8mp::choose_block_gemm_path(recipe, kE4M3, kE4M3, cc, k131, k131, false);
      REQUIRE(choice.path == BlockGemmPath::Chunked);
      REQUIRE(choice.why_not.empty());
      REQUIRE_FALSE(choice.mxfp8_cache_key_workaround);
    }
    REQUIRE(fp8mp::choose_block_gemm_path(recipe, kE4M3, kE4M3, 90, k131, k131, true).path == BlockGemmPath::Chunked);
  }
}

TEST_CASE("MXFP8 runs VEC32_UE8M0 on 10.x and 12.x from cuBLASLt 12.8, with the cache-key workaround to 12.8.3",
          "[block_gemm_path]") {
  for (const int cc : {100, 103, 120, 121}) {
    const auto old = fp8mp::choose_block_gemm_path(BlockGemmRecipe::Mxfp8, kE4M3, kE4M3, cc, k128, k131, false);
    REQUIRE((old.path == BlockGemmPath::Native && old.mxfp8_cache_key_workaround));
    REQUIRE(fp8mp::choose_block_gemm_path(BlockGemmRecipe::Mxfp8, kE4M3, kE4M3, cc, k1283, k131, false).mxfp8_cache_key_workaround);
    const auto fixed = fp8mp::choose_block_gemm_path(BlockGemmRecipe::Mxfp8, kE4M3, kE4M3, cc, k1284, k131, false);
    REQUIRE((fixed.path == BlockGemmPath::Native && !fixed.mxfp8_cache_key_workaround));
    REQUIRE(fp8mp::choose_block_gemm_path(BlockGemmRecipe::Mxfp8, kE4M3, kE4M3, cc, 120700, k131, false).path ==
            BlockGemmPath::Chunked);
    REQUIRE(fp8mp::choose_block_gemm_path(BlockGemmRecipe::Mxfp8, kE4M3, kE4M3, cc, k131, 120700, false).path ==
            BlockGemmPath::Chunked);
  }
  for (const int cc : {89, 90}) {  // no E8M0 block scaling in Ada's or Hopper's tensor cores
    const auto choice = fp8mp::choose_block_gemm_path(BlockGemmRecipe::Mxfp8, kE4M3, kE4M3, cc, k131, k131, false);
    REQUIRE((choice.path == BlockGemmPath::Chunked && !choice.mxfp8_cache_key_workaround && choice.why_not.empty()));
  }
  REQUIRE(fp8mp::choose_block_gemm_path(BlockGemmRecipe::Mxfp8, kE4M3, kE4M3, 100, k1283, k131, true).path ==
          BlockGemmPath::Chunked);
}

TEST_CASE("an E5M2 operand (HYBRID gradients) takes the chunked path where E4M3 x E4M3 takes Hopper's block modes",
          "[block_gemm_path]") {
  for (const auto recipe : {BlockGemmRecipe::Rowwise, BlockGemmRecipe::DeepSeek}) {
    REQUIRE(fp8mp::choose_block_gemm_path(recipe, kE4M3, kE4M3, 90, k131, k131, false).path == BlockGemmPath::Native);
    for (const auto& [a, b] : {std::pair{kE5M2, kE4M3}, std::pair{kE4M3, kE5M2}}) {
      const auto choice = fp8mp::choose_block_gemm_path(recipe, a, b, 90, k131, k131, false);
      REQUIRE(choice.path == BlockGemmPath::Chunked);
      REQUIRE(choice.why_not.empty());
    }
  }
  REQUIRE(fp8mp::native_block_modes_take(kE4M3, kE4M3));
  REQUIRE_FALSE(fp8mp::native_block_modes_take(kE5M2, kE4M3));
  REQUIRE_FALSE(fp8mp::native_block_modes_take(kE4M3, kE5M2));
}

TEST_CASE("the block sizes select rowwise, DeepSeek-V3 or MXFP8, and anything else is refused with the sizes named",
          "[block_gemm_path]") {
  using fp8mp::LtScaleLayout;
  const auto rowwise = fp8mp::cuda::block_gemm_recipe(256, 1, 1, 256, false, false);
  REQUIRE((rowwise.why_not.empty() && rowwise.recipe == BlockGemmRecipe::Rowwise));
  const auto deepseek = fp8mp::cuda::block_gemm_recipe(512, 1, 128, 128, false, false);
  REQUIRE((deepseek.why_not.empty() && deepseek.recipe == BlockGemmRecipe::DeepSeek));
  REQUIRE((deepseek.a_layout == LtScaleLayout::Vec128 && deepseek.b_layout == LtScaleLayout::Blk128x128));
  const auto mx = fp8mp::cuda::block_gemm_recipe(512, 1, 1, 32, true, true);
  REQUIRE((mx.why_not.empty() && mx.recipe == BlockGemmRecipe::Mxfp8 && mx.a_layout == LtScaleLayout::Vec32Swizzled));
  const auto both_128 = fp8mp::cuda::block_gemm_recipe(512, 128, 128, 128, false, false);
  REQUIRE_THAT(both_128.why_not, Catch::Contains("a_block_rows = 128, b_block_rows = 128, block_k = 128"));
  REQUIRE_FALSE(fp8mp::cuda::block_gemm_recipe(512, 1, 1, 32, true, false).why_not.empty());  // mixed scale dtypes
}

TEST_CASE("the cuBLASLt heuristic is asked about power-of-two sizes of at least 16", "[gemm_plan]") {
  REQUIRE(fp8mp::heuristic_extent(1) == 16);
  REQUIRE(fp8mp::heuristic_extent(16) == 16);
  REQUIRE(fp8mp::heuristic_extent(17) == 32);
  REQUIRE(fp8mp::heuristic_extent(128) == 128);
  REQUIRE(fp8mp::heuristic_extent(129) == 256);
  REQUIRE(fp8mp::heuristic_extent(5000) == 8192);
  // A step's per-expert token counts from 1 to 4096 fall into 9 buckets: 9 heuristic queries, not 4096.
  std::vector<int64_t> buckets;
  for (int64_t m = 1; m <= 4096; ++m) {
    const int64_t e = fp8mp::heuristic_extent(m);
    REQUIRE((e >= m && e < 2 * m + 16));
    if (buckets.empty() || buckets.back() != e) buckets.push_back(e);
  }
  REQUIRE(buckets.size() == 9);
}

TEST_CASE("a GPU without FP8 tensor cores has no block-scaled path, and the reason says what is needed",
          "[block_gemm_path]") {
  for (const int cc : {75, 80, 86, 87}) {
    for (const auto recipe : {BlockGemmRecipe::Rowwise, BlockGemmRecipe::DeepSeek, BlockGemmRecipe::Mxfp8}) {
      const auto choice = fp8mp::choose_block_gemm_path(recipe, kE4M3, kE4M3, cc, k131, k131, false);
      REQUIRE_THAT(choice.why_not, Catch::Contains("compute capability 8.9 or newer"));
      REQUIRE_THAT(choice.why_not, Catch::Contains(fp8mp::block_gemm_recipe_name(recipe)));
    }
  }
}

TEST_CASE("a 1 x 128 operand is padded to a multiple of 8 rows and its scale vectors cover every padded row",
          "[block_gemm_path]") {
  using fp8mp::LtScaleLayout;
  for (const int64_t M : {1, 3, 4, 12, 17}) {
    const int64_t M_pad = fp8mp::lt_round_up(M, fp8mp::block_gemm_row_multiple(LtScaleLayout::Vec128, 1));
    REQUIRE(M_pad % 8 == 0);
    REQUIRE((M_pad >= M && M_pad - M < 8));
    const auto shape = fp8mp::lt_scale_shape(LtScaleLayout::Vec128, M_pad, 3);
    REQUIRE(shape.outer == M_pad);  // cuBLASLt's stride between K chunks: one scale per padded row
    REQUIRE(fp8mp::lt_scale_offset(LtScaleLayout::Vec128, shape, M_pad - 1, 2) == shape.elements - 1);
  }
  // cuBLASLt's A (our b) is the leading dimension of D as well: 16 wins over 8.
  REQUIRE(fp8mp::block_gemm_row_multiple(LtScaleLayout::Vec128, 16) == 16);
  REQUIRE(fp8mp::block_gemm_row_multiple(LtScaleLayout::Blk128x128, 16) == 128);
  REQUIRE(fp8mp::block_gemm_row_multiple(LtScaleLayout::OuterVec, 16) == 16);
  REQUIRE(fp8mp::block_gemm_row_multiple(LtScaleLayout::Vec32Swizzled, 1) == 1);
}

TEST_CASE("a build runs where a cubin of the same major and no newer minor, or older PTX, exists", "[device]") {
  REQUIRE(fp8mp::parse_arch_list("89_90_100_120") == std::vector<int>{89, 90, 100, 120});
  REQUIRE(fp8mp::parse_arch_list("").empty());
  const std::string cubins = "89_90_100_120", ptx = "120";  // setup.py's default TORCH_CUDA_ARCH_LIST
  for (const int cc : {89, 90, 100, 103, 120, 121, 130}) {
    INFO("compute capability " << cc);
    REQUIRE(fp8mp::device_code_refusal(cc, cubins, ptx).empty());
  }
  // Jetson Thor: 10.0's cubins need major 10 and 12.0's PTX cannot be compiled down to 11.0.
  const std::string thor = fp8mp::device_code_refusal(110, cubins, ptx);
  REQUIRE_THAT(thor, Catch::Contains("none of which runs on compute capability 11.0"));
  REQUIRE_THAT(thor, Catch::Contains("TORCH_CUDA_ARCH_LIST=\"11.0\""));
  REQUIRE_THAT(thor, Catch::Contains("8.9, 9.0, 10.0, 12.0"));
  const std::string ampere = fp8mp::device_code_refusal(80, cubins, ptx);
  REQUIRE_THAT(ampere, Catch::Contains("FP8 GEMMs need compute capability 8.9 or newer"));
  // A Hopper-and-Blackwell build without PTX: nothing for Ada, nor for a future major.
  REQUIRE_FALSE(fp8mp::device_code_refusal(89, "90_100", "").empty());
  REQUIRE_FALSE(fp8mp::device_code_refusal(130, "90_100", "").empty());
  REQUIRE(fp8mp::device_code_refusal(103, "90_100", "").empty());
  const fp8mp::DeviceDescription gpu{1, 110, "NVIDIA Thor"};
  REQUIRE(gpu.text() == "cuda:1 (NVIDIA Thor) has compute capability 11.0");
}

TEST_CASE("NaN bits: a NaN the arithmetic makes is +quiet NaN, a NaN input keeps its own", "[nan]") {
  volatile float inf = kInf, zero = 0.0f;
  REQUIRE(bits(inf * zero) == kX86DefaultNan);  // what the hardware alone gives here (the GPU: 0x7FFFFFFF)
  REQUIRE(bits(fp8mp::scale_keep_nan(kInf, 0.0f)) == kPositiveQuietNan);
  REQUIRE(bits(fp8mp::scale_keep_nan(-kInf, 0.0f)) == kPositiveQuietNan);
  REQUIRE(bits(fp8mp::scale_keep_nan(1.0f, std::nanf(""))) == kPositiveQuietNan);
  REQUIRE(bits(fp8mp::scale_keep_nan(from_bits(0xFFC00001u), 2.0f)) == 0xFFC00001u);
  REQUIRE(bits(fp8mp::scale_keep_nan(-3.0f, 0.5f)) == bits(-1.5f));
  REQUIRE(bits(fp8mp::pin_nan(kInf - kInf)) == kPositiveQuietNan);
  REQUIRE(bits(fp8mp::pin_nan(-0.0f)) == bits(-0.0f));
}

TEST_CASE("a cast scale that is not finite and > 0 becomes NaN, so every value it casts is NaN", "[nan]") {
  const float denorm = std::numeric_limits<float>::denorm_min();
  REQUIRE(fp8mp::checked_scale(1.5f) == 1.5f);
  REQUIRE(fp8mp::checked_scale(denorm) == denorm);
  REQUIRE(fp8mp::checked_scale(std::numeric_limits<float>::max()) == std::numeric_limits<float>::max());
  for (const float bad : {0.0f, -0.0f, -1.0f, -denorm, kInf, -kInf, std::nanf(""), -std::nanf("")}) {
    INFO("scale bits " << bits(bad));
    REQUIRE(bits(fp8mp::checked_scale(bad)) == kPositiveQuietNan);
  }
}

TEST_CASE("the CPU cast kernels write +NaN codes for NaNs their arithmetic makes, both formats", "[nan]") {
  // 80 values (more than one AVX-512 block of 64, so both the vector and the scalar loop run).
  std::vector<float> x(80, 1.0f);
  x[3] = kInf;
  x[70] = -kInf;
  x[5] = -std::nanf("");  // an input NaN keeps its sign
  x[71] = -2.0f;
  for (const Fp8Format format : {Fp8Format::E4M3, Fp8Format::E5M2}) {
    std::vector<uint8_t> y(x.size());
    fp8mp::cpu::cast_to_fp8(x.data(), HpType::Float32, y.data(), int64_t(x.size()), 0.0f, format, serial_for);
    // A zero scale is refused by the CPU ops; the kernels make it NaN (checked_scale): every code is +NaN
    // (+-Inf x 0 included), an input NaN's keeping its sign.
    for (size_t i = 0; i < x.size(); ++i) REQUIRE(y[i] == (i == 5 ? 0xFF : 0x7F));
    // A negative scale flips no sign: every code is NaN, an input NaN's keeping its sign.
    fp8mp::cpu::cast_to_fp8(x.data(), HpType::Float32, y.data(), int64_t(x.size()), -1.0f, format, serial_for);
    for (size_t i = 0; i < x.size(); ++i) REQUIRE(y[i] == (i == 5 ? 0xFF : 0x7F));
    // A valid scale: +-Inf saturate (E4M3) or stay Inf (E5M2), as before.
    fp8mp::cpu::cast_to_fp8(x.data(), HpType::Float32, y.data(), int64_t(x.size()), 1.0f, format, serial_for);
    REQUIRE(y[3] == (format == Fp8Format::E4M3 ? 0x7E : 0x7C));
    REQUIRE(y[70] == (format == Fp8Format::E4M3 ? 0xFE : 0xFC));
  }
  // Decoding: E5M2's -Inf (0xFC) times a zero scale_inv is +NaN, not x86's -NaN.
  const std::vector<uint8_t> codes = {0xFC, 0x7C, 0x3C, 0xFF};
  std::vector<float> out(codes.size());
  fp8mp::cpu::cast_from_fp8(codes.data(), Fp8Format::E5M2, out.data(), HpType::Float32, int64_t(codes.size()), 0.0f,
                            serial_for);
  REQUIRE(bits(out[0]) == kPositiveQuietNan);
  REQUIRE(bits(out[1]) == kPositiveQuietNan);
  REQUIRE(bits(out[2]) == kPositiveQuietNan);
  REQUIRE(bits(out[3]) == 0xFFC00000u);  // the -NaN code decodes to -NaN and keeps it
}

// A float32 LayerNorm forward of x [rows, hidden] without weight or bias (eps 1e-5) into mean, rstd and out.
static fp8mp::NormFwdArgs layernorm_fwd_args(const std::vector<float>& x, int64_t rows, int64_t hidden,
                                             std::vector<float>& mean, std::vector<float>& rstd, void* out) {
  fp8mp::NormFwdArgs args{};
  args.centered = true;
  args.x = x.data();
  args.x_type = HpType::Float32;
  args.rows = rows;
  args.hidden = hidden;
  args.weight = nullptr;
  args.bias = nullptr;
  args.eps = 1e-5f;
  args.mean = mean.data();
  args.rstd = rstd.data();
  args.out = out;
  args.fp8 = false;
  return args;
}

TEST_CASE("the CPU norm writes +NaN where Inf - Inf makes one: outputs, statistics and FP8 codes", "[nan]") {
  const int64_t rows = 2, hidden = 8;
  std::vector<float> x(size_t(rows * hidden), 0.5f);
  x[1] = kInf;  // row 0: mean Inf, Inf - Inf = NaN inside the statistics
  x[2] = -kInf;
  std::vector<float> mean(rows), rstd(rows), out(size_t(rows * hidden));
  fp8mp::NormFwdArgs args = layernorm_fwd_args(x, rows, hidden, mean, rstd, out.data());
  fp8mp::cpu::norm_fwd(args, serial_for);
  REQUIRE(bits(mean[0]) == kPositiveQuietNan);
  REQUIRE(bits(rstd[0]) == kPositiveQuietNan);
  for (int64_t i = 0; i < hidden; ++i) REQUIRE(bits(out[size_t(i)]) == kPositiveQuietNan);
  REQUIRE(std::isfinite(rstd[1]));

  std::vector<uint8_t> codes(size_t(rows * hidden));
  const float scale = 1.0f;
  float amax = 0.0f;
  args.out = codes.data();
  args.fp8 = true;
  args.format = Fp8Format::E4M3;
  args.scale = &scale;
  args.amax = &amax;
  fp8mp::cpu::norm_fwd(args, serial_for);
  for (int64_t i = 0; i < hidden; ++i) REQUIRE(codes[size_t(i)] == 0x7F);
}

TEST_CASE("the CPU norm backward writes +NaN into grad_weight and grad_bias where their sums make Inf - Inf",
          "[nan]") {
  // Column 0 of grad_out is +Inf in row 0 and -Inf in row 1, and x's column 0 normalizes to the same positive
  // value in both rows: grad_weight[0] and grad_bias[0] add +Inf and -Inf, which x86 makes 0xFFC00000.
  const int64_t rows = 2, hidden = 8;
  std::vector<float> x(size_t(rows * hidden), 0.0f), grad_out(size_t(rows * hidden), 0.25f);
  x[0] = x[size_t(hidden)] = 1.0f;
  grad_out[0] = kInf;
  grad_out[size_t(hidden)] = -kInf;
  std::vector<float> weight(size_t(hidden), 1.5f), mean(rows), rstd(rows);
  std::vector<float> out(size_t(rows * hidden));
  fp8mp::cpu::norm_fwd(layernorm_fwd_args(x, rows, hidden, mean, rstd, out.data()), serial_for);
  std::vector<float> grad_x(static_cast<size_t>(rows * hidden)), grad_w(static_cast<size_t>(hidden)),
      grad_b(static_cast<size_t>(hidden));
  const fp8mp::NormBwdArgs bwd{true,          grad_out.data(), x.data(),      HpType::Float32, rows,
                               hidden,        weight.data(),   HpType::Float32, false,         mean.data(),
                               rstd.data(),   grad_x.data(),   grad_w.data(), grad_b.data()};
  fp8mp::cpu::norm_bwd(bwd, serial_for);
  REQUIRE(bits(grad_w[0]) == kPositiveQuietNan);
  REQUIRE(bits(grad_b[0]) == kPositiveQuietNan);
  // Every other column's sums are finite: grad_out there is 0.25 in both rows.
  for (int64_t i = 1; i < hidden; ++i) REQUIRE((std::isfinite(grad_w[size_t(i)]) && grad_b[size_t(i)] == 0.5f));
}

TEST_CASE("an fp8_max that is not finite and > 0 makes the updated scale and its inverse +NaN", "[nan]") {
  const float pow2 = fp8mp::pow2_margin(0);
  REQUIRE(fp8mp::updated_scale(448.0f, 2.0f, pow2, 1.0f) == 224.0f);
  REQUIRE(fp8mp::updated_scale(448.0f, 0.0f, pow2, 3.0f) == 3.0f);  // an unusable amax keeps the old scale
  for (const float bad : {0.0f, -448.0f, kInf, std::nanf("")}) {
    INFO("fp8_max " << bad);
    REQUIRE(bits(fp8mp::updated_scale(bad, 2.0f, pow2, 1.0f)) == kPositiveQuietNan);
  }
  REQUIRE(bits(fp8mp::reciprocal(from_bits(kPositiveQuietNan))) == kPositiveQuietNan);
  REQUIRE(bits(fp8mp::reciprocal(from_bits(0xFFC00000u))) == kPositiveQuietNan);
  REQUIRE(fp8mp::reciprocal(4.0f) == 0.25f);
}
