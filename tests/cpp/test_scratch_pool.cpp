// The CPU kernels' scratch pool (csrc/common/scratch_pool.h): aligned, reused, bounded.
#include <catch2/catch.hpp>

#include <cstdint>
#include <thread>
#include <vector>

#include "common/scratch_pool.h"

using fp8mp::cpu::kScratchPoolBytes;
using fp8mp::cpu::scratch_pool_bytes;
using fp8mp::cpu::ScratchBuffer;

TEST_CASE("scratch buffers are 64-byte aligned and come back for reuse", "[scratch]") {
  void* first = nullptr;
  {
    const ScratchBuffer buffer(1000003);
    first = buffer.as<void>();
    CHECK(reinterpret_cast<uintptr_t>(first) % 64 == 0);
  }
  const size_t kept = scratch_pool_bytes();
  CHECK(kept >= 1000003);
  {
    const ScratchBuffer again(1000001);  // the smallest kept buffer that fits: the one just released
    CHECK(again.as<void>() == first);
    CHECK(scratch_pool_bytes() == kept - 1000003);
  }
  CHECK(scratch_pool_bytes() == kept);
}

TEST_CASE("two buffers held at once are distinct", "[scratch]") {
  const ScratchBuffer a(4096), b(4096);
  const bool apart = a.as<char>() + 4096 <= b.as<char>() || b.as<char>() + 4096 <= a.as<char>();
  CHECK(apart);
}

TEST_CASE("the pool never keeps more than its bound", "[scratch]") {
  {
    const ScratchBuffer huge(kScratchPoolBytes + 1);  // larger than the bound: freed, not kept
    huge.as<char>()[kScratchPoolBytes] = 1;
  }
  CHECK(scratch_pool_bytes() <= kScratchPoolBytes);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([] {
      for (int i = 0; i < 50; ++i) {
        const ScratchBuffer big(kScratchPoolBytes / 3), small(1 << 16);
        big.as<char>()[0] = small.as<char>()[0] = 1;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  CHECK(scratch_pool_bytes() <= kScratchPoolBytes);
}
