// The scaling, GEMM and norm ops through the dispatcher from C++ (no Python), against values
// computed here from their documented formulas.
#define CATCH_CONFIG_PREFIX_ALL  // torch (glog-style logging) defines its own CHECK
#include <catch2/catch.hpp>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <cmath>

#include "common/fp8_format.h"

namespace {

template <typename Fn>
c10::TypedOperatorHandle<Fn> op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Fn>();
}

}  // namespace

CATCH_TEST_CASE("update_amax_history_and_scale rolls the history and rescales every column", "[ops]") {
  using Fn = void(const at::Tensor&, at::Tensor&, at::Tensor&, at::Tensor&, const at::Tensor&, int64_t, c10::string_view);
  auto update = op<Fn>("fp8mp::update_amax_history_and_scale");
  at::Tensor history = at::zeros({3, 2});
  at::Tensor scale = at::ones({2}), scale_inv = at::ones({2});
  const at::Tensor fp8_max = at::tensor({448.0f, 57344.0f});
  const float amaxes[3][2] = {{2.0f, 0.0f}, {8.0f, 4.0f}, {1.0f, std::nanf("")}};
  for (const auto& step : amaxes) update.call(at::tensor({step[0], step[1]}), history, scale, scale_inv, fp8_max, 1, "max");
  // Row 0 is the newest amax; the history holds the three steps.
  CATCH_REQUIRE(history[0][0].item<float>() == 1.0f);
  CATCH_REQUIRE(history[1][0].item<float>() == 8.0f);
  CATCH_REQUIRE(history[2][0].item<float>() == 2.0f);
  CATCH_REQUIRE(std::isnan(history[0][1].item<float>()));
  // Column 0: 448 / max(1, 8, 2) / 2^margin. Column 1: a NaN in the window keeps the last good scale.
  CATCH_REQUIRE(scale[0].item<float>() == 448.0f / 8.0f / 2.0f);
  CATCH_REQUIRE(scale[1].item<float>() == 57344.0f / 4.0f / 2.0f);
  CATCH_REQUIRE(scale_inv[0].item<float>() == 1.0f / scale[0].item<float>());
}

CATCH_TEST_CASE("fp8_gemm multiplies decoded codes with fp32 accumulation", "[ops]") {
  using Fn = at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                        const std::optional<at::Tensor>&, at::ScalarType, bool);
  auto gemm = op<Fn>("fp8mp::fp8_gemm");
  at::manual_seed(1);
  const at::Tensor a = (at::randn({5, 32}) * 4).to(at::kFloat8_e4m3fn);
  const at::Tensor b = (at::randn({7, 32}) * 4).to(at::kFloat8_e5m2);
  const at::Tensor bias = at::randn({7});
  const at::Tensor out = gemm.call(a, at::full({1}, 0.5f), b, at::full({1}, 0.25f), bias, at::kFloat, false);
  CATCH_REQUIRE(out.sizes() == at::IntArrayRef({5, 7}));
  const uint8_t* ap = reinterpret_cast<const uint8_t*>(a.const_data_ptr());
  const uint8_t* bp = reinterpret_cast<const uint8_t*>(b.const_data_ptr());
  for (int64_t m = 0; m < 5; ++m) {
    for (int64_t n = 0; n < 7; ++n) {
      double acc = 0.0;  // exact: products of FP8 values and their sums fit a double
      for (int64_t k = 0; k < 32; ++k) {
        acc += double(fp8mp::decode<fp8mp::Fp8Format::E4M3>(ap[m * 32 + k])) *
               double(fp8mp::decode<fp8mp::Fp8Format::E5M2>(bp[n * 32 + k]));
      }
      const double expected = acc * 0.125 + double(bias[n].item<float>());
      CATCH_REQUIRE(std::fabs(out[m][n].item<float>() - expected) <= 1e-5 * (std::fabs(expected) + 1.0));
    }
  }
}

CATCH_TEST_CASE("layernorm_fwd normalizes rows in fp32", "[ops]") {
  using Fn = std::tuple<at::Tensor, at::Tensor, at::Tensor>(const at::Tensor&, const std::optional<at::Tensor>&,
                                                            const std::optional<at::Tensor>&, double, bool);
  auto layernorm = op<Fn>("fp8mp::layernorm_fwd");
  const at::Tensor x = at::randn({4, 100}) * 3 + 10;
  auto [out, mean, rstd] = layernorm.call(x, std::nullopt, std::nullopt, 1e-5, false);
  const at::Tensor x64 = x.to(at::kDouble);
  const at::Tensor ref = (x64 - x64.mean(-1, true)) / at::sqrt(x64.var(-1, false, true) + 1e-5);
  CATCH_REQUIRE(at::allclose(out.to(at::kDouble), ref, 1e-5, 1e-5));
  CATCH_REQUIRE(at::allclose(mean.to(at::kDouble), x64.mean(-1), 1e-6, 1e-6));
}
