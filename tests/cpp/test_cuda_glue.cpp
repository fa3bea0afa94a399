// The CUDA ops' host code, run on CPU tensors: every function of csrc/*/*_cuda.cpp (argument checks, dispatcher
// calls, allocation, contiguous copies, recipe choice, group offsets, scratch) with the kernel launches and
// cuBLASLt calls replaced by recorders (cuda_launch_stubs.cpp) and CUDA's headers by CPU stand-ins
// (cuda_standin/). What reaches a launch is checked against the tensors the test made; the dbias column sum is
// real and checked against an fp64 sum. Compiled on the stable ABI of torch 2.11, as the glue is (no ATen here).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "blockwise/blockwise_cuda.h"
#include "cast/cast_cuda.h"
#include "common/stable_cuda.h"  // the stand-in
#include "cuda_launch_stubs.h"
#include "gemm/gemm_cuda.h"
#include "grouped_gemm/grouped_gemm_cuda.h"
#include "grouped_gemm/grouped_gemm_group_args.h"
#include "norm/norm_cuda.h"
#include "norm/norm_entry_points.h"
#include "optim/optim_cuda.h"
#include "scale_update/scale_update_cuda.h"

namespace {

namespace glue = fp8mp::cuda_glue;
namespace stub = fp8mp_test::stub;
using fp8mp::Fp8Format;
using fp8mp::HpType;
using fp8mp::ScalarType;
using fp8mp::Tensor;

const torch::stable::Device kCpu(torch::headeronly::DeviceType::CPU);

Tensor empty(const std::vector<int64_t>& sizes, ScalarType dtype) {
  return torch::stable::empty(sizes, dtype, std::nullopt, kCpu);
}

// A float32 tensor holding value(i) at flat index i.
template <typename F>
Tensor floats(const std::vector<int64_t>& sizes, F value) {
  Tensor t = empty(sizes, fp8mp::kFloat);
  float* p = static_cast<float*>(t.mutable_data_ptr());
  for (int64_t i = 0; i < t.numel(); ++i) p[i] = value(i);
  return t;
}

Tensor full(const std::vector<int64_t>& sizes, float value) {
  return floats(sizes, [value](int64_t) { return value; });
}

// Zero FP8 codes (or any 1-byte dtype).
Tensor codes(const std::vector<int64_t>& sizes, ScalarType dtype = fp8mp::kFloat8_e4m3fn) {
  Tensor t = empty(sizes, dtype);
  std::memset(t.mutable_data_ptr(), 0, size_t(t.numel()));
  return t;
}

Tensor int32s(const std::vector<int32_t>& values) {
  Tensor t = empty({int64_t(values.size())}, ScalarType::Int);
  std::memcpy(t.mutable_data_ptr(), values.data(), values.size() * sizeof(int32_t));
  return t;
}

std::vector<int64_t> shape(const Tensor& t) { return fp8mp::sizes_of(t); }

const void* data(const Tensor& t) { return t.const_data_ptr(); }

// x's values in row-major order, as the bytes a kernel reading a contiguous x would see.
std::vector<uint8_t> row_major_bytes(const Tensor& x) {
  const Tensor c = torch::stable::contiguous(x);
  const uint8_t* p = static_cast<const uint8_t*>(c.const_data_ptr());
  return std::vector<uint8_t>(p, p + c.numel() * 4);
}

}  // namespace

