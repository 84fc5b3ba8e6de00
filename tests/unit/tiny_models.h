// What several unit suites build their models and placements from: the registry's tiny presets
// with init-model's random weights, and a balanced split over virtual CPU devices.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "actcap/init_model.h"
#include "actcap/model.h"
#include "actcap/planner.h"
#include "models/arch/architecture.h"

namespace actcap::test {

inline std::vector<std::string> every_architecture() {
  std::vector<std::string> out;
  for (const Architecture* a : architectures()) out.push_back(a->name());
  return out;
}

// `arch`'s tiny preset, random weights (seed 17) stored in `stored`, loaded with `options`.
inline std::unique_ptr<Model> tiny_model(const std::string& arch, at::ScalarType stored,
                                         const LoadOptions& options = {}) {
  ModelConfig c = preset_config(arch, "tiny");
  return Model::from_tensors(c, random_weights(c, 17, stored), arch + "-tiny", options);
}

// A tiny GPT-2 of `layers` blocks, random weights (seed 5), and a batch of two sequences of
// different lengths (padding, so a capture gathers its rows): what the execution tests run.
inline std::unique_ptr<Model> tiny_gpt2(int64_t layers = 6) {
  ModelConfig c = preset_config("gpt2", "tiny");
  c.num_hidden_layers = layers;
  return Model::from_tensors(c, random_weights(c, 5, at::kFloat), "gpt2");
}
inline Batch padded_batch(const Model& m) {
  return Batch::from_sequences({{4, 8, 15, 16, 23, 42, 7, 1}, {3, 1, 4, 1, 5}},
                               m.config().vocab_size, m.config().max_positions());
}

// Places `m` over virtual devices cpu:0..cpu:n-1 with the planner's balanced split for `b`.
inline void place_balanced(Model& m, const Batch& b, int n) {
  PlanRequest req;
  req.stages = m.stage_costs(b.size(), b.max_len());
  for (int i = 0; i < n; ++i) req.devices.push_back(DeviceId::virtual_cpu(i));
  req.strategy = PlanStrategy::kBalanced;
  ExecutionOptions o;
  o.stage_device = plan_devices(req).stage_device;
  m.place(o);
}

}  // namespace actcap::test
