// actcap repro: the seed's minimal reproduction, naive / guarded / clone / safe, per device count.
#include <algorithm>
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "actcap/devices.h"
#include "actcap/error.h"
#include "actcap/numbers.h"
#include "actcap/repro.h"
#include "common.h"

namespace actcap::cli {

namespace {

// The flags of `actcap repro`.
struct ReproCommand {
  std::string devices = "1,2,3,4";
  std::vector<std::string> on;  // device lists, one run each (replaces the counts)
  std::string arch = "gpt2";
  bool json = false;
};

// --devices: counts of devices, "1,2,3,4".
std::vector<int> device_counts(const std::string& text) {
  std::vector<int> counts;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const std::optional<int64_t> v = parse_int64(item);
    if (!v || *v < 1 || *v > 64)
      throw InputError(
          concat("--devices: '", item, "' is not a device count between 1 and 64 (e.g. 1,2,3,4)"));
    counts.push_back(static_cast<int>(*v));
  }
  return counts;
}

// Runs the kept-hook-reference reproduction for each device count (or list) and prints each
// variant.
int run_repro_command(const ReproCommand& o) {
  std::vector<ReproResult> results;
  if (!o.on.empty()) {
    std::vector<std::vector<DeviceId>> maps;
    for (const std::string& list : o.on) maps.push_back(parse_device_list(list));
    results = run_repro_on(maps, o.arch);
  } else {
    results = run_repro(device_counts(o.devices), o.arch);
  }
  if (o.json) {
    nlohmann::json arr = nlohmann::json::array();
    for (const auto& r : results)
      arr.push_back(
          {{"name", r.name},
           {"devices", r.devices},
           {"device_list", r.device_list},
           {"mismatched",
            r.mismatched < 0 ? nlohmann::json(nullptr) : nlohmann::json(r.mismatched)},
           {"total", r.total},
           {"max_abs_err", r.max_abs_err},
           {"error", r.error.empty() ? nlohmann::json(nullptr) : nlohmann::json(r.error)}});
    std::cout << nlohmann::json({{"variants", arr}}).dump(2) << "\n";
    return 0;
  }
  std::cout << "12-block " << (o.arch == "gpt2" ? "GPT-2" : o.arch)
            << "-style model, 2 steps, hooks on every block output, inference mode\n";
  // The first column: the device count, or with --on the devices.
  const auto label = [&](const ReproResult& r) {
    return o.on.empty() ? std::to_string(r.devices) : r.device_list;
  };
  size_t width = 9;
  for (const auto& r : results) width = std::max(width, label(r).size() + 2);
  std::cout << std::left << std::setw(width) << "devices" << std::setw(9) << "variant"
            << std::setw(12) << "mismatched" << std::setw(13) << "max_abs_err"
            << "result\n";
  for (const auto& r : results) {
    std::ostringstream mm, err;
    if (r.mismatched < 0)
      mm << "-";
    else
      mm << r.mismatched << "/" << r.total;
    err << std::setprecision(3) << r.max_abs_err;
    std::string verdict = !r.error.empty()   ? "stopped: " + r.error.substr(0, 70) + "..."
                          : r.mismatched > 0 ? "CORRUPTED"
                                             : "exact";
    std::cout << std::left << std::setw(width) << label(r) << std::setw(9) << r.name
              << std::setw(12) << mm.str() << std::setw(13) << (r.mismatched < 0 ? "-" : err.str())
              << verdict << "\n";
  }
  return 0;
}

}  // namespace

Command add_repro(CLI::App& app) {
  auto* sub = app.add_subcommand(
      "repro", "Reproduce the kept-hook-reference corruption and show each defence");
  auto o = std::make_shared<ReproCommand>();
  auto* counts = sub->add_option("--devices", o->devices,
                                 "Device counts to try, e.g. 1,2,3,4 (1: cpu; N: cpu:0..cpu:N-1)");
  sub->add_option("--on", o->on,
                  "Device lists instead, one run each, e.g. --on cuda:0 cuda:0,cpu:1,cpu:2")
      ->expected(1, -1)
      ->excludes(counts);
  sub->add_option("--arch", o->arch,
                  "Architecture of the model the reproduction builds (as init-model --arch)");
  sub->add_flag("--json", o->json, "Machine-readable output");
  return {sub, [o] { return run_repro_command(*o); }};
}

}  // namespace actcap::cli
