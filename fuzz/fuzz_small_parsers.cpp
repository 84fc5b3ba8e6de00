// The small string parsers behind CLI options. The input is split into lines (at most 16) and
// each line is fed to every parser:
//   parse_device (both integer modes), parse_device_list, parse_bytes, parse_max_memory,
//   match_point against real hook-point names + nearest_points, PositionSpec::parse + select,
//   parse_faults (ACTCAP_FAULT), cli::parse_token_lists (--tokens), and the keyword parsers.
// (nearest_points only for a short first line: it dominates the cost.)
// Invariants: results re-parse from their canonical text to the same value (device, list,
// bytes, budgets, token lists); a pattern without '*' matches exactly the equal name; '**'
// matches every output point; nearest_points returns at most n of the given names; select()
// returns strictly increasing positions inside the sequence.
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "actcap/capture.h"
#include "actcap/devices.h"
#include "actcap/executor.h"
#include "actcap/hooks.h"
#include "actcap/planner.h"
#include "common.h"
#include "fuzz_common.h"

namespace {

using actcap::DeviceId;

const std::vector<std::string>& point_names() {
  static const std::vector<std::string> kNames = [] {
    std::vector<std::string> v = {"transformer.wte",  "transformer.wpe", "transformer.drop",
                                  "transformer.ln_f", "lm_head",         "model.embed_tokens",
                                  "model.norm",       "model.rotary_emb"};
    for (int i = 0; i < 2; ++i) {
      const std::string h = "transformer.h." + std::to_string(i);
      for (const char* s : {"", ".ln_1", ".attn", ".attn.c_attn", ".attn.c_proj", ".ln_2", ".mlp",
                            ".mlp.c_fc", ".mlp.act", ".mlp.c_proj"})
        v.push_back(h + s);
      const std::string l = "model.layers." + std::to_string(i);
      for (const char* s :
           {"", ".input_layernorm", ".self_attn", ".self_attn.q_proj", ".self_attn.k_proj",
            ".self_attn.v_proj", ".self_attn.o_proj", ".post_attention_layernorm", ".mlp",
            ".mlp.gate_proj", ".mlp.up_proj", ".mlp.down_proj", ".mlp.act_fn"})
        v.push_back(l + s);
    }
    const size_t n = v.size();
    for (size_t i = 0; i < n; ++i) v.push_back(v[i] + ":input");
    return v;
  }();
  return kNames;
}

void devices(const std::string& line) {
  for (bool integer_is_cuda : {false, true}) {
    DeviceId d;
    if (!fuzz::clean([&] { d = actcap::parse_device(line, integer_is_cuda); })) continue;
    FUZZ_CHECK(d.index >= 0 && d.index < 64, "device index %d", d.index);
    DeviceId again;
    FUZZ_CHECK(fuzz::clean([&] { again = actcap::parse_device(d.str(), false); }) && again == d,
               "parse_device('%s') = %s does not re-parse", fuzz::escape(line).c_str(),
               d.str().c_str());
    (void)d.c10();
  }
  std::vector<DeviceId> list;
  if (fuzz::clean([&] { list = actcap::parse_device_list(line); })) {
    FUZZ_CHECK(!list.empty() && list.size() <= 64, "%zu devices", list.size());
    std::string joined;
    for (const auto& d : list) joined += (joined.empty() ? "" : ",") + d.str();
    std::vector<DeviceId> again;
    FUZZ_CHECK(fuzz::clean([&] { again = actcap::parse_device_list(joined); }) && again == list,
               "parse_device_list('%s') -> '%s' does not re-parse", fuzz::escape(line).c_str(),
               joined.c_str());
  }
}

void bytes(const std::string& line) {
  uint64_t v = 0;
  if (fuzz::clean([&] { v = actcap::parse_bytes(line); })) {
    uint64_t again = 0;
    FUZZ_CHECK(fuzz::clean([&] { again = actcap::parse_bytes(std::to_string(v)); }) && again == v,
               "parse_bytes('%s') = %llu does not re-parse", fuzz::escape(line).c_str(),
               static_cast<unsigned long long>(v));
    (void)actcap::format_bytes(v);
  }
  std::map<DeviceId, uint64_t> budgets;
  if (fuzz::clean([&] { budgets = actcap::parse_max_memory(line); })) {
    std::string joined;
    for (const auto& [d, b] : budgets)
      joined += (joined.empty() ? "" : ",") + d.str() + "=" + std::to_string(b);
    std::map<DeviceId, uint64_t> again;
    FUZZ_CHECK(fuzz::clean([&] { again = actcap::parse_max_memory(joined); }) && again == budgets,
               "parse_max_memory('%s') -> '%s' does not re-parse", fuzz::escape(line).c_str(),
               joined.c_str());
  }
}

void patterns(const std::string& line, bool nearest) {
  const auto& names = point_names();
  const bool literal = line.find('*') == std::string::npos;
  for (const std::string& name : names) {
    const bool m = actcap::match_point(line, name);
    if (literal)
      FUZZ_CHECK(m == (line == name), "match_point('%s', '%s') = %d", fuzz::escape(line).c_str(),
                 name.c_str(), m);
    if (line == "**" || line == "**:input")
      FUZZ_CHECK(m == ((name.find(':') == std::string::npos) == (line == "**")),
                 "match_point('%s', '%s') = %d", line.c_str(), name.c_str(), m);
  }
  // Patterns are also matched against names that contain the line (names are not fuzzed
  // otherwise): the pattern must match itself when it has no '*'.
  if (literal)
    FUZZ_CHECK(actcap::match_point(line, line), "'%s' does not match itself",
               fuzz::escape(line).c_str());
  if (!nearest) return;
  // A subset of the names: the edit distance is quadratic and instrumented comparisons are slow.
  static const std::vector<std::string> some(names.begin(), names.begin() + 24);
  const auto near = actcap::nearest_points(line, some, 5);
  FUZZ_CHECK(near.size() == 5, "nearest_points gave %zu", near.size());
  for (const auto& n : near)
    FUZZ_CHECK(std::find(some.begin(), some.end(), n) != some.end(), "unknown name %s", n.c_str());
}

void positions(const std::string& line) {
  actcap::PositionSpec spec;
  if (!fuzz::clean([&] { spec = actcap::PositionSpec::parse(line); })) return;
  for (int64_t n : {0, 1, 2, 7, 64}) {
    const std::vector<int64_t> sel = spec.select(n);
    for (size_t i = 0; i < sel.size(); ++i) {
      FUZZ_CHECK(sel[i] >= 0 && sel[i] < n, "select(%lld) gave %lld for '%s'",
                 static_cast<long long>(n), static_cast<long long>(sel[i]),
                 fuzz::escape(line).c_str());
      FUZZ_CHECK(i == 0 || sel[i - 1] < sel[i], "select(%lld) not increasing for '%s'",
                 static_cast<long long>(n), fuzz::escape(line).c_str());
    }
    if (spec.ranges.empty())
      FUZZ_CHECK(static_cast<int64_t>(sel.size()) == n, "'all' did not select everything");
  }
}

void token_lists(const std::string& line) {
  std::vector<std::vector<int64_t>> lists;
  if (!fuzz::clean([&] { lists = actcap::cli::parse_token_lists(line); })) return;
  std::string joined;
  for (size_t i = 0; i < lists.size(); ++i) {
    FUZZ_CHECK(!lists[i].empty(), "empty token list accepted");
    if (i) joined += ";";
    for (size_t k = 0; k < lists[i].size(); ++k)
      joined += (k ? "," : "") + std::to_string(lists[i][k]);
  }
  std::vector<std::vector<int64_t>> again;
  FUZZ_CHECK(fuzz::clean([&] { again = actcap::cli::parse_token_lists(joined); }) && again == lists,
             "parse_token_lists('%s') -> '%s' does not re-parse", fuzz::escape(line).c_str(),
             joined.c_str());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> lines = fuzz::split(text, '\n');
  if (lines.size() > 16) lines.resize(16);
  for (size_t i = 0; i < lines.size(); ++i) {
    const std::string& line = lines[i];
    devices(line);
    bytes(line);
    // nearest_points (edit distance to all 244 names) would dominate the cost: first line only,
    // when short (patterns are short; the edit distance is not what is being fuzzed).
    patterns(line, i == 0 && line.size() <= 64);
    positions(line);
    token_lists(line);
    fuzz::clean([&] { (void)actcap::parse_faults(line); });
    fuzz::clean([&] { (void)actcap::parse_bare_ref_policy(line); });
    fuzz::clean([&] { (void)actcap::parse_capture_dtype(line); });
    fuzz::clean([&] { (void)actcap::parse_strategy(line); });
  }
  return 0;
}
