// Device-map planner: contiguous strategies (sequential, balanced, auto) over the stages in
// execution order, and accelerate-style explicit maps. A stage is never split.
#include "actcap/planner.h"

#include <algorithm>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "actcap/error.h"
#include "io/text_file.h"

namespace actcap {

namespace {

constexpr uint64_t kInf = std::numeric_limits<uint64_t>::max();
constexpr size_t kListMax = 10;  // offenders named in one message

uint64_t sat_add(uint64_t a, uint64_t b) { return a > kInf - b ? kInf : a + b; }

uint64_t arena_bytes(uint64_t hidden) { return hidden > kInf / 3 ? kInf : 3 * hidden; }

// "a, b, c and 4 more"
std::string list_names(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < names.size() && i < kListMax; ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > kListMax) out += concat(" and ", names.size() - kListMax, " more");
  return out;
}

const char* strategy_name(PlanStrategy s) {
  switch (s) {
    case PlanStrategy::kAuto:
      return "auto";
    case PlanStrategy::kBalanced:
      return "balanced";
    case PlanStrategy::kSequential:
      return "sequential";
    case PlanStrategy::kExplicit:
      return "explicit";
  }
  return "auto";
}

// True when `key` covers `module`: equal, a dot-prefix of it, or "" (everything).
bool covers(const std::string& key, const std::string& module) {
  if (key.empty() || key == module) return true;
  return module.size() > key.size() && module.compare(0, key.size(), key) == 0 &&
         module[key.size()] == '.';
}

// True when `key` names something strictly inside `module` ("model.layers.0.mlp" in
// "model.layers.0").
bool inside(const std::string& key, const std::string& module) {
  return key.size() > module.size() && key.compare(0, module.size(), module) == 0 &&
         key[module.size()] == '.';
}

std::string compact_ranges(const std::vector<size_t>& stages) {
  if (stages.empty()) return "-";
  std::string out;
  size_t i = 0;
  while (i < stages.size()) {
    size_t j = i;
    while (j + 1 < stages.size() && stages[j + 1] == stages[j] + 1) ++j;
    if (!out.empty()) out += ",";
    out += j == i ? concat(stages[i]) : concat(stages[i], "-", stages[j]);
    i = j + 1;
  }
  return out;
}

struct Cost {
  uint64_t weights = 0, workspace = 0, reserve = 0;
  uint64_t total() const { return sat_add(sat_add(weights, workspace), reserve); }
};

// Costs of the request's stages; segment costs for contiguous plans in O(1 + tied stages).
class Planner {
 public:
  explicit Planner(const PlanRequest& r) : req_(r), n_(r.stages.size()) {
    weight_prefix_.assign(n_ + 1, 0);
    capture_prefix_.assign(n_ + 1, 0);
    for (size_t i = 0; i < n_; ++i) {
      weight_prefix_[i + 1] = sat_add(weight_prefix_[i], r.stages[i].weight_bytes);
      capture_prefix_[i + 1] =
          sat_add(capture_prefix_[i], sat_add(r.stages[i].capture_bytes, r.stages[i].cache_bytes));
    }
    // Sparse table for the largest workspace over a range of stages.
    size_t levels = 1;
    while ((size_t{1} << levels) <= n_) ++levels;
    workspace_max_.assign(levels, std::vector<uint64_t>(n_, 0));
    for (size_t i = 0; i < n_; ++i) workspace_max_[0][i] = r.stages[i].workspace_bytes;
    for (size_t k = 1; k < levels; ++k)
      for (size_t i = 0; i + (size_t{1} << k) <= n_; ++i)
        workspace_max_[k][i] =
            std::max(workspace_max_[k - 1][i], workspace_max_[k - 1][i + (size_t{1} << (k - 1))]);
    // Tied weights: which stage holds the module a stage's shared weight belongs to.
    tied_owner_.assign(n_, -1);
    for (size_t t = 0; t < n_; ++t) {
      const StageCost& s = r.stages[t];
      if (s.shared_with.empty() || s.shared_weight_bytes == 0) continue;
      tied_stages_.push_back(t);
      for (size_t o = 0; o < n_ && tied_owner_[t] < 0; ++o)
        for (const auto& m : r.stages[o].modules)
          if (covers(m, s.shared_with) || covers(s.shared_with, m)) {
            tied_owner_[t] = static_cast<long>(o);
            break;
          }
    }
  }

