// actcap plan: the device map and per-device memory table, without running anything.
#include <iostream>

#include "actcap/capture.h"
#include "common.h"

namespace actcap::cli {

namespace {

// The flags of `actcap plan`.
struct PlanCommand {
  std::string model = "demo";
  DeviceOptions dev;
  int64_t batch = 1, seq = 0;
  std::vector<std::string> capture;
  bool json = false;
};

// Prints the device map and the per-device memory table for a run, without running it.
int run_plan_command(const PlanCommand& o) {
  auto model = Model::load(o.model, load_options(o.dev));
  const int64_t seq = o.seq > 0 ? o.seq : model->config().max_positions();
  std::vector<PointInfo> capture;
  if (!o.capture.empty()) {
    CaptureOptions c{o.capture};
    c.attention_keys = seq;  // attention patterns: [heads, seq] per row
    capture = plan_capture(*model, c);
  }
  // With --capture this is the plan run/extract use, which skip an uncaptured lm_head.
  DevicePlan plan =
      plan_split(*model, split_options(o.dev), o.batch, seq, capture,
                 o.capture.empty() ? Model::Logits::kCompute : Model::Logits::kSkipIfUnhooked);
  if (o.json) {
    auto j = plan.to_json();
    j["batch"] = o.batch;
    j["seq"] = seq;
    std::cout << j.dump(2) << "\n";
    return 0;
  }
  auto mods = model->stage_modules();
  for (size_t i = 0; i < mods.size(); ++i)
    for (const std::string& m : mods[i])
      std::cout << m << " -> " << plan.stage_device[i].str() << "\n";
  std::cout << "\nfor batch " << o.batch << " x seq " << seq << ":\n" << plan.table();
  return 0;
}

}  // namespace

Command add_plan(CLI::App& app) {
  auto* sub = app.add_subcommand("plan", "Show the device map and per-device memory for a run");
  auto o = std::make_shared<PlanCommand>();
  sub->add_option("MODEL", o->model, "Checkpoint directory or 'demo'");
  add_device_options(sub, o->dev);
  sub->add_option("--batch", o->batch, "Batch size the plan is for")->check(CLI::PositiveNumber);
  sub->add_option("--seq", o->seq, "Sequence length the plan is for (default: the model's context)")
      ->check(CLI::PositiveNumber);
  sub->add_option("--capture", o->capture,
                  "Plan a run/extract capturing these hook points: their capture staging is "
                  "reserved, and the logits' workspace only when lm_head is captured");
  sub->add_flag("--json", o->json, "Machine-readable output");
  return {sub, [o] { return run_plan_command(*o); }};
}

}  // namespace actcap::cli
