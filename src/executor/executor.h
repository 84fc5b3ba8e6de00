// The executor: runs a Model's stages on their devices. It owns placement (which device each stage
// runs on, the weight bytes there and their budgets), one lane per device (arena, accounting,
// per-forward state), the boundary hand-off between lanes (verified transfers) and the stats.
// Model::place/forward and the other placement accessors are a facade over it (executor.cpp).
#pragma once

#include <ATen/ATen.h>

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "actcap/executor.h"
#include "actcap/model.h"
#include "executor/arena.h"
#include "models/module.h"

namespace actcap {

// One device's share of a run. Lanes run one after another on the host thread today; the
// asynchronous-streams issue adds here the lane's c10::Stream (its stages and incoming copies are
// queued on it) and a c10::Event recorded after each stage, which hand_off() makes the next lane's
// stream wait on instead of the host.
struct Lane {
  explicit Lane(DeviceId d, uint64_t weights)
      : device(d), arena(d), weight_bytes(weights), peak_bytes(weights) {}
  DeviceId device;
  Arena arena;
  // Since the last place():
  uint64_t weight_bytes = 0;
  uint64_t peak_bytes = 0;     // weights + the largest arena reservation seen
  int64_t widen_elements = 0;  // the largest 16-bit matrix of its stages (the widening scratch)
  int64_t transfers_in = 0;
  uint64_t bytes_in = 0;
  // Per forward (reset when one begins):
  ForwardState* state = nullptr;  // tables for this lane's physical device (virtual lanes share)
  Arena::Slot block_out_slot = Arena::kPing;  // the slot the next block writes (ping, pong, ...)
};

class Executor {
 public:
  explicit Executor(Model& model) : model_(model) {}

  // Model::place: moves each stage's weights to its device, checks the weight budgets, resets the
  // lanes and stats.
  void place(const ExecutionOptions& options);
  // Model::forward.
  at::Tensor forward(const Batch& batch, Model::Logits logits);

  const ExecutionOptions& placement() const { return options_; }
  DeviceId stage_device(size_t stage) const { return stage_device_.at(stage); }
  std::vector<DeviceStats> device_stats() const;
  const TransferStats& transfer_stats() const { return transfers_; }
  int64_t steps() const { return steps_; }

 private:
  // The one place a ForwardState is built: the tables every module of one forward shares.
  ForwardState make_state(c10::Device device, int64_t batch, int64_t seq, int64_t step);
  // The boundary between two lanes: copies the hidden state `h` (on `from`) into `to`'s
  // transfer-in slot, verified, and accounts it. Returns what the stage `into` on `to` reads.
  at::Tensor hand_off(const at::Tensor& h, Lane& from, Lane& to, size_t into);
  // The arena slot block `stage` writes its output into; throws RunError when the lane's weights
  // and arena exceed its budget.
  at::Tensor block_output(Lane& lane, size_t stage, at::IntArrayRef shape);

  Model& model_;
  ExecutionOptions options_;
  std::vector<DeviceId> stage_device_;  // resolved placement, one per stage
  std::map<DeviceId, Lane> lanes_;      // one per device the placement uses
  TransferStats transfers_;
  int64_t steps_ = 0;
  std::set<std::string> bare_ref_warned_;  // points the bare-reference guard warned about
};

}  // namespace actcap
