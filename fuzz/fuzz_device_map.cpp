// The device planner. Input: a first line, then a JSON document.
//   * the first line goes to parse_device_list (--devices) and parse_max_memory (--max-memory);
//     when they parse, they are the devices and budgets of the plans below;
//   * the rest, when it is JSON, is an accelerate-style explicit device map for plan_devices
//     (against the given devices or cpu:0..cpu:3, and against no device list at all);
//   * the auto, balanced and sequential strategies also run with those devices and budgets.
// Stages: a 4-layer GPT-2 (tied lm_head) and a 4-layer Llama (untied), with the byte costs of
// `actcap plan` for the tiny presets at seq 16.
// Invariants of a successful plan: one device per stage, every stage on a planned device, usage
// in listed order, every budget respected, device_map() maps every module of every stage,
// table()/to_json() render.
#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "actcap/devices.h"
#include "actcap/planner.h"
#include "fuzz_common.h"

namespace {

using actcap::DeviceId;
using actcap::PlanRequest;
using actcap::PlanStrategy;
using actcap::StageCost;

std::vector<StageCost> gpt2_stages() {
  std::vector<StageCost> s;
  s.push_back({{"transformer.wte", "transformer.wpe"}, 163840, 0, "", 20480, 0});
  for (int i = 0; i < 4; ++i)
    s.push_back({{"transformer.h." + std::to_string(i)}, 199936, 0, "", 94208, 4096});
  s.push_back({{"transformer.ln_f"}, 512, 0, "", 8192, 0});
  s.push_back({{"lm_head"}, 0, 131072, "transformer.wte", 32768, 0});
  return s;
}

std::vector<StageCost> llama_stages() {
  std::vector<StageCost> s;
  s.push_back({{"model.embed_tokens"}, 131072, 0, "", 8192, 0});
  for (int i = 0; i < 4; ++i)
    s.push_back({{"model.layers." + std::to_string(i)}, 173312, 0, "", 75776, 8192});
  s.push_back({{"model.norm"}, 256, 0, "", 8192, 0});
  s.push_back({{"lm_head"}, 131072, 0, "", 32768, 0});
  return s;
}

void check_plan(const PlanRequest& req, const actcap::DevicePlan& plan) {
  const size_t n = req.stages.size();
  FUZZ_CHECK(plan.stage_device.size() == n && plan.stage_modules.size() == n,
             "plan has %zu stage devices for %zu stages", plan.stage_device.size(), n);
  if (!req.devices.empty()) {
    FUZZ_CHECK(plan.usage.size() == req.devices.size(), "usage has %zu rows for %zu devices",
               plan.usage.size(), req.devices.size());
    for (size_t i = 0; i < req.devices.size(); ++i)
      FUZZ_CHECK(plan.usage[i].device == req.devices[i], "usage row %zu is %s, expected %s", i,
                 plan.usage[i].device.str().c_str(), req.devices[i].str().c_str());
  }
  std::vector<int> seen(n, 0);
  for (const actcap::DeviceUsage& u : plan.usage) {
    if (u.budget)
      FUZZ_CHECK(u.total() <= *u.budget, "%s uses %llu of a %llu budget", u.device.str().c_str(),
                 static_cast<unsigned long long>(u.total()),
                 static_cast<unsigned long long>(*u.budget));
    auto it = req.budgets.find(u.device);
    FUZZ_CHECK(
        (it != req.budgets.end()) == u.budget.has_value() && (!u.budget || *u.budget == it->second),
        "%s: budget not carried into the usage", u.device.str().c_str());
    for (size_t s : u.stages) {
      FUZZ_CHECK(s < n && plan.stage_device[s] == u.device, "stage %zu listed under %s", s,
                 u.device.str().c_str());
      ++seen[s];
    }
  }
  for (size_t s = 0; s < n; ++s) FUZZ_CHECK(seen[s] == 1, "stage %zu appears %d times", s, seen[s]);
  if (req.strategy != PlanStrategy::kExplicit) {
    // Contiguous strategies: stages on one device form one run, in listed device order.
    auto rank = [&](const DeviceId& d) {
      return std::find(req.devices.begin(), req.devices.end(), d) - req.devices.begin();
    };
    for (size_t s = 1; s < n; ++s)
      FUZZ_CHECK(rank(plan.stage_device[s - 1]) <= rank(plan.stage_device[s]),
                 "contiguous plan goes back from %s to %s", plan.stage_device[s - 1].str().c_str(),
                 plan.stage_device[s].str().c_str());
  }
  const nlohmann::json map = plan.device_map();
  for (size_t s = 0; s < n; ++s)
    for (const std::string& m : req.stages[s].modules)
      FUZZ_CHECK(map.contains(m) && map[m] == plan.stage_device[s].str(),
                 "device_map() misses or misplaces %s", m.c_str());
  (void)plan.table();
  (void)plan.to_json().dump();
}

void plan(PlanRequest req) {
  actcap::DevicePlan p;
  if (fuzz::clean([&] { p = actcap::plan_devices(req); })) {
    if (req.strategy == PlanStrategy::kExplicit && req.devices.empty()) {
      // plan_devices fills the list itself; check against the devices it reported.
      for (const auto& u : p.usage) req.devices.push_back(u.device);
    }
    check_plan(req, p);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  const size_t nl = text.find('\n');
  const std::string first = text.substr(0, nl);
  const std::string rest = nl == std::string::npos ? std::string() : text.substr(nl + 1);

  std::vector<DeviceId> devices;
  std::map<DeviceId, uint64_t> budgets;
  const bool have_devices = fuzz::clean([&] { devices = actcap::parse_device_list(first); });
  const bool have_budgets = fuzz::clean([&] { budgets = actcap::parse_max_memory(first); });
  if (have_devices) {
    FUZZ_CHECK(!devices.empty() && devices.size() <= 64, "%zu devices", devices.size());
    std::string joined;
    for (const auto& d : devices) joined += (joined.empty() ? "" : ",") + d.str();
    std::vector<DeviceId> again;
    FUZZ_CHECK(fuzz::clean([&] { again = actcap::parse_device_list(joined); }) && again == devices,
               "parse_device_list does not round-trip '%s' -> '%s'", fuzz::escape(first).c_str(),
               joined.c_str());
  }
  if (!have_devices)
    devices = {DeviceId::virtual_cpu(0), DeviceId::virtual_cpu(1), DeviceId::virtual_cpu(2),
               DeviceId::virtual_cpu(3)};
  if (have_budgets) {
    // Budgets for unlisted devices are rejected by the CLI before planning; do the same.
    for (auto it = budgets.begin(); it != budgets.end();)
      it = std::find(devices.begin(), devices.end(), it->first) == devices.end() ? budgets.erase(it)
                                                                                 : std::next(it);
  }

  for (const auto& stages : {gpt2_stages(), llama_stages()}) {
    PlanRequest req;
    req.stages = stages;
    req.devices = devices;
    req.budgets = budgets;
    req.hidden_bytes = 16 * 64 * 4;
    for (PlanStrategy s :
         {PlanStrategy::kAuto, PlanStrategy::kBalanced, PlanStrategy::kSequential}) {
      req.strategy = s;
      plan(req);
    }
    // Explicit map from the rest of the input.
    nlohmann::json map = nlohmann::json::parse(rest, nullptr, /*allow_exceptions=*/false);
    if (map.is_discarded()) continue;
    req.strategy = PlanStrategy::kExplicit;
    if (!fuzz::clean([&] { req.explicit_map = actcap::device_map_from_json(map); })) continue;
    plan(req);
    req.devices.clear();
    req.budgets.clear();
    plan(req);
  }
  return 0;
}