TEST_CASE("dbias is torch's float32 column sum of x, and the cast beside it gets x's values in row-major order",
          "[cuda_glue]") {
  stub::reset();
  // x [37, 21] as a transposed view of a [21, 37] tensor: not contiguous, so the glue hands the kernel a copy.
  const Tensor base =
      floats({21, 37}, [](int64_t i) { return std::ldexp(float((i * 7919) % 201 - 100), int(i % 9) - 4); });
  const Tensor x = torch::stable::transpose(base, 0, 1);
  REQUIRE_FALSE(x.is_contiguous());
  const Tensor scale = full({1}, 2.0f);
  Tensor amax = full({1}, 0.0f);
  const auto [y, yt, dbias] = glue::cast_to_fp8_transpose_dbias(x, scale, amax, "e5m2");

  REQUIRE(shape(y) == std::vector<int64_t>{37, 21});
  REQUIRE(shape(yt) == std::vector<int64_t>{21, 37});
  REQUIRE((y.scalar_type() == fp8mp::kFloat8_e5m2 && yt.scalar_type() == fp8mp::kFloat8_e5m2));
  REQUIRE(shape(dbias) == std::vector<int64_t>{21});
  REQUIRE(dbias.scalar_type() == fp8mp::kFloat);
  REQUIRE(fp8mp::standin::last_guarded_device() == x.get_device_index());

  const auto& casts = stub::recorded().cast_to_fp8_transpose;
  REQUIRE(casts.size() == 1);
  const auto& c = casts[0];
  REQUIRE((c.rows == 37 && c.cols == 21 && c.x_type == HpType::Float32 && c.format == Fp8Format::E5M2));
  REQUIRE((c.y == data(y) && c.yt == data(yt)));
  REQUIRE((c.scale == data(scale) && c.amax == data(amax)));
  REQUIRE(c.x != data(x));
  REQUIRE(c.x_bytes == row_major_bytes(x));

  // Each column's float32 sum against its fp64 sum: 37 fp32 additions are within 37 ulps of sum |x| of it.
  const float* xb = static_cast<const float*>(base.const_data_ptr());
  const float* db = static_cast<const float*>(dbias.const_data_ptr());
  for (int64_t col = 0; col < 21; ++col) {
    double sum = 0.0, sum_abs = 0.0;
    for (int64_t row = 0; row < 37; ++row) {
      sum += double(xb[col * 37 + row]);  // x[row, col] = base[col, row]
      sum_abs += std::fabs(double(xb[col * 37 + row]));
    }
    INFO("column " << col);
    REQUIRE(std::fabs(double(db[col]) - sum) <= 37.0 * std::ldexp(1.0, -24) * sum_abs);
  }
}

TEST_CASE("dbias sums a bfloat16 x into float32", "[cuda_glue]") {
  stub::reset();
  // Values 1 + i / 128 are exact in bfloat16 (8 significant bits); 300 rows of them overflow bfloat16's
  // precision by far, so a sum kept in bfloat16 would miss the fp64 sum where a float32 one cannot.
  const Tensor x32 = floats({300, 2}, [](int64_t i) { return 1.0f + float(i % 128) / 128.0f; });
  const Tensor x = torch::stable::to(x32, fp8mp::kBFloat16);
  const auto [y, yt, dbias] = glue::cast_to_fp8_transpose_dbias(x, full({1}, 1.0f), full({1}, 0.0f), "e4m3");
  REQUIRE(dbias.scalar_type() == fp8mp::kFloat);
  const float* xp = static_cast<const float*>(x32.const_data_ptr());
  for (int64_t col = 0; col < 2; ++col) {
    double sum = 0.0;
    for (int64_t row = 0; row < 300; ++row) sum += double(xp[row * 2 + col]);
    REQUIRE(std::fabs(double(static_cast<const float*>(dbias.const_data_ptr())[col]) - sum) <= 1e-3);
  }
  REQUIRE(stub::recorded().cast_to_fp8_transpose.at(0).x_type == HpType::BFloat16);
}

TEST_CASE("the casts hand the kernels a contiguous view's own data pointer, unaligned, without a copy",
          "[cuda_glue]") {
  stub::reset();
  Tensor base = floats({8, 5}, [](int64_t i) { return float(i); });
  const Tensor x = torch::stable::narrow(base, 0, 1, 7);  // starts 20 bytes in: not 16-byte aligned
  REQUIRE(x.is_contiguous());
  const Tensor scale = full({1}, 1.0f);
  Tensor amax = full({1}, 0.0f);
  const Tensor y = glue::cast_to_fp8(x, scale, amax, "e4m3");
  const auto& c = stub::recorded().cast_to_fp8.at(0);
  REQUIRE(c.x == data(x));
  REQUIRE(reinterpret_cast<uintptr_t>(c.x) % 16 != 0);
  REQUIRE((c.n == 35 && c.y == data(y) && c.format == Fp8Format::E4M3 && c.amax == data(amax)));
  REQUIRE(shape(y) == std::vector<int64_t>{7, 5});

  Tensor codes_base = codes({9, 4}, fp8mp::kFloat8_e5m2);
  const Tensor codes_view = torch::stable::narrow(codes_base, 0, 1, 8);
  const Tensor scale_inv = full({1}, 0.5f);
  const Tensor out = glue::cast_from_fp8(codes_view, scale_inv, fp8mp::kBFloat16);
  const auto& d = stub::recorded().cast_from_fp8.at(0);
  REQUIRE((d.y == data(codes_view) && d.format == Fp8Format::E5M2 && d.n == 32));
  REQUIRE((d.out == data(out) && d.out_type == HpType::BFloat16 && d.scale_inv == data(scale_inv)));
  REQUIRE((shape(out) == std::vector<int64_t>{8, 4} && out.scalar_type() == fp8mp::kBFloat16));
}

