// 256-entry FP8 -> fp32 (and -> bf16) decode tables for the CPU kernels
// (cast_from_fp8 and fp8_gemm). Built once from fp8_format.h's decode<F>, so every
// CPU path decodes exactly like the CUDA kernels do.
#pragma once

#include <array>
#include <cstdint>

#include "common/fp8_format.h"

namespace fp8mp {

template <Fp8Format F>
const std::array<float, 256>& decode_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int code = 0; code < 256; ++code) t[code] = decode<F>(uint8_t(code));
    return t;
  }();
  return table;
}

inline const float* decode_table_for(Fp8Format format) {
  return format == Fp8Format::E4M3 ? decode_table<Fp8Format::E4M3>().data() : decode_table<Fp8Format::E5M2>().data();
}

// The bf16 bits of every FP8 value: the upper half of its fp32 bits, exactly (3 or 2 mantissa bits fit in 7).
template <Fp8Format F>
const std::array<uint16_t, 256>& bf16_decode_table() {
  static const std::array<uint16_t, 256> table = [] {
    std::array<uint16_t, 256> t{};
    for (int code = 0; code < 256; ++code) t[code] = uint16_t(float_to_bits(decode_table<F>()[code]) >> 16);
    return t;
  }();
  return table;
}

inline const uint16_t* bf16_decode_table_for(Fp8Format format) {
  return format == Fp8Format::E4M3 ? bf16_decode_table<Fp8Format::E4M3>().data()
                                   : bf16_decode_table<Fp8Format::E5M2>().data();
}

}  // namespace fp8mp
