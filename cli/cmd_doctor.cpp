// actcap doctor: probes every ordered device pair with test patterns; exit 1 when a link is broken.
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>

#include "actcap/devices.h"
#include "actcap/error.h"
#include "actcap/executor.h"
#include "common.h"

namespace actcap::cli {

namespace {

// The flags of `actcap doctor`.
struct DoctorCommand {
  std::string devices = "3";
  bool json = false;
};

// Probes copies between every pair of devices; exit 1 when a link is broken.
int run_doctor_command(const DoctorCommand& o) {
  auto devices = parse_device_list(o.devices);
  if (devices.size() < 2) throw InputError("--devices: doctor needs at least two devices");
  auto probes = probe_links(devices, {4096, 1 << 20, 16 << 20}, transfer_faults_from_env());
  bool all_ok = true;
  nlohmann::json arr = nlohmann::json::array();
  bool any_rerouted = false;
  for (const LinkProbe& p : probes) {
    all_ok = all_ok && p.ok();
    nlohmann::json sizes = nlohmann::json::array();
    bool direct_damaged = false;
    for (const LinkResult& r : p.results) {
      sizes.push_back({{"bytes", r.bytes},
                       {"ok", r.ok},
                       {"retried", r.retried},
                       {"detail", r.detail},
                       {"via_host_ok", r.host_ok},
                       {"via_host_detail", r.host_detail}});
      direct_damaged = direct_damaged || r.retried || !r.ok;
    }
    // How a run copies over this link: directly; through host memory (direct copies arrive
    // corrupted, staged ones intact: the first corrupted copy reroutes the link); or not at all.
    const char* route = !direct_damaged ? "direct" : p.host_ok() ? "host" : "none";
    any_rerouted = any_rerouted || std::string(route) == "host";
    arr.push_back({{"src", p.src.str()},
                   {"dst", p.dst.str()},
                   {"ok", p.ok()},
                   {"route", route},
                   {"sizes", sizes}});
    if (!o.json) {
      std::cout << std::left << std::setw(18) << (p.src.str() + " -> " + p.dst.str());
      for (const LinkResult& r : p.results)
        std::cout << std::setw(22)
                  << (format_bytes(r.bytes) + (r.ok ? (r.retried ? " FLAKY" : " ok") : " BROKEN"));
      std::cout << (p.ok() ? (std::string(route) == "host" ? "OK via host" : "OK") : "BROKEN")
                << "\n";
    }
  }
  if (o.json) {
    std::cout << nlohmann::json({{"ok", all_ok}, {"links", arr}}).dump(2) << "\n";
  } else {
    std::cout << (all_ok ? "all links intact\n"
                         : "BROKEN links: copies between them are damaged\n");
    if (any_rerouted)
      std::cout << "links marked 'via host' damage direct copies; copies staged through host "
                   "memory arrive intact, so runs route them through the host\n";
  }
  return all_ok ? 0 : 1;
}

}  // namespace

Command add_doctor(CLI::App& app) {
  auto* sub =
      app.add_subcommand("doctor", "Check that copies between every pair of devices arrive intact");
  auto o = std::make_shared<DoctorCommand>();
  sub->add_option("--devices", o->devices, "Devices to probe (default 3 = cpu:0,cpu:1,cpu:2)");
  sub->add_flag("--json", o->json, "Machine-readable output");
  return {sub, [o] { return run_doctor_command(*o); }};
}

}  // namespace actcap::cli
