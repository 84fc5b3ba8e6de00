#include "export/merge.h"

#include <filesystem>
#include <functional>
#include <map>

#include "actcap/error.h"
#include "actcap/extract.h"
#include "actcap/hash.h"
#include "actcap/safetensors.h"
#include "export/layout.h"
#include "export/stats.h"
#include "io/atomic_file.h"
#include "io/text_file.h"
#include "util/strings.h"

namespace actcap {

namespace fs = std::filesystem;
using nlohmann::json;

json write_merged_stats(const std::string& dir, const EntrySource& shards,
                        const ShardSchema& schema, FaultPoints* faults) {
  std::map<std::string, FeatureStats> merged;
  shards([&](const json& entry) {
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
  });
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

// DIR/manifest.json, when it was assembled from rank manifests that have changed since (a rank
// ran again after the assembler read them, and the assembler was killed before it looked again),
// is removed, that file only (a newer one renamed over it meanwhile stays). Returns what was
// removed and why, or "" when nothing was.
std::string drop_stale_manifest(const std::string& dir) {
  const std::string path = (fs::path(dir) / kManifestName).string();
  std::optional<HeldFile> pinned = hold_file(path);
  if (!pinned) return "";
  ManifestFile read(path);
  std::string problem;
  const std::optional<json> m = read.outline(problem);
  // The file read must be the one pinned (none was renamed over it in between).
  if (!m || file_id(path) != pinned->id()) return "";
  const std::vector<std::string> stale = stale_rank_manifests(dir, *m);
  if (stale.empty() || !remove_if_same(path, *pinned)) return "";
  return concat("removed ", path, ": it was assembled from another version of ", stale.front(),
                " (a rank ran again)");
}

}  // namespace

std::vector<std::string> stale_rank_manifests(const std::string& dir, const json& manifest) {
  std::vector<std::string> stale;
  if (!manifest.is_object() || !manifest.contains("world_size") ||
      !manifest["world_size"].is_number_integer() || !manifest.contains("ranks") ||
      !manifest["ranks"].is_array())
    return stale;
  const int world = manifest["world_size"].get<int>();
  if (world <= 1) return stale;
  for (const json& rank : manifest["ranks"]) {
    if (!rank.is_object() || !rank.contains("rank") || !rank["rank"].is_number_integer() ||
        !rank.contains("manifest_xxh3") || !rank["manifest_xxh3"].is_string())
      continue;
    const int r = rank["rank"].get<int>();
    if (r < 0 || r >= world) continue;
    const std::string file = OutputLayout{r, world}.manifest();
    const std::string path = (fs::path(dir) / file).string();
    std::error_code ec;
    if (!fs::exists(path, ec)) continue;  // a copy of the dataset without its rank manifests
    const std::optional<uint64_t> got = ManifestFile(path).bytes_xxh3();
    if (!got || hex64(*got) != rank["manifest_xxh3"].get<std::string>()) stale.push_back(file);
  }
  return stale;
}

MergeReport merge_ranks(const std::string& dir, const std::vector<std::string>& sealed_as,
                        int world_size, const ExportFaults& faults) {
  return merge_ranks_observed(dir, sealed_as, world_size, nullptr, faults);
}

MergeReport merge_ranks_observed(const std::string& dir, const std::vector<std::string>& sealed_as,
                                 int world_size, const std::function<void()>& after_write,
                                 const ExportFaults& faults) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw InputError(concat(dir, " is not a folder"));
  MergeReport report;
  // A rank of this run assembling through the folder, not a gather's rank 0 or `actcap merge`.
  const bool by_a_rank = sealed_as.empty() && world_size > 0;
  if (!sealed_as.empty()) {
    report.world_size = static_cast<int>(sealed_as.size());
  } else if (world_size > 0) {
    // A rank of this run: another world size's manifests are an earlier run's that this run's
    // rank 0 removes when it starts (--overwrite); until it has, rank 0 is not complete either.
    report.world_size = world_size;
  } else {
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
  }

