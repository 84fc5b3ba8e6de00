// Shared pieces of the actcap subcommands.
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "actcap/capture.h"
#include "actcap/export.h"
#include "actcap/model.h"
#include "actcap/planner.h"
#include "actcap/split.h"

namespace actcap::cli {

// Registers each subcommand on the app; run() is called after parsing when it was chosen.
struct Command {
  CLI::App* app = nullptr;
  std::function<int()> run;
};

Command add_init_model(CLI::App& app);
Command add_points(CLI::App& app);
Command add_run(CLI::App& app);
Command add_plan(CLI::App& app);
Command add_doctor(CLI::App& app);
Command add_verify(CLI::App& app);
Command add_repro(CLI::App& app);
Command add_compare(CLI::App& app);
Command add_tokenize(CLI::App& app);
Command add_bench(CLI::App& app);
Command add_extract(CLI::App& app);
Command add_generate(CLI::App& app);
Command add_merge(CLI::App& app);

// --devices, --max-memory, --device-map, --no-verify-transfers, --weights-dtype: every command
// that runs a model.
struct DeviceOptions {
  std::string devices;
  std::string max_memory;
  std::string device_map = "auto";
  bool no_verify_transfers = false;
  std::string weights_dtype = "keep";
  std::string compute_dtype = "f32";
  std::string copy_window;  // empty: the library's default
};
void add_device_options(CLI::App* sub, DeviceOptions& o);
// The library's load options from the flags (--weights-dtype).
LoadOptions load_options(const DeviceOptions& o);
// --dtype, --positions, --capture-budget, --bare-ref: the capture flags of run and extract.
struct CaptureFlags {
  std::string dtype = "keep", positions = "all", capture_budget, bare_ref = "error", heads;
};
void add_capture_options(CLI::App* sub, CaptureFlags& f);
// The library's capture options for `patterns` from the flags.
CaptureOptions capture_options(const CaptureFlags& f, std::vector<std::string> patterns);

// The library's split options from the flags (--devices, --max-memory, --device-map,
// --no-verify-transfers).
SplitOptions split_options(const DeviceOptions& o);
// Test-only transfer faults from ACTCAP_FAULT (docs/devices.md); empty when it is not set.
std::vector<TransferFault> transfer_faults_from_env();
// Test-only export faults from ACTCAP_FAULT_SHARD, ACTCAP_FAULT_ASSEMBLED, ACTCAP_FAULT_QUEUED and
// ACTCAP_KILL_AT (DEVELOPERS.md); InputError naming the variable when one is malformed.
ExportFaults export_faults_from_env();

// Inter-device transfer counters for the summary of run and extract:
// "N transfers (V verified, R retried, F faults injected)", and the same as JSON.
std::string transfer_summary(const TransferStats& s);
nlohmann::json transfer_json(const TransferStats& s);

// "1,2,3;4,5" -> {{1,2,3},{4,5}}; throws InputError naming the bad entry.
std::vector<std::vector<int64_t>> parse_token_lists(const std::string& text);
// Tokenises text for MODEL: the demo model's byte-level tokenizer (one id per UTF-8 byte).
std::vector<std::vector<int64_t>> tokenize_text(const Model& model, const std::string& text);
// Human-readable shape: [768] / [] / [3, 64].
std::string shape_string(const std::vector<int64_t>& shape);

// A message as one line, whatever the library below wrote (newlines become spaces).
std::string one_line(std::string s);
// "actcap: KIND: MESSAGE\n" on stderr in a single write(2), so that the lines of processes sharing
// a stream (the ranks under mpirun) never interleave within a line. An empty kind leaves out
// "KIND: ".
void say(const std::string& kind, const std::string& message);

}  // namespace actcap::cli
