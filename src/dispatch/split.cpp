#include "actcap/split.h"

#include <algorithm>

#include "actcap/error.h"
#include "actcap/executor.h"
#include "models/model_parts.h"

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

// The links a placement crosses that must go through host memory: each link with an accelerator at
// either end (or, in tests, a transfer fault on it) is probed with two 1 MiB copies, direct and
// staged through the host; a link whose direct copies both arrive corrupted and staged copies
// intact is routed through the host. The probe uses its own copy of the faults (their counts stay
// the run's).
std::vector<LinkRoute> probe_routes(const std::vector<DeviceId>& stage_device,
                                    const std::vector<TransferFault>& faults) {
  std::vector<LinkRoute> routes;
  std::vector<std::pair<DeviceId, DeviceId>> seen;
  for (size_t i = 1; i < stage_device.size(); ++i) {
    const DeviceId &a = stage_device[i - 1], &b = stage_device[i];
    if (a == b || std::find(seen.begin(), seen.end(), std::make_pair(a, b)) != seen.end()) continue;
    seen.emplace_back(a, b);
    const bool accelerator = a.kind == DeviceId::Kind::kCuda || b.kind == DeviceId::Kind::kCuda;
    const bool faulted = std::any_of(faults.begin(), faults.end(), [&](const TransferFault& f) {
      return f.src == a && f.dst == b;
    });
    if (!accelerator && !faulted) continue;
    // Two copies: a link is routed only when every direct copy arrived corrupted (one damaged copy
    // may be transient; the run's own retry covers that).
    const LinkProbe probe = probe_links({a, b}, {1 << 20, 1 << 20}, faults).front();  // a -> b
    bool direct_damaged = true;
    for (const LinkResult& r : probe.results) direct_damaged = direct_damaged && r.retried;
    if (direct_damaged && probe.ok() && probe.host_ok())
      routes.push_back({a, b,
                        "a direct copy arrived corrupted when probed, one staged through "
                        "host memory intact"});
  }
  return routes;
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
  if (options.kv_cache_tokens > 0) {
    const std::vector<int64_t> kv = ModelParts::kv_elements_per_token(model);
    const uint64_t per = static_cast<uint64_t>(batch * options.kv_cache_tokens) *
                         c10::elementSize(model.compute_dtype());
    for (size_t i = 0; i < kv.size(); ++i)
      req.stages[i].cache_bytes = static_cast<uint64_t>(kv[i]) * per;
  }
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
  req.hidden_bytes = static_cast<uint64_t>(batch * seq * model.config().hidden_size) *
                     c10::elementSize(model.compute_dtype());
  // Probing a link needs its devices here; a plan alone does not (plan_devices never looks at
  // the hardware), so an unverified plan may be made for GPUs this machine lacks.
  if (options.verify_transfers)
    for (const DeviceId& d : req.devices) require_available(d);
  DevicePlan plan = plan_devices(req);
  // Unverified transfers could not tell a corrupting link anyway: no probe then.
  if (options.verify_transfers) {
    for (const DeviceId& d : plan.stage_device) require_available(d);  // an explicit map's
    plan.routes = probe_routes(plan.stage_device, options.faults);
  }
  return plan;
}

DevicePlan split_model(Model& model, const SplitOptions& options, int64_t batch, int64_t seq,
                       const std::vector<PointInfo>& capture, Model::Logits logits) {
  DevicePlan plan = plan_split(model, options, batch, seq, capture, logits);
  for (const DeviceId& d : options.devices) require_available(d);  // running needs them all
  for (const DeviceId& d : plan.stage_device) require_available(d);
  ExecutionOptions exec;
  exec.stage_device = plan.stage_device;
  for (const DeviceUsage& u : plan.usage)
    if (u.budget) exec.budgets[u.device] = *u.budget;
  exec.verify_transfers = options.verify_transfers;
  exec.faults = options.faults;
  exec.async_faults = options.async_faults;
  exec.copy_window_bytes = options.copy_window_bytes;
  for (const LinkRoute& r : plan.routes) exec.host_routes.emplace_back(r.from, r.to);
  // A test fault on a link this forward never crosses could never fire: refuse it before
  // anything runs or is written.
  std::vector<DeviceId> running = plan.stage_device;
  if (!head_runs(model, capture, logits) && !running.empty()) running.pop_back();
  check_fault_links(options.faults, running);
  model.place(exec);
  return plan;
}

}  // namespace actcap
