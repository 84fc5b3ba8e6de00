#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "actcap/error.h"
#include "actcap/export.h"
#include "actcap/hash.h"
#include "actcap/safetensors.h"
#include "export/shard.h"
#include "io/atomic_file.h"
#include "util/strings.h"

namespace actcap {

namespace fs = std::filesystem;
using nlohmann::json;

bool is_output_file(const std::string& name) {
  const std::string base = temp_target(name);  // a temp file counts as the file it was for
  return base == kManifestName || base == kJournalName ||
         (starts_with(base, "shard-") && ends_with(base, ".safetensors"));
}

void prepare_output_dir(const std::string& dir, bool overwrite) {
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec))
    throw InputError(concat("output folder ", dir, " exists and is not a folder"), {"out"});
  if (fs::exists(dir, ec) && !fs::is_empty(dir, ec)) {
    if (!overwrite)
      throw InputError(
          concat("output folder ", dir, " is not empty; allow overwriting to replace its contents"),
          {"out", "overwrite"});
    // Manifest first: from this moment nothing in the folder claims to be complete.
    fs::remove(fs::path(dir) / kManifestName, ec);
    for (const auto& entry : fs::directory_iterator(dir, ec))
      if (entry.is_regular_file() && is_output_file(entry.path().filename().string()))
        fs::remove(entry.path(), ec);
  }
  fs::create_directories(dir, ec);
  if (ec)
    throw InputError(concat("cannot create output folder ", dir, ": ", ec.message()), {"out"});
}

std::vector<ExportedTensor> export_run(const std::string& dir, const SafeCapturer& capturer,
                                       const Model& model, const ExportFaults& faults) {
  ShardContents shard;
  shard.rows = static_cast<int64_t>(capturer.row_seq().size());
  for (const PointInfo& p : capturer.plan())
    shard.tensors.emplace_back(p.name, capturer.get(p.name));
  shard.tensors.emplace_back("__rows__.seq", at::tensor(capturer.row_seq(), at::kLong));
  shard.tensors.emplace_back("__rows__.pos", at::tensor(capturer.row_pos(), at::kLong));
  // Checksums first, then the snapshots re-checked against their fingerprints: the bytes the
  // checksums cover are the captured ones (what changes after this is caught on read-back).
  shard.checksums = tensor_checksums(shard.tensors);
  capturer.verify();

  json manifest = manifest_head(model, capturer.plan());
  std::string problem;
  const std::optional<ShardSchema> schema = shard_schema(manifest, problem);
  if (!schema) throw RunError(concat("cannot describe the capture's shard: manifest ", problem));
  FaultPoints points(faults);
  const json entry = write_checked_shard(dir, 0, shard, *schema, &points);
  std::vector<ExportedTensor> out;
  for (const auto& [name, t] : shard.tensors)
    out.push_back({name, t.sizes().vec(), safetensors_dtype_name(t.scalar_type()),
                   shard.checksums[name].get<std::string>()});
  manifest["complete"] = true;
  manifest["rows"] = shard.rows;
  manifest["shards"].push_back(entry);
  write_manifest(dir, manifest, &points);
  return out;
}

}  // namespace actcap