  size_t n() const { return n_; }
  size_t devices() const { return req_.devices.size(); }
  uint64_t weights_between(size_t a, size_t b) const {
    return weight_prefix_[b] - weight_prefix_[a];
  }

  std::optional<uint64_t> budget(size_t d) const {
    auto it = req_.budgets.find(req_.devices[d]);
    if (it == req_.budgets.end()) return std::nullopt;
    return it->second;
  }

  // Stages [a, b) together on one device.
  Cost segment(size_t a, size_t b) const {
    Cost c;
    if (a >= b) return c;
    c.weights = weight_prefix_[b] - weight_prefix_[a];
    std::vector<const std::string*> counted;  // tied weights already counted (usually none)
    for (size_t t : tied_stages_) {
      if (t < a || t >= b) continue;
      const long o = tied_owner_[t];
      const bool elsewhere = o < 0 || static_cast<size_t>(o) < a || static_cast<size_t>(o) >= b;
      const std::string& name = req_.stages[t].shared_with;
      if (!elsewhere || std::any_of(counted.begin(), counted.end(),
                                    [&](const std::string* c) { return *c == name; }))
        continue;
      counted.push_back(&name);
      c.weights = sat_add(c.weights, req_.stages[t].shared_weight_bytes);
    }
    c.workspace = sat_add(arena_bytes(req_.hidden_bytes), max_workspace_between(a, b));
    c.reserve = capture_prefix_[b] - capture_prefix_[a];
    return c;
  }

  bool fits(size_t d, size_t a, size_t b) const {
    if (a >= b) return true;
    const auto bud = budget(d);
    return !bud || segment(a, b).total() <= *bud;
  }

  // Any assignment (explicit maps may be non-contiguous); `devices` in listed order.
  std::vector<DeviceUsage> usage(const std::vector<DeviceId>& devices,
                                 const std::vector<DeviceId>& stage_device) const {
    std::vector<DeviceUsage> out;
    for (const auto& d : devices) {
      DeviceUsage u;
      u.device = d;
      auto it = req_.budgets.find(d);
      if (it != req_.budgets.end()) u.budget = it->second;
      std::set<std::string> counted;
      uint64_t max_ws = 0;
      for (size_t s = 0; s < n_; ++s) {
        if (stage_device[s] != d) continue;
        const StageCost& st = req_.stages[s];
        u.stages.push_back(s);
        u.weights = sat_add(u.weights, st.weight_bytes);
        u.reserve = sat_add(u.reserve, sat_add(st.capture_bytes, st.cache_bytes));
        max_ws = std::max(max_ws, st.workspace_bytes);
        if (!st.shared_with.empty() && st.shared_weight_bytes > 0) {
          const long o = tied_owner_[s];
          const bool elsewhere = o < 0 || stage_device[static_cast<size_t>(o)] != d;
          if (elsewhere && counted.insert(st.shared_with).second)
            u.weights = sat_add(u.weights, st.shared_weight_bytes);
        }
      }
      if (!u.stages.empty()) u.workspace = sat_add(arena_bytes(req_.hidden_bytes), max_ws);
      out.push_back(std::move(u));
    }
    return out;
  }

  // cuts[d]..cuts[d+1] are device d's stages.
  std::vector<DeviceId> assignment(const std::vector<size_t>& cuts) const {
    std::vector<DeviceId> out(n_);
    for (size_t d = 0; d + 1 < cuts.size(); ++d)
      for (size_t s = cuts[d]; s < cuts[d + 1]; ++s) out[s] = req_.devices[d];
    return out;
  }

  // accelerate's sequential: fill each device as far as its budget allows, then the next.
  std::optional<std::vector<size_t>> sequential() const {
    std::vector<size_t> cuts{0};
    size_t a = 0;
    for (size_t d = 0; d < devices(); ++d) {
      size_t b = a;
      while (b < n_ && fits(d, a, b + 1)) ++b;
      cuts.push_back(b);
      a = b;
    }
    if (a < n_) return std::nullopt;
    return cuts;
  }

