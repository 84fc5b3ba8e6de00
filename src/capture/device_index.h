// An index tensor's copies on accelerator streams (RowSelection::index_on, the attention heads a
// SafeCapturer keeps). Internal to src/capture/.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/Device.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <mutex>
#include <utility>
#include <vector>

namespace actcap {

// `cpu`'s copy on `device`'s current stream, made once per stream from pinned memory without
// waiting (a blocking copy from pageable memory stalls the host until the stream drains). Safe to
// call from several threads.
class DeviceIndex {
 public:
  at::Tensor on(const at::Tensor& cpu, c10::Device device) {
    if (device.is_cpu()) return cpu;
    const c10::Stream stream = c10::impl::getDeviceGuardImpl(device.type())->getStream(device);
    std::lock_guard<std::mutex> lock(mutex_);
    for (const auto& [s, t] : copies_)
      if (s == stream) return t;
    // The pinned source may be freed at once: the caching host allocator keeps its block until the
    // copy, queued on `stream`, has read it.
    at::Tensor copy = cpu.pin_memory().to(device, /*non_blocking=*/true);
    copies_.emplace_back(stream, copy);
    return copy;
  }

 private:
  std::mutex mutex_;
  std::vector<std::pair<c10::Stream, at::Tensor>> copies_;
};

}  // namespace actcap
