#include "actcap/split.h"

#include <algorithm>

#include "actcap/error.h"
#include "actcap/executor.h"

namespace actcap {

namespace {

// Calls f(stage, point) for every captured point, with the stage holding its module.
template <typename F>
void for_each_point_stage(const std::vector<std::vector<std::string>>& modules,
                          const std::vector<PointInfo>& capture, F f) {
  for (const PointInfo& p : capture) {
    const std::string module = p.name.substr(0, p.name.find(':'));
    for (size_t i = 0; i < modules.size(); ++i)
      for (const std::string& m : modules[i])
        if (module == m || module.rfind(m + ".", 0) == 0) f(i, p);
  }
}

// Whether the forward runs the last stage (lm_head): always with kCompute; with kSkipIfUnhooked
// only when a point inside it is captured.
bool head_runs(const Model& model, const std::vector<PointInfo>& capture, Model::Logits logits) {
  bool captured = false;
  for_each_point_stage(model.stage_modules(), capture, [&](size_t i, const PointInfo&) {
    captured |= model.stage_kind(i) == StageKind::kHead;
  });
  return logits == Model::Logits::kCompute || captured;
}

}  // namespace

DevicePlan plan_split(const Model& model, const SplitOptions& options, int64_t batch, int64_t seq,
                      const std::vector<PointInfo>& capture, Model::Logits logits) {
  // Capture staging: each captured point costs its bytes per token on the device of its stage.
  const std::vector<std::vector<std::string>> modules = model.stage_modules();
  std::vector<uint64_t> staging(modules.size(), 0);
  for_each_point_stage(modules, capture, [&](size_t i, const PointInfo& p) {
    int64_t per_token = static_cast<int64_t>(c10::elementSize(p.dtype));
    for (int64_t d : p.shape) per_token *= d;
    staging[i] += per_token * batch * seq;
  });
  PlanRequest req;
  req.stages = model.stage_costs(batch, seq, head_runs(model, capture, logits));
  for (size_t i = 0; i < staging.size(); ++i) req.stages[i].capture_bytes = staging[i];
  req.devices = options.devices;
  req.budgets = options.budgets;
  req.strategy = options.strategy;
  if (options.strategy == PlanStrategy::kExplicit) {
    req.explicit_map = options.explicit_map;
  } else if (req.devices.empty()) {
    req.devices = {DeviceId::cpu()};
  }
  for (const auto& [dev, bytes] : req.budgets)
    if (!req.devices.empty() &&
        std::find(req.devices.begin(), req.devices.end(), dev) == req.devices.end())
      throw InputError(
          concat("a memory budget names ", dev.str(), ", which is not among the devices"),
          {"max_memory", "devices"});
  req.hidden_bytes =
      static_cast<uint64_t>(batch * seq * model.config().hidden_size) * sizeof(float);
  return plan_devices(req);
}

DevicePlan split_model(Model& model, const SplitOptions& options, int64_t batch, int64_t seq,
                       const std::vector<PointInfo>& capture, Model::Logits logits) {
  DevicePlan plan = plan_split(model, options, batch, seq, capture, logits);
  ExecutionOptions exec;
  exec.stage_device = plan.stage_device;
  for (const DeviceUsage& u : plan.usage)
    if (u.budget) exec.budgets[u.device] = *u.budget;
  exec.verify_transfers = options.verify_transfers;
  exec.faults = options.faults;
  exec.async_faults = options.async_faults;
  // A test fault on a link this forward never crosses could never fire: refuse it before
  // anything runs or is written.
  std::vector<DeviceId> running = plan.stage_device;
  if (!head_runs(model, capture, logits) && !running.empty()) running.pop_back();
  check_fault_links(options.faults, running);
  model.place(exec);
  return plan;
}

}  // namespace actcap
