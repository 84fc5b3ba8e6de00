// Work queues and the events that order them: one execution model for every device.
//
// Each lane (device) has a compute queue, where its stages run, a copy queue, where boundary
// transfers into it run, and a capture queue, where capture copies out of it to the host run (apart
// from the transfers: a transfer waits for another lane, a capture copy never does, so a hook
// waiting for room in the copy window can never wait behind a transfer that waits for the hook's
// own stage — a device map that comes back to a device would otherwise deadlock). Work on different
// queues is ordered only by events (Marker): a queue told to wait() for a marker runs nothing
// submitted after that until the marker completed.
//
//   kind          device            submit(work) runs work ...           a marker completes when
//   ... kInline       cpu               now, on the calling thread            at once (work is
//   done) kWorker       cpu:N (virtual)   later, on the queue's own thread      the worker finished
//   it kAccelerator  cuda:N            now, on the calling thread, under a   the device reached the
//                                   StreamGuard: kernels it launches are  c10::Event recorded
//                                   queued on the queue's c10::Stream     after them
//
// So a virtual CPU device really is asynchronous: its stages and copies run on their own threads
// and a missing wait() shows as wrong values (the delay faults below make the race deterministic).
// A wait across kinds goes through the host (the waiting queue's thread blocks on the marker).
#pragma once

#include <ATen/ATen.h>
#include <c10/core/Event.h>
#include <c10/core/Stream.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "actcap/devices.h"
#include "actcap/executor.h"

namespace actcap {

struct WorkerState;  // streams.cpp

// An event: "everything submitted to one queue before it was recorded".
class Marker {
 public:
  Marker() = default;  // complete
  bool query() const;
  void synchronize() const;  // blocks the calling thread until complete

 private:
  friend class WorkQueue;
  std::shared_ptr<WorkerState> worker_;  // kWorker: complete when worker_->done >= seq_
  uint64_t seq_ = 0;
  std::shared_ptr<c10::Event> event_;  // kAccelerator
};

class WorkQueue {
 public:
  enum class Kind { kInline, kWorker, kAccelerator };
  // The queue kind of `device` (the table above).
  explicit WorkQueue(const DeviceId& device);
  // A queue of `kind` for `device`: only kWorker may differ from the device's own kind (a host
  // thread working for an accelerator lane: the check of its capture copies as they land).
  WorkQueue(const DeviceId& device, Kind kind);
  ~WorkQueue();  // waits for what was submitted, then stops the worker
  WorkQueue(const WorkQueue&) = delete;
  WorkQueue& operator=(const WorkQueue&) = delete;

  Kind kind() const { return kind_; }
  const DeviceId& device() const { return device_; }
  // Runs `work` after everything submitted before and every marker waited for before. `work` must
  // not throw (the executor wraps it): a throw that escapes (a wait that failed) is kept, the
  // queue's later work is skipped, and synchronize() rethrows it.
  void submit(std::function<void()> work);
  // A marker after everything submitted so far. Called from inside this queue's own work (a hook
  // running on the worker), that work is already ordered before anything the caller does next, so
  // the marker is complete.
  Marker record();
  // Work submitted after this runs after `m` completed.
  void wait(const Marker& m);
  // Blocks the calling thread until everything submitted so far ran; rethrows an escaped throw.
  void synchronize();
  // True on this queue's worker thread (always false for kInline / kAccelerator).
  bool on_worker() const;
  // kAccelerator: keep `t`'s memory from being reused by its allocator until the work queued on
  // this queue so far is done (the caching allocator's record_stream). No-op otherwise.
  void record_use(const at::Tensor& t) const;
  // kAccelerator: work queued after this runs after what the calling thread queued on the device's
  // current stream so far (its inputs, the per-forward tables). No-op otherwise.
  void wait_for_caller();
  // kAccelerator: `t`, made on this queue, is handed to the calling thread: its memory is not
  // reused before the work the caller queues on the device's current stream ran. No-op otherwise.
  void hand_to_caller(const at::Tensor& t) const;

 private:
  DeviceId device_;
  Kind kind_;
  std::shared_ptr<WorkerState> worker_;
  std::thread thread_;
  std::optional<c10::Stream> stream_;
};

// The capture copies one lane has in flight, bounded in bytes: back-pressure for hooks.
struct CopyWindow {
  uint64_t limit = 0;
  std::deque<std::pair<Marker, uint64_t>> in_flight;  // oldest first
  uint64_t bytes = 0;                                 // in flight now
  int64_t copies = 0, waits = 0;                      // since the lane was placed
  uint64_t total_bytes = 0;
  // Before queueing a copy of `need` bytes: forgets the copies that landed, then, while the window
  // would overflow and something is still in flight, waits for the oldest (counted in `waits`).
  void reserve(uint64_t need);
  void add(Marker landed, uint64_t need);
};

// The lane whose stage is running on this thread (set by the executor around each stage), for
// observers that queue copies on it (SafeCapturer). Null outside a stage.
struct LaneContext {
  DeviceId device;
  WorkQueue* compute = nullptr;
  WorkQueue* capture = nullptr;  // where capture copies to the host go
  CopyWindow* window = nullptr;
  const AsyncFaults* faults = nullptr;
  // Accelerator lanes: a host worker that checks each capture copy as soon as it landed (its
  // device hash recomputed over the host bytes, its fingerprint taken), while the device runs on.
  WorkQueue* check = nullptr;
};
const LaneContext* current_lane();
class LaneScope {
 public:
  explicit LaneScope(const LaneContext* lane);
  ~LaneScope();
  LaneScope(const LaneScope&) = delete;
  LaneScope& operator=(const LaneScope&) = delete;

 private:
  const LaneContext* previous_;
};

}  // namespace actcap
