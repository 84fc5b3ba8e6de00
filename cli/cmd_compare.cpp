// actcap compare: a single-device reference run and the split run, point by point.
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>

#include "actcap/compare.h"
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
  const CompareReport report = compare_split(*model, batch, o.capture, split_options(dev));
  std::vector<std::string> order;
  int64_t bad = 0;
  nlohmann::json rows = nlohmann::json::array();
  for (const CompareRow& r : report.rows) {
    order.push_back(r.point);
    bad += !r.equal;
    rows.push_back({{"point", r.point},
                    {"equal", r.equal},
                    {"max_abs_diff", r.max_abs_diff},
                    {"reference_xxh3", hex64(r.reference_xxh3)},
                    {"split_xxh3", hex64(r.split_xxh3)}});
  }
  if (o.json) {
    std::cout << nlohmann::json({{"equal", bad == 0},
                                 {"mismatched", bad},
                                 {"device_map", report.plan.device_map()},
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
