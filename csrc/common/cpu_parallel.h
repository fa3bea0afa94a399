// How the torch-free CPU kernels run in parallel: the glue hands them a
// ParallelFor that splits [begin, end) into chunks of at least `grain` items
// over torch's intra-op thread pool (at::parallel_for, or its stable-ABI
// counterpart), so the kernels use the threads torch is configured with
// without depending on torch. Standard library only.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>

namespace fp8mp {

using RangeBody = std::function<void(int64_t begin, int64_t end)>;
using ParallelFor = void (*)(int64_t begin, int64_t end, int64_t grain, const RangeBody& body);

// Positive floats order like their bit patterns, and NaN's bits sort above
// Inf's, so an integer max over |x| bits is a NaN-propagating float max.
inline void atomic_max_bits(std::atomic<uint32_t>& target, uint32_t value) {
  uint32_t seen = target.load(std::memory_order_relaxed);
  while (value > seen && !target.compare_exchange_weak(seen, value, std::memory_order_relaxed)) {
  }
}

}  // namespace fp8mp
