// `actcap verify` (and --resume's check): everything an output folder claims, against what a
// reader would decode from it.
#include <filesystem>
#include <nlohmann/json.hpp>

#include "actcap/error.h"
#include "actcap/export.h"
#include "actcap/hash.h"
#include "actcap/safetensors.h"
#include "export/journal.h"
#include "export/layout.h"
#include "export/shard.h"
#include "io/text_file.h"

namespace actcap {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// XXH3 of the manifest without its manifest_checksum field, dumped canonically: what sealing
// writes and verifying recomputes.
std::string manifest_checksum(json manifest) {
  manifest.erase("manifest_checksum");
  const std::string canonical = manifest.dump();
  return hex64(xxh3(canonical.data(), canonical.size()));
}

bool plain_file_name(const std::string& name) {
  return !name.empty() && name.find('/') == std::string::npos &&
         name.find('\\') == std::string::npos && name != "." && name != "..";
}

// Adds an issue, its kind from the file it names.
void add_issue(VerifyReport& r, const std::string& file, const std::string& tensor,
               const std::string& problem) {
  const bool journal = file == kJournalName || (parse_rank_file(file) && parse_rank_file(file)->journal);
  const bool manifest = file == kManifestName || (parse_rank_file(file) && !journal);
  const VerifyIssue::Kind kind = manifest  ? VerifyIssue::Kind::kManifest
                                 : journal ? VerifyIssue::Kind::kJournal
                                           : VerifyIssue::Kind::kShard;
  r.issues.push_back({file, tensor, problem, kind});
}

// The manifest itself: present, JSON, sealed and unaltered, complete, with a shard list and a
// schema. Reports what is wrong; the schema when the shards can be checked against it.
std::optional<ShardSchema> check_manifest(const std::string& dir, const std::string& name,
                                          json& manifest, bool& complete, VerifyReport& r) {
  std::error_code ec;
  const std::string manifest_path = (fs::path(dir) / name).string();
  if (!fs::exists(manifest_path, ec)) {
    const auto ranks = rank_manifests(dir);
    if (name == kManifestName && !ranks.empty()) {
      const auto& [world, have] = *ranks.rbegin();
      add_issue(r, name, "",
                concat("missing: the ", have.size(), " of ", world,
                       " rank manifests here are not assembled (docs/scale.md); run actcap "
                       "merge on the folder once every rank has finished, or resume the "
                       "unfinished ranks"));
    } else {
      add_issue(r, name, "", "missing: nothing in this folder is claimed complete");
    }
    return std::nullopt;
  }
  try {
    manifest = json::parse(read_text_file(manifest_path, kMaxManifestBytes, "manifest"));
  } catch (const json::exception& e) {
    add_issue(r, name, "", concat("not valid JSON (", e.what(), ")"));
    return std::nullopt;
  }
  if (!manifest.is_object() || !manifest.contains("manifest_checksum") ||
      !manifest["manifest_checksum"].is_string()) {
    add_issue(r, name, "", "has no manifest_checksum");
    return std::nullopt;
  }
  if (manifest_checksum(manifest) != manifest["manifest_checksum"].get<std::string>())
    add_issue(r, name, "",
              "contents do not match manifest_checksum (the manifest was altered)");
  complete = manifest.contains("complete") && manifest["complete"] == true;
  if (!complete)
    r.issues.push_back(
        {name, "", "run is not marked complete", VerifyIssue::Kind::kIncomplete});
  if (!manifest.contains("shards") || !manifest["shards"].is_array()) {
    add_issue(r, name, "", "has no shard list");
    return std::nullopt;
  }
  std::string problem;
  std::optional<ShardSchema> schema = shard_schema(manifest, problem);
  if (!schema) add_issue(r, name, "", problem);
  return schema;
}

// Every claimed shard: a well-formed entry naming a plain file, which opens and holds what its
// entry and the schema say.
void check_shards(const std::string& dir, const json& shards, const ShardSchema& schema,
                  VerifyReport& r) {
  for (const json& shard : shards) {
    if (!shard.is_object() || !shard.contains("file") || !shard["file"].is_string()) {
      add_issue(r, kManifestName, "", "malformed shard entry");
      continue;
    }
    const std::string file = shard["file"].get<std::string>();
    if (!plain_file_name(file)) {
      add_issue(r, kManifestName, "",
                concat("shard name '", file, "' is not a plain file name inside the folder"));
      continue;
    }
    ++r.shards;
    std::shared_ptr<SafetensorsFile> st;
    try {
      st = SafetensorsFile::open((fs::path(dir) / file).string());
    } catch (const Error& e) {
      add_issue(r, file, "", e.what());
      continue;
    }
    r.bytes += st->file_size();
    r.tensors += static_cast<int64_t>(st->tensors().size());
    for (VerifyIssue& i : check_shard(*st, file, shard, schema)) r.issues.push_back(std::move(i));
  }
}

// Across shards (extract): document lines strictly increase from shard to shard (each shard holds
// whole documents, in order, whichever rank wrote it), and a complete run's rows add up.
void check_order(const json& manifest, const json& shards, bool complete, VerifyReport& r,
                 const std::string& name) {
  int64_t last = -1, rows = 0;
  std::string last_file;
  bool rows_known = true;
  for (const json& s : shards) {
    if (!s.is_object()) continue;
    if (s.contains("rows") && s["rows"].is_number_integer())
      rows += s["rows"].get<int64_t>();
    else
      rows_known = false;
    if (!s.contains("first_line") || !s["first_line"].is_number_integer() ||
        !s.contains("last_line") || !s["last_line"].is_number_integer())
      continue;
    const int64_t first = s["first_line"].get<int64_t>(), end = s["last_line"].get<int64_t>();
    const std::string file = s.value("file", "?");
    if (first > end || first <= last)
      add_issue(r, name, "",
                concat("shard ", file, " holds lines ", first, "..", end,
                       last_file.empty() ? std::string()
                                         : concat(", not after ", last_file, "'s last line ", last),
                       ": the shards are out of order or overlap"));
    last = std::max(last, end);
    last_file = file;
  }
  if (complete && rows_known && manifest.contains("rows") && manifest["rows"].is_number_integer() &&
      manifest["rows"].get<int64_t>() != rows)
    add_issue(r, name, "",
              concat("claims ", manifest["rows"].get<int64_t>(), " rows but its shards hold ",
                     rows));
}

}  // namespace

