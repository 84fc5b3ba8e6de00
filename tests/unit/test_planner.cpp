#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <random>

#include "actcap/error.h"
#include "actcap/planner.h"

using namespace actcap;
using nlohmann::json;

namespace {

DeviceId V(int i) { return DeviceId::virtual_cpu(i); }

std::vector<DeviceId> cpus(int n) {
  std::vector<DeviceId> out;
  for (int i = 0; i < n; ++i) out.push_back(V(i));
  return out;
}

// n equal stages "model.layers.i".
std::vector<StageCost> layers(int n, uint64_t weights = 100) {
  std::vector<StageCost> out;
  for (int i = 0; i < n; ++i) {
    StageCost s;
    s.modules = {"model.layers." + std::to_string(i)};
    s.weight_bytes = weights;
    out.push_back(s);
  }
  return out;
}

// GPT-2 shaped: embeddings (wte + wpe), blocks, ln_f, lm_head tied to wte.
std::vector<StageCost> gpt2(int blocks, uint64_t wte = 1000, uint64_t block = 100) {
  std::vector<StageCost> out;
  StageCost emb;
  emb.modules = {"transformer.wte", "transformer.wpe"};
  emb.weight_bytes = wte + 10;
  out.push_back(emb);
  for (int i = 0; i < blocks; ++i) {
    StageCost b;
    b.modules = {"transformer.h." + std::to_string(i)};
    b.weight_bytes = block;
    out.push_back(b);
  }
  StageCost ln;
  ln.modules = {"transformer.ln_f"};
  ln.weight_bytes = 2;
  out.push_back(ln);
  StageCost head;
  head.modules = {"lm_head"};
  head.weight_bytes = 0;
  head.shared_weight_bytes = wte;
  head.shared_with = "transformer.wte";
  out.push_back(head);
  return out;
}

PlanRequest request(std::vector<StageCost> stages, std::vector<DeviceId> devices,
                    PlanStrategy strategy) {
  PlanRequest r;
  r.stages = std::move(stages);
  r.devices = std::move(devices);
  r.strategy = strategy;
  return r;
}

std::string plan_error(const PlanRequest& r) {
  try {
    plan_devices(r);
  } catch (const InputError& e) {
    EXPECT_EQ(e.exit_code(), 2);
    return e.what();
  }
  ADD_FAILURE() << "expected an InputError";
  return "";
}

bool has(const std::string& haystack, const std::string& needle) {
  return haystack.find(needle) != std::string::npos;
}

std::vector<size_t> counts(const DevicePlan& p) {
  std::vector<size_t> out;
  for (const auto& u : p.usage) out.push_back(u.stages.size());
  return out;
}

// Every stage on exactly one device, usage consistent with stage_device, budgets respected.
void check_plan(const PlanRequest& r, const DevicePlan& p, bool contiguous) {
  ASSERT_EQ(p.stage_device.size(), r.stages.size());
  std::vector<int> seen(r.stages.size(), 0);
  for (const auto& u : p.usage) {
    for (size_t s : u.stages) {
      ASSERT_LT(s, r.stages.size());
      ++seen[s];
      EXPECT_EQ(p.stage_device[s], u.device);
    }
    if (u.budget) {
      EXPECT_LE(u.total(), *u.budget) << u.device.str();
    }
    auto it = r.budgets.find(u.device);
    if (it != r.budgets.end()) {
      ASSERT_TRUE(u.budget.has_value());
      EXPECT_EQ(*u.budget, it->second);
    }
  }
  for (size_t s = 0; s < seen.size(); ++s) EXPECT_EQ(seen[s], 1) << "stage " << s;
  if (contiguous) {
    // Stages follow the listed device order.
    std::vector<size_t> order;
    for (size_t s = 0; s < r.stages.size(); ++s)
      for (size_t d = 0; d < r.devices.size(); ++d)
        if (r.devices[d] == p.stage_device[s]) order.push_back(d);
    EXPECT_TRUE(std::is_sorted(order.begin(), order.end()));
  }
}

}  // namespace

