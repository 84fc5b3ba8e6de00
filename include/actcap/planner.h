// Device-map planner: places the model's top-level stages (embeddings, each block, final norm,
// lm_head) on devices. Never splits a stage. Counts per device the weights, the activation
// workspace for the batch x sequence it will run and a reserve for capture staging.
#pragma once

#include <cstdint>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <vector>

#include "actcap/devices.h"

namespace actcap {

// What the planner knows about one stage.
struct StageCost {
  std::vector<std::string>
      modules;  // HF module names the stage covers, e.g. {"transformer.wte", "transformer.wpe"}
  uint64_t weight_bytes = 0;  // parameters owned by this stage
  uint64_t shared_weight_bytes =
      0;                    // tied parameters (lm_head <-> embeddings) also counted here when split
  std::string shared_with;  // module name holding the tied weight ("" when none)
  uint64_t workspace_bytes = 0;  // peak temporary activations while the stage runs
  uint64_t capture_bytes = 0;    // capture staging for hook points inside the stage
  uint64_t cache_bytes = 0;      // a generation's KV cache of the stage's attention modules
};

enum class PlanStrategy { kAuto, kBalanced, kSequential, kExplicit };

// accelerate's device map: module name (or a dot-prefix of module names; "" maps everything) ->
// device as written: "cpu:0", "cuda:1", or accelerate's integer N ("1" = cuda:1).
using DeviceMap = std::map<std::string, std::string>;

struct PlanRequest {
  std::vector<StageCost> stages;         // in execution order
  std::vector<DeviceId> devices;         // listed order = fill order
  std::map<DeviceId, uint64_t> budgets;  // absent = unlimited
  PlanStrategy strategy = PlanStrategy::kAuto;
  DeviceMap explicit_map;     // for kExplicit
  uint64_t hidden_bytes = 0;  // one hidden state [B, T, H] in f32: arena slot size
};

struct DeviceUsage {
  DeviceId device;
  uint64_t weights = 0;
  uint64_t workspace =
      0;                 // arena (2 ping-pong slots + transfer-in slot) + largest stage temporaries
  uint64_t reserve = 0;  // capture staging and a generation's KV cache
  uint64_t total() const { return weights + workspace + reserve; }
  std::optional<uint64_t> budget;
  std::vector<size_t> stages;  // indices into PlanRequest::stages
};

// A link (ordered device pair) the plan sends through host memory: direct copies over it arrived
// corrupted when probed, copies staged through the host intact (split.h).
struct LinkRoute {
  DeviceId from, to;
  std::string reason;
};

struct DevicePlan {
  std::vector<DeviceId> stage_device;                   // one per stage
  std::vector<LinkRoute> routes;                        // links copied through host memory
  std::vector<DeviceUsage> usage;                       // one per listed device, in listed order
  std::vector<std::vector<std::string>> stage_modules;  // HF module names per stage (device_map())
  // accelerate's format: module name -> device string, every module of every stage.
  DeviceMap device_map() const;
  // Per-device table: device, stages, weights, workspace, reserve, total, budget.
  std::string table() const;
  nlohmann::json to_json() const;  // {"device_map": {...}, "devices": [{...}]}
};

// Throws InputError (exit 2) when the model does not fit (message carries the per-device table of
// what is needed), when an explicit map names unknown modules, leaves modules out, splits a
// stage, or names devices not in the list.
DevicePlan plan_devices(const PlanRequest& request);
PlanStrategy parse_strategy(
    const std::string& text);  // auto | balanced | sequential (else FILE.json)
// An accelerate-style device map file (read with a size bound); InputError naming it when
// unreadable, not JSON, or not a device map (device_map_from_json).
DeviceMap load_device_map(const std::string& path);
// accelerate's JSON device map (an object of module name -> device string or integer) as a
// DeviceMap; InputError when it is not an object or an entry is neither a string nor an integer.
DeviceMap device_map_from_json(const nlohmann::json& map);

}  // namespace actcap
