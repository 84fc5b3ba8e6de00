#include "export/merge.h"

#include <filesystem>
#include <map>

#include "actcap/error.h"
#include "actcap/extract.h"
#include "actcap/hash.h"
#include "actcap/safetensors.h"
#include "export/layout.h"
#include "export/stats.h"
#include "io/text_file.h"
#include "util/strings.h"

namespace actcap {

namespace fs = std::filesystem;
using nlohmann::json;

json write_merged_stats(const std::string& dir, const json& shards, const ShardSchema& schema,
                        FaultPoints* faults) {
  std::map<std::string, FeatureStats> merged;
  for (const json& entry : shards) {
    const std::string file = entry["file"].get<std::string>();
    auto st = SafetensorsFile::open((fs::path(dir) / file).string());
    auto read = [&](const std::string& name) {
      at::Tensor t = st->tensor(name);
      const std::string got = hex64(tensor_xxh3(t));
      if (!entry["checksums"].contains(name) || entry["checksums"][name] != got)
        throw RunError(concat(dir, "/", file, ": statistics tensor ", name,
                              " does not match its checksum; run actcap verify"));
      return t;
    };
    for (const auto& [point, shape] : schema.stat_points) {
      FeatureStats s = stats_from(point, schema.stats_top_k, read);
      auto it = merged.find(point);
      if (it == merged.end())
        merged.emplace(point, std::move(s));
      else
        it->second = merge_stats(it->second, s);
    }
  }
  ShardContents c;
  for (const auto& [point, shape] : schema.stat_points) {
    auto it = merged.find(point);
    if (it != merged.end()) stats_tensors(point, it->second, c.tensors);
  }
  c.checksums = tensor_checksums(c.tensors);
  json entry = write_checked_file(dir, kStatsFileName, c, stats_file_schema(schema), faults);
  entry["top_k"] = schema.stats_top_k;
  entry["stored"] = schema.stats_stored;
  return entry;
}

namespace {

// What every rank of one run shares, and must agree on.
constexpr const char* kSharedKeys[] = {"format", "model", "points", "settings", "input", "stats"};

json parse_rank_manifest(const std::string& text, const std::string& file) {
  json m;
  try {
    m = json::parse(text);
  } catch (const json::exception& e) {
    throw RunError(concat(file, " is not valid JSON (", e.what(), "); resume that rank"));
  }
  if (!manifest_sealed(m))
    throw RunError(concat(file,
                          " does not match its manifest_checksum (altered or damaged); "
                          "resume that rank, or overwrite the run"));
  if (!m.contains("shards") || !m["shards"].is_array() || !m.contains("rank") ||
      !m["rank"].is_object())
    throw RunError(concat(file, " is not a rank's extract manifest (no rank or shard list)"));
  return m;
}

}  // namespace

MergeReport merge_ranks(const std::string& dir, const std::vector<std::string>& texts) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw InputError(concat(dir, " is not a folder"));
  MergeReport report;
  std::vector<std::string> manifest_texts = texts;
  if (manifest_texts.empty()) {
    const auto found = rank_manifests(dir);
    if (found.empty())
      throw InputError(concat(dir,
                              " holds no rank manifests (rank-RRRRR-of-NNNNN.json): "
                              "nothing to merge; a single process writes manifest.json "
                              "itself"));
    if (found.size() > 1) {
      std::vector<std::string> sizes;
      for (const auto& [w, r] : found) sizes.push_back(std::to_string(w));
      throw InputError(concat(dir, " holds rank manifests of runs of ", join(sizes, " and "),
                              " ranks; keep one run's files (or overwrite the run)"));
    }
    report.world_size = found.begin()->first;
    for (int r = 0; r < report.world_size; ++r) {
      const std::string file = OutputLayout{r, report.world_size}.manifest();
      const fs::path path = fs::path(dir) / file;
      if (!fs::exists(path, ec)) {
        report.waiting.push_back(
            concat("rank ", r, " of ", report.world_size, " has not started (no ", file, ")"));
        manifest_texts.emplace_back();
        continue;
      }
      manifest_texts.push_back(read_text_file(path.string(), kMaxManifestBytes, "manifest"));
    }
  } else {
    report.world_size = static_cast<int>(manifest_texts.size());
  }

  json out;
  json ranks = json::array();
  int64_t rows = 0, documents = 0, skipped = 0;
  for (int r = 0; r < report.world_size; ++r) {
    if (manifest_texts[r].empty()) continue;  // reported as waiting
    const std::string file = OutputLayout{r, report.world_size}.manifest();
    const json m = parse_rank_manifest(manifest_texts[r], file);
    const json& rank = m["rank"];
    if (rank.value("rank", -1) != r || rank.value("world_size", -1) != report.world_size)
      throw RunError(concat(file, " says it is rank ", rank.value("rank", -1), " of ",
                            rank.value("world_size", -1), "; its name says rank ", r, " of ",
                            report.world_size));
    if (m.value("complete", false) != true) {
      const json& shards = m["shards"];
      report.waiting.push_back(concat("rank ", r, " of ", report.world_size, " is not complete (",
                                      shards.size(),
                                      " shards in its manifest; resume it with --resume --rank ", r,
                                      " --world-size ", report.world_size, ")"));
      continue;
    }
    if (out.is_null()) {
      out = m;
      out.erase("rank");
      out.erase("manifest_checksum");
      out["shards"] = json::array();
    } else {
      for (const char* key : kSharedKeys)
        if (m.value(key, json()) != out.value(key, json()))
          throw RunError(concat(file, " differs from the other ranks in '", key,
                                "': the ranks ran different jobs into one folder; overwrite "
                                "the run"));
    }
    for (const json& s : m["shards"]) out["shards"].push_back(s);
    rows += m.value("rows", int64_t{0});
    documents += m.value("documents", int64_t{0});
    skipped += m.value("skipped_lines", int64_t{0});
    ranks.push_back({{"rank", r},
                     {"lines", rank["lines"]},
                     {"shards", m["shards"].size()},
                     {"rows", m.value("rows", int64_t{0})},
                     {"documents", m.value("documents", int64_t{0})},
                     {"device_map", m.value("device_map", json::object())}});
  }
  if (!report.waiting.empty()) return report;

  out["rows"] = rows;
  out["documents"] = documents;
  out["skipped_lines"] = skipped;
  out["world_size"] = report.world_size;
  out["ranks"] = ranks;
  out["complete"] = true;
  std::string problem;
  const std::optional<ShardSchema> schema = shard_schema(out, problem);
  if (!schema) throw RunError(concat("the ranks' manifests in ", dir, " ", problem));
  if (schema->stats) out["stats"] = write_merged_stats(dir, out["shards"], *schema);
  write_manifest(dir, out);
  report.assembled = true;
  report.shards = static_cast<int64_t>(out["shards"].size());
  report.rows = rows;
  report.manifest = (fs::path(dir) / kManifestName).string();
  return report;
}

}  // namespace actcap
