#include "common.h"

#include <algorithm>
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
  return s;
}

std::string transfer_summary(const TransferStats& s) {
  return concat(s.transfers, " transfers (", s.verified, " verified, ", s.retried, " retried, ",
                s.injected, " faults injected)");
}

nlohmann::json transfer_json(const TransferStats& s) {
  return {{"transfers", s.transfers},
          {"verified", s.verified},
          {"retried", s.retried},
          {"faults_injected", s.injected},
          {"bytes", s.bytes}};
}

}  // namespace actcap::cli