  // accelerate's get_balanced_memory + infer_auto_device_map: every device but the last gets a
  // weight target (the remaining weights spread over the remaining devices; the first stage on a
  // device is always allowed, which is what the largest-layer buffer is for), never more than its
  // budget; the last device takes the rest up to its budget. Each device but the last leaves at
  // least one stage for each device after it, so every device is used when there are enough
  // stages.
  std::optional<std::vector<size_t>> auto_fill() const {
    const size_t nd = devices();
    std::vector<size_t> cuts{0};
    size_t a = 0;
    for (size_t d = 0; d < nd; ++d) {
      size_t b = a;
      if (d + 1 == nd) {
        b = n_;
        if (!fits(d, a, b)) return std::nullopt;
      } else {
        const uint64_t k = nd - d;
        const uint64_t remaining = weights_between(a, n_);
        const uint64_t target = remaining / k + (remaining % k ? 1 : 0);
        const size_t later = nd - d - 1;
        while (b < n_) {
          if (!fits(d, a, b + 1)) break;
          if (b > a) {
            if (weights_between(a, b + 1) > target) break;
            if (n_ - (b + 1) < later) break;
          }
          ++b;
        }
      }
      cuts.push_back(b);
      a = b;
    }
    return cuts;
  }

  // Contiguous partition minimising the largest per-device weight total; among those, the one
  // with the smallest sum of squared weights (the most even). With `respect_budgets`, only
  // partitions where every device fits its budget.
  std::optional<std::vector<size_t>> balanced(bool respect_budgets) const {
    const size_t nd = devices();
    auto allowed = [&](size_t d, size_t a, size_t b) { return !respect_budgets || fits(d, a, b); };
    // Phase 1: the smallest achievable maximum.
    std::vector<uint64_t> prev(n_ + 1, kInf), cur(n_ + 1, kInf);
    prev[0] = 0;
    for (size_t d = 0; d < nd; ++d) {
      std::fill(cur.begin(), cur.end(), kInf);
      for (size_t b = 0; b <= n_; ++b)
        for (size_t a = 0; a <= b; ++a) {
          if (prev[a] == kInf || !allowed(d, a, b)) continue;
          const uint64_t cand = std::max(prev[a], segment(a, b).weights);
          cur[b] = std::min(cur[b], cand);
        }
      std::swap(prev, cur);
    }
    const uint64_t cap = prev[n_];
    if (cap == kInf) return std::nullopt;
    // Phase 2: most even partition under that maximum.
    const double scale = cap > 0 ? static_cast<double>(cap) : 1.0;
    const double inf = std::numeric_limits<double>::infinity();
    std::vector<std::vector<double>> best(nd + 1, std::vector<double>(n_ + 1, inf));
    std::vector<std::vector<size_t>> from(nd + 1, std::vector<size_t>(n_ + 1, 0));
    best[0][0] = 0;
    for (size_t d = 0; d < nd; ++d)
      for (size_t b = 0; b <= n_; ++b)
        for (size_t a = 0; a <= b; ++a) {
          if (best[d][a] == inf || !allowed(d, a, b)) continue;
          const uint64_t w = segment(a, b).weights;
          if (w > cap) continue;
          const double x = static_cast<double>(w) / scale;
          const double cand = best[d][a] + x * x;
          if (cand < best[d + 1][b]) {
            best[d + 1][b] = cand;
            from[d + 1][b] = a;
          }
        }
    if (best[nd][n_] == inf) return std::nullopt;
    std::vector<size_t> cuts(nd + 1, 0);
    cuts[nd] = n_;
    for (size_t d = nd; d > 0; --d) cuts[d - 1] = from[d][cuts[d]];
    return cuts;
  }

  bool all_fit(const std::vector<DeviceUsage>& usage) const {
    for (const auto& u : usage)
      if (u.budget && u.total() > *u.budget) return false;
    return true;
  }

