#include "export/shard.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "actcap/error.h"
#include "actcap/export.h"
#include "actcap/hash.h"
#include "actcap/safetensors.h"

namespace actcap {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

void damage_if_asked(const std::string& path, int64_t index) {
  const char* env = std::getenv("ACTCAP_FAULT_SHARD");
  if (!env || std::to_string(index) != env) return;
  std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(-1, std::ios::end);
  const char c = static_cast<char>(f.get() ^ 0x01);
  f.seekp(-1, std::ios::end);
  f.put(c);
}

}  // namespace

std::string shard_file_name(int64_t index) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "shard-%05lld.safetensors", static_cast<long long>(index));
  return buf;
}

WrittenShard write_checked_shard(const std::string& dir, int64_t index,
                                 const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                                 const std::string& model_fingerprint) {
  WrittenShard out;
  out.file = shard_file_name(index);
  out.checksums = json::object();
  for (const auto& [name, t] : tensors) out.checksums[name] = hex64(tensor_xxh3(t));
  const std::string path = (fs::path(dir) / out.file).string();
  write_safetensors(path, tensors,
                    {{"actcap.format", kFormatVersion},
                     {"actcap.model", model_fingerprint},
                     {"actcap.checksums", out.checksums.dump()}});
  damage_if_asked(path, index);

  // Read back what landed on disk before anyone claims it.
  std::string bad;
  {
    auto file = SafetensorsFile::open(path);
    out.bytes = file->file_size();
    for (const auto& [name, sum] : out.checksums.items()) {
      const TensorInfo* info = file->find(name);
      if (!info || hex64(xxh3(file->data(*info), info->end - info->begin)) != sum) {
        bad = name;
        break;
      }
    }
  }
  if (!bad.empty()) {
    std::error_code ec;
    fs::remove(path, ec);
    throw RunError(concat(path, ": tensor ", bad,
                          " does not read back with the checksum it was written with (removed it; "
                          "check the disk, then run again or --resume)"));
  }
  return out;
}

json manifest_head(const Model& model, const std::vector<PointInfo>& plan) {
  json points = json::object();
  for (const PointInfo& p : plan)
    points[p.name] = {{"dtype", safetensors_dtype_name(p.dtype)}, {"shape", p.shape}};
  json device_map = json::object();
  const auto modules = model.stage_modules();
  for (size_t i = 0; i < modules.size(); ++i)
    for (const std::string& m : modules[i]) device_map[m] = model.stage_device(i).str();
  return {{"format", kFormatVersion},
          {"complete", false},
          {"model",
           {{"path", model.origin()},
            {"model_type", model.config().model_type},
            {"fingerprint", model.fingerprint()}}},
          {"device_map", device_map},
          {"points", points},
          {"rows", 0},
          {"shards", json::array()}};
}

}  // namespace actcap
