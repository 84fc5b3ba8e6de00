// Split execution over virtual devices: bit-identical to one device, arenas really reused,
// transfer faults detected.
#include <gtest/gtest.h>

#include <map>

#include "actcap/error.h"
#include "actcap/init_model.h"
#include "actcap/model.h"
#include "actcap/planner.h"
#include "actcap/split.h"
#include "executor/transfer.h"
#include "models/weights.h"

using namespace actcap;

namespace {

// Re-places the model with these test faults on its transfers ("" removes them).
void with_faults(Model& m, const std::string& spec) {
  ExecutionOptions o = m.placement();
  o.faults = spec.empty() ? std::vector<TransferFault>{} : parse_faults(spec);
  m.place(o);
}

std::unique_ptr<Model> tiny(const std::string& arch) {
  ModelConfig c = preset_config(arch, "tiny");
  return Model::from_tensors(c, random_weights(c, 11, at::kFloat), arch);
}

Batch padded(const Model& m) {
  return Batch::from_sequences({{5, 9, 2, 7, 11, 3, 8, 1, 4, 6, 10, 12}, {7, 3}, {1, 2, 3, 4, 5}},
                               m.config().vocab_size, m.config().max_positions());
}

// Every point's value (cloned inside the hook) plus logits.
std::map<std::string, at::Tensor> capture_all(Model& m, const Batch& b) {
  std::map<std::string, at::Tensor> out;
  auto keep = [&](const HookContext& ctx, const at::Tensor& t) {
    out[ctx.point] = t.to(at::kCPU).clone();
  };
  auto h1 = m.register_forward_hook("**", keep);
  auto h2 = m.register_forward_hook("**:input", keep);
  out["logits"] = m.forward(b).to(at::kCPU);
  h1.remove();
  h2.remove();
  return out;
}

void place(Model& m, PlanStrategy strategy, int n, const Batch& b, DeviceMap explicit_map = {}) {
  PlanRequest req;
  req.stages = m.stage_costs(b.size(), b.max_len());
  for (int i = 0; i < n; ++i) req.devices.push_back(DeviceId::virtual_cpu(i));
  req.strategy = strategy;
  req.explicit_map = std::move(explicit_map);
  req.hidden_bytes = b.size() * b.max_len() * m.config().hidden_size * 4;
  DevicePlan plan = plan_devices(req);
  ExecutionOptions opts;
  opts.stage_device = plan.stage_device;
  m.place(opts);
}

struct SplitCase {
  std::string arch;
  int devices;
  PlanStrategy strategy;
};

class SplitRun : public ::testing::TestWithParam<SplitCase> {};

}  // namespace

TEST_P(SplitRun, BitIdenticalToOneDevice) {
  const SplitCase& c = GetParam();
  auto m = tiny(c.arch);
  Batch b = padded(*m);
  auto reference = capture_all(*m, b);
  place(*m, c.strategy, c.devices, b);
  std::set<DeviceId> used;
  for (size_t i = 0; i < m->stages().size(); ++i) used.insert(m->stage_device(i));
  EXPECT_EQ(static_cast<int>(used.size()), std::min<int>(c.devices, m->stages().size()));
  auto split = capture_all(*m, b);
  ASSERT_EQ(split.size(), reference.size());
  for (const auto& [name, t] : reference) EXPECT_TRUE(at::equal(t, split.at(name))) << name;
  if (c.devices > 1) {
    EXPECT_GT(m->transfer_stats().verified, 0);
  }
}

std::vector<SplitCase> split_cases() {
  std::vector<SplitCase> out;
  for (const char* arch : {"gpt2", "llama", "qwen2"})
    for (int n : {1, 2, 3, 4, 8})
      for (PlanStrategy s :
           {PlanStrategy::kAuto, PlanStrategy::kBalanced, PlanStrategy::kSequential}) {
        if (s == PlanStrategy::kSequential && n > 1)
          continue;  // unlimited budgets: sequential uses one device
        out.push_back({arch, n, s});
      }
  return out;
}

std::string split_case_name(const ::testing::TestParamInfo<SplitCase>& i) {
  static const char* names[] = {"auto", "balanced", "sequential", "explicit"};
  return i.param.arch + "_" + std::to_string(i.param.devices) + "_" +
         names[static_cast<int>(i.param.strategy)];
}

INSTANTIATE_TEST_SUITE_P(Devices, SplitRun, ::testing::ValuesIn(split_cases()), split_case_name);