TEST(Planner, UsageCountsWeightsWorkspaceReserve) {
  auto stages = layers(4);
  stages[0].workspace_bytes = 30;
  stages[1].workspace_bytes = 70;
  stages[2].workspace_bytes = 5;
  for (auto& s : stages) s.capture_bytes = 8;
  auto r = request(stages, cpus(3), PlanStrategy::kExplicit);
  r.hidden_bytes = 1000;
  r.explicit_map = {{"model.layers.0", "cpu:0"},
                    {"model.layers.1", "cpu:0"},
                    {"model.layers.2", "cpu:1"},
                    {"model.layers.3", "cpu:1"}};
  const auto p = plan_devices(r);
  ASSERT_EQ(p.usage.size(), 3u);  // cpu:2 holds nothing but is still listed
  EXPECT_EQ(p.usage[0].weights, 200u);
  EXPECT_EQ(p.usage[0].workspace, 3000u + 70);
  EXPECT_EQ(p.usage[0].reserve, 16u);
  EXPECT_EQ(p.usage[0].total(), 200u + 3070 + 16);
  EXPECT_EQ(p.usage[1].workspace, 3000u + 5);
  EXPECT_EQ(p.usage[2].device, V(2));
  EXPECT_TRUE(p.usage[2].stages.empty());
  EXPECT_EQ(p.usage[2].total(), 0u);
  EXPECT_FALSE(p.usage[2].budget.has_value());
}

TEST(Planner, SequentialFillsFirstDeviceFirst) {
  auto r = request(layers(6), cpus(2), PlanStrategy::kSequential);
  auto p = plan_devices(r);
  EXPECT_EQ(counts(p), (std::vector<size_t>{6, 0}));  // unlimited: everything on cpu:0
  r.budgets = {{V(0), 250}, {V(1), 1000}};
  p = plan_devices(r);
  check_plan(r, p, true);
  EXPECT_EQ(counts(p), (std::vector<size_t>{2, 4}));
  // cpu:0 too small for even one stage: accelerate moves on to the next device.
  r.budgets = {{V(0), 50}, {V(1), 1000}};
  p = plan_devices(r);
  check_plan(r, p, true);
  EXPECT_EQ(counts(p), (std::vector<size_t>{0, 6}));
}

TEST(Planner, BalancedEqualises) {
  auto r = request(layers(8), cpus(4), PlanStrategy::kBalanced);
  auto p = plan_devices(r);
  check_plan(r, p, true);
  EXPECT_EQ(counts(p), (std::vector<size_t>{2, 2, 2, 2}));
  // Uneven stages: the largest per-device weight is minimised.
  auto stages = layers(5);
  stages[0].weight_bytes = 400;
  r = request(stages, cpus(2), PlanStrategy::kBalanced);
  p = plan_devices(r);
  check_plan(r, p, true);
  EXPECT_EQ(counts(p), (std::vector<size_t>{1, 4}));
}

TEST(Planner, BalancedFallsBackToBudgets) {
  auto r = request(layers(8), cpus(2), PlanStrategy::kBalanced);
  r.budgets = {{V(0), 300}, {V(1), 10000}};
  const auto p = plan_devices(r);
  check_plan(r, p, true);
  EXPECT_EQ(counts(p), (std::vector<size_t>{3, 5}));
}

TEST(Planner, AutoUsesAllDevicesWhenUnlimited) {
  auto r = request(layers(6), cpus(3), PlanStrategy::kAuto);
  auto p = plan_devices(r);
  check_plan(r, p, true);
  for (const auto& u : p.usage) EXPECT_FALSE(u.stages.empty()) << u.device.str();
  EXPECT_EQ(counts(p), (std::vector<size_t>{2, 2, 2}));
  // A big first stage does not starve the later devices.
  auto stages = layers(3);
  stages[0].weight_bytes = 1000;
  r = request(stages, cpus(3), PlanStrategy::kAuto);
  p = plan_devices(r);
  check_plan(r, p, true);
  EXPECT_EQ(counts(p), (std::vector<size_t>{1, 1, 1}));
}

