#include "common.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <iostream>
#include <sstream>

#include "actcap/error.h"
#include "actcap/extract.h"
#include "actcap/numbers.h"

namespace actcap::cli {

std::vector<std::vector<int64_t>> parse_token_lists(const std::string& text) {
  std::vector<std::vector<int64_t>> out;
  std::stringstream seqs(text);
  std::string seq;
  size_t si = 0;
  while (std::getline(seqs, seq, ';')) {
    std::vector<int64_t> ids;
    std::stringstream items(seq);
    std::string item;
    while (std::getline(items, item, ',')) {
      size_t b = item.find_first_not_of(" \t"), e = item.find_last_not_of(" \t");
      std::string trimmed = b == std::string::npos ? "" : item.substr(b, e - b + 1);
      const std::optional<int64_t> v = parse_int64(trimmed);
      if (!v)
        throw InputError(
            concat("--tokens: '", trimmed, "' in sequence ", si, " is not an integer token id"));
      ids.push_back(*v);
    }
    if (ids.empty()) throw InputError(concat("--tokens: sequence ", si, " is empty"));
    out.push_back(std::move(ids));
    ++si;
  }
  if (out.empty()) throw InputError("--tokens: no token ids given");
  return out;
}

std::vector<std::vector<int64_t>> tokenize_text(const Model& model, const std::string& text) {
  auto tokenizer = tokenizer_for(model.origin());
  if (!tokenizer)
    throw InputError(concat("--text: ", model.origin(), " has no tokenizer.json; pass --tokens"));
  if (text.empty()) throw InputError("--text is empty");
  return {tokenizer->encode(text)};
}

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace actcap::cli

#include <fstream>
#include <nlohmann/json.hpp>

namespace actcap::cli {

void add_device_options(CLI::App* sub, DeviceOptions& o) {
  sub->add_option("--devices", o.devices,
                  "Devices: cpu:0,cpu:1,cuda:0 or a count N (= cpu:0..cpu:N-1)");
  sub->add_option("--max-memory", o.max_memory, "Per-device budgets: cpu:0=300MiB,cpu:1=1GiB");
  sub->add_option("--device-map", o.device_map,
                  "auto | balanced | sequential | FILE.json (accelerate format)");
  sub->add_flag("--no-verify-transfers", o.no_verify_transfers,
                "Skip checksumming inter-device copies");
  sub->add_option("--weights-dtype", o.weights_dtype,
                  "16-bit and MXFP4 weights: keep (as stored, widened or decoded per layer as it "
                  "runs) | f32 (widened at load, twice the memory; MXFP4 about 7.5 times)");
  sub->add_option("--compute-dtype", o.compute_dtype,
                  "Dtype the forward computes in: f32 (default) | bf16 | f16 (f16 needs an "
                  "accelerator or a LibTorch with float16 CPU kernels); captures then keep it "
                  "unless --dtype casts them");
  sub->add_option("--copy-window", o.copy_window,
                  "Capture copies in flight per device before a hook waits, e.g. 256MiB (the "
                  "default); 0 copies each capture inside its hook, blocking");
}

LoadOptions load_options(const DeviceOptions& o) {
  LoadOptions l;
  l.weights_dtype = parse_weights_dtype(o.weights_dtype);
  l.compute_dtype = parse_compute_dtype(o.compute_dtype);
  return l;
}

void add_capture_options(CLI::App* sub, CaptureFlags& f) {
  sub->add_option("--dtype", f.dtype, "Stored dtype of captures: keep | f32 | f16 | bf16");
  sub->add_option("--positions", f.positions,
                  "Token positions: all | first | last | ranges like 0:8,-4:");
  sub->add_option("--capture-budget", f.capture_budget,
                  "Refuse batches whose captures exceed this (e.g. 2GiB)");
  sub->add_option("--bare-ref", f.bare_ref,
                  "Hooks that keep the borrowed tensor: error | warn | off");
  sub->add_option("--heads", f.heads,
                  "Attention patterns (NAME:scores, NAME:probs): keep these heads, e.g. 0,3,7");
}

CaptureOptions capture_options(const CaptureFlags& f, std::vector<std::string> patterns) {
  CaptureOptions c;
  c.patterns = std::move(patterns);
  c.dtype = parse_capture_dtype(f.dtype);
  c.positions = PositionSpec::parse(f.positions);
  if (!f.capture_budget.empty()) c.budget_bytes = parse_bytes(f.capture_budget);
  if (!f.heads.empty()) c.attention_heads = parse_heads(f.heads);
  return c;
}

SplitOptions split_options(const DeviceOptions& o) {
  SplitOptions s;
  if (!o.devices.empty()) s.devices = parse_device_list(o.devices);
  if (!o.max_memory.empty()) s.budgets = parse_max_memory(o.max_memory);
  if (o.device_map == "auto" || o.device_map == "balanced" || o.device_map == "sequential") {
    s.strategy = parse_strategy(o.device_map);
  } else {
    s.strategy = PlanStrategy::kExplicit;
    s.explicit_map = load_device_map(o.device_map);
  }
  s.verify_transfers = !o.no_verify_transfers;
  if (!o.copy_window.empty()) {
    try {
      s.copy_window_bytes = parse_bytes(o.copy_window);
    } catch (const InputError& e) {
      throw InputError(concat("--copy-window: ", e.what()));
    }
  }
  s.faults = transfer_faults_from_env();
  if (const char* env = std::getenv("ACTCAP_FAULT")) s.async_faults = parse_async_faults(env);
  return s;
}

ExportFaults export_faults_from_env() {
  ExportFaults f;
  auto index = [](const char* name) -> std::optional<int64_t> {
    const char* v = std::getenv(name);
    if (!v) return std::nullopt;
    const std::optional<int64_t> n = parse_int64(v);
    if (!n || *n < 0) throw InputError(concat(name, "='", v, "' is not a shard index (0, 1, ...)"));
    return n;
  };
  f.damage_file = index("ACTCAP_FAULT_SHARD");
  f.damage_assembled = index("ACTCAP_FAULT_ASSEMBLED");
  f.damage_queued = index("ACTCAP_FAULT_QUEUED");
  if (const char* kill = std::getenv("ACTCAP_KILL_AT")) {
    try {
      parse_kill_at(kill, f);
    } catch (const InputError& e) {
      throw InputError(concat("ACTCAP_KILL_AT: ", e.what()));
    }
  }
  return f;
}

std::vector<TransferFault> transfer_faults_from_env() {
  const char* env = std::getenv("ACTCAP_FAULT");
  return env ? parse_faults(env) : std::vector<TransferFault>{};
}

std::string transfer_summary(const TransferStats& s) {
  // Copies routed through host memory are named only when there are any (docs/devices.md).
  return concat(s.transfers, " transfers (", s.verified, " verified, ", s.retried, " retried, ",
                s.via_host > 0 ? concat(s.via_host, " through host memory, ") : std::string(),
                s.injected, " faults injected)");
}

nlohmann::json transfer_json(const TransferStats& s) {
  return {{"transfers", s.transfers},      {"verified", s.verified}, {"retried", s.retried},
          {"faults_injected", s.injected}, {"via_host", s.via_host}, {"bytes", s.bytes}};
}

std::string one_line(std::string s) {
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  for (char& ch : s)
    if (ch == '\n' || ch == '\r') ch = ' ';
  return s;
}

void say(const std::string& kind, const std::string& message) {
  std::cout.flush();  // what was printed before comes before (std::cerr, tied to cout, did so)
  const std::string line = "actcap: " + (kind.empty() ? "" : kind + ": ") + message + "\n";
  const char* p = line.data();
  size_t left = line.size();
  while (left > 0) {  // one write(2) unless the pipe takes a short one (a line over PIPE_BUF)
    const ssize_t n = ::write(STDERR_FILENO, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // stderr closed or full: nothing better to do with the message
    p += n;
    left -= static_cast<size_t>(n);
  }
}

}  // namespace actcap::cli
