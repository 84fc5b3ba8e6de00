// actcap compare: a single-device reference run and the split run, point by point.
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>

#include "actcap/capture.h"
#include "actcap/error.h"
#include "actcap/hash.h"
#include "common.h"

namespace actcap::cli {

namespace {

// The flags of `actcap compare`.
struct CompareCommand {
  std::string model = "demo", tokens, text;
  std::vector<std::string> capture = {"**"};
  DeviceOptions dev;
  bool json = false;
};

// A single-device reference run and the split run, point by point; exit 1 on any mismatch.
int run_compare_command(const CompareCommand& o) {
  if (o.tokens.empty() && o.text.empty())
    throw InputError("give the input with --tokens or --text");
  DeviceOptions dev = o.dev;
  if (dev.devices.empty() && dev.device_map == "auto") dev.devices = "3";
  auto model = Model::load(o.model, load_options(o.dev));
  auto seqs = o.tokens.empty() ? tokenize_text(*model, o.text) : parse_token_lists(o.tokens);
  Batch batch =
      Batch::from_sequences(seqs, model->config().vocab_size, model->config().max_positions());
  auto capture_run = [&](std::map<std::string, at::Tensor>& out) {
    SafeCapturer cap(*model, CaptureOptions{o.capture});
    out["logits"] = cap.run(batch).to(at::kCPU);
    for (const PointInfo& p : cap.plan()) out[p.name] = cap.get(p.name);
    return cap.plan();
  };
  std::map<std::string, at::Tensor> ref, split;
  model->place(ExecutionOptions{});  // everything on one device
  auto plan = capture_run(ref);
  DevicePlan dp = split_model(*model, split_options(dev), batch.size(), batch.max_len(), plan);
  capture_run(split);
  std::vector<std::string> order;
  for (const PointInfo& p : plan) order.push_back(p.name);
  order.push_back("logits");
  int64_t bad = 0;
  nlohmann::json rows = nlohmann::json::array();
  for (const std::string& name : order) {
    const at::Tensor& a = ref.at(name);
    const at::Tensor& b = split.at(name);
    const bool equal = at::equal(a, b);
    const double diff =
        a.is_floating_point() ? (a - b).abs().max().item<double>() : static_cast<double>(!equal);
    bad += !equal;
    rows.push_back({{"point", name},
                    {"equal", equal},
                    {"max_abs_diff", diff},
                    {"reference_xxh3", hex64(tensor_xxh3(a))},
                    {"split_xxh3", hex64(tensor_xxh3(b))}});
  }
  if (o.json) {
    std::cout << nlohmann::json({{"equal", bad == 0},
                                 {"mismatched", bad},
                                 {"device_map", dp.device_map()},
                                 {"points", rows}})
                     .dump(2)
              << "\n";
  } else {
    size_t w = 6;
    for (const auto& n : order) w = std::max(w, n.size());
    std::cout << std::left << std::setw(w + 2) << "point" << std::setw(7) << "equal"
              << std::setw(14) << "max_abs_diff"
              << "xxh3 (reference / split)\n";
    for (const auto& r : rows)
      std::cout << std::left << std::setw(w + 2) << r["point"].get<std::string>() << std::setw(7)
                << (r["equal"].get<bool>() ? "yes" : "NO") << std::setw(14)
                << r["max_abs_diff"].get<double>() << r["reference_xxh3"].get<std::string>()
                << " / " << r["split_xxh3"].get<std::string>() << "\n";
    std::cout << (bad == 0 ? "split run is bit-identical to the single-device run: " : "MISMATCH: ")
              << rows.size() - bad << "/" << rows.size() << " tensors equal\n";
  }
  return bad == 0 ? 0 : 1;
}

}  // namespace

Command add_compare(CLI::App& app) {
  auto* sub = app.add_subcommand("compare",
                                 "Prove a split run equals a single-device run, tensor by tensor");
  auto o = std::make_shared<CompareCommand>();
  sub->add_option("MODEL", o->model, "Checkpoint directory or 'demo'");
  auto* tok = sub->add_option("--tokens", o->tokens, "Token ids: \"1,2,3;4,5\"");
  sub->add_option("--text", o->text, "Text")->excludes(tok);
  sub->add_option("--capture", o->capture, "Hook point patterns (default **)")->expected(1, -1);
  add_device_options(sub, o->dev);
  sub->add_flag("--json", o->json, "Machine-readable output");
  return {sub, [o] { return run_compare_command(*o); }};
}

}  // namespace actcap::cli