TEST_CASE("the CUDA glue refuses bad arguments with the CPU's messages before it launches anything", "[cuda_glue]") {
  stub::reset();
  const Tensor x3 = full({2, 3, 4}, 1.0f);
  REQUIRE_THROWS_WITH(glue::cast_to_fp8_transpose_dbias(x3, full({1}, 1.0f), full({1}, 0.0f), "e4m3"),
                      Catch::Contains("[ValueError]") && Catch::Contains("argument 'x' must be 2-D"));
  REQUIRE_THROWS_WITH(glue::cast_to_fp8(full({4}, 1.0f), full({1}, 1.0f), full({1}, 0.0f), "e3m4"),
                      Catch::Contains("fmt"));
  // The offsets must end at the token count: 9 of a's 10 rows.
  REQUIRE_THROWS_WITH(glue::fp8_grouped_gemm(codes({10, 32}), full({1}, 1.0f), codes({2, 16, 32}), full({2}, 1.0f),
                                             int32s({4, 9}), std::nullopt, fp8mp::kBFloat16, false),
                      Catch::Contains("offs"));
  const auto& r = stub::recorded();
  REQUIRE((r.cast_to_fp8.empty() && r.cast_to_fp8_transpose.empty() && r.fp8_grouped_gemm.empty()));
}

TEST_CASE("fp8_gemm's glue hands cuBLASLt contiguous operands, the scales, the bias and the output", "[cuda_glue]") {
  stub::reset();
  const Tensor a = codes({5, 32});
  const Tensor b = torch::stable::transpose(codes({32, 16}, fp8mp::kFloat8_e5m2), 0, 1);  // [16, 32], not contiguous
  const Tensor sa = full({1}, 0.5f), sb = full({1}, 0.25f);
  const Tensor bias = torch::stable::to(full({16}, 1.0f), fp8mp::kBFloat16);
  const Tensor out = glue::fp8_gemm(a, sa, b, sb, bias, fp8mp::kBFloat16, true);
  REQUIRE((shape(out) == std::vector<int64_t>{5, 16} && out.scalar_type() == fp8mp::kBFloat16));
  const auto& g = stub::recorded().fp8_gemm.at(0);
  REQUIRE((g.args.M == 5 && g.args.N == 16 && g.args.K == 32));
  REQUIRE((g.args.a == data(a) && g.args.a_format == Fp8Format::E4M3));
  REQUIRE((g.args.b != data(b) && g.args.b_format == Fp8Format::E5M2));  // b's contiguous copy
  REQUIRE((g.args.a_scale_inv == data(sa) && g.args.b_scale_inv == data(sb) && g.args.bias == data(bias)));
  REQUIRE((g.args.out == data(out) && g.args.out_type == HpType::BFloat16 && g.args.use_fast_accum));
  REQUIRE(g.scratch != nullptr);

  glue::fp8_gemm(a, sa, codes({16, 32}), sb, std::nullopt, fp8mp::kFloat, false);
  REQUIRE(stub::recorded().fp8_gemm.at(1).args.bias == nullptr);
}

TEST_CASE("the block quantizers' glue allocates data and scale_inv of both layouts for the kernels", "[cuda_glue]") {
  stub::reset();
  const Tensor x = torch::stable::to(full({130, 260}, 1.0f), fp8mp::kBFloat16);
  const auto [y, s] = glue::block_quantize(x, 1, 128, "e4m3", "pow2");
  REQUIRE((shape(y) == std::vector<int64_t>{130, 260} && shape(s) == std::vector<int64_t>{130, 3}));
  REQUIRE(s.scalar_type() == fp8mp::kFloat);
  const auto& q = stub::recorded().block_quantize.at(0);
  REQUIRE((q.x == data(x) && q.x_type == HpType::BFloat16 && q.rows == 130 && q.cols == 260));
  REQUIRE((q.block_rows == 1 && q.block_cols == 128 && q.mode == fp8mp::BlockScaleMode::Pow2));
  REQUIRE((q.y == data(y) && q.scale_inv == data(s) && q.scratch != nullptr));

  const auto [y2, s2, yt, st] = glue::block_quantize_transpose(x, 128, 32, "e5m2", "e8m0_floor");
  REQUIRE((shape(yt) == std::vector<int64_t>{260, 130} && shape(st) == std::vector<int64_t>{260, 5}));
  REQUIRE(shape(s2) == std::vector<int64_t>{130, 3});
  REQUIRE(st.scalar_type() == ScalarType::Float8_e8m0fnu);
  const auto& t = stub::recorded().block_quantize_transpose.at(0);
  REQUIRE((t.y == data(y2) && t.scale_inv == data(s2) && t.y_t == data(yt) && t.scale_inv_t == data(st)));
  REQUIRE((t.block_rows == 128 && t.block_cols == 32 && t.format == Fp8Format::E5M2));
}

