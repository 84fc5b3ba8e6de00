// split_model / plan_split (actcap/split.h): the library call that plans a split for a run's
// batch, length and capture, which the CLI used to do itself.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "actcap/capture.h"
#include "actcap/error.h"
#include "actcap/split.h"

using namespace actcap;

namespace {

const DeviceUsage& on(const DevicePlan& p, const DeviceId& d) {
  for (const DeviceUsage& u : p.usage)
    if (u.device == d) return u;
  throw std::runtime_error("device not in plan: " + d.str());
}

}  // namespace

// Captured points reserve their bytes on the device of the stage that holds them; the logits'
// workspace is reserved only when the forward runs lm_head.
TEST(Split, CaptureReserveAndLogitsFollowTheRun) {
  auto m = Model::load("demo");
  SplitOptions o;
  for (int i = 0; i < 3; ++i) o.devices.push_back(DeviceId::virtual_cpu(i));
  o.strategy = PlanStrategy::kBalanced;
  const int64_t B = 2, T = 16;
  const auto first = plan_capture(*m, CaptureOptions{{"transformer.h.0"}});
  const DevicePlan p = plan_split(*m, o, B, T, first, Model::Logits::kSkipIfUnhooked);
  const DeviceId holder = p.stage_device[1];  // stage 1 is transformer.h.0
  EXPECT_EQ(on(p, holder).reserve, static_cast<uint64_t>(B * T * 64 * 4));
  for (const DeviceUsage& u : p.usage) {
    if (u.device == holder) continue;
    EXPECT_EQ(u.reserve, 0u) << u.device.str();
  }

  // lm_head alone on cpu:1: its logits' workspace is reserved only when lm_head runs (captured,
  // or a forward that computes logits).
  SplitOptions head_apart;
  head_apart.devices = {DeviceId::virtual_cpu(0), DeviceId::virtual_cpu(1)};
  head_apart.strategy = PlanStrategy::kExplicit;
  for (const auto& stage : m->stage_modules())
    for (const std::string& module : stage)
      head_apart.explicit_map[module] = module == "lm_head" ? "cpu:1" : "cpu:0";
  const DeviceId head_device = DeviceId::virtual_cpu(1);
  const auto head = plan_capture(*m, CaptureOptions{{"transformer.h.0", "lm_head"}});
  const uint64_t skipped =
      on(plan_split(*m, head_apart, B, T, first, Model::Logits::kSkipIfUnhooked), head_device)
          .workspace;
  const uint64_t captured =
      on(plan_split(*m, head_apart, B, T, head, Model::Logits::kSkipIfUnhooked), head_device)
          .workspace;
  const uint64_t computed =
      on(plan_split(*m, head_apart, B, T, first, Model::Logits::kCompute), head_device).workspace;
  EXPECT_EQ(captured - skipped, static_cast<uint64_t>(B * T * 257 * 4));  // the logits, f32
  EXPECT_EQ(computed, captured);

  // split_model places the model as planned.
  const DevicePlan placed = split_model(*m, o, B, T, first, Model::Logits::kSkipIfUnhooked);
  for (size_t i = 0; i < placed.stage_device.size(); ++i)
    EXPECT_EQ(m->stage_device(i), placed.stage_device[i]);
}

// Contradicting options are InputErrors naming the settings, not flags.
TEST(Split, ContradictionsNameTheSettings) {
  auto m = Model::load("demo");
  SplitOptions o;
  o.devices = {DeviceId::virtual_cpu(0), DeviceId::virtual_cpu(1)};
  o.budgets[DeviceId::virtual_cpu(5)] = 1 << 20;
  try {
    plan_split(*m, o, 1, 8);
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_NE(std::string(e.what()).find("cpu:5"), std::string::npos) << e.what();
    EXPECT_EQ(e.settings(), (std::vector<std::string>{"max_memory", "devices"}));
    EXPECT_EQ(std::string(e.what()).find("--"), std::string::npos) << e.what();
  }
  try {
    device_map_from_json(nlohmann::json::array());  // what SplitOptions::explicit_map is read from
    FAIL() << "expected InputError";
  } catch (const InputError& e) {
    EXPECT_EQ(e.settings(), std::vector<std::string>{"device_map"});
  }
}