TEST(Planner, AutoRespectsBudgets) {
  auto r = request(layers(6), cpus(3), PlanStrategy::kAuto);
  r.budgets = {{V(0), 100}, {V(1), 1000}, {V(2), 1000}};
  const auto p = plan_devices(r);
  check_plan(r, p, true);
  EXPECT_EQ(counts(p), (std::vector<size_t>{1, 2, 3}));
  // The balanced caps fail (cpu:2 cannot take the rest), plain sequential works.
  r = request(layers(6), cpus(2), PlanStrategy::kAuto);
  r.budgets = {{V(0), 500}, {V(1), 100}};
  const auto q = plan_devices(r);
  check_plan(r, q, true);
  EXPECT_EQ(counts(q), (std::vector<size_t>{5, 1}));
}

TEST(Planner, ImpossibleBudgetNamesEveryDevice) {
  for (auto strategy : {PlanStrategy::kAuto, PlanStrategy::kBalanced, PlanStrategy::kSequential}) {
    auto r = request(layers(4, 1 << 20), cpus(3), strategy);
    r.budgets = {{V(0), 1 << 20}, {V(1), 1 << 20}, {V(2), 1 << 20}};  // 4 stages of 1 MiB
    const auto e = plan_error(r);
    EXPECT_TRUE(has(e, "does not fit")) << e;
    EXPECT_TRUE(has(e, "cpu:0 needs")) << e;
    EXPECT_TRUE(has(e, "cpu:1 needs")) << e;
    EXPECT_TRUE(has(e, "cpu:2 needs")) << e;
    EXPECT_TRUE(has(e, "of 1.00 MiB")) << e;
    EXPECT_TRUE(has(e, "weights ")) << e;
    EXPECT_EQ(e.find('\n'), std::string::npos) << e;
  }
  auto r = request(layers(2), cpus(2), PlanStrategy::kAuto);
  r.hidden_bytes = 100;
  r.budgets = {{V(0), 350}, {V(1), 350}};  // a stage needs 100 weights + 300 arena
  const auto e = plan_error(r);
  EXPECT_TRUE(has(e, "(auto)")) << e;
  EXPECT_TRUE(has(e, "workspace 300 B")) << e;
}

TEST(Planner, TiedWeightsCountedWhenSplit) {
  const auto stages = gpt2(2);  // stages: emb, h.0, h.1, ln_f, lm_head
  auto r = request(stages, cpus(2), PlanStrategy::kExplicit);
  r.explicit_map = {{"transformer", "cpu:0"}, {"lm_head", "cpu:1"}};
  auto p = plan_devices(r);
  EXPECT_EQ(p.usage[0].weights, 1010u + 200 + 2);
  EXPECT_EQ(p.usage[1].weights, 1000u);  // the tied wte must exist on cpu:1 too
  r.explicit_map = {{"", "cpu:0"}};
  p = plan_devices(r);
  EXPECT_EQ(p.usage[0].weights, 1010u + 200 + 2);  // once when together
  EXPECT_TRUE(p.usage[1].stages.empty());
  // Contiguous strategies count it the same way.
  auto staged = stages;
  staged.back().capture_bytes = 1;  // lm_head no longer fits next to the rest on cpu:0
  r = request(staged, cpus(2), PlanStrategy::kSequential);
  r.budgets = {{V(0), 1010 + 200 + 2}, {V(1), 1000}};
  auto e = plan_error(r);
  EXPECT_TRUE(has(e, "does not fit")) << e;
  r.budgets[V(1)] = 1001;
  p = plan_devices(r);
  check_plan(r, p, true);
  EXPECT_EQ(p.usage[1].weights, 1000u);
  EXPECT_EQ(p.usage[1].stages, std::vector<size_t>{4});
}