TEST_CASE("block_scaled_gemm's glue picks the recipe from the block sizes and refuses what cuBLASLt has not",
          "[cuda_glue]") {
  stub::reset();
  // DeepSeek-V3 with HYBRID formats: an E5M2 gradient (1 x 128 blocks) against an E4M3 weight (128 x 128).
  const Tensor a = codes({4, 256}, fp8mp::kFloat8_e5m2), sa = full({4, 2}, 1.0f);
  const Tensor b = codes({128, 256}), sb = full({1, 2}, 1.0f);
  const Tensor out = glue::block_scaled_gemm(a, sa, b, sb, 1, 128, 128, std::nullopt, fp8mp::kFloat);
  REQUIRE(shape(out) == std::vector<int64_t>{4, 128});
  const auto& g = stub::recorded().block_scaled_gemm.at(0);
  REQUIRE(g.args.recipe == fp8mp::BlockGemmRecipe::DeepSeek);
  REQUIRE((g.args.a.layout == fp8mp::LtScaleLayout::Vec128 && g.args.b.layout == fp8mp::LtScaleLayout::Blk128x128));
  REQUIRE((g.args.a.data == data(a) && g.args.a.format == Fp8Format::E5M2 && g.args.a.scale_inv == data(sa)));
  REQUIRE((g.args.b.data == data(b) && g.args.b.format == Fp8Format::E4M3 && g.args.b.rows == 128));
  REQUIRE((g.args.K == 256 && g.args.block_k == 128 && g.args.out == data(out) && g.args.bias == nullptr));

  REQUIRE_THROWS_WITH(glue::block_scaled_gemm(codes({4, 256}), full({4, 4}, 1.0f), b, full({1, 4}, 1.0f), 1, 128, 64,
                                              std::nullopt, fp8mp::kFloat),
                      Catch::Contains("block_k = 64"));
  REQUIRE(stub::recorded().block_scaled_gemm.size() == 1);
}

