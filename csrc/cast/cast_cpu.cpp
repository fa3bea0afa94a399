// CPU implementations of the cast ops: parallel over chunks (at::parallel_for),
// with branch-free inner loops (fp8_format.h) that the compiler vectorizes.
#include <ATen/ATen.h>
#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <atomic>
#include <cstring>

#include "common/fp8_decode_table.h"
#include "common/cpu_clones.h"
#include "common/fp8_format.h"
#include "cast/cast_checks.h"

namespace fp8mp {
namespace {

constexpr int64_t kGrain = 1 << 15;  // elements per parallel task: big enough to amortize scheduling
// Transpose tiles: 64 rows (a full 64-byte line of the transpose per column) by 512 columns
// (2 KiB runs of fp32 input, long enough that rows 16 KiB apart do not thrash the L1 sets).
constexpr int64_t kTileRows = 64;
constexpr int64_t kTileCols = 512;

// Positive floats order like their bit patterns, and NaN's bits sort above
// Inf's, so an integer max over |x| bits is a NaN-propagating float max.
void atomic_max_bits(std::atomic<uint32_t>& target, uint32_t value) {
  uint32_t seen = target.load(std::memory_order_relaxed);
  while (value > seen && !target.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}

template <Fp8Format F, typename scalar_t>
FP8MP_CPU_CLONES uint32_t cast_span(const scalar_t* __restrict x, uint8_t* __restrict y, int64_t n, float scale) {
  uint32_t amax_bits = 0;
  for (int64_t i = 0; i < n; ++i) {
    const float v = static_cast<float>(x[i]);
    const uint32_t abs_bits = float_to_bits(v) & 0x7FFFFFFFu;
    amax_bits = abs_bits > amax_bits ? abs_bits : amax_bits;
    y[i] = encode<F>(v * scale);
  }
  return amax_bits;
}

// dst[j][i] = src[i][j] for an 8x8 byte block: rows held as uint64 words and transposed by
// swapping 1-, 2- and 4-byte sub-blocks (three rounds of masked shifts).
inline void transpose8x8(const uint8_t* src, int64_t src_stride, uint8_t* dst, int64_t dst_stride) {
  uint64_t row[8];
  for (int i = 0; i < 8; ++i) std::memcpy(&row[i], src + i * src_stride, 8);
  constexpr struct { int shift; uint64_t mask; } kRounds[3] = {
      {8, 0x00FF00FF00FF00FFull}, {16, 0x0000FFFF0000FFFFull}, {32, 0x00000000FFFFFFFFull}};
  for (const auto& round : kRounds) {
    for (int i = 0; i < 8; ++i) {
      if (i & round.shift / 8) continue;  // i is the upper row of a pair (i, i + shift/8)
      const int j = i + round.shift / 8;
      const uint64_t t = ((row[i] >> round.shift) ^ row[j]) & round.mask;
      row[j] ^= t;
      row[i] ^= t << round.shift;
    }
  }
  for (int i = 0; i < 8; ++i) std::memcpy(dst + i * dst_stride, &row[i], 8);
}

// Cast one tile [r0, r1) x [c0, c1) of the row-major (rows x cols) input to y and to its transpose yt.
template <Fp8Format F, typename scalar_t>
uint32_t cast_tile_transpose(const scalar_t* __restrict x, uint8_t* __restrict y, uint8_t* __restrict yt, int64_t rows,
                             int64_t cols, int64_t r0, int64_t r1, int64_t c0, int64_t c1, float scale) {
  uint32_t amax_bits = 0;
  const int64_t width = c1 - c0;
  for (int64_t r = r0; r < r1; ++r) {
    const uint32_t row_amax = cast_span<F>(x + r * cols + c0, y + r * cols + c0, width, scale);
    amax_bits = row_amax > amax_bits ? row_amax : amax_bits;
  }
  // The tile of y just written is in cache: transpose it into yt in 8x8 byte blocks through
  // registers, then the ragged edges byte by byte.
  const uint8_t* tile = y + r0 * cols + c0;
  const int64_t height = r1 - r0, full_rows = height / 8 * 8, full_cols = width / 8 * 8;
  for (int64_t bc = 0; bc < full_cols; bc += 8) {
    for (int64_t br = 0; br < full_rows; br += 8) {
      transpose8x8(tile + br * cols + bc, cols, yt + (c0 + bc) * rows + r0 + br, rows);
    }
  }
  for (int64_t c = 0; c < width; ++c) {
    uint8_t* out = yt + (c0 + c) * rows + r0;
    for (int64_t r = (c < full_cols ? full_rows : 0); r < height; ++r) out[r] = tile[r * cols + c];
  }
  return amax_bits;
}

at::Tensor cast_to_fp8_cpu(const at::Tensor& x, const at::Tensor& scale, at::Tensor& amax, c10::string_view fmt) {
  const Fp8Format format = check_cast_to_fp8_args(x, scale, amax, fmt, "fp8mp::cast_to_fp8");
  const at::Tensor xc = x.contiguous();
  at::Tensor y = at::empty(x.sizes(), x.options().dtype(fp8_dtype(format)));
  const float scale_value = scale.item<float>();
  std::atomic<uint32_t> amax_bits{0};
  uint8_t* y_ptr = reinterpret_cast<uint8_t*>(y.data_ptr());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "fp8mp::cast_to_fp8", [&] {
    const scalar_t* x_ptr = xc.const_data_ptr<scalar_t>();
    FP8MP_DISPATCH_FORMAT(format, [&] {
      at::parallel_for(0, xc.numel(), kGrain, [&](int64_t begin, int64_t end) {
        atomic_max_bits(amax_bits, cast_span<kFormat>(x_ptr + begin, y_ptr + begin, end - begin, scale_value));
      });
    });
  });
  amax.fill_(bits_to_float(amax_bits.load()));
  return y;
}

std::tuple<at::Tensor, at::Tensor> cast_to_fp8_transpose_cpu(const at::Tensor& x, const at::Tensor& scale,
                                                             at::Tensor& amax, c10::string_view fmt) {
  constexpr const char* op = "fp8mp::cast_to_fp8_transpose";
  const Fp8Format format = check_cast_to_fp8_args(x, scale, amax, fmt, op);
  TORCH_CHECK_VALUE(x.dim() == 2, op, ": argument 'x' must be 2-D, got shape ", x.sizes());
  const at::Tensor xc = x.contiguous();
  const int64_t rows = x.size(0), cols = x.size(1);
  const auto fp8_options = x.options().dtype(fp8_dtype(format));
  at::Tensor y = at::empty({rows, cols}, fp8_options);
  at::Tensor yt = at::empty({cols, rows}, fp8_options);
  const float scale_value = scale.item<float>();
  std::atomic<uint32_t> amax_bits{0};
  uint8_t* y_ptr = reinterpret_cast<uint8_t*>(y.data_ptr());
  uint8_t* yt_ptr = reinterpret_cast<uint8_t*>(yt.data_ptr());
  const int64_t row_tiles = (rows + kTileRows - 1) / kTileRows, col_tiles = (cols + kTileCols - 1) / kTileCols;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), op, [&] {
    const scalar_t* x_ptr = xc.const_data_ptr<scalar_t>();
    FP8MP_DISPATCH_FORMAT(format, [&] {
      const int64_t grain = std::max<int64_t>(1, kGrain / (kTileRows * kTileCols));
      at::parallel_for(0, row_tiles * col_tiles, grain, [&](int64_t begin, int64_t end) {
        uint32_t local = 0;
        for (int64_t t = begin; t < end; ++t) {
          const int64_t r0 = (t / col_tiles) * kTileRows, c0 = (t % col_tiles) * kTileCols;
          const uint32_t tile_amax =
              cast_tile_transpose<kFormat>(x_ptr, y_ptr, yt_ptr, rows, cols, r0, std::min(r0 + kTileRows, rows), c0,
                                           std::min(c0 + kTileCols, cols), scale_value);
          local = tile_amax > local ? tile_amax : local;
        }
        atomic_max_bits(amax_bits, local);
      });
    });
  });
  amax.fill_(bits_to_float(amax_bits.load()));
  return {y, yt};
}

