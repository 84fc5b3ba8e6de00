#include "executor/arena.h"

namespace actcap {

at::Tensor Arena::slot(Slot which, at::IntArrayRef shape) {
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  at::Tensor& buf = storage_[which];
  if (!buf.defined() || buf.numel() < numel) {
    buf = at::empty({numel}, at::TensorOptions().dtype(dtype_).device(device_.c10()));
  } else {
    ++reuses_;
  }
  return buf.narrow(0, 0, numel).view(shape);
}

at::Tensor Arena::widen_buffer(int64_t numel) {
  if (!widen_.defined() || widen_.numel() < numel)
    widen_ = at::empty({numel}, at::TensorOptions().dtype(dtype_).device(device_.c10()));
  return widen_;
}

uint64_t Arena::bytes() const {
  uint64_t n = widen_.defined() ? widen_.nbytes() : 0;
  for (const auto& b : storage_)
    if (b.defined()) n += b.nbytes();
  return n;
}

const void* Arena::slot_data(Slot which) const {
  return storage_[which].defined() ? storage_[which].data_ptr() : nullptr;
}

}  // namespace actcap