TEST_CASE("the grouped GEMMs' glue reads host group offsets where they lie and hands the launches their values",
          "[cuda_glue]") {
  stub::reset();
  const Tensor offs = int32s({4, 4, 10});  // an empty middle group
  const Tensor a = codes({10, 32}), b = codes({3, 16, 32}), sb = full({3}, 0.5f), sa = full({1}, 1.0f);
  const Tensor bias = full({3, 16}, 0.0f);
  const Tensor out = glue::fp8_grouped_gemm(a, sa, b, sb, offs, bias, fp8mp::kFloat, false);
  REQUIRE(shape(out) == std::vector<int64_t>{10, 16});
  const auto& r = stub::recorded();
  REQUIRE(r.group_offset_reads == 0);  // CPU offsets: no device-to-host copy (and no sync on a GPU)
  const auto& g = r.fp8_grouped_gemm.at(0);
  REQUIRE(g.offs == std::vector<int32_t>{4, 4, 10});
  REQUIRE((g.args.groups == 3 && g.args.N == 16 && g.args.K == 32 && g.args.a == data(a) && g.args.b == data(b)));
  REQUIRE((g.args.b_scale_inv == data(sb) && g.args.bias == data(bias) && g.args.out == data(out)));

  const Tensor offs_t = int32s({3, 10});
  const Tensor dw = glue::fp8_grouped_gemm_wgrad(codes({16, 10}), sa, codes({32, 10}), sa, offs_t, fp8mp::kBFloat16,
                                                 false);
  REQUIRE(shape(dw) == std::vector<int64_t>{2, 16, 32});
  const auto& w = r.fp8_grouped_gemm_wgrad.at(0);
  REQUIRE((w.offs == std::vector<int32_t>{3, 10} && w.args.N == 16 && w.args.K == 32 && w.args.T == 10));
  REQUIRE(w.args.out == data(dw));

  const Tensor ba = codes({10, 256}), bsa = full({10, 2}, 1.0f), bb = codes({2, 128, 256}), bsb = full({2, 1, 2}, 1.0f);
  const Tensor bout = glue::block_scaled_grouped_gemm(ba, bsa, bb, bsb, int32s({6, 10}), 1, 128, 128, std::nullopt,
                                                      fp8mp::kBFloat16);
  REQUIRE(shape(bout) == std::vector<int64_t>{10, 128});
  const auto& bg = r.block_scaled_grouped_gemm.at(0);
  REQUIRE((bg.args.recipe == fp8mp::BlockGemmRecipe::DeepSeek && bg.offs == std::vector<int32_t>{6, 10}));
  REQUIRE((bg.args.a.data == data(ba) && bg.args.a.scale_inv == data(bsa) && bg.args.b.scale_inv == data(bsb)));
  REQUIRE((bg.args.groups == 2 && bg.args.N == 128 && bg.args.K == 256 && bg.args.out == data(bout)));

  // Grouped along T = 10 in groups of 3 and 7 columns: one 128-column chunk each, C = 2 scale columns.
  const Tensor wa = codes({16, 10}), wsa = full({16, 2}, 1.0f), wb = codes({32, 10}), wsb = full({32, 2}, 1.0f);
  const Tensor wout = glue::block_scaled_grouped_gemm_wgrad(wa, wsa, wb, wsb, offs_t, 128, fp8mp::kFloat);
  REQUIRE(shape(wout) == std::vector<int64_t>{2, 16, 32});
  const auto& bw = r.block_scaled_grouped_gemm_wgrad.at(0);
  REQUIRE((bw.args.chunks == 2 && bw.args.T == 10 && bw.args.N == 16 && bw.args.K == 32));
  REQUIRE((bw.args.recipe == fp8mp::BlockGemmRecipe::Rowwise && bw.offs == std::vector<int32_t>{3, 10}));
  REQUIRE(r.group_offset_reads == 0);
}

TEST_CASE("the norm entry points on CUDA's device hand the kernels the outputs they allocate", "[cuda_glue]") {
  stub::reset();
  using Ops = fp8mp::NormEntryPoints<glue::CudaNorm>;
  const Tensor x = torch::stable::to(floats({3, 40}, [](int64_t i) { return float(i % 13); }), fp8mp::kBFloat16);
  const Tensor w = full({40}, 1.0f), b = full({40}, 0.0f);
  const auto [out, mean, rstd] = Ops::layernorm_fwd(x, w, b, 1e-5, true);
  REQUIRE((shape(out) == std::vector<int64_t>{3, 40} && out.scalar_type() == fp8mp::kBFloat16));
  REQUIRE((shape(mean) == std::vector<int64_t>{3} && rstd.scalar_type() == fp8mp::kFloat));
  const auto& f = stub::recorded().norm_fwd.at(0);
  REQUIRE((f.args.centered && f.args.x == data(x) && f.args.rows == 3 && f.args.hidden == 40));
  REQUIRE((f.args.weight == data(w) && f.args.bias == data(b) && f.args.zero_centered_gamma && !f.args.fp8));
  REQUIRE((f.args.mean == data(mean) && f.args.rstd == data(rstd) && f.args.out == data(out)));
  REQUIRE(f.scratch != nullptr);

  const Tensor scale = full({1}, 2.0f);
  Tensor amax = full({1}, 0.0f);
  const auto [codes8, rstd8] = Ops::rmsnorm_fwd_fp8(x, std::nullopt, 1e-6, false, scale, amax, "e4m3");
  REQUIRE(codes8.scalar_type() == fp8mp::kFloat8_e4m3fn);
  const auto& f8 = stub::recorded().norm_fwd.at(1);
  REQUIRE((!f8.args.centered && f8.args.weight == nullptr && f8.args.fp8 && f8.args.mean == nullptr));
  REQUIRE((f8.args.scale == data(scale) && f8.args.amax == data(amax) && f8.args.out == data(codes8)));

  const auto [gx, gw, gb] = Ops::layernorm_bwd(x, x, mean, rstd, w, false);
  REQUIRE((shape(gw) == std::vector<int64_t>{40} && gw.scalar_type() == fp8mp::kFloat && shape(gb) == shape(gw)));
  const auto& k = stub::recorded().norm_bwd.at(0);
  REQUIRE((k.args.grad_x == data(gx) && k.args.grad_weight == data(gw) && k.args.grad_bias == data(gb)));
  REQUIRE((k.args.mean == data(mean) && k.args.rstd == data(rstd) && k.args.weight == data(w)));

  const auto [gx2, gw2] = Ops::rmsnorm_bwd(x, x, rstd, std::nullopt, false);
  REQUIRE((shape(gw2) == std::vector<int64_t>{0} && gw2.scalar_type() == fp8mp::kFloat));
  const auto& k2 = stub::recorded().norm_bwd.at(1);
  REQUIRE((k2.args.grad_weight == nullptr && k2.args.grad_bias == nullptr && k2.args.grad_x == data(gx2)));
}

