// The registered ops, called through the dispatcher from C++ (no Python): the
// shared fp8mp_core library must carry its TORCH_LIBRARY registrations.
// Prefixed Catch macros: torch (glog-style logging) defines its own CHECK.
#define CATCH_CONFIG_PREFIX_ALL
#include <catch2/catch.hpp>

#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>

#include <cmath>

#include "common/fp8_format.h"

namespace {

using CastFn = at::Tensor(const at::Tensor&, const at::Tensor&, at::Tensor&, c10::string_view);
using CastTransposeFn = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&, at::Tensor&,
                                                           c10::string_view);
using CastFromFn = at::Tensor(const at::Tensor&, const at::Tensor&, at::ScalarType);

template <typename Fn>
c10::TypedOperatorHandle<Fn> op(const char* name) {
  return c10::Dispatcher::singleton().findSchemaOrThrow(name, "").typed<Fn>();
}

}  // namespace

CATCH_TEST_CASE("cast_to_fp8 is registered and matches the scalar encoder", "[ops]") {
  at::manual_seed(0);
  const at::Tensor x = at::randn({300, 257}) * 200;
  const at::Tensor scale = at::full({1}, 1.75f);
  at::Tensor amax = at::zeros({1});
  const at::Tensor y = op<CastFn>("fp8mp::cast_to_fp8").call(x, scale, amax, "e4m3");
  CATCH_REQUIRE(y.scalar_type() == at::kFloat8_e4m3fn);
  const float* xp = x.const_data_ptr<float>();
  const uint8_t* yp = reinterpret_cast<const uint8_t*>(y.const_data_ptr());
  float expected_amax = 0.0f;
  for (int64_t i = 0; i < x.numel(); ++i) {
    CATCH_REQUIRE(yp[i] == fp8mp::encode<fp8mp::Fp8Format::E4M3>(xp[i] * 1.75f));
    expected_amax = std::max(expected_amax, std::fabs(xp[i]));
  }
  CATCH_REQUIRE(amax.item<float>() == expected_amax);
}

CATCH_TEST_CASE("cast_to_fp8_transpose gives the transpose and cast_from_fp8 decodes", "[ops]") {
  const at::Tensor x = at::randn({70, 130}).to(at::kBFloat16) * 10;
  at::Tensor amax = at::zeros({1});
  auto [y, yt] = op<CastTransposeFn>("fp8mp::cast_to_fp8_transpose").call(x, at::ones({1}), amax, "e5m2");
  CATCH_REQUIRE(yt.sizes() == at::IntArrayRef({130, 70}));
  CATCH_REQUIRE(at::equal(yt.view(at::kByte), y.view(at::kByte).t().contiguous()));
  const at::Tensor back = op<CastFromFn>("fp8mp::cast_from_fp8").call(y, at::full({1}, 0.5f), at::kFloat);
  const uint8_t* yp = reinterpret_cast<const uint8_t*>(y.const_data_ptr());
  const float* bp = back.const_data_ptr<float>();
  for (int64_t i = 0; i < y.numel(); ++i) CATCH_REQUIRE(bp[i] == fp8mp::decode<fp8mp::Fp8Format::E5M2>(yp[i]) * 0.5f);
}

CATCH_TEST_CASE("bad arguments raise errors naming the argument", "[ops]") {
  at::Tensor amax = at::zeros({1});
  auto cast = op<CastFn>("fp8mp::cast_to_fp8");
  CATCH_REQUIRE_THROWS_WITH(cast.call(at::ones({4}), at::ones({1}), amax, "e3m4"), Catch::Contains("'fmt'"));
  CATCH_REQUIRE_THROWS_WITH(cast.call(at::ones({4}), at::ones({2}), amax, "e4m3"), Catch::Contains("'scale'"));
  CATCH_REQUIRE_THROWS_WITH(cast.call(at::ones({4}, at::kDouble), at::ones({1}), amax, "e4m3"), Catch::Contains("'x'"));
  // Shape and value errors carry fp8mp's ValueError tag (csrc/common/stable.h), which fp8mp.ops re-raises as ValueError.
  CATCH_REQUIRE_THROWS_WITH(cast.call(at::ones({4}), at::ones({1}), amax, "bad"), Catch::StartsWith("[ValueError] "));
  CATCH_REQUIRE_THROWS_WITH(cast.call(at::ones({4}), at::ones({1}), amax, "bad"), Catch::Contains("'fmt'"));
}

CATCH_TEST_CASE("an amax that overlaps the input or the scale is refused", "[ops]") {
  auto cast = op<CastFn>("fp8mp::cast_to_fp8");
  at::Tensor x = at::ones({4});
  at::Tensor alias = x.narrow(0, 0, 1);
  CATCH_REQUIRE_THROWS_WITH(cast.call(x, at::ones({1}), alias, "e4m3"),
                            Catch::Contains("'amax' is written in place and must not share memory with 'x'"));
  at::Tensor scale = at::ones({1});
  CATCH_REQUIRE_THROWS_WITH(cast.call(x, scale, scale, "e4m3"), Catch::Contains("share memory with 'scale'"));
}
