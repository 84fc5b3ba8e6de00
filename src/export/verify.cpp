// `actcap verify` (and --resume's check): everything an output folder claims, against what a
// reader would decode from it.
#include <filesystem>
#include <nlohmann/json.hpp>

#include "actcap/error.h"
#include "actcap/export.h"
#include "actcap/hash.h"
#include "actcap/safetensors.h"
#include "export/journal.h"
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
  const VerifyIssue::Kind kind = file == kManifestName  ? VerifyIssue::Kind::kManifest
                                 : file == kJournalName ? VerifyIssue::Kind::kJournal
                                                        : VerifyIssue::Kind::kShard;
  r.issues.push_back({file, tensor, problem, kind});
}

// The manifest itself: present, JSON, sealed and unaltered, complete, with a shard list and a
// schema. Reports what is wrong; the schema when the shards can be checked against it.
std::optional<ShardSchema> check_manifest(const std::string& dir, json& manifest, bool& complete,
                                          VerifyReport& r) {
  std::error_code ec;
  const std::string manifest_path = (fs::path(dir) / kManifestName).string();
  if (!fs::exists(manifest_path, ec)) {
    add_issue(r, kManifestName, "", "missing: nothing in this folder is claimed complete");
    return std::nullopt;
  }
  try {
    manifest = json::parse(read_text_file(manifest_path, kMaxManifestBytes, "manifest"));
  } catch (const json::exception& e) {
    add_issue(r, kManifestName, "", concat("not valid JSON (", e.what(), ")"));
    return std::nullopt;
  }
  if (!manifest.is_object() || !manifest.contains("manifest_checksum") ||
      !manifest["manifest_checksum"].is_string()) {
    add_issue(r, kManifestName, "", "has no manifest_checksum");
    return std::nullopt;
  }
  if (manifest_checksum(manifest) != manifest["manifest_checksum"].get<std::string>())
    add_issue(r, kManifestName, "",
              "contents do not match manifest_checksum (the manifest was altered)");
  complete = manifest.contains("complete") && manifest["complete"] == true;
  if (!complete)
    r.issues.push_back(
        {kManifestName, "", "run is not marked complete", VerifyIssue::Kind::kIncomplete});
  if (!manifest.contains("shards") || !manifest["shards"].is_array()) {
    add_issue(r, kManifestName, "", "has no shard list");
    return std::nullopt;
  }
  std::string problem;
  std::optional<ShardSchema> schema = shard_schema(manifest, problem);
  if (!schema) add_issue(r, kManifestName, "", problem);
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

}  // namespace

std::string seal_manifest(json manifest) {
  manifest["manifest_checksum"] = manifest_checksum(manifest);
  return manifest.dump(2) + "\n";
}

VerifyReport verify_output(const std::string& dir) {
  json claimed;
  return verify_output(dir, claimed);
}

VerifyReport verify_output(const std::string& dir, json& claimed) {
  claimed = json::array();
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw InputError(concat(dir, " is not a folder"));
  VerifyReport r;
  json manifest;
  bool complete = false;
  const std::optional<ShardSchema> schema = check_manifest(dir, manifest, complete, r);
  if (!schema) return r;
  if (!complete)  // an unfinished extract claims shards in its journal
    for (const std::string& p : merge_journal(dir, manifest["shards"]))
      add_issue(r, kJournalName, "", p);
  claimed = manifest["shards"];
  for (const json& shard : claimed)
    r.claimed.push_back(shard.is_object() && shard.contains("file") && shard["file"].is_string()
                            ? shard["file"].get<std::string>()
                            : std::string());
  check_shards(dir, manifest["shards"], *schema, r);
  // A complete run with statistics lists their merged file (docs/stats.md).
  if (complete && schema->stats) {
    const json& st = manifest["stats"];
    if (!st.contains("file") || st["file"] != kStatsFileName)
      add_issue(r, kManifestName, "", concat("the run's statistics list no ", kStatsFileName));
    else
    {
      check_shards(dir, json::array({st}), stats_file_schema(*schema), r);
      --r.shards;  // a file of the run, not a shard of rows
    }
  }
  return r;
}

}  // namespace actcap