TEST_CASE("the optimizer steps' glue hands the kernels every buffer, found_inf and the hyperparameters",
          "[cuda_glue]") {
  stub::reset();
  Tensor param = full({300}, 1.0f), grad = full({300}, 0.5f), m = full({300}, 0.0f), v = full({300}, 0.0f);
  Tensor step = empty({1}, ScalarType::Long);
  *static_cast<int64_t*>(step.mutable_data_ptr()) = 0;
  const Tensor found_inf = full({1}, 0.0f);
  glue::adamw_step(param, grad, m, std::nullopt, v, std::nullopt, step, found_inf, 1e-3, 0.9, 0.95, 1e-8, 0.1, 7, 128);
  const auto& s = stub::recorded().adamw_step.at(0);
  REQUIRE((s.buffers.param == data(param) && s.buffers.grad == data(grad) && s.buffers.numel == 300));
  REQUIRE((s.buffers.state[0] == data(m) && s.buffers.state[1] == data(v) && s.buffers.step == data(step)));
  REQUIRE((s.buffers.found_inf == data(found_inf) && s.buffers.seed == 7 && s.buffers.element_offset == 128));
  REQUIRE((s.lr == 1e-3 && s.beta1 == 0.9 && s.beta2 == 0.95 && s.eps == 1e-8 && s.weight_decay == 0.1));

  glue::lion_step(param, grad, m, std::nullopt, step, std::nullopt, 1e-4, 0.9, 0.99, 0.0, 3, 0);
  const auto& l = stub::recorded().lion_step.at(0);
  REQUIRE((l.buffers.found_inf == nullptr && l.buffers.state[0] == data(m) && l.lr == 1e-4 && l.beta2 == 0.99));
}

TEST_CASE("update_amax_history_and_scale's glue launches over all T tensors, and not at all for T = 0",
          "[cuda_glue]") {
  stub::reset();
  const Tensor amax = full({3}, 1.0f), fp8_max = full({3}, 448.0f);
  Tensor history = full({4, 3}, 0.0f), scale = full({3}, 1.0f), scale_inv = full({3}, 1.0f);
  glue::update_amax_history_and_scale(amax, history, scale, scale_inv, fp8_max, 1, "most_recent");
  const auto& u = stub::recorded().update_amax_history_and_scale.at(0);
  REQUIRE((u.amax == data(amax) && u.history == data(history) && u.scale == data(scale)));
  REQUIRE((u.scale_inv == data(scale_inv) && u.fp8_max == data(fp8_max)));
  REQUIRE((u.H == 4 && u.T == 3 && u.margin == 1 && u.algo == fp8mp::AmaxComputeAlgo::MostRecent));

  glue::update_amax_history_and_scale(full({0}, 0.0f), full({4, 0}, 0.0f), full({0}, 0.0f), full({0}, 0.0f),
                                      full({0}, 0.0f), 0, "max");
  REQUIRE(stub::recorded().update_amax_history_and_scale.size() == 1);
}

