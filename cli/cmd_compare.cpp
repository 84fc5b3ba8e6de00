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
  double tolerance = 0.0;
  bool json = false;
};

// A single-device reference run and the split run, point by point; exit 1 on any mismatch.
int run_compare_command(const CompareCommand& o) {
  if (o.tokens.empty() && o.text.empty())
    throw InputError("give the input with --tokens or --text");
  check_tolerance(o.tolerance);  // before the model loads
  DeviceOptions dev = o.dev;
  if (dev.devices.empty() && dev.device_map == "auto") dev.devices = "3";
  auto model = Model::load(o.model, load_options(o.dev));
  auto seqs = o.tokens.empty() ? tokenize_text(*model, o.text) : parse_token_lists(o.tokens);
  Batch batch =
      Batch::from_sequences(seqs, model->config().vocab_size, model->config().max_positions());
  const CompareReport report =
      compare_split(*model, batch, o.capture, split_options(dev), o.tolerance);
  std::vector<std::string> order;
  const int64_t bad = report.mismatched();
  nlohmann::json rows = nlohmann::json::array();
  for (const CompareRow& r : report.rows) {
    order.push_back(r.point);
    rows.push_back({{"point", r.point},
                    {"equal", r.equal},
                    {"within_tolerance", r.within_tolerance},
                    {"max_abs_diff", r.max_abs_diff},
                    {"max_abs_reference", r.max_abs_reference},
                    {"rel_rms", r.rel_rms},
                    {"reference_xxh3", hex64(r.reference_xxh3)},
                    {"split_xxh3", hex64(r.split_xxh3)}});
  }
  const int64_t total = static_cast<int64_t>(rows.size()), exact = report.bit_identical();
  if (o.json) {
    std::cout << nlohmann::json({{"equal", exact == total},
                                 {"within_tolerance", bad == 0},
                                 {"tolerance", o.tolerance},
                                 {"mismatched", bad},
                                 {"device_map", report.plan.device_map()},
                                 {"points", rows}})
                     .dump(2)
              << "\n";
  } else {
    size_t w = 6;
    for (const auto& n : order) w = std::max(w, n.size());
    std::cout << std::left << std::setw(w + 2) << "point" << std::setw(7) << "equal"
              << std::setw(14) << "max_abs_diff" << std::setw(12) << "rel_rms"
              << "xxh3 (reference / split)\n";
    for (const CompareRow& r : report.rows)
      std::cout << std::left << std::setw(w + 2) << r.point << std::setw(7)
                << (r.equal              ? "yes"
                    : r.within_tolerance ? "~"
                                         : "NO")
                << std::setw(14) << r.max_abs_diff << std::setw(12) << r.rel_rms
                << hex64(r.reference_xxh3) << " / " << hex64(r.split_xxh3) << "\n";
    if (exact == total)
      std::cout << "split run is bit-identical to the single-device run: " << total << "/" << total
                << " tensors equal\n";
    else if (bad == 0)
      std::cout << "split run matches the single-device run within " << o.tolerance
                << " of each tensor's largest magnitude: " << exact << "/" << total
                << " tensors bit-identical, the rest within (~)\n";
    else
      std::cout << "MISMATCH: " << total - bad << "/" << total << " tensors "
                << (o.tolerance > 0 ? "within tolerance" : "equal") << "\n";
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
  sub->add_option("--tolerance", o->tolerance,
                  "0 (default): every tensor bit-identical. Above 0: each within this fraction of "
                  "its largest magnitude, for a split with a GPU against the CPU reference (1e-4 "
                  "for f32)");
  add_device_options(sub, o->dev);
  sub->add_flag("--json", o->json, "Machine-readable output");
  return {sub, [o] { return run_compare_command(*o); }};
}

}  // namespace actcap::cli