at::Tensor cast_from_fp8_cpu(const at::Tensor& y, const at::Tensor& scale_inv, at::ScalarType out_dtype) {
  const Fp8Format format = check_cast_from_fp8_args(y, scale_inv, out_dtype);
  const at::Tensor yc = y.contiguous();
  at::Tensor out = at::empty(y.sizes(), y.options().dtype(out_dtype));
  const float scale_inv_value = scale_inv.item<float>();
  const uint8_t* y_ptr = reinterpret_cast<const uint8_t*>(yc.const_data_ptr());
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, out_dtype, "fp8mp::cast_from_fp8", [&] {
    scalar_t* out_ptr = out.mutable_data_ptr<scalar_t>();
    FP8MP_DISPATCH_FORMAT(format, [&] {
      const float* table = decode_table<kFormat>().data();
      at::parallel_for(0, yc.numel(), kGrain, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) out_ptr[i] = static_cast<scalar_t>(table[y_ptr[i]] * scale_inv_value);
      });
    });
  });
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(fp8mp, CPU, m) {
  m.impl("cast_to_fp8", &cast_to_fp8_cpu);
  m.impl("cast_to_fp8_transpose", &cast_to_fp8_transpose_cpu);
  m.impl("cast_from_fp8", &cast_from_fp8_cpu);
}

}  // namespace fp8mp
