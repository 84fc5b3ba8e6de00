// A device's activation arena: three float32 slots reused stage after stage.
//   slots 0 and 1: ping-pong outputs of consecutive stages on the device (stage k writes slot k%2,
//                  reading its input from the other slot or the transfer-in slot)
//   slot 2:        the hidden state copied in from another device
// and one more buffer, the widening scratch: a weight stored in 16 bits is widened to float32
// into it just before use (Linear), so the device holds one float32 copy of its largest 16-bit
// matrix instead of float32 copies of them all.
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
  explicit Arena(DeviceId device) : device_(device) {}

  // A float32 tensor of `shape` over the slot's memory (contents undefined).
  at::Tensor slot(Slot which, at::IntArrayRef shape);
  // The widening scratch, at least `numel` float32 elements (grows, never shrinks).
  at::Tensor widen_buffer(int64_t numel);
  uint64_t bytes() const;
  int64_t reuses() const { return reuses_; }
  const DeviceId& device() const { return device_; }
  // Data pointer of a slot's storage (for tests that show reuse).
  const void* slot_data(Slot which) const;

 private:
  DeviceId device_;
  std::array<at::Tensor, 3> storage_;
  at::Tensor widen_;
  int64_t reuses_ = 0;
};

}  // namespace actcap