TEST_CASE("column_sum_fp32 sums the columns of a float32 x as fp64 does, to fp32 rounding", "[cuda_glue]") {
  const Tensor x = floats({1000, 3}, [](int64_t i) { return float((i * 37) % 1001) * 0.001f - 0.5f; });
  const Tensor s = fp8mp::column_sum_fp32(x);
  REQUIRE((shape(s) == std::vector<int64_t>{3} && s.scalar_type() == fp8mp::kFloat));
  const float* xp = static_cast<const float*>(x.const_data_ptr());
  for (int64_t col = 0; col < 3; ++col) {
    double sum = 0.0, sum_abs = 0.0;
    for (int64_t row = 0; row < 1000; ++row) {
      sum += double(xp[row * 3 + col]);
      sum_abs += std::fabs(double(xp[row * 3 + col]));
    }
    REQUIRE(std::fabs(double(static_cast<const float*>(s.const_data_ptr())[col]) - sum) <=
            1000.0 * std::ldexp(1.0, -24) * sum_abs);
  }
}

// The per-group arguments the grouped launches feed to fp8_gemm / block_scaled_gemm (grouped_gemm_group_args.h),
// against the schema's layouts: group g is rows offs[g - 1]:offs[g] of a and out, b[g], b_scale_inv[g], bias[g].
TEST_CASE("each M-grouped GEMM gets its group's rows of a and out, its matrix, scale and bias", "[cuda_glue]") {
  namespace grouped = fp8mp::cuda::grouped;
  const int64_t M = 10, K = 32, N = 16, G = 3;
  const std::vector<int32_t> offs{4, 4, 10};
  std::vector<uint8_t> a(static_cast<size_t>(M * K)), b(static_cast<size_t>(G * N * K));
  std::vector<float> sa(1), sb(static_cast<size_t>(G));
  std::vector<uint16_t> bias(static_cast<size_t>(G * N)), out(static_cast<size_t>(M * N));  // bfloat16
  const fp8mp::cuda::Fp8GroupedGemmArgs args{a.data(), Fp8Format::E4M3, b.data(), Fp8Format::E4M3, offs.data(), G, N,
                                             K, sa.data(), sb.data(), bias.data(), out.data(), HpType::BFloat16, true};
  const fp8mp::cuda::Fp8GemmArgs g2 = grouped::group_args(args, 2, 4, 10);
  REQUIRE((g2.M == 6 && g2.N == N && g2.K == K && g2.use_fast_accum));
  REQUIRE((g2.a == &a[size_t(4 * K)] && g2.b == &b[size_t(2 * N * K)]));
  REQUIRE((g2.a_scale_inv == &sa[0] && g2.b_scale_inv == &sb[2]));
  REQUIRE((g2.bias == &bias[size_t(2 * N)] && g2.out == &out[size_t(4 * N)]));
}

TEST_CASE("each M-grouped block-scaled GEMM gets its group's rows of a with their scales, and b[g] with its scales",
          "[cuda_glue]") {
  namespace grouped = fp8mp::cuda::grouped;
  using fp8mp::cuda::BlockGemmOperand;
  const int64_t M = 10, K = 256, N = 128, G = 2;
  const std::vector<int32_t> offs{6, 10};
  std::vector<uint8_t> a(static_cast<size_t>(M * K)), b(static_cast<size_t>(G * N * K));
  std::vector<float> out(static_cast<size_t>(M * N)), bias(static_cast<size_t>(G * N));
  SECTION("DeepSeek-V3: 1 x 128 blocks on a, 128 x 128 on b, float32 scales") {
    const int64_t chunks = K / 128, b_row_blocks = N / 128;
    std::vector<float> sa(static_cast<size_t>(M * chunks)), sb(static_cast<size_t>(G * b_row_blocks * chunks));
    const fp8mp::cuda::BlockScaledGroupedGemmArgs args{
        fp8mp::BlockGemmRecipe::DeepSeek,
        BlockGemmOperand{a.data(), Fp8Format::E4M3, sa.data(), M, 1, fp8mp::LtScaleLayout::Vec128},
        BlockGemmOperand{b.data(), Fp8Format::E4M3, sb.data(), N, 128, fp8mp::LtScaleLayout::Blk128x128},
        offs.data(), G, N, K, 128, bias.data(), out.data(), HpType::Float32};
    const fp8mp::cuda::BlockGemmArgs g1 = grouped::block_group_args(args, 1, 6, 10);
    REQUIRE((g1.a.rows == 4 && g1.a.data == &a[size_t(6 * K)] && g1.a.scale_inv == &sa[size_t(6 * chunks)]));
    REQUIRE((g1.b.rows == N && g1.b.data == &b[size_t(N * K)] && g1.b.scale_inv == &sb[size_t(b_row_blocks * chunks)]));
    REQUIRE((g1.bias == &bias[size_t(N)] && g1.out == &out[size_t(6 * N)] && g1.K == K && g1.block_k == 128));
  }
  SECTION("MXFP8: 1 x 32 blocks on both, one E8M0 byte a scale") {
    const int64_t chunks = K / 32;
    std::vector<uint8_t> sa(static_cast<size_t>(M * chunks)), sb(static_cast<size_t>(G * N * chunks));
    const fp8mp::cuda::BlockScaledGroupedGemmArgs args{
        fp8mp::BlockGemmRecipe::Mxfp8,
        BlockGemmOperand{a.data(), Fp8Format::E4M3, sa.data(), M, 1, fp8mp::LtScaleLayout::Vec32Swizzled},
        BlockGemmOperand{b.data(), Fp8Format::E4M3, sb.data(), N, 1, fp8mp::LtScaleLayout::Vec32Swizzled},
        offs.data(), G, N, K, 32, nullptr, out.data(), HpType::Float32};
    const fp8mp::cuda::BlockGemmArgs g1 = grouped::block_group_args(args, 1, 6, 10);
    REQUIRE((g1.a.scale_inv == &sa[size_t(6 * chunks)] && g1.b.scale_inv == &sb[size_t(N * chunks)]));
    REQUIRE(g1.bias == nullptr);
  }
}