TEST(Executor, ScrambledExplicitMapIsBitIdentical) {
  for (const char* arch : {"gpt2", "llama"}) {
    auto m = tiny(arch);
    Batch b = padded(*m);
    auto reference = capture_all(*m, b);
    DeviceMap map;
    const std::vector<std::string> devs = {"cpu:2", "cpu:0", "cpu:3", "cpu:1",
                                           "cpu:0", "cpu:2", "cpu:1", "cpu:3"};
    auto mods = m->stage_modules();
    for (size_t i = 0; i < mods.size(); ++i)
      for (const auto& name : mods[i]) map[name] = devs[i % devs.size()];
    place(*m, PlanStrategy::kExplicit, 4, b, map);
    auto split = capture_all(*m, b);
    for (const auto& [name, t] : reference)
      EXPECT_TRUE(at::equal(t, split.at(name))) << arch << " " << name;
    EXPECT_EQ(m->transfer_stats().transfers,
              static_cast<int64_t>(mods.size()) - 1);  // every boundary moves
  }
}

TEST(Executor, ArenaReuseOverwritesAnEarlierLayersOutput) {
  auto m = tiny("gpt2");
  m->set_bare_ref_policy(BareRefPolicy::kOff);  // this test keeps the bare reference on purpose
  Batch b = padded(*m);
  at::Tensor kept, layer2_copy;
  const void* p0 = nullptr;
  const void* p2 = nullptr;
  auto h0 =
      m->register_forward_hook("transformer.h.0", [&](const HookContext&, const at::Tensor& t) {
        kept = t;  // the bare reference the guard exists to forbid
        p0 = t.data_ptr();
      });
  auto h2 =
      m->register_forward_hook("transformer.h.2", [&](const HookContext&, const at::Tensor& t) {
        p2 = t.data_ptr();
        layer2_copy = t.clone();
      });
  m->forward(b);
  h0.remove();
  h2.remove();
  EXPECT_EQ(p0, p2);  // layer 2 wrote into the memory layer 0's output used
  EXPECT_TRUE(
      at::equal(kept, layer2_copy));  // so the kept "layer 0" tensor now holds layer 2's values
  auto stats = m->device_stats();
  ASSERT_EQ(stats.size(), 1u);
  EXPECT_GT(stats[0].slot_reuses, 0);
}

TEST(Executor, TransferFaultIsDetectedAndNamed) {
  auto m = tiny("llama");
  Batch b = padded(*m);
  place(*m, PlanStrategy::kBalanced, 3, b);
  with_faults(*m, "transfer:cpu:1->cpu:2:bitflip");
  try {
    m->forward(b);
    with_faults(*m, "");
    FAIL() << "corrupted transfer not detected";
  } catch (const RunError& e) {
    with_faults(*m, "");
    const std::string msg = e.what();
    EXPECT_NE(msg.find("cpu:1"), std::string::npos) << msg;
    EXPECT_NE(msg.find("cpu:2"), std::string::npos) << msg;
    EXPECT_NE(msg.find("model.layers."), std::string::npos) << msg;
  }
  // The model stays usable afterwards.
  EXPECT_NO_THROW(m->forward(b));
}

TEST(Executor, TransientFaultIsRepairedByHostStagedRetry) {
  auto m = tiny("gpt2");
  Batch b = padded(*m);
  auto reference = m->forward(b).clone();
  place(*m, PlanStrategy::kBalanced, 3, b);
  with_faults(*m, "transfer:cpu:0->cpu:1:zeros-once");
  auto logits = m->forward(b);
  EXPECT_TRUE(at::equal(reference, logits));
  EXPECT_EQ(m->transfer_stats().retried, 1);
}

TEST(Executor, WithoutVerificationAFaultCorruptsSilently) {
  auto m = tiny("gpt2");
  Batch b = padded(*m);
  auto reference = m->forward(b).clone();
  PlanRequest req;
  req.stages = m->stage_costs(b.size(), b.max_len());
  req.devices = {DeviceId::virtual_cpu(0), DeviceId::virtual_cpu(1), DeviceId::virtual_cpu(2)};
  req.strategy = PlanStrategy::kBalanced;
  ExecutionOptions opts;
  opts.stage_device = plan_devices(req).stage_device;
  opts.verify_transfers = false;
  m->place(opts);
  with_faults(*m, "transfer:cpu:1->cpu:2:bitflip");
  auto logits = m->forward(b);
  EXPECT_FALSE(at::equal(reference, logits));  // the damage the verification exists to catch
}

TEST(Executor, BudgetExceededMidRunIsAnError) {
  auto m = tiny("gpt2");
  Batch small = Batch::from_sequences({{1, 2}}, 512, 128);
  ExecutionOptions opts;
  opts.stage_device.assign(m->stages().size(), DeviceId::virtual_cpu(0));
  opts.budgets[DeviceId::virtual_cpu(0)] = m->stage_costs(1, 1)[1].weight_bytes * 4 + 1000000;
  m->place(opts);
  EXPECT_NO_THROW(m->forward(small));
  Batch big = Batch::from_sequences(
      std::vector<std::vector<int64_t>>(64, std::vector<int64_t>(128, 1)), 512, 128);
  EXPECT_THROW(m->forward(big), RunError);
}

