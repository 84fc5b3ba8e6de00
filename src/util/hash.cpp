#include "actcap/hash.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <xxhash.h>

#include <cstdio>
#include <cstring>
#include <new>
#include <vector>

namespace actcap {

uint64_t xxh3(const void* data, size_t size) {
  // XXH3 accepts a null pointer only together with size 0; pass a valid one regardless.
  static const char kEmpty = 0;
  return XXH3_64bits(size == 0 ? &kEmpty : data, size);
}

std::string hex64(uint64_t h) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(h));
  return std::string(buf, 16);
}

uint64_t tensor_xxh3(const at::Tensor& t) {
  // Hash the logical row-major bytes so that views, strided tensors and device copies of the same
  // values all hash alike.
  at::Tensor c = t.device().is_cpu() ? t.contiguous() : t.cpu().contiguous();
  const size_t nbytes = static_cast<size_t>(c.numel()) * c.element_size();
  if (nbytes == 0) return xxh3(nullptr, 0);
  return xxh3(c.data_ptr(), nbytes);
}

namespace {

constexpr size_t kChunk = size_t{64} << 10;

// The shared loop: chunk i is [i * kChunk, min(size, (i + 1) * kChunk)).
uint64_t chunks(const void* src, void* dst, size_t size, bool fingerprint) {
  if (size == 0) return fingerprint ? xxh3(nullptr, 0) : 0;
  const auto* from = static_cast<const char*>(src);
  auto* to = static_cast<char*>(dst);
  const int64_t n = static_cast<int64_t>((size + kChunk - 1) / kChunk);
  std::vector<uint64_t> hashes(fingerprint ? static_cast<size_t>(n) : 0);
  at::parallel_for(0, n, /*grain_size=*/4, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      const size_t off = static_cast<size_t>(i) * kChunk, len = std::min(kChunk, size - off);
      if (to) std::memcpy(to + off, from + off, len);
      if (fingerprint) hashes[static_cast<size_t>(i)] = XXH3_64bits((to ? to : from) + off, len);
    }
  });
  return fingerprint ? xxh3(hashes.data(), hashes.size() * sizeof(uint64_t)) : 0;
}

}  // namespace

uint64_t chunked_xxh3(const void* data, size_t size) { return chunks(data, nullptr, size, true); }

uint64_t copy_chunked(const void* src, void* dst, size_t size, bool fingerprint) {
  return chunks(src, dst, size, fingerprint);
}

Xxh3Stream::Xxh3Stream() : state_(XXH3_createState()) {
  if (!state_) throw std::bad_alloc();
  XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_));
}

Xxh3Stream::~Xxh3Stream() { XXH3_freeState(static_cast<XXH3_state_t*>(state_)); }

void Xxh3Stream::update(const void* data, size_t size) {
  if (size > 0) XXH3_64bits_update(static_cast<XXH3_state_t*>(state_), data, size);
}

void Xxh3Stream::reset() { XXH3_64bits_reset(static_cast<XXH3_state_t*>(state_)); }

uint64_t Xxh3Stream::digest() const {
  return XXH3_64bits_digest(static_cast<const XXH3_state_t*>(state_));
}

uint64_t stream_and_fingerprint(const void* data, size_t size, Xxh3Stream& stream) {
  if (size == 0) return xxh3(nullptr, 0);  // as chunked_xxh3()
  const auto* bytes = static_cast<const char*>(data);
  const size_t n = (size + kChunk - 1) / kChunk;
  std::vector<uint64_t> hashes(n);
  for (size_t i = 0; i < n; ++i) {
    const size_t off = i * kChunk, len = std::min(kChunk, size - off);
    stream.update(bytes + off, len);            // the checksum first,
    hashes[i] = XXH3_64bits(bytes + off, len);  // then the check of the same bytes
  }
  return xxh3(hashes.data(), hashes.size() * sizeof(uint64_t));
}

uint64_t copy_stream_and_fingerprint(const void* src, void* dst, size_t size, Xxh3Stream& stream) {
  if (size == 0) return xxh3(nullptr, 0);  // as chunked_xxh3()
  const auto* from = static_cast<const char*>(src);
  auto* to = static_cast<char*>(dst);
  const size_t n = (size + kChunk - 1) / kChunk;
  std::vector<uint64_t> hashes(n);
  for (size_t i = 0; i < n; ++i) {
    const size_t off = i * kChunk, len = std::min(kChunk, size - off);
    std::memcpy(to + off, from + off, len);  // copied, then everything from the copy:
    stream.update(to + off, len);            // the checksum first,
    hashes[i] = XXH3_64bits(to + off, len);  // then the check of the same bytes
  }
  return xxh3(hashes.data(), hashes.size() * sizeof(uint64_t));
}

uint64_t tensor_chunked_xxh3(const at::Tensor& t) {
  at::Tensor c = t.device().is_cpu() ? t.contiguous() : t.cpu().contiguous();
  return chunked_xxh3(c.data_ptr(), static_cast<size_t>(c.numel()) * c.element_size());
}

}  // namespace actcap
