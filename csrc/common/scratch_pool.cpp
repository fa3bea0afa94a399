// The pool behind scratch_pool.h: a mutex-guarded list of free buffers.
#include "common/scratch_pool.h"

#include <algorithm>
#include <mutex>
#include <new>
#include <vector>

namespace fp8mp::cpu {
namespace {

constexpr std::align_val_t kAlignment{64};

struct FreeBuffer {
  void* data;
  size_t capacity;
};

struct Pool {
  std::mutex mutex;
  std::vector<FreeBuffer> free;
  size_t bytes = 0;
};

Pool& pool() {
  static Pool* const instance = new Pool();  // never destroyed: threads may still return buffers at exit
  return *instance;
}

}  // namespace

ScratchBuffer::ScratchBuffer(size_t bytes) : data_(nullptr), capacity_(std::max<size_t>(bytes, 64)) {
  {
    Pool& p = pool();
    const std::lock_guard<std::mutex> lock(p.mutex);
    auto best = p.free.end();
    for (auto it = p.free.begin(); it != p.free.end(); ++it) {
      if (it->capacity >= capacity_ && (best == p.free.end() || it->capacity < best->capacity)) best = it;
    }
    if (best != p.free.end()) {
      data_ = best->data;
      capacity_ = best->capacity;
      p.bytes -= best->capacity;
      p.free.erase(best);
      return;
    }
  }
  data_ = ::operator new(capacity_, kAlignment);
}

ScratchBuffer::~ScratchBuffer() {
  Pool& p = pool();
  const std::lock_guard<std::mutex> lock(p.mutex);
  // Keep this buffer, dropping the smallest kept ones while over the bound (a large buffer serves small
  // calls too); a buffer larger than the bound itself is freed.
  std::sort(p.free.begin(), p.free.end(), [](const FreeBuffer& x, const FreeBuffer& y) { return x.capacity > y.capacity; });
  while (!p.free.empty() && p.bytes + capacity_ > kScratchPoolBytes) {
    p.bytes -= p.free.back().capacity;
    ::operator delete(p.free.back().data, kAlignment);
    p.free.pop_back();
  }
  if (p.bytes + capacity_ <= kScratchPoolBytes) {
    p.free.push_back({data_, capacity_});
    p.bytes += capacity_;
  } else {
    ::operator delete(data_, kAlignment);
  }
}

size_t scratch_pool_bytes() {
  Pool& p = pool();
  const std::lock_guard<std::mutex> lock(p.mutex);
  return p.bytes;
}

}  // namespace fp8mp::cpu
