#include "export/layout.h"

#include <cstdio>
#include <filesystem>

#include "actcap/export.h"
#include "io/atomic_file.h"
#include "util/strings.h"

namespace actcap {

namespace fs = std::filesystem;

namespace {

std::string rank_stem(int rank, int world_size) {
  char buf[48];
  std::snprintf(buf, sizeof(buf), "rank-%05d-of-%05d", rank, world_size);
  return buf;
}

// The digits of `s` from `at` (at least one, at most 9): the value, and `at` moved past them.
std::optional<int> digits(const std::string& s, size_t& at) {
  size_t end = at;
  while (end < s.size() && end - at < 9 && s[end] >= '0' && s[end] <= '9') ++end;
  if (end == at) return std::nullopt;
  const int v = std::stoi(s.substr(at, end - at));
  at = end;
  return v;
}

}  // namespace

std::string OutputLayout::manifest() const {
  return ranked() ? rank_stem(rank, world_size) + ".json" : kManifestName;
}

std::string OutputLayout::journal() const {
  return ranked() ? rank_stem(rank, world_size) + ".journal" : kJournalName;
}

std::string OutputLayout::shard(int64_t index) const {
  char buf[64];
  if (ranked())
    std::snprintf(buf, sizeof(buf), "shard-r%05d-%05lld.safetensors", rank,
                  static_cast<long long>(index));
  else
    std::snprintf(buf, sizeof(buf), "shard-%05lld.safetensors", static_cast<long long>(index));
  return buf;
}

std::optional<int64_t> OutputLayout::shard_index(const std::string& file) const {
  const std::string tail = "00000.safetensors";  // shard(0) ends so, after shard- or shard-rRRRRR-
  const std::string zero = shard(0), head = zero.substr(0, zero.size() - tail.size());
  if (!starts_with(file, head) || !ends_with(file, ".safetensors") ||
      file.size() < head.size() + tail.size())
    return std::nullopt;
  const std::string digits = file.substr(head.size(), file.size() - head.size() - 12);
  if (digits.size() < 5 || digits.size() > 18 ||
      digits.find_first_not_of("0123456789") != std::string::npos)
    return std::nullopt;
  const int64_t index = std::stoll(digits);
  if (shard(index) != file) return std::nullopt;  // not as shard() spells it (leading zeros)
  return index;
}

bool OutputLayout::owns(const std::string& file) const {
  if (!ranked()) return is_output_file(file);
  const std::string base = temp_target(file);
  if (base == manifest() || base == journal()) return true;
  const std::optional<int> r = shard_rank(base);
  return r && *r == rank;
}

std::optional<RankFile> parse_rank_file(const std::string& name) {
  const std::string base = temp_target(name);
  RankFile f;
  if (ends_with(base, ".journal"))
    f.journal = true;
  else if (!ends_with(base, ".json"))
    return std::nullopt;
  if (!starts_with(base, "rank-")) return std::nullopt;
  size_t at = 5;
  const std::optional<int> rank = digits(base, at);
  if (!rank || base.compare(at, 4, "-of-") != 0) return std::nullopt;
  at += 4;
  const std::optional<int> world = digits(base, at);
  if (!world || base.substr(at) != (f.journal ? ".journal" : ".json")) return std::nullopt;
  f.rank = *rank;
  f.world_size = *world;
  return f;
}

std::optional<int> shard_rank(const std::string& name) {
  const std::string base = temp_target(name);
  if (!starts_with(base, "shard-r") || !ends_with(base, ".safetensors")) return std::nullopt;
  size_t at = 7;
  const std::optional<int> rank = digits(base, at);
  if (!rank || at >= base.size() || base[at] != '-') return std::nullopt;
  return rank;
}

std::map<int, std::set<int>> rank_manifests(const std::string& dir) {
  std::map<int, std::set<int>> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    const std::string n = e.path().filename().string();
    if (n != temp_target(n)) continue;  // a temp file is no manifest yet
    if (auto f = parse_rank_file(n); f && !f->journal) out[f->world_size].insert(f->rank);
  }
  return out;
}

}  // namespace actcap