  // Each rank's manifest streamed once: its outline, its seal, its entries counted. Only the
  // outlines are kept; the entries are read again, from the files, to write the dataset's.
  json out;
  json ranks = json::array();
  std::vector<EntrySource> sources;
  std::vector<std::pair<int, std::shared_ptr<ManifestFile>>> held_files;  // the complete ranks'
  EntryTally listed;  // every complete rank's entries, in rank order
  int64_t rows = 0, documents = 0, skipped = 0;
  int first_rank = -1;  // the first complete rank's: what the others must agree with
  for (int r = 0; r < report.world_size; ++r) {
    const std::string file = OutputLayout{r, report.world_size}.manifest();
    const std::string path = (fs::path(dir) / file).string();
    if (!fs::exists(path, ec)) {
      report.waiting.push_back(
          concat("rank ", r, " of ", report.world_size, " has not started (no ", file, ")"));
      continue;
    }
    std::string problem;
    // The rank may be running: every pass reads the one version held open.
    auto held = std::make_shared<ManifestFile>(path);
    std::optional<json> outline = held->outline(problem);
    if (!outline) throw RunError(concat(file, " ", problem, "; resume that rank"));
    const json& m = *outline;
    if (!m.is_object() || !m.contains("shards") || !m["shards"].is_array() || !m.contains("rank") ||
        !m["rank"].is_object())
      throw RunError(concat(file, " is not a rank's extract manifest (no rank or shard list)"));
    const bool complete = m.value("complete", false) == true;
    EntryTally mine;
    bool sealed = false;
    try {
      sealed = held->entries(m, [&](const json& e) {
        mine.add(e);
        if (complete) listed.add(e);
      });
    } catch (const json::exception& e) {
      throw RunError(concat(file, " is not valid JSON (", e.what(), "); resume that rank"));
    }
    if (!sealed)
      throw RunError(concat(file,
                            " does not match its manifest_checksum (altered or damaged); "
                            "resume that rank, or overwrite the run"));
    // The bytes merged, which manifest.json records: a rank that runs again changes them.
    const std::optional<uint64_t> bytes = held->bytes_xxh3();
    if (!bytes) throw RunError(concat(file, " cannot be read; resume that rank"));
    if (!sealed_as.empty() && m["manifest_checksum"] != sealed_as[r])
      throw RunError(concat(file, " is not the manifest rank ", r, " sealed (manifest_checksum ",
                            m["manifest_checksum"].dump(), " on disk, ", sealed_as[r],
                            " at the rank): the folder differs between nodes, or another run "
                            "wrote it"));
    const json& rank = m["rank"];
    if (rank.value("rank", -1) != r || rank.value("world_size", -1) != report.world_size)
      throw RunError(concat(file, " says it is rank ", rank.value("rank", -1), " of ",
                            rank.value("world_size", -1), "; its name says rank ", r, " of ",
                            report.world_size));
    if (!complete) {
      report.waiting.push_back(concat("rank ", r, " of ", report.world_size, " is not complete (",
                                      mine.count(),
                                      " shards in its manifest; resume it with --resume --rank ", r,
                                      " --world-size ", report.world_size, ")"));
      continue;
    }
    if (out.is_null()) {
      first_rank = r;
      out = m;
      out.erase("rank");
      out.erase("manifest_checksum");
    } else {
      const char* differs = nullptr;
      for (const char* key : kSharedKeys)
        if (!differs && m.value(key, json()) != out.value(key, json())) differs = key;
      if (differs && by_a_rank) {
        // A rank of a new run over an earlier one's folder can finish before a sibling has
        // replaced its earlier manifest: that sibling assembles when it completes this run.
        report.waiting.push_back(concat("ranks ", first_rank, " and ", r, " of ", report.world_size,
                                        " differ in '", differs,
                                        "': one holds an earlier run's manifest until it runs"));
        continue;
      }
      if (differs) {
        const std::string dropped = drop_stale_manifest(dir);
        throw RunError(concat(file, " differs from the other ranks in '", differs,
                              "': the ranks ran different jobs into one folder; overwrite "
                              "the run",
                              dropped.empty() ? std::string() : concat(" (", dropped, ")")));
      }
    }
    rows += m.value("rows", int64_t{0});
    documents += m.value("documents", int64_t{0});
    skipped += m.value("skipped_lines", int64_t{0});
    ranks.push_back({{"rank", r},
                     {"lines", rank["lines"]},
                     {"shards", mine.count()},
                     {"rows", m.value("rows", int64_t{0})},
                     {"documents", m.value("documents", int64_t{0})},
                     {"device_map", m.value("device_map", json::object())},
                     {"manifest_xxh3", hex64(*bytes)}});
    sources.push_back(manifest_entries(held, m));
    held_files.push_back({r, held});
  }
  // Not assembled now: a manifest.json assembled from another version of a rank's manifest
  // (its assembler killed before it looked again) must not stay.
  const auto not_assembled = [&] {
    const std::string dropped = drop_stale_manifest(dir);
    if (!dropped.empty()) report.waiting.push_back(dropped);
    return report;
  };
  if (!report.waiting.empty()) return not_assembled();

  out["rows"] = rows;
  out["documents"] = documents;
  out["skipped_lines"] = skipped;
  out["world_size"] = report.world_size;
  out["ranks"] = ranks;
  out["complete"] = true;
  std::string problem;
  const std::optional<ShardSchema> schema = shard_schema(out, problem);
  if (!schema) throw RunError(concat("the ranks' manifests in ", dir, " ", problem));
  const EntrySource shards = in_turn(std::move(sources));
  // A complete rank's manifest replaced or removed since it was read means that rank is running
  // again (a run started over the folder of an earlier one of the same world size, each rank
  // overwriting its own files): its shards may be gone, and it assembles when it completes.
  auto running_again = [&] {
    for (const auto& [r, held] : held_files)
      if (held->replaced())
        report.waiting.push_back(concat("rank ", r, " of ", report.world_size,
                                        " is running again (its manifest was replaced while it "
                                        "was read)"));
    return !report.waiting.empty();
  };
  const std::string manifest = (fs::path(dir) / kManifestName).string();
  HeldFile mine;  // held open until looked again: its identity cannot pass to a newer file
  // The merge-write moment is the manifest writer's own half-written one, in this write only.
  ExportFaults kill;
  if (faults.kill_at == ExportFaults::Moment::kMergeWrite) {
    kill.kill_at = ExportFaults::Moment::kManifestWrite;
    kill.kill_occurrence = faults.kill_occurrence;
  }
  FaultPoints points(kill);
  try {
    if (schema->stats) out["stats"] = write_merged_stats(dir, shards, *schema);
    write_manifest_streamed(dir, out, shards, &listed, &points, kManifestName, &mine);
  } catch (const std::exception&) {
    if (running_again()) return not_assembled();
    throw;
  }
  if (after_write) after_write();
  // A rank starting again replaces its manifest and then removes manifest.json. Its manifest
  // replaced by now, its removal may have come before this one was written, and this one lists
  // files being replaced: it goes, and only it (that run's last rank may have assembled a new
  // one over it since). Not replaced by now, the rank removes this one when it starts.
  if (running_again()) {
    remove_if_same(manifest, mine);
    return report;
  }
  report.assembled = true;
  report.shards = listed.count();
  report.rows = rows;
  report.manifest = manifest;
  return report;
}

}  // namespace actcap