  [[noreturn]] void fail(const char* strategy, const std::vector<DeviceUsage>& usage) const {
    std::string msg = concat("model does not fit the device budgets (", strategy, "): ");
    for (size_t i = 0; i < usage.size(); ++i) {
      const auto& u = usage[i];
      msg += concat(i ? "; " : "", u.device.str(), " needs ", format_bytes(u.total()), " of ",
                    u.budget ? format_bytes(*u.budget) : std::string("unlimited"), " (weights ",
                    format_bytes(u.weights), ", workspace ", format_bytes(u.workspace),
                    ", reserve ", format_bytes(u.reserve), ")");
    }
    msg += "; raise the budgets, add devices or lower batch x sequence length";
    throw InputError(msg);
  }

  // Contiguous strategies fail with the most even split (ignoring budgets) as the report.
  [[noreturn]] void fail_contiguous(const char* strategy) const {
    const auto cuts = balanced(/*respect_budgets=*/false);
    fail(strategy, usage(req_.devices, assignment(*cuts)));
  }

 private:
  uint64_t max_workspace_between(size_t a, size_t b) const {
    size_t k = 0;
    while ((size_t{2} << k) <= b - a) ++k;
    return std::max(workspace_max_[k][a], workspace_max_[k][b - (size_t{1} << k)]);
  }

  const PlanRequest& req_;
  size_t n_;
  // Prefix sums: weight_prefix_[i] / capture_prefix_[i] = weight / capture bytes of stages [0, i).
  std::vector<uint64_t> weight_prefix_, capture_prefix_;
  // Sparse table: workspace_max_[k][i] = largest workspace of stages [i, i + 2^k).
  std::vector<std::vector<uint64_t>> workspace_max_;
  // Per stage: the stage holding the module its tied weight belongs to (-1: none or not found).
  std::vector<long> tied_owner_;
  std::vector<size_t> tied_stages_;  // stages with a tied (shared) weight
};

using KeyDevices = std::vector<std::pair<std::string, DeviceId>>;  // map key -> its device

// The explicit map's devices, parsed (accelerate's integer N is cuda:N).
KeyDevices parse_map_devices(const DeviceMap& map) {
  if (map.empty())
    throw InputError(
        "device map must be a non-empty JSON object mapping module names to devices (e.g. "
        "{\"model.layers.0\": \"cpu:0\"}), got {}");
  KeyDevices keys;
  for (const auto& [key, text] : map) {
    try {
      keys.emplace_back(key, parse_device(text, /*integer_is_cuda=*/true));
    } catch (const InputError& e) {
      throw InputError(concat("device map entry '", key, "': ", e.what()));
    }
  }
  return keys;
}

// Keys: each must cover at least one module; keys inside a stage's module would split it.
void check_map_keys(const PlanRequest& req, const KeyDevices& keys) {
  std::vector<std::string> unknown, splitting;
  for (const auto& [key, dev] : keys) {
    bool covering = false;
    std::string inside_of;
    for (const auto& st : req.stages)
      for (const auto& m : st.modules) {
        if (covers(key, m)) covering = true;
        if (inside_of.empty() && inside(key, m)) inside_of = m;
      }
    if (covering) continue;
    if (!inside_of.empty())
      splitting.push_back(concat(key, " (inside ", inside_of, ")"));
    else
      unknown.push_back(key.empty() ? std::string("\"\"") : key);
  }
  if (!splitting.empty())
    throw InputError(concat("device map would split a block: ", list_names(splitting),
                            "; map the whole block (a stage is never split across devices)"));
  if (!unknown.empty())
    throw InputError(concat("unknown module names in device map: ", list_names(unknown)));
}

// Modules: the longest covering key decides; all modules of a stage must land on one device.
std::vector<DeviceId> assign_stages(const PlanRequest& req, const KeyDevices& keys) {
  std::vector<std::string> left_out, split_stages;
  std::vector<DeviceId> stage_device(req.stages.size());
  for (size_t s = 0; s < req.stages.size(); ++s) {
    const auto& st = req.stages[s];
    if (st.modules.empty())
      throw InputError(concat("stage ", s, " has no module names; it cannot be mapped"));
    std::vector<std::pair<std::string, DeviceId>> chosen;  // module -> device
    for (const auto& m : st.modules) {
      const std::pair<std::string, DeviceId>* best = nullptr;
      for (const auto& kd : keys)
        if (covers(kd.first, m) && (!best || kd.first.size() > best->first.size())) best = &kd;
      if (!best) {
        left_out.push_back(m);
        continue;
      }
      chosen.emplace_back(m, best->second);
    }
    if (chosen.empty()) continue;
    stage_device[s] = chosen.front().second;
    bool mixed = false;
    for (const auto& c : chosen) mixed = mixed || c.second != chosen.front().second;
    if (mixed) {
      std::string detail;
      for (const auto& c : chosen)
        detail += concat(detail.empty() ? "" : ", ", c.first, " -> ", c.second.str());
      split_stages.push_back(concat("stage ", s, " (", detail, ")"));
    }
  }
  if (!left_out.empty())
    throw InputError(concat("device map leaves out: ", list_names(left_out),
                            "; every module must be mapped (\"\" maps everything)"));
  if (!split_stages.empty())
    throw InputError(concat("device map would split a block: ", list_names(split_stages),
                            "; map all modules of a stage to one device"));
  return stage_device;
}

// Devices must be listed: fills `devices` (first use first) when it is empty, else refuses
// devices of the map that it does not list.
void check_map_devices(const std::vector<DeviceId>& stage_device, const KeyDevices& keys,
                       std::vector<DeviceId>& devices) {
  if (devices.empty()) {
    for (const auto& d : stage_device)
      if (std::find(devices.begin(), devices.end(), d) == devices.end()) devices.push_back(d);
    for (const auto& kd : keys)
      if (std::find(devices.begin(), devices.end(), kd.second) == devices.end())
        devices.push_back(kd.second);
    return;
  }
  std::vector<std::string> missing;
  for (const auto& kd : keys)
    if (std::find(devices.begin(), devices.end(), kd.second) == devices.end() &&
        std::find(missing.begin(), missing.end(), kd.second.str()) == missing.end())
      missing.push_back(kd.second.str());
  if (!missing.empty()) {
    std::vector<std::string> listed;
    for (const auto& d : devices) listed.push_back(d.str());
    throw InputError(concat(missing.size() == 1 ? "device " : "devices ", list_names(missing),
                            missing.size() == 1 ? " is" : " are",
                            " not among the devices to plan on (", list_names(listed), ")"),
                     {"devices", "device_map"});
  }
}

// Explicit map -> device per stage; fills `devices` when it is empty.
std::vector<DeviceId> explicit_assignment(const PlanRequest& req, std::vector<DeviceId>& devices) {
  const KeyDevices keys = parse_map_devices(req.explicit_map);
  check_map_keys(req, keys);
  std::vector<DeviceId> stage_device = assign_stages(req, keys);
  check_map_devices(stage_device, keys, devices);
  return stage_device;
}

}  // namespace

