#include "common.h"

#include <algorithm>
#include <sstream>

#include "actcap/error.h"
#include "actcap/extract.h"
#include "actcap/numbers.h"

namespace actcap::cli {

std::vector<std::vector<int64_t>> parse_token_lists(const std::string& text) {
  std::vector<std::vector<int64_t>> out;
  std::stringstream seqs(text);
  std::string seq;
  size_t si = 0;
  while (std::getline(seqs, seq, ';')) {
    std::vector<int64_t> ids;
    std::stringstream items(seq);
    std::string item;
    while (std::getline(items, item, ',')) {
      size_t b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
      std::string trimmed = b == std::string::npos ? "" : item.substr(b, e - b + 1);
      const std::optional<int64_t> v = parse_int64(trimmed);
      if (!v)
        throw InputError(
            concat("--tokens: '", trimmed, "' in sequence ", si, " is not an integer token id"));
      ids.push_back(*v);
    }
    if (ids.empty()) throw InputError(concat("--tokens: sequence ", si, " is empty"));
    out.push_back(std::move(ids));
    ++si;
  }
  if (out.empty()) throw InputError("--tokens: no token ids given");
  return out;
}

std::vector<std::vector<int64_t>> tokenize_text(const Model& model, const std::string& text) {
  auto tokenizer = tokenizer_for(model.origin());
  if (!tokenizer)
    throw InputError(concat("--text: ", model.origin(), " has no tokenizer.json; pass --tokens"));
  if (text.empty()) throw InputError("--text is empty");
  return {tokenizer->encode(text)};
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace actcap::cli

#include <fstream>
#include <nlohmann/json.hpp>

namespace actcap::cli {

void add_device_options(CLI::App* sub, DeviceOptions& o) {
  sub->add_option("--devices", o.devices,
                  "Devices: cpu:0,cpu:1,cuda:0 or a count N (= cpu:0..cpu:N-1)");
  sub->add_option("--max-memory", o.max_memory, "Per-device budgets: cpu:0=300MiB,cpu:1=1GiB");
  sub->add_option("--device-map", o.device_map,
                  "auto | balanced | sequential | FILE.json (accelerate format)");
  sub->add_flag("--no-verify-transfers", o.no_verify_transfers,
                "Skip checksumming inter-device copies");
}

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
// (run and extract) only when a point inside it is captured.
bool head_runs(const std::vector<std::vector<std::string>>& modules,
               const std::vector<PointInfo>& capture, Model::Logits logits) {
  bool captured = false;
  for_each_point_stage(modules, capture,
                       [&](size_t i, const PointInfo&) { captured |= i + 1 == modules.size(); });
  return logits == Model::Logits::kCompute || captured;
}

}  // namespace

DevicePlan plan_for(const Model& model, const DeviceOptions& o, int64_t batch, int64_t seq,
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
  // run and extract (kSkipIfUnhooked) run lm_head only when it is captured.
  req.stages = model.stage_costs(batch, seq, head_runs(modules, capture, logits));
  for (size_t i = 0; i < staging.size(); ++i) req.stages[i].capture_bytes = staging[i];
  if (!o.devices.empty()) req.devices = parse_device_list(o.devices);
  if (!o.max_memory.empty()) req.budgets = parse_max_memory(o.max_memory);
  if (o.device_map == "auto" || o.device_map == "balanced" || o.device_map == "sequential") {
    req.strategy = parse_strategy(o.device_map);
    if (req.devices.empty()) req.devices = {DeviceId::cpu()};
  } else {
    req.explicit_map = load_device_map(o.device_map);
    if (!req.explicit_map.is_object())
      throw InputError(
          concat("--device-map ", o.device_map, ": expected an object of module name -> device"));
    req.strategy = PlanStrategy::kExplicit;
  }
  for (const auto& [dev, bytes] : req.budgets)
    if (!req.devices.empty() &&
        std::find(req.devices.begin(), req.devices.end(), dev) == req.devices.end())
      throw InputError(concat("--max-memory names ", dev.str(), ", which is not in --devices"));
  req.hidden_bytes =
      static_cast<uint64_t>(batch * seq * model.config().hidden_size()) * sizeof(float);
  return plan_devices(req);
}

DevicePlan apply_devices(Model& model, const DeviceOptions& o, int64_t batch, int64_t seq,
                         const std::vector<PointInfo>& capture, Model::Logits logits) {
  DevicePlan plan = plan_for(model, o, batch, seq, capture, logits);
  ExecutionOptions exec;
  exec.stage_device = plan.stage_device;
  for (const DeviceUsage& u : plan.usage)
    if (u.budget) exec.budgets[u.device] = *u.budget;
  exec.verify_transfers = !o.no_verify_transfers;
  // A test fault (ACTCAP_FAULT) on a link this forward never crosses could never fire: refuse it
  // before anything runs or is written.
  std::vector<DeviceId> running = plan.stage_device;
  if (!head_runs(model.stage_modules(), capture, logits) && !running.empty()) running.pop_back();
  check_fault_links(process_faults(), running);
  model.place(exec);
  return plan;
}

std::string transfer_summary(const TransferStats& s) {
  return concat(s.transfers, " transfers (", s.verified, " verified, ", s.retried, " retried, ",
                s.injected, " faults injected)");
}

nlohmann::json transfer_json(const TransferStats& s) {
  return {{"transfers", s.transfers},
          {"verified", s.verified},
          {"retried", s.retried},
          {"faults_injected", s.injected},
          {"bytes", s.bytes}};
}

}  // namespace actcap::cli
