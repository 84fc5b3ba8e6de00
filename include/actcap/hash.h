// XXH3-64 fingerprints, printed as 16 lowercase hex digits.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace actcap {

uint64_t xxh3(const void* data, size_t size);
std::string hex64(uint64_t h);
// Hash of a tensor's bytes in contiguous row-major order (CPU copy made if needed).
uint64_t tensor_xxh3(const at::Tensor& t);

// Snapshot fingerprints, taken and checked within one process: XXH3 of every 64 KiB chunk (chunks
// hashed in parallel on ATen's intra-op threads), then XXH3 of the chunk hashes. A different value
// from xxh3() of the same bytes; checksums written to files use xxh3() / tensor_xxh3().
uint64_t chunked_xxh3(const void* data, size_t size);
// Copies `size` bytes from `src` to `dst` (not overlapping) chunk by chunk in parallel; with
// `fingerprint`, hashes each chunk right after copying it, while it is in cache, and returns
// chunked_xxh3() of the bytes (0 otherwise).
uint64_t copy_chunked(const void* src, void* dst, size_t size, bool fingerprint);
// chunked_xxh3() of a tensor's bytes in contiguous row-major order (CPU copy made if needed).
uint64_t tensor_chunked_xxh3(const at::Tensor& t);

// xxh3() of bytes fed piece by piece: digest() is xxh3() of everything fed so far, in order.
class Xxh3Stream {
 public:
  Xxh3Stream();
  ~Xxh3Stream();
  Xxh3Stream(const Xxh3Stream&) = delete;
  Xxh3Stream& operator=(const Xxh3Stream&) = delete;
  void update(const void* data, size_t size);
  uint64_t digest() const;
  void reset();  // as new

 private:
  void* state_;  // XXH3_state_t
};

// One pass over `size` bytes on the calling thread, 64 KiB chunk by chunk: each chunk, while in
// cache, first feeds `stream`, then is hashed. Returns chunked_xxh3() of the bytes, so that a
// checksum taken with `stream` is proven to be of bytes that match a fingerprint taken earlier.
uint64_t stream_and_fingerprint(const void* data, size_t size, Xxh3Stream& stream);
// The same pass copying each chunk to `dst` first (not overlapping `src`): `stream` and the
// returned fingerprint are of the copied bytes, so a match proves the copy is what was captured.
uint64_t copy_stream_and_fingerprint(const void* src, void* dst, size_t size, Xxh3Stream& stream);

}  // namespace actcap