DeviceMap DevicePlan::device_map() const {
  DeviceMap out;
  for (size_t s = 0; s < stage_device.size() && s < stage_modules.size(); ++s)
    for (const auto& m : stage_modules[s]) out[m] = stage_device[s].str();
  return out;
}

std::string DevicePlan::table() const {
  std::vector<std::vector<std::string>> rows;
  rows.push_back({"device", "stages", "weights", "workspace", "reserve", "total", "budget"});
  for (const auto& u : usage)
    rows.push_back({u.device.str(), compact_ranges(u.stages), format_bytes(u.weights),
                    format_bytes(u.workspace), format_bytes(u.reserve), format_bytes(u.total()),
                    u.budget ? format_bytes(*u.budget) : std::string("-")});
  std::vector<size_t> width(rows[0].size(), 0);
  for (const auto& r : rows)
    for (size_t c = 0; c < r.size(); ++c) width[c] = std::max(width[c], r[c].size());
  std::ostringstream os;
  for (const auto& r : rows) {
    std::string line;
    for (size_t c = 0; c < r.size(); ++c) {
      line += r[c];
      if (c + 1 < r.size()) line += std::string(width[c] - r[c].size() + 2, ' ');
    }
    os << line << "\n";
  }
  for (const LinkRoute& r : routes)
    os << "link " << r.from.str() << " -> " << r.to.str() << ": through host memory (" << r.reason
       << ")\n";
  return os.str();
}

