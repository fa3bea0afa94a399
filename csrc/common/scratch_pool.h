// Scratch memory for the CPU kernels' packed operands, kept between calls.
//
// A GEMM packs megabytes of decoded operands per call; fresh pages for them cost
// more than the packing itself (the kernel zero-fills every 4 KiB page on first
// touch: measured about a quarter of an AMX GEMM's time at 2048^3). Released
// buffers therefore go back to one process-wide pool, bounded in bytes, from which
// the next call of any thread takes the smallest one that fits. Thread-safe;
// standard library only.
#pragma once

#include <cstddef>
#include <cstdint>

namespace fp8mp::cpu {

// The most bytes the pool keeps while no call holds them; a buffer that would exceed it is freed.
constexpr size_t kScratchPoolBytes = size_t(128) << 20;

// `bytes` of 64-byte-aligned scratch memory (contents undefined) for the lifetime of this object.
class ScratchBuffer {
 public:
  explicit ScratchBuffer(size_t bytes);
  ~ScratchBuffer();
  ScratchBuffer(const ScratchBuffer&) = delete;
  ScratchBuffer& operator=(const ScratchBuffer&) = delete;

  template <typename T>
  T* as() const {
    return static_cast<T*>(data_);
  }

 private:
  void* data_;
  size_t capacity_;
};

// Bytes the pool holds right now (for tests).
size_t scratch_pool_bytes();

}  // namespace fp8mp::cpu
