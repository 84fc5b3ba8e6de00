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

std::string seal_manifest(json manifest) {
  manifest.erase("manifest_checksum");
  const std::string canonical = manifest.dump();
  manifest["manifest_checksum"] = hex64(xxh3(canonical.data(), canonical.size()));
  return manifest.dump(2) + "\n";
}

namespace {

bool plain_file_name(const std::string& name) {
  return !name.empty() && name.find('/') == std::string::npos &&
         name.find('\\') == std::string::npos && name != "." && name != "..";
}

}  // namespace

VerifyReport verify_output(const std::string& dir) {
  json claimed;
  return verify_output(dir, claimed);
}

VerifyReport verify_output(const std::string& dir, json& claimed) {
  claimed = json::array();
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw InputError(concat(dir, " is not a folder"));
  VerifyReport r;
  const std::string manifest_path = (fs::path(dir) / kManifestName).string();
  auto issue = [&](const std::string& file, const std::string& tensor, const std::string& problem) {
    const VerifyIssue::Kind kind = file == kManifestName  ? VerifyIssue::Kind::kManifest
                                   : file == kJournalName ? VerifyIssue::Kind::kJournal
                                                          : VerifyIssue::Kind::kShard;
    r.issues.push_back({file, tensor, problem, kind});
  };
  json manifest;
  if (!fs::exists(manifest_path, ec)) {
    issue(kManifestName, "", "missing: nothing in this folder is claimed complete");
    return r;
  }
  try {
    manifest = json::parse(read_text_file(manifest_path, kMaxManifestBytes, "manifest"));
  } catch (const json::exception& e) {
    issue(kManifestName, "", concat("not valid JSON (", e.what(), ")"));
    return r;
  }
  if (!manifest.is_object() || !manifest.contains("manifest_checksum") ||
      !manifest["manifest_checksum"].is_string()) {
    issue(kManifestName, "", "has no manifest_checksum");
    return r;
  }
  {
    json body = manifest;
    body.erase("manifest_checksum");
    const std::string canonical = body.dump();
    if (hex64(xxh3(canonical.data(), canonical.size())) !=
        manifest["manifest_checksum"].get<std::string>())
      issue(kManifestName, "",
            "contents do not match manifest_checksum (the manifest was altered)");
  }
  const bool complete = manifest.contains("complete") && manifest["complete"] == true;
  if (!complete)
    r.issues.push_back(
        {kManifestName, "", "run is not marked complete", VerifyIssue::Kind::kIncomplete});
  if (!manifest.contains("shards") || !manifest["shards"].is_array()) {
    issue(kManifestName, "", "has no shard list");
    return r;
  }
  std::string problem;
  const std::optional<ShardSchema> schema = shard_schema(manifest, problem);
  if (!schema) {
    issue(kManifestName, "", problem);
    return r;
  }
  if (!complete)  // an unfinished extract claims shards in its journal
    for (const std::string& p : merge_journal(dir, manifest["shards"])) issue(kJournalName, "", p);
  claimed = manifest["shards"];
  for (const json& shard : claimed)
    r.claimed.push_back(shard.is_object() && shard.contains("file") && shard["file"].is_string()
                            ? shard["file"].get<std::string>()
                            : std::string());
  for (const json& shard : manifest["shards"]) {
    if (!shard.is_object() || !shard.contains("file") || !shard["file"].is_string()) {
      issue(kManifestName, "", "malformed shard entry");
      continue;
    }
    const std::string file = shard["file"].get<std::string>();
    if (!plain_file_name(file)) {
      issue(kManifestName, "",
            concat("shard name '", file, "' is not a plain file name inside the folder"));
      continue;
    }
    ++r.shards;
    std::shared_ptr<SafetensorsFile> st;
    try {
      st = SafetensorsFile::open((fs::path(dir) / file).string());
    } catch (const Error& e) {
      issue(file, "", e.what());
      continue;
    }
    r.bytes += st->file_size();
    r.tensors += static_cast<int64_t>(st->tensors().size());
    for (VerifyIssue& i : check_shard(*st, file, shard, *schema)) r.issues.push_back(std::move(i));
  }
  return r;
}

}  // namespace actcap
