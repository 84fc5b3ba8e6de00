// The executor: runs a Model's stages on their devices. It owns placement (which device each stage
// runs on, the weight bytes there and their budgets), one lane per device (arena, accounting,
// per-forward state), the boundary hand-off between lanes (verified transfers) and the stats.
// Model::place/forward and the other placement accessors are a facade over it (executor.cpp).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "actcap/executor.h"
#include "actcap/model.h"
#include "executor/arena.h"
#include "executor/streams.h"
#include "models/model_parts.h"
#include "models/module.h"

namespace actcap {

// One device's share of a run: its queues (streams.h: stages on `compute`, boundary copies into
// it on `copy`, capture copies out of it on `capture`), arena and accounting. Work on the queues is
// ordered by markers only: hand_off() makes the copy wait for the producing stage and the next
// stage wait for the copy.
struct Lane {
  Lane(DeviceId d, uint64_t weights, const ExecutionOptions& options, at::ScalarType compute_dtype)
      : device(d),
        arena(d, compute_dtype),
        weight_bytes(weights),
        peak_bytes(weights),
        compute(std::make_unique<WorkQueue>(d)),
        copy(std::make_unique<WorkQueue>(d)),
        capture(std::make_unique<WorkQueue>(d)) {
    if (compute->kind() == WorkQueue::Kind::kAccelerator)
      check = std::make_unique<WorkQueue>(d, WorkQueue::Kind::kWorker);
    window.limit = options.copy_window_bytes;
    context =
        LaneContext{d, compute.get(), capture.get(), &window, &options.async_faults, check.get()};
  }
  DeviceId device;
  Arena arena;
  // Since the last place():
  uint64_t weight_bytes = 0;
  uint64_t peak_bytes = 0;     // weights + the largest arena reservation seen
  int64_t widen_elements = 0;  // its stages' largest matrix not in the compute dtype (scratch)
  int64_t transfers_in = 0;
  uint64_t bytes_in = 0;
  // Per forward (reset when one begins):
  ForwardState* state = nullptr;  // tables for this lane's physical device (virtual lanes share)
  Arena::Slot block_out_slot = Arena::kPing;  // the slot the next block writes (ping, pong, ...)
  std::unique_ptr<WorkQueue> compute, copy, capture;
  std::unique_ptr<WorkQueue> check;  // accelerator lanes: the host's check of capture copies
  CopyWindow window;    // capture copies in flight on `capture` (used by the lane's hooks only)
  LaneContext context;  // what current_lane() returns while this lane's stages run
};

// One forward in flight: what its queued work shares. The first throw is kept and every later
// piece of work is skipped; forward() rethrows it once the queues are drained.
struct ForwardRun {
  std::mutex mu;
  std::exception_ptr error;
  bool failed() { return first_error() != nullptr; }
  void fail(std::exception_ptr e) {
    std::lock_guard<std::mutex> lock(mu);
    if (!error) error = std::move(e);
  }
  std::exception_ptr first_error() {
    std::lock_guard<std::mutex> lock(mu);
    return error;
  }
};

// Throws InputError (setting compute_dtype) naming the first of `devices` whose kernels cannot
// compute in `dtype` (float16 on Debian's CPU LibTorch 1.13).
void check_compute_dtype(at::ScalarType dtype, const std::vector<DeviceId>& devices);

class Executor {
 public:
  explicit Executor(Model& model) : model_(model) {}

  // Model::place: moves each stage's weights to its device, checks the weight budgets, resets the
  // lanes and stats.
  void place(const ExecutionOptions& options);
  // Model::forward.
  // With `cached`, a step of a generation (ModelParts::forward_cached).
  at::Tensor forward(const Batch& batch, Model::Logits logits, const CachedStep* cached = nullptr);

  const ExecutionOptions& placement() const { return options_; }
  DeviceId stage_device(size_t stage) const { return stage_device_.at(stage); }
  std::vector<DeviceStats> device_stats() const;
  const TransferStats& transfer_stats() const { return transfers_; }
  int64_t steps() const { return steps_; }

 private:
  // The one place a ForwardState is built: the tables every module of one forward shares.
  ForwardState make_state(c10::Device device, int64_t batch, int64_t seq, int64_t step,
                          const CachedStep* cached);
  // The boundary between two lanes: queues on `to`'s copy queue, after the stage before `into`
  // (on `from`), the verified copy of that stage's output (`outs[into - 1]`; `produced_slot`, the
  // arena slot it is written into, is read instead under the nofence:transfer-out fault) into
  // `dst`, `to`'s transfer-in slot, and makes `to`'s compute queue wait for it.
  void hand_off(std::vector<at::Tensor>& outs, at::Tensor produced_slot, at::Tensor dst, Lane& from,
                Lane& to, size_t into, const std::shared_ptr<ForwardRun>& run);
  // Queues `work` on `queue` for `lane`: skipped once the run failed, a throw kept in the run, run
  // under inference mode with `lane` as current_lane().
  void submit(WorkQueue& queue, Lane& lane, const std::shared_ptr<ForwardRun>& run,
              std::function<void()> work);
  // The arena slot block `stage` writes its output into; throws RunError when the lane's weights
  // and arena exceed its budget.
  at::Tensor block_output(Lane& lane, size_t stage, at::IntArrayRef shape);

  Model& model_;
  ExecutionOptions options_;
  std::vector<DeviceId> stage_device_;  // resolved placement, one per stage
  std::map<DeviceId, Lane> lanes_;      // one per device the placement uses
  TransferStats transfers_;
  std::mutex transfer_mu_;  // transfers_, options_.faults, host_routes_: updated by copy work
  std::set<std::pair<DeviceId, DeviceId>> host_routes_;  // links copied through host memory
  int64_t steps_ = 0;
  std::set<std::string> bare_ref_warned_;  // points the bare-reference guard warned about
};

}  // namespace actcap
