#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "actcap/error.h"
#include "actcap/export.h"
#include "actcap/hash.h"
#include "actcap/safetensors.h"
#include "export/journal.h"
#include "export/shard.h"
#include "io/atomic_file.h"
#include "io/text_file.h"

namespace actcap {

namespace fs = std::filesystem;
using nlohmann::json;

bool is_output_file(const std::string& name) {
  const std::string base = temp_target(name);  // a temp file counts as the file it was for
  const std::string ext = ".safetensors";
  return base == kManifestName || base == kJournalName ||
         (base.rfind("shard-", 0) == 0 && base.size() > ext.size() &&
          base.compare(base.size() - ext.size(), ext.size(), ext) == 0);
}

void prepare_output_dir(const std::string& dir, bool overwrite) {
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec))
    throw InputError(concat("--out ", dir, " exists and is not a directory"));
  if (fs::exists(dir, ec) && !fs::is_empty(dir, ec)) {
    if (!overwrite)
      throw InputError(
          concat("--out ", dir, " is not empty; pass --overwrite to replace its contents"));
    // Manifest first: from this moment nothing in the folder claims to be complete.
    fs::remove(fs::path(dir) / kManifestName, ec);
    for (const auto& entry : fs::directory_iterator(dir, ec))
      if (entry.is_regular_file() && is_output_file(entry.path().filename().string()))
        fs::remove(entry.path(), ec);
  }
  fs::create_directories(dir, ec);
  if (ec) throw InputError(concat("cannot create --out ", dir, ": ", ec.message()));
}

std::vector<ExportedTensor> export_run(const std::string& dir, const SafeCapturer& capturer,
                                       const Model& model) {
  capturer.verify();  // nothing changed between capture and export
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  const int64_t rows = static_cast<int64_t>(capturer.row_seq().size());
  for (const PointInfo& p : capturer.plan())
    tensors.emplace_back(p.name, capturer.get(p.name).contiguous());
  tensors.emplace_back("__rows__.seq", at::tensor(capturer.row_seq(), at::kLong));
  tensors.emplace_back("__rows__.pos", at::tensor(capturer.row_pos(), at::kLong));

  const WrittenShard shard = write_checked_shard(dir, 0, tensors, model.fingerprint());
  std::vector<ExportedTensor> out;
  for (const auto& [name, t] : tensors)
    out.push_back({name, t.sizes().vec(), safetensors_dtype_name(t.scalar_type()),
                   shard.checksums[name].get<std::string>()});
  json manifest = manifest_head(model, capturer.plan());
  manifest["complete"] = true;
  manifest["rows"] = rows;
  manifest["shards"].push_back({{"file", shard.file},
                                {"rows", rows},
                                {"bytes", shard.bytes},
                                {"checksums", shard.checksums}});
  write_file_atomic((fs::path(dir) / kManifestName).string(), seal_manifest(manifest));
  return out;
}

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
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) throw InputError(concat(dir, " is not a folder"));
  VerifyReport r;
  const std::string manifest_path = (fs::path(dir) / kManifestName).string();
  auto issue = [&](const std::string& file, const std::string& tensor, const std::string& problem) {
    r.issues.push_back({file, tensor, problem});
  };
  json manifest;
  {
    std::error_code ec;
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
  if (!complete) issue(kManifestName, "", "run is not marked complete");
  if (!manifest.contains("shards") || !manifest["shards"].is_array()) {
    issue(kManifestName, "", "has no shard list");
    return r;
  }
  if (!complete)  // an unfinished extract claims shards in its journal
    for (const std::string& problem : merge_journal(dir, manifest["shards"]))
      issue(kJournalName, "", problem);
  r.claimed = manifest["shards"];
  for (const json& shard : manifest["shards"]) {
    if (!shard.is_object() || !shard.contains("file") || !shard["file"].is_string() ||
        !shard.contains("checksums") || !shard["checksums"].is_object()) {
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
    if (shard.contains("bytes") && shard["bytes"] != st->file_size())
      issue(file, "",
            concat("is ", st->file_size(), " bytes, manifest says ", shard["bytes"].dump()));
    json meta_sums;
    auto meta = st->metadata().find("actcap.checksums");
    try {
      if (meta == st->metadata().end()) throw std::runtime_error("absent");
      meta_sums = json::parse(meta->second);
    } catch (const std::exception&) {
      issue(file, "", "__metadata__ has no readable actcap.checksums");
    }
    const json& sums = shard["checksums"];
    for (const TensorInfo& info : st->tensors()) {
      ++r.tensors;
      if (!sums.contains(info.name)) {
        issue(file, info.name, "is in the shard but not in the manifest");
        continue;
      }
      const std::string want =
          sums[info.name].is_string() ? sums[info.name].get<std::string>() : "";
      const std::string got = hex64(xxh3(st->data(info), info.end - info.begin));
      if (got != want) issue(file, info.name, concat("checksum ", got, ", manifest says ", want));
      if (meta_sums.is_object() && (!meta_sums.contains(info.name) || meta_sums[info.name] != want))
        issue(file, info.name, "checksum in the shard's __metadata__ differs from the manifest");
    }
    for (const auto& [name, v] : sums.items())
      if (!st->find(name)) issue(file, name, "listed in the manifest but absent from the shard");
  }
  return r;
}

}  // namespace actcap
