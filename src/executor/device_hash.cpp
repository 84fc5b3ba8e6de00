#include "executor/device_hash.h"

#include <c10/core/DeviceGuard.h>

namespace actcap {

namespace {
constexpr uint64_t kStep = 0x9E3779B97F4A7C15ull, kOffset = 0x632BE59BD9B4E019ull,
                   kLength = 0xC2B2AE3D27D4EB4Full;
int64_t as_signed(uint64_t v) { return static_cast<int64_t>(v); }  // two's complement bits
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
  // Integer arithmetic wraps mod 2^64 on every backend, and the sum's order does not matter.
  const at::Tensor m = at::arange(words.numel(), words.options())
                           .mul_(as_signed(kStep))
                           .add_(as_signed(kOffset))
                           .bitwise_or_(1);
  return words.mul(m).sum().add_(as_signed(static_cast<uint64_t>(n) * kLength));
}

uint64_t device_hash_value(const at::Tensor& t) {
  return static_cast<uint64_t>(device_hash(t).item<int64_t>());
}

}  // namespace actcap
