// An index tensor's copies on accelerator streams (RowSelection::index_on, the attention heads a
// SafeCapturer keeps). Internal to src/capture/.
#pragma once

#include <ATen/ATen.h>
#include <c10/core/Device.h>
#include <c10/core/Stream.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include <cstdint>
#include <mutex>
#include <vector>

namespace actcap {

// `cpu`'s copy on `device`'s current stream, made once per stream from pinned memory without
// waiting (a blocking copy from pageable memory stalls the host until the stream drains). A copy is
// reused only for the same tensor `cpu`, unmodified since (its version counter), so a selection
// whose index was replaced or edited never gets the old rows. Safe to call from several threads.
class DeviceIndex {
 public:
  at::Tensor on(const at::Tensor& cpu, c10::Device device) {
    if (device.is_cpu()) return cpu;
    const c10::Stream stream = c10::impl::getDeviceGuardImpl(device.type())->getStream(device);
    const int64_t version = cpu._version();
    std::lock_guard<std::mutex> lock(mutex_);
    // At most one entry per stream: one made for an older index is replaced (its memory was
    // allocated on this stream, so the allocator reuses it only after the work queued there).
    Entry* entry = nullptr;
    for (Entry& e : copies_)
      if (e.stream == stream) entry = &e;
    if (entry && entry->source.is_same(cpu) && entry->version == version) return entry->copy;
    // The pinned source may be freed at once: the caching host allocator keeps its block until the
    // copy, queued on `stream`, has read it.
    Entry made{stream, cpu, version, cpu.pin_memory().to(device, /*non_blocking=*/true)};
    if (entry)
      *entry = std::move(made);
    else
      entry = &copies_.emplace_back(std::move(made));
    return entry->copy;
  }

 private:
  struct Entry {
    c10::Stream stream;
    at::Tensor source;  // held: its address cannot be reused by another tensor meanwhile
    int64_t version;
    at::Tensor copy;
  };
  std::mutex mutex_;
  std::vector<Entry> copies_;
};

}  // namespace actcap
