// Splitting a model across devices for a run, as accelerate's device_map="auto" does, but for the
// batch, sequence length and capture plan the run will use: each stage's weights, its activation
// workspace and the capture staging of the points inside it count against its device's budget.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "actcap/devices.h"
#include "actcap/executor.h"
#include "actcap/model.h"
#include "actcap/planner.h"

namespace actcap {

struct SplitOptions {
  std::vector<DeviceId> devices;         // in fill order; empty: the CPU alone
  std::map<DeviceId, uint64_t> budgets;  // per-device memory budgets; absent = unlimited
  PlanStrategy strategy = PlanStrategy::kAuto;
  DeviceMap explicit_map;             // accelerate format (module name -> device), for kExplicit
  bool verify_transfers = true;       // checksum both sides of every inter-device copy
  std::vector<TransferFault> faults;  // test-only: damage copies over these links (executor.h)
  AsyncFaults async_faults;           // test-only: delays and removed fences (executor.h)
  // Capture copies in flight per device (ExecutionOptions::copy_window_bytes); 0: every capture
  // is copied to the host inside its hook, blocking (what the overlapped path is measured against).
  uint64_t copy_window_bytes = uint64_t{256} << 20;
  // Generation (generate.h): positions of KV cache each sequence of the batch holds; each block's
  // cache is reserved on its device like capture staging. 0: no cache.
  int64_t kv_cache_tokens = 0;
};

// The plan for a batch x seq forward capturing `capture` (each captured point's bytes are
// reserved on the device of the stage holding it). `logits` as the forward will run: with
// kSkipIfUnhooked the logits' workspace is reserved only when `capture` holds an lm_head point.
// Throws InputError naming the setting when it does not fit or the options contradict each other.
DevicePlan plan_split(const Model& model, const SplitOptions& options, int64_t batch, int64_t seq,
                      const std::vector<PointInfo>& capture = {},
                      Model::Logits logits = Model::Logits::kCompute);

// plan_split, then Model::place on it. Also throws InputError when a test fault names a link this
// forward never crosses (it could never fire).
DevicePlan split_model(Model& model, const SplitOptions& options, int64_t batch, int64_t seq,
                       const std::vector<PointInfo>& capture = {},
                       Model::Logits logits = Model::Logits::kCompute);

}  // namespace actcap