TEST(Planner, ExplicitScrambledNonContiguous) {
  auto r = request(layers(3), cpus(2), PlanStrategy::kExplicit);
  r.explicit_map = {
      {"model.layers.0", "cpu:1"}, {"model.layers.1", "cpu:0"}, {"model.layers.2", "cpu:1"}};
  const auto p = plan_devices(r);
  check_plan(r, p, false);
  EXPECT_EQ(p.stage_device, (std::vector<DeviceId>{V(1), V(0), V(1)}));
  EXPECT_EQ(p.usage[1].stages, (std::vector<size_t>{0, 2}));
  EXPECT_EQ(p.usage[1].weights, 200u);
}

TEST(Planner, ExplicitPrefixKeys) {
  auto stages = layers(4);
  StageCost head;
  head.modules = {"lm_head"};
  stages.push_back(head);
  auto r = request(stages, cpus(3), PlanStrategy::kExplicit);
  r.explicit_map = {{"", "cpu:2"}, {"model.layers", "cpu:0"}, {"model.layers.3", "cpu:1"}};
  const auto p = plan_devices(r);
  EXPECT_EQ(p.stage_device, (std::vector<DeviceId>{V(0), V(0), V(0), V(1), V(2)}));
  // "model.layers.1" is not a dot-prefix of "model.layers.10".
  auto many = layers(11);
  r = request(many, cpus(2), PlanStrategy::kExplicit);
  r.explicit_map = {{"model", "cpu:0"}, {"model.layers.1", "cpu:1"}};
  const auto q = plan_devices(r);
  EXPECT_EQ(q.stage_device[1], V(1));
  EXPECT_EQ(q.stage_device[10], V(0));
}