TEST_CASE("the K-grouped GEMMs write group g's [N, K] block of out and pack the widest group in their scratch",
          "[cuda_glue]") {
  namespace grouped = fp8mp::cuda::grouped;
  const int64_t N = 16, K = 32, T = 10, G = 3;
  const std::vector<int32_t> offs{3, 3, 10};
  REQUIRE(grouped::widest_group(offs.data(), G) == 7);
  std::vector<uint8_t> a(static_cast<size_t>(N * T)), b(static_cast<size_t>(K * T)), a_group(1), b_group(1);
  std::vector<float> s(1), out(static_cast<size_t>(G * N * K));
  const fp8mp::cuda::Fp8GroupedGemmWgradArgs args{a.data(), Fp8Format::E5M2, b.data(), Fp8Format::E4M3, offs.data(),
                                                  G, N, K, T, s.data(), s.data(), out.data(), HpType::Float32, false};
  const fp8mp::cuda::Fp8GemmArgs g2 = grouped::wgrad_group_args(args, 2, 7, a_group.data(), b_group.data());
  REQUIRE((g2.M == N && g2.N == K && g2.K == 7 && g2.a == a_group.data() && g2.b == b_group.data()));
  REQUIRE(g2.out == &out[size_t(2 * N * K)]);

  // Block-scaled, 128-column chunks: the packed a [N, 7], b [K, 7] and their one chunk of scales each, 256-aligned.
  std::vector<float> sa(static_cast<size_t>(N * 2)), sb(static_cast<size_t>(K * 2));
  const fp8mp::cuda::BlockScaledGroupedGemmWgradArgs bargs{
      fp8mp::BlockGemmRecipe::Rowwise,
      fp8mp::cuda::BlockGemmOperand{a.data(), Fp8Format::E4M3, sa.data(), N, 1, fp8mp::LtScaleLayout::OuterVec},
      fp8mp::cuda::BlockGemmOperand{b.data(), Fp8Format::E4M3, sb.data(), K, 1, fp8mp::LtScaleLayout::OuterVec},
      offs.data(), G, N, K, T, 2, 128, out.data(), HpType::Float32};
  alignas(256) static uint8_t scratch[4096];
  const grouped::BlockWgradScratch layout = grouped::block_wgrad_scratch(bargs, scratch);
  REQUIRE((layout.a_group == scratch && layout.b_group == scratch + 256));  // N * 7 = 112 bytes, rounded up
  REQUIRE((layout.a_scales == scratch + 512 && layout.b_scales == scratch + 768));  // 16 and 32 floats of one chunk
  REQUIRE((layout.bytes == 1024 && layout.gemm == scratch + 1024));
  const fp8mp::cuda::BlockGemmArgs bg = grouped::block_wgrad_group_args(bargs, 1, 7, layout.a_group, layout.a_scales,
                                                                         layout.b_group, layout.b_scales);
  REQUIRE((bg.K == 7 && bg.a.data == layout.a_group && bg.b.scale_inv == layout.b_scales));
  REQUIRE(bg.out == &out[size_t(N * K)]);
}