bool manifest_sealed(const json& manifest) {
  return manifest.is_object() && manifest.contains("manifest_checksum") &&
         manifest["manifest_checksum"].is_string() &&
         manifest["manifest_checksum"].get<std::string>() == manifest_checksum(manifest);
}

std::string seal_manifest(json manifest) {
  manifest["manifest_checksum"] = manifest_checksum(manifest);
  return manifest.dump(2) + "\n";
}

VerifyReport verify_output(const std::string& dir) {
  json claimed;
  return verify_output(dir, claimed);
}

VerifyReport verify_output(const std::string& dir, json& claimed, const OutputLayout& layout) {
  claimed = json::array();
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw InputError(concat(dir, " is not a folder"));
  VerifyReport r;
  json manifest;
  bool complete = false;
  const std::optional<ShardSchema> schema =
      check_manifest(dir, layout.manifest(), manifest, complete, r);
  if (!schema) return r;
  if (!complete)  // an unfinished extract claims shards in its journal
    for (const std::string& p : merge_journal(dir, manifest["shards"], layout.journal()))
      add_issue(r, layout.journal(), "", p);
  claimed = std::move(manifest["shards"]);  // one copy of a long shard list, not two
  for (const json& shard : claimed)
    r.claimed.push_back(shard.is_object() && shard.contains("file") && shard["file"].is_string()
                            ? shard["file"].get<std::string>()
                            : std::string());
  check_order(manifest, claimed, complete, r, layout.manifest());
  check_shards(dir, claimed, *schema, r);
  // A complete run with statistics lists their merged file (docs/stats.md); a rank's are merged
  // with the others' when manifest.json is assembled.
  if (complete && schema->stats && !layout.ranked()) {
    const json& st = manifest["stats"];
    if (!st.contains("file") || st["file"] != kStatsFileName)
      add_issue(r, kManifestName, "", concat("the run's statistics list no ", kStatsFileName));
    else {
      check_shards(dir, json::array({st}), stats_file_schema(*schema), r);
      --r.shards;  // a file of the run, not a shard of rows
    }
  }
  return r;
}

}  // namespace actcap
