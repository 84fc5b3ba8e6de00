#include "executor/device_hash.h"

#include <ATen/Parallel.h>
#include <c10/core/DeviceGuard.h>

#include <cstring>
#include <map>
#include <mutex>

namespace actcap {

namespace {
constexpr uint64_t kStep = 0x9E3779B97F4A7C15ull, kOffset = 0x632BE59BD9B4E019ull,
                   kLength = 0xC2B2AE3D27D4EB4Full;
int64_t as_signed(uint64_t v) { return static_cast<int64_t>(v); }  // two's complement bits

// The words are summed as rows of kCols: with kCols even and kStep, kOffset odd, the low bit of
// (r * kCols + c) * kStep + kOffset is that of c + 1, so
//   m_(r * kCols + c) = r * kCols * kStep + m_c   (mod 2^64)
// and sum_i w_i m_i = sum_c m_c * colsum_c + kCols * kStep * sum_r r * rowsum_r: two reductions
// over the data and a table of kCols multipliers, instead of a multiplier per word.
constexpr int64_t kCols = int64_t{1} << 16;

// m_0 .. m_(kCols - 1) on `device`, made once per device and never freed (kernels on any stream
// may read it, so it must never be handed back to an allocator). Made with a blocking copy, so it
// is complete before any stream reads it.
const at::Tensor& multipliers(c10::Device device) {
  static std::mutex mu;
  static auto* tables = new std::map<std::pair<int, int>, at::Tensor>();  // leaked: see above
  std::lock_guard<std::mutex> lock(mu);
  const std::pair<int, int> key{static_cast<int>(device.type()), device.index()};
  auto it = tables->find(key);
  if (it == tables->end()) {
    at::Tensor host = at::empty({kCols}, at::kLong);
    auto* m = host.data_ptr<int64_t>();
    for (int64_t c = 0; c < kCols; ++c)
      m[c] = as_signed((static_cast<uint64_t>(c) * kStep + kOffset) | 1);
    it = tables->emplace(key, device.is_cpu() ? host : host.to(device)).first;
  }
  return it->second;
}
}  // namespace

at::Tensor device_hash(const at::Tensor& t) {
  c10::DeviceGuard guard(t.device());
  const at::Tensor bytes = t.contiguous().view({-1}).view(at::kByte);
  const int64_t n = bytes.numel();
  at::Tensor words;
  if (n % 8 == 0 && bytes.storage_offset() % 8 == 0 &&
      reinterpret_cast<uintptr_t>(bytes.data_ptr()) % 8 == 0) {
    words = bytes.view(at::kLong);
  } else {
    at::Tensor padded = at::zeros({(n + 7) / 8 * 8}, bytes.options());
    padded.narrow(0, 0, n).copy_(bytes);
    words = padded.view(at::kLong);
  }
  // Integer arithmetic wraps mod 2^64 on every backend, and the sums' order does not matter.
  const at::Tensor& m = multipliers(t.device());
  const int64_t rows = words.numel() / kCols, tail = words.numel() - rows * kCols;
  at::Tensor h = at::full({}, as_signed(static_cast<uint64_t>(n) * kLength), words.options());
  if (rows > 0) {
    const at::Tensor w = words.narrow(0, 0, rows * kCols).view({rows, kCols});
    h.add_(w.sum(0).mul_(m).sum());
    if (rows > 1)
      h.add_(w.sum(1).mul_(at::arange(rows, words.options())).sum().mul_(as_signed(kCols * kStep)));
  }
  if (tail > 0) {  // the last, partial row: r = rows
    const at::Tensor w = words.narrow(0, rows * kCols, tail);
    h.add_(w.mul(m.narrow(0, 0, tail)).sum());
    if (rows > 0) h.add_(w.sum().mul_(as_signed(static_cast<uint64_t>(rows) * kCols * kStep)));
  }
  return h;
}

namespace {

// sum of w_i * m_i over the whole words [begin, end), added to s: the word at index i as
// device_hash's view(kLong) reads it (native byte order), m_i = (i * kStep + kOffset) | 1. The sum
// is mod 2^64 in any order, so ranges add up.
uint64_t add_words(const unsigned char* bytes, int64_t begin, int64_t end, uint64_t s) {
  uint64_t base = static_cast<uint64_t>(begin) * kStep + kOffset;
  for (int64_t i = begin; i < end; ++i, base += kStep) {
    uint64_t w;
    std::memcpy(&w, bytes + 8 * i, 8);
    s += w * (base | 1);
  }
  return s;
}

// The zero-padded last word of n bytes (none when n is a whole number of words), and the length.
uint64_t tail_and_length(const unsigned char* bytes, uint64_t n) {
  uint64_t s = n * kLength;
  if (const uint64_t tail = n % 8) {
    const uint64_t words = n / 8;
    uint64_t w = 0;
    std::memcpy(&w, bytes + 8 * words, tail);
    s += w * ((words * kStep + kOffset) | 1);
  }
  return s;
}

const unsigned char* host_bytes(const at::Tensor& c, const char* what) {
  TORCH_CHECK(c.device().is_cpu(), what, " of a tensor on ", c.device());
  return static_cast<const unsigned char*>(c.data_ptr());
}

}  // namespace

uint64_t host_hash(const at::Tensor& t) {
  const at::Tensor c = t.contiguous();
  const unsigned char* bytes = host_bytes(c, "host_hash");
  const uint64_t n = static_cast<uint64_t>(c.numel()) * c.element_size();
  constexpr int64_t kGrain = int64_t{1} << 17;  // 1 MiB of words per task
  const uint64_t sum = at::parallel_reduce(
      int64_t{0}, static_cast<int64_t>(n / 8), kGrain, uint64_t{0},
      [bytes](int64_t begin, int64_t end, uint64_t s) { return add_words(bytes, begin, end, s); },
      [](uint64_t a, uint64_t b) { return a + b; });
  return sum + tail_and_length(bytes, n);
}

uint64_t device_hash_value(const at::Tensor& t) {
  if (t.device().is_cpu()) return host_hash(t);
  return static_cast<uint64_t>(device_hash(t).item<int64_t>());
}

}  // namespace actcap
