// The key/value cache of a generation (src/generate/): per attention module, keys and values
// [batch, kv_heads, capacity, head_dim] in the compute dtype on the module's device, allocated on
// first use (the prompt pass) and written at each row's positions as decoding goes on. Entries are
// looked up by module under a lock: the stages of virtual devices run on their own threads.
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <mutex>

namespace actcap {

struct KvCache {
  struct Entry {
    at::Tensor k, v;
  };
  explicit KvCache(int64_t capacity) : capacity(capacity) {}
  // The entry of `owner` (an attention module); references stay valid while the cache lives.
  Entry& entry(const void* owner) {
    std::lock_guard<std::mutex> lock(mu_);
    return entries_[owner];
  }
  uint64_t bytes() const {
    std::lock_guard<std::mutex> lock(mu_);
    uint64_t n = 0;
    for (const auto& [owner, e] : entries_)
      if (e.k.defined()) n += e.k.nbytes() + e.v.nbytes();
    return n;
  }
  const int64_t capacity;  // positions each row can hold

 private:
  mutable std::mutex mu_;
  std::map<const void*, Entry> entries_;
};

}  // namespace actcap