nlohmann::json DevicePlan::to_json() const {
  nlohmann::json devs = nlohmann::json::array();
  for (const auto& u : usage) {
    nlohmann::json stages = nlohmann::json::array();
    for (size_t s : u.stages) stages.push_back(s);
    devs.push_back({{"device", u.device.str()},
                    {"stages", stages},
                    {"weights", u.weights},
                    {"workspace", u.workspace},
                    {"reserve", u.reserve},
                    {"total", u.total()},
                    {"budget", u.budget ? nlohmann::json(*u.budget) : nlohmann::json(nullptr)}});
  }
  nlohmann::json out = {{"device_map", device_map()}, {"devices", devs}};
  if (!routes.empty()) {
    nlohmann::json links = nlohmann::json::array();
    for (const LinkRoute& r : routes)
      links.push_back(
          {{"from", r.from.str()}, {"to", r.to.str()}, {"via", "host"}, {"reason", r.reason}});
    out["routes"] = links;
  }
  return out;
}

DevicePlan plan_devices(const PlanRequest& request) {
  {
    std::set<DeviceId> seen;
    for (const auto& d : request.devices)
      if (!seen.insert(d).second) throw InputError(concat("device ", d.str(), " is listed twice"));
  }
  DevicePlan plan;
  for (const auto& st : request.stages) plan.stage_modules.push_back(st.modules);

  if (request.strategy == PlanStrategy::kExplicit) {
    PlanRequest req = request;
    plan.stage_device = explicit_assignment(request, req.devices);
    Planner p(req);
    plan.usage = p.usage(req.devices, plan.stage_device);
    if (!p.all_fit(plan.usage)) p.fail("explicit", plan.usage);
    return plan;
  }

  if (request.devices.empty())
    throw InputError("no devices to plan on; list at least one device (e.g. cpu)", {"devices"});
  Planner p(request);
  const char* name = strategy_name(request.strategy);
  std::optional<std::vector<size_t>> cuts;
  switch (request.strategy) {
    case PlanStrategy::kSequential:
      cuts = p.sequential();
      break;
    case PlanStrategy::kBalanced:
      cuts = p.balanced(/*respect_budgets=*/false);
      if (cuts && !p.all_fit(p.usage(request.devices, p.assignment(*cuts))))
        cuts = p.balanced(/*respect_budgets=*/true);
      break;
    case PlanStrategy::kAuto:
      cuts = p.auto_fill();
      if (!cuts) cuts = p.sequential();
      break;
    case PlanStrategy::kExplicit:
      break;
  }
  if (!cuts) p.fail_contiguous(name);
  plan.stage_device = p.assignment(*cuts);
  plan.usage = p.usage(request.devices, plan.stage_device);
  if (!p.all_fit(plan.usage)) p.fail(name, plan.usage);  // cannot happen; guards the invariant
  return plan;
}

DeviceMap device_map_from_json(const nlohmann::json& map) {
  if (!map.is_object())
    throw InputError("device map: expected an object of module name -> device", {"device_map"});
  DeviceMap out;
  for (auto it = map.begin(); it != map.end(); ++it) {
    const auto& v = it.value();
    if (v.is_string())
      out[it.key()] = v.get<std::string>();
    else if (v.is_number_integer())
      out[it.key()] = v.dump();
    else
      throw InputError(concat("device map entry '", it.key(),
                              "' must be a device string or an integer (cuda:N), got ", v.dump()));
  }
  return out;
}

DeviceMap load_device_map(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    throw InputError(concat("device map: cannot read ", path,
                            " (expected auto, balanced, sequential or a JSON file)"),
                     {"device_map"});
  nlohmann::json map;
  try {
    map = nlohmann::json::parse(read_text_file(path, kMaxConfigBytes, "device map"));
  } catch (const nlohmann::json::exception& e) {
    throw InputError(concat("device map ", path, ": not valid JSON (", e.what(), ")"),
                     {"device_map"});
  }
  return device_map_from_json(map);
}

PlanStrategy parse_strategy(const std::string& text) {
  if (text == "auto") return PlanStrategy::kAuto;
  if (text == "balanced") return PlanStrategy::kBalanced;
  if (text == "sequential") return PlanStrategy::kSequential;
  throw InputError(concat("unknown device-map strategy '", text,
                          "'; expected auto, balanced, sequential or a device-map FILE.json"));
}

}  // namespace actcap
