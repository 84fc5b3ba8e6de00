#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>

#include "actcap/error.h"
#include "actcap/export.h"
#include "actcap/hash.h"
#include "actcap/safetensors.h"

namespace actcap {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {
bool is_own_file(const std::string& name) {
  return name == kManifestName || (name.rfind("shard-", 0) == 0 && name.find(".safetensors") != std::string::npos);
}
}  // namespace

void prepare_output_dir(const std::string& dir, bool overwrite) {
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec))
    throw InputError(concat("--out ", dir, " exists and is not a directory"));
  if (fs::exists(dir, ec) && !fs::is_empty(dir, ec)) {
    if (!overwrite) throw InputError(concat("--out ", dir, " is not empty; pass --overwrite to replace its contents"));
    // Manifest first: from this moment nothing in the folder claims to be complete.
    fs::remove(fs::path(dir) / kManifestName, ec);
    for (const auto& entry : fs::directory_iterator(dir, ec))
      if (entry.is_regular_file() && is_own_file(entry.path().filename().string())) fs::remove(entry.path(), ec);
  }
  fs::create_directories(dir, ec);
  if (ec) throw InputError(concat("cannot create --out ", dir, ": ", ec.message()));
}

void write_file_atomic(const std::string& path, const std::string& text) {
  const std::string tmp = concat(path, ".tmp.", ::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw RunError(concat("cannot write ", path, ": ", std::strerror(errno)));
  size_t done = 0;
  while (done < text.size()) {
    ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      int err = errno;
      ::close(fd);
      ::unlink(tmp.c_str());
      throw RunError(concat("cannot write ", path, ": ", std::strerror(err)));
    }
    done += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0 || ::close(fd) != 0 || ::rename(tmp.c_str(), path.c_str()) != 0) {
    int err = errno;
    ::unlink(tmp.c_str());
    throw RunError(concat("cannot write ", path, ": ", std::strerror(err)));
  }
}

std::vector<ExportedTensor> export_run(const std::string& dir, const SafeCapturer& capturer, const Batch& batch,
                                       const Model& model) {
  capturer.verify();  // nothing changed between capture and export
  std::vector<std::pair<std::string, at::Tensor>> tensors;
  std::vector<int64_t> seq, pos;
  for (int64_t b = 0; b < batch.size(); ++b)
    for (int64_t t = 0; t < batch.lengths[b]; ++t) {
      seq.push_back(b);
      pos.push_back(t);
    }
  for (const PointInfo& p : capturer.plan()) tensors.emplace_back(p.name, capturer.rows(p.name).contiguous());
  tensors.emplace_back("__rows__.seq", at::tensor(seq, at::kLong));
  tensors.emplace_back("__rows__.pos", at::tensor(pos, at::kLong));

  std::vector<ExportedTensor> out;
  json checksums = json::object();
  for (const auto& [name, t] : tensors) {
    ExportedTensor e{name, t.sizes().vec(), safetensors_dtype_name(t.scalar_type()), hex64(tensor_xxh3(t))};
    checksums[name] = e.checksum;
    out.push_back(std::move(e));
  }
  const std::string shard_name = "shard-00000.safetensors";
  const std::string shard_path = (fs::path(dir) / shard_name).string();
  write_safetensors(shard_path, tensors,
                    {{"actcap.format", kFormatVersion},
                     {"actcap.model", model.fingerprint()},
                     {"actcap.checksums", checksums.dump()}});

  // Read back what landed on disk before claiming it.
  auto file = SafetensorsFile::open(shard_path);
  for (const ExportedTensor& e : out) {
    const TensorInfo* info = file->find(e.name);
    if (!info || hex64(xxh3(file->data(*info), info->end - info->begin)) != e.checksum)
      throw RunError(concat(shard_path, ": tensor ", e.name, " does not read back with checksum ", e.checksum));
  }

  json points = json::object();
  for (const PointInfo& p : capturer.plan())
    points[p.name] = {{"dtype", safetensors_dtype_name(p.dtype)}, {"shape", p.shape}};
  json device_map = json::object();
  const auto modules = model.stage_modules();
  for (size_t i = 0; i < modules.size(); ++i)
    for (const std::string& m : modules[i]) device_map[m] = model.stage_device(i).str();
  json manifest = {
      {"format", kFormatVersion},
      {"complete", true},
      {"model", {{"path", model.origin()}, {"model_type", model.config().model_type}, {"fingerprint", model.fingerprint()}}},
      {"device_map", device_map},
      {"points", points},
      {"rows", batch.tokens()},
      {"shards", json::array({{{"file", shard_name}, {"rows", batch.tokens()}, {"bytes", file->file_size()},
                               {"checksums", checksums}}})},
  };
  write_file_atomic((fs::path(dir) / kManifestName).string(), manifest.dump(2) + "\n");
  return out;
}

}  // namespace actcap