TEST(Planner, ExplicitErrors) {
  auto r = request(layers(3), cpus(2), PlanStrategy::kExplicit);
  r.explicit_map = {
      {"model.layers.0", "cpu:0"}, {"model.layerz", "cpu:0"}, {"model.layers.9", "cpu:1"}};
  auto e = plan_error(r);
  EXPECT_TRUE(has(e, "unknown module names in device map")) << e;
  EXPECT_TRUE(has(e, "model.layerz")) << e;
  EXPECT_TRUE(has(e, "model.layers.9")) << e;

  r.explicit_map = {{"model.layers.0", "cpu:0"}};
  e = plan_error(r);
  EXPECT_TRUE(has(e, "leaves out")) << e;
  EXPECT_TRUE(has(e, "model.layers.1")) << e;
  EXPECT_TRUE(has(e, "model.layers.2")) << e;

  r.explicit_map = {{"model.layers", "cpu:0"}, {"model.layers.0.mlp", "cpu:1"}};
  e = plan_error(r);
  EXPECT_TRUE(has(e, "split a block")) << e;
  EXPECT_TRUE(has(e, "model.layers.0.mlp")) << e;
  EXPECT_TRUE(has(e, "map the whole block")) << e;

  r.explicit_map = {{"model.layers", "cuda:3"}};
  e = plan_error(r);
  EXPECT_TRUE(has(e, "device cuda:3 is not among the devices to plan on")) << e;

  r.explicit_map =
      device_map_from_json(json{{"model.layers", 1}});  // accelerate's integer = cuda:1
  e = plan_error(r);
  EXPECT_TRUE(has(e, "cuda:1 is not among the devices to plan on")) << e;

  r.explicit_map = {{"model.layers", "disk"}};
  e = plan_error(r);
  EXPECT_TRUE(has(e, "does not offload")) << e;
  EXPECT_TRUE(has(e, "model.layers")) << e;

  auto from_json_error = [](const json& map) {
    try {
      device_map_from_json(map);
    } catch (const InputError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  e = from_json_error(json{{"model.layers", true}});
  EXPECT_TRUE(has(e, "model.layers")) << e;
  EXPECT_TRUE(has(e, "must be a device string or an integer")) << e;

  e = from_json_error(json::array());
  EXPECT_TRUE(has(e, "expected an object")) << e;

  r.explicit_map = {};
  e = plan_error(r);
  EXPECT_TRUE(has(e, "non-empty JSON object")) << e;

  // GPT-2's embedding stage covers wte and wpe: they must go together.
  r = request(gpt2(1), cpus(2), PlanStrategy::kExplicit);
  r.explicit_map = {{"", "cpu:0"}, {"transformer.wpe", "cpu:1"}};
  e = plan_error(r);
  EXPECT_TRUE(has(e, "transformer.wte -> cpu:0")) << e;
  EXPECT_TRUE(has(e, "transformer.wpe -> cpu:1")) << e;

  // Budgets are still checked.
  r = request(layers(3), cpus(2), PlanStrategy::kExplicit);
  r.explicit_map = {{"", "cpu:1"}};
  r.budgets = {{V(1), 250}};
  e = plan_error(r);
  EXPECT_TRUE(has(e, "does not fit the device budgets (explicit)")) << e;
  EXPECT_TRUE(has(e, "cpu:0 needs 0 B of unlimited")) << e;
  EXPECT_TRUE(has(e, "cpu:1 needs 300 B of 250 B")) << e;
}

TEST(Planner, ExplicitIntegerDevicesAndDerivedDeviceList) {
  auto r = request(layers(3), {}, PlanStrategy::kExplicit);
  r.explicit_map = device_map_from_json(
      json{{"model.layers.0", 1}, {"model.layers.1", 0}, {"model.layers.2", "cuda:1"}});
  const auto p = plan_devices(r);
  EXPECT_EQ(p.stage_device,
            (std::vector<DeviceId>{DeviceId::cuda(1), DeviceId::cuda(0), DeviceId::cuda(1)}));
  ASSERT_EQ(p.usage.size(), 2u);  // distinct devices, first use first
  EXPECT_EQ(p.usage[0].device, DeviceId::cuda(1));
  EXPECT_EQ(p.usage[1].device, DeviceId::cuda(0));
  EXPECT_EQ(p.device_map()["model.layers.0"], "cuda:1");
}

TEST(Planner, DeviceMapTableAndJson) {
  auto r = request(gpt2(2), cpus(3), PlanStrategy::kSequential);
  r.budgets = {{V(0), 1110}, {V(1), 5000}};
  const auto p = plan_devices(r);
  check_plan(r, p, true);
  const json m = p.device_map();
  ASSERT_TRUE(m.is_object());
  EXPECT_EQ(m.size(), 6u);  // wte, wpe, h.0, h.1, ln_f, lm_head
  EXPECT_EQ(m["transformer.wte"], "cpu:0");
  EXPECT_EQ(m["transformer.wpe"], "cpu:0");
  EXPECT_EQ(m["transformer.h.0"], "cpu:0");
  EXPECT_EQ(m["transformer.h.1"], "cpu:1");
  EXPECT_EQ(m["lm_head"], "cpu:1");

  const json j = p.to_json();
  EXPECT_EQ(j["device_map"], m);
  ASSERT_TRUE(j["devices"].is_array());
  ASSERT_EQ(j["devices"].size(), 3u);
  const json& d0 = j["devices"][0];
  EXPECT_EQ(d0["device"], "cpu:0");
  EXPECT_EQ(d0["stages"], json::array({0, 1}));
  EXPECT_EQ(d0["weights"], 1110u);
  EXPECT_EQ(d0["budget"], 1110u);
  EXPECT_EQ(d0["total"], d0["weights"].get<uint64_t>() + d0["workspace"].get<uint64_t>() +
                             d0["reserve"].get<uint64_t>());
  EXPECT_EQ(j["devices"][1]["stages"], json::array({2, 3, 4}));
  EXPECT_TRUE(j["devices"][2]["budget"].is_null());
  EXPECT_EQ(j["devices"][2]["stages"], json::array());

  const std::string t = p.table();
  EXPECT_TRUE(has(t, "device")) << t;
  for (const char* col : {"stages", "weights", "workspace", "reserve", "total", "budget"})
    EXPECT_TRUE(has(t, col)) << t;
  EXPECT_TRUE(has(t, "0-1")) << t;
  EXPECT_TRUE(has(t, "2-4")) << t;
  EXPECT_TRUE(has(t, "1.08 KiB")) << t;  // 1110 bytes
  EXPECT_EQ(std::count(t.begin(), t.end(), '\n'), 4);
}

TEST(Planner, TableCompactRanges) {
  auto r = request(layers(9), cpus(2), PlanStrategy::kExplicit);
  r.explicit_map = {{"model.layers", "cpu:0"},
                    {"model.layers.4", "cpu:1"},
                    {"model.layers.5", "cpu:1"},
                    {"model.layers.6", "cpu:1"}};
  const auto t = plan_devices(r).table();
  EXPECT_TRUE(has(t, "0-3,7-8")) << t;
  EXPECT_TRUE(has(t, "4-6")) << t;
  EXPECT_TRUE(has(t, " -\n")) << t;  // no budget
}

TEST(Planner, ParseStrategy) {
  EXPECT_EQ(parse_strategy("auto"), PlanStrategy::kAuto);
  EXPECT_EQ(parse_strategy("balanced"), PlanStrategy::kBalanced);
  EXPECT_EQ(parse_strategy("sequential"), PlanStrategy::kSequential);
  try {
    parse_strategy("greedy");
    FAIL();
  } catch (const InputError& e) {
    EXPECT_TRUE(has(e.what(), "greedy"));
  }
}

TEST(Planner, NoDevicesIsAnError) {
  const auto e = plan_error(request(layers(2), {}, PlanStrategy::kAuto));
  EXPECT_TRUE(has(e, "no devices")) << e;
}

// Random stages and budgets: whatever a strategy returns fits, never splits a stage and keeps
// stages in device order; balanced fits whenever sequential does, auto whenever sequential does.
TEST(Planner, RandomPlansRespectBudgets) {
  std::mt19937 rng(1234);
  int planned = 0, refused = 0;
  for (int iter = 0; iter < 400; ++iter) {
    const int n = 1 + static_cast<int>(rng() % 12);
    const int nd = 1 + static_cast<int>(rng() % 4);
    auto stages = layers(n);
    for (auto& s : stages) {
      s.weight_bytes = rng() % 1000;
      s.workspace_bytes = rng() % 200;
      s.capture_bytes = rng() % 50;
    }
    if (n >= 3 && rng() % 2) {  // a tied head
      stages.back().shared_with = stages.front().modules[0];
      stages.back().shared_weight_bytes = stages.front().weight_bytes;
    }
    std::map<DeviceId, uint64_t> budgets;
    for (int d = 0; d < nd; ++d)
      if (rng() % 4) budgets[V(d)] = 500 + rng() % 4000;
    const uint64_t hidden = rng() % 40;
    bool balanced_ok = false, sequential_ok = false;
    for (auto strategy :
         {PlanStrategy::kBalanced, PlanStrategy::kSequential, PlanStrategy::kAuto}) {
      auto r = request(stages, cpus(nd), strategy);
      r.budgets = budgets;
      r.hidden_bytes = hidden;
      try {
        const auto p = plan_devices(r);
        check_plan(r, p, true);
        ++planned;
        if (strategy == PlanStrategy::kBalanced) balanced_ok = true;
        if (strategy == PlanStrategy::kSequential) {
          sequential_ok = true;
          EXPECT_TRUE(balanced_ok);  // balanced finds a fitting split whenever one exists
        }
      } catch (const InputError& e) {
        ++refused;
        EXPECT_TRUE(has(e.what(), "does not fit")) << e.what();
        if (strategy == PlanStrategy::kAuto) {
          EXPECT_FALSE(sequential_ok);  // auto falls back to sequential
        }
      }
    }
  }
  EXPECT_GT(planned, 100);
  EXPECT_GT(refused, 10);
}
