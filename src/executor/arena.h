// A device's activation arena: three slots in the compute dtype reused stage after stage.
//   slots 0 and 1: ping-pong outputs of consecutive stages on the device (stage k writes slot k%2,
//                  reading its input from the other slot or the transfer-in slot)
//   slot 2:        the hidden state copied in from another device
// and one more buffer, the conversion scratch: a matrix stored in another dtype (16 bits under
// float32 compute, float32 under 16-bit compute) is converted into it just before use (Linear), so
// the device holds one converted copy of its largest such matrix instead of copies of them all.
// A slot grows when a larger batch needs it and is otherwise handed out again as is: the memory a
// stage wrote two stages ago is overwritten. That reuse is what corrupts a kept hook reference.
#pragma once

#include <ATen/ATen.h>

#include <array>
#include <cstdint>

#include "actcap/devices.h"

namespace actcap {

class Arena {
 public:
  enum Slot { kPing = 0, kPong = 1, kTransferIn = 2 };
  Arena(DeviceId device, at::ScalarType dtype) : device_(device), dtype_(dtype) {}

  // A tensor of `shape` in the arena's dtype over the slot's memory (contents undefined).
  at::Tensor slot(Slot which, at::IntArrayRef shape);
  // The conversion scratch, at least `numel` elements (grows, never shrinks).
  at::Tensor widen_buffer(int64_t numel);
  uint64_t bytes() const;
  int64_t reuses() const { return reuses_; }
  const DeviceId& device() const { return device_; }
  // Data pointer of a slot's storage (for tests that show reuse).
  const void* slot_data(Slot which) const;

 private:
  DeviceId device_;
  at::ScalarType dtype_;
  std::array<at::Tensor, 3> storage_;
  at::Tensor widen_;
  int64_t reuses_ = 0;
};

}  // namespace actcap