TEST(Executor, FaultSpecParsing) {
  auto f = parse_faults("transfer:cpu:1->cpu:2:bitflip;transfer:cpu:0->cuda:1:zeros-once");
  ASSERT_EQ(f.size(), 2u);
  EXPECT_EQ(f[0].src.str(), "cpu:1");
  EXPECT_EQ(f[1].dst.str(), "cuda:1");
  EXPECT_TRUE(f[1].once);
  EXPECT_THROW(parse_faults("transfer:cpu:1=>cpu:2:bitflip"), InputError);
  EXPECT_THROW(parse_faults("transfer:cpu:1->cpu:2:melt"), InputError);
}

TEST(Executor, DoctorReportsBrokenPairOnly) {
  auto probes =
      probe_links({DeviceId::virtual_cpu(0), DeviceId::virtual_cpu(1), DeviceId::virtual_cpu(2)},
                  {4096}, parse_faults("transfer:cpu:2->cpu:0:bitflip"));
  ASSERT_EQ(probes.size(), 6u);
  for (const auto& p : probes)
    EXPECT_EQ(p.ok(), !(p.src.str() == "cpu:2" && p.dst.str() == "cpu:0"))
        << p.src.str() << "->" << p.dst.str();
}

TEST(Executor, ALinkThatCorruptsDirectCopiesIsRoutedThroughTheHostForTheRestOfTheRun) {
  auto m = tiny("gpt2");
  Batch b = padded(*m);
  auto reference = m->forward(b).clone();
  place(*m, PlanStrategy::kBalanced, 3, b);
  with_faults(*m, "transfer:cpu:1->cpu:2:bitflip-direct");
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(at::equal(reference, m->forward(b))) << i;
  const TransferStats& s = m->transfer_stats();
  EXPECT_EQ(s.retried, 1);   // the first direct copy: corrupted, repaired through the host
  EXPECT_EQ(s.injected, 1);  // the staged copies are not damaged, and no direct copy follows
  EXPECT_EQ(s.via_host, 2);  // forwards 2 and 3 went through the host from the start
  EXPECT_EQ(s.transfers, 6);
}

TEST(Executor, ThePlanProbesAFaultyLinkAndRoutesItThroughTheHostFromTheStart) {
  auto m = tiny("gpt2");
  Batch b = padded(*m);
  auto reference = m->forward(b).clone();
  SplitOptions o;
  o.devices = {DeviceId::virtual_cpu(0), DeviceId::virtual_cpu(1), DeviceId::virtual_cpu(2)};
  o.strategy = PlanStrategy::kBalanced;
  o.faults = parse_faults("transfer:cpu:1->cpu:2:zeros-direct");
  const DevicePlan plan = split_model(*m, o, b.size(), b.max_len(), {}, Model::Logits::kCompute);
  ASSERT_EQ(plan.routes.size(), 1u);
  EXPECT_EQ(plan.routes[0].from.str(), "cpu:1");
  EXPECT_EQ(plan.routes[0].to.str(), "cpu:2");
  EXPECT_NE(plan.table().find("link cpu:1 -> cpu:2: through host memory"), std::string::npos);
  EXPECT_EQ(plan.to_json()["routes"][0]["via"], "host");
  EXPECT_TRUE(at::equal(reference, m->forward(b)));
  EXPECT_EQ(m->transfer_stats().retried, 0);
  EXPECT_EQ(m->transfer_stats().via_host, 1);
  EXPECT_EQ(m->transfer_stats().injected, 0);
  // A link that corrupts staged copies too is not routed: the run fails loudly on it.
  o.faults = parse_faults("transfer:cpu:1->cpu:2:zeros");
  EXPECT_TRUE(
      split_model(*m, o, b.size(), b.max_len(), {}, Model::Logits::kCompute).routes.empty());
  EXPECT_THROW(m->forward(b), RunError);
}

TEST(Executor, DoctorProbesDirectAndThroughTheHost) {
  auto probes = probe_links({DeviceId::virtual_cpu(0), DeviceId::virtual_cpu(1)}, {4096},
                            parse_faults("transfer:cpu:0->cpu:1:bitflip-direct"));
  ASSERT_EQ(probes.size(), 2u);
  EXPECT_TRUE(probes[0].ok());  // repaired by the retry through the host
  EXPECT_TRUE(probes[0].results[0].retried);
  EXPECT_TRUE(probes[0].host_ok());
  probes = probe_links({DeviceId::virtual_cpu(0), DeviceId::virtual_cpu(1)}, {4096},
                       parse_faults("transfer:cpu:0->cpu:1:bitflip"));
  EXPECT_FALSE(probes[0].ok());
  EXPECT_FALSE(probes[0].host_ok());
  EXPECT_TRUE(probes[1].ok() && probes[1].host_ok());
  const auto f = parse_faults("transfer:cpu:0->cpu:1:zeros-once-direct");
  ASSERT_EQ(f.size(), 1u);
  EXPECT_TRUE(f[0].once && f[0].direct_only);
  EXPECT_TRUE(parse_faults("transfer:cpu:0->cpu:1:bitflip-direct-once")[0].once);
}
