// Helpers the kernel tests share: a float's bits and back, and a ParallelFor that runs the body in one piece.
#pragma once

#include <cstdint>
#include <cstring>

#include "common/cpu_parallel.h"

namespace fp8mp_test {

inline uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}

inline float from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

inline void serial_for(int64_t begin, int64_t end, int64_t, const fp8mp::RangeBody& body) { body(begin, end); }

}  // namespace fp8mp_test
