// cpu::cast_to_fp8_transpose (the torch-free kernel) against the scalar encode and a
// byte-by-byte transpose, for every shape class: 1 row, 1 column, rows and columns
// below, at and past multiples of 16 (the portable transpose block), 64 (the AVX-512
// block and the tile height) and 512 (the tile width), with the work handed out whole
// and cut into one-tile tasks run out of order (as threads may split tile rows), and with
// more than one thread declared, which hands out bands of 64-column strips where the rows
// are fewer than the columns.
#define CATCH_CONFIG_PREFIX_ALL
#include <catch2/catch.hpp>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "cast/cast_cpu_kernels.h"
#include "common/fp8_format.h"
#include "common/half_types.h"

namespace {

using fp8mp::Fp8Format;

void run_whole(int64_t begin, int64_t end, int64_t, const fp8mp::RangeBody& body) { body(begin, end); }

// Tasks of `grain` items, last first.
void run_in_pieces(int64_t begin, int64_t end, int64_t grain, const fp8mp::RangeBody& body) {
  const int64_t pieces = (end - begin + grain - 1) / grain;
  for (int64_t p = pieces - 1; p >= 0; --p) body(begin + p * grain, std::min(end, begin + (p + 1) * grain));
}

// Two tasks, as at::parallel_for gives two threads (halves, rounded up), the second first.
void run_in_halves(int64_t begin, int64_t end, int64_t, const fp8mp::RangeBody& body) {
  const int64_t middle = std::min(end, begin + (end - begin + 1) / 2);
  if (middle < end) body(middle, end);
  body(begin, middle);
}

template <Fp8Format F, typename scalar_t>
void check_shape(const std::vector<scalar_t>& x, fp8mp::HpType x_type, int64_t rows, int64_t cols, float scale,
                 fp8mp::ParallelFor parallel_for, int threads = 1) {
  CATCH_INFO(rows << " x " << cols << ", " << threads << " threads");
  const int64_t n = rows * cols;
  std::vector<uint8_t> y(n + 64, 0xEE), yt(n + 64, 0xEE);  // guard bytes after each output
  const float amax = fp8mp::cpu::cast_to_fp8_transpose(x.data(), x_type, y.data(), yt.data(), rows, cols, scale, F,
                                                       parallel_for, nullptr, threads);
  float expected_amax = 0.0f;
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t c = 0; c < cols; ++c) {
      const float v = static_cast<float>(x[r * cols + c]);
      expected_amax = std::max(expected_amax, v < 0 ? -v : v);
      const uint8_t code = fp8mp::encode<F>(v * scale);
      if (y[r * cols + c] != code || yt[c * rows + r] != code) {
        CATCH_INFO("element (" << r << ", " << c << "): y " << int(y[r * cols + c]) << ", yt "
                               << int(yt[c * rows + r]) << ", expected " << int(code));
        CATCH_REQUIRE(false);
      }
    }
  }
  for (int64_t i = n; i < n + 64; ++i) CATCH_REQUIRE((y[i] == 0xEE && yt[i] == 0xEE));
  CATCH_REQUIRE(amax == expected_amax);
}

// With dbias: the same y and yt, and dbias[c] with the bits of the documented order (kDbiasRows rows at a
// time summed row by row in fp32, then those sums in order), whichever of the kernel's pieces summed them
// (the AVX-512 blocks while casting, the portable loop for the columns past the last whole block).
template <Fp8Format F, typename scalar_t>
void check_dbias(const std::vector<scalar_t>& x, fp8mp::HpType x_type, int64_t rows, int64_t cols, float scale,
                 fp8mp::ParallelFor parallel_for, int threads = 1) {
  CATCH_INFO(rows << " x " << cols << " with dbias, " << threads << " threads");
  const int64_t n = rows * cols;
  std::vector<uint8_t> y(n), yt(n), y_plain(n), yt_plain(n);
  std::vector<float> dbias(cols + 16, -7.0f);  // guard values after the columns
  fp8mp::cpu::cast_to_fp8_transpose(x.data(), x_type, y_plain.data(), yt_plain.data(), rows, cols, scale, F,
                                    parallel_for);
  fp8mp::cpu::cast_to_fp8_transpose(x.data(), x_type, y.data(), yt.data(), rows, cols, scale, F, parallel_for,
                                    dbias.data(), threads);
  CATCH_REQUIRE((y == y_plain && yt == yt_plain));
  for (int64_t c = 0; c < cols; ++c) {
    float total = 0.0f;
    for (int64_t r0 = 0; r0 < rows; r0 += fp8mp::cpu::kDbiasRows) {
      float tile = static_cast<float>(x[r0 * cols + c]);
      for (int64_t r = r0 + 1; r < std::min(rows, r0 + fp8mp::cpu::kDbiasRows); ++r) tile += static_cast<float>(x[r * cols + c]);
      total = r0 == 0 ? tile : total + tile;
    }
    if (fp8mp::float_to_bits(dbias[c]) != fp8mp::float_to_bits(total)) {
      CATCH_INFO("column " << c << ": " << dbias[c] << ", expected " << total);
      CATCH_REQUIRE(false);
    }
  }
  for (int64_t c = cols; c < cols + 16; ++c) CATCH_REQUIRE(dbias[c] == -7.0f);
}

