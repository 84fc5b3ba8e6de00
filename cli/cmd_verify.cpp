// actcap verify DIR: re-hash everything an output folder claims; exit 1 listing each bad tensor.
#include <iostream>
#include <nlohmann/json.hpp>

#include "actcap/devices.h"
#include "actcap/error.h"
#include "actcap/export.h"
#include "common.h"

namespace actcap::cli {

namespace {
const char* issue_kind_name(VerifyIssue::Kind k) {
  switch (k) {
    case VerifyIssue::Kind::kIncomplete:
      return "incomplete";
    case VerifyIssue::Kind::kManifest:
      return "manifest";
    case VerifyIssue::Kind::kJournal:
      return "journal";
    case VerifyIssue::Kind::kShard:
      return "shard";
  }
  return "?";
}

// The flags of `actcap verify`.
struct VerifyCommand {
  std::string dir;
  bool json = false;
};

// Re-hashes everything DIR claims and prints each problem; exit 1 on any.
int run_verify_command(const VerifyCommand& o) {
  VerifyReport r = verify_output(o.dir);
  if (o.json) {
    nlohmann::json issues = nlohmann::json::array();
    for (const auto& i : r.issues)
      issues.push_back({{"file", i.file},
                        {"tensor", i.tensor},
                        {"problem", i.problem},
                        {"kind", issue_kind_name(i.kind)}});
    std::cout << nlohmann::json({{"ok", r.ok()},
                                 {"shards", r.shards},
                                 {"tensors", r.tensors},
                                 {"bytes", r.bytes},
                                 {"issues", issues}})
                     .dump(2, ' ', false, nlohmann::json::error_handler_t::replace)
              << "\n";
  } else {
    for (const auto& i : r.issues)
      std::cout << "BAD  " << i.file << (i.tensor.empty() ? "" : " :: " + i.tensor) << ": "
                << i.problem << "\n";
    std::cout << (r.ok() ? "OK   " : "FAILED ") << r.tensors << " tensors in " << r.shards
              << " shards (" << format_bytes(r.bytes) << ")"
              << (r.ok() ? " intact" : concat(", ", r.issues.size(), " problems")) << "\n";
  }
  return r.ok() ? 0 : 1;
}

}  // namespace

Command add_verify(CLI::App& app) {
  auto* sub = app.add_subcommand("verify",
                                 "Re-hash every tensor of an output folder against its checksums");
  auto o = std::make_shared<VerifyCommand>();
  sub->add_option("DIR", o->dir, "Output folder of run/extract")->required();
  sub->add_flag("--json", o->json, "Machine-readable output");
  return {sub, [o] { return run_verify_command(*o); }};
}

}  // namespace actcap::cli