template <typename scalar_t>
std::vector<scalar_t> values(int64_t n) {
  std::vector<scalar_t> x(n);
  // Finite values over the whole range of the format (saturating ones and subnormals too), both signs.
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t h = uint32_t(i) * 2654435761u;
    const float magnitude = float(h >> 8) / float(1 << 24) * 1000.0f / float(1 + (h & 0xFF));
    x[i] = scalar_t((h & 0x100u) ? -magnitude : magnitude);
  }
  return x;
}

}  // namespace

CATCH_TEST_CASE("cast_to_fp8_transpose kernel equals the scalar encode and a byte transpose for every shape class",
                "[transpose]") {
  const std::vector<int64_t> row_counts = {1, 2, 15, 16, 17, 63, 64, 65, 128, 130, 200};
  const std::vector<int64_t> col_counts = {1, 3, 16, 31, 64, 65, 127, 512, 513, 1100};
  for (int64_t rows : row_counts) {
    for (int64_t cols : col_counts) {
      const std::vector<float> x = values<float>(rows * cols);
      check_shape<Fp8Format::E4M3>(x, fp8mp::HpType::Float32, rows, cols, 1.5f, run_whole);
      check_shape<Fp8Format::E4M3>(x, fp8mp::HpType::Float32, rows, cols, 1.5f, run_in_pieces);
      check_shape<Fp8Format::E5M2>(x, fp8mp::HpType::Float32, rows, cols, 0.25f, run_in_pieces);
      check_dbias<Fp8Format::E4M3>(x, fp8mp::HpType::Float32, rows, cols, 1.5f, run_in_pieces);
      check_shape<Fp8Format::E4M3>(x, fp8mp::HpType::Float32, rows, cols, 1.5f, run_in_pieces, 2);
      check_shape<Fp8Format::E4M3>(x, fp8mp::HpType::Float32, rows, cols, 1.5f, run_in_halves, 2);
      check_dbias<Fp8Format::E4M3>(x, fp8mp::HpType::Float32, rows, cols, 1.5f, run_in_halves, 2);
    }
  }
}

CATCH_TEST_CASE("cast_to_fp8_transpose kernel with bf16 and fp16 input", "[transpose]") {
  for (int64_t rows : {1, 64, 129}) {
    for (int64_t cols : {1, 70, 1100}) {
      check_shape<Fp8Format::E4M3>(values<fp8mp::bf16>(rows * cols), fp8mp::HpType::BFloat16, rows, cols, 2.0f,
                                   run_in_pieces);
      check_shape<Fp8Format::E5M2>(values<fp8mp::fp16>(rows * cols), fp8mp::HpType::Float16, rows, cols, 2.0f,
                                   run_whole);
      check_dbias<Fp8Format::E4M3>(values<fp8mp::bf16>(rows * cols), fp8mp::HpType::BFloat16, rows, cols, 2.0f,
                                   run_whole);
      check_dbias<Fp8Format::E5M2>(values<fp8mp::fp16>(rows * cols), fp8mp::HpType::Float16, rows, cols, 2.0f,
                                   run_in_pieces);
      check_shape<Fp8Format::E4M3>(values<fp8mp::bf16>(rows * cols), fp8mp::HpType::BFloat16, rows, cols, 2.0f,
                                   run_in_halves, 2);
      check_dbias<Fp8Format::E5M2>(values<fp8mp::bf16>(rows * cols), fp8mp::HpType::BFloat16, rows, cols, 2.0f,
                                   run_in_pieces, 3);
    }
  }
}
